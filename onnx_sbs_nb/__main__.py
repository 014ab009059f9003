"""``python -m onnx_sbs_nb`` and the ``onnx-sbs`` console script."""

import sys

from .command_gc import one_command_gc


def main() -> int:
    """The command: :func:`onnx_sbs_nb.cli.main`, in a process tuned for one run
    (``command_gc.py``)."""
    with one_command_gc() as imports_done:
        from . import cli  # torch comes with it

        imports_done()
        return cli.main()


if __name__ == "__main__":
    sys.exit(main())
