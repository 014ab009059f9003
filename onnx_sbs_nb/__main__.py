"""``python -m onnx_sbs_nb`` is ``onnx-sbs``."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
