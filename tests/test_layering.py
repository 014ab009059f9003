"""One engine, many views: the engine never imports view code."""

from __future__ import annotations

import subprocess
import sys


def test_engine_imports_no_view_code():
    code = (
        "import sys\n"
        "import numpy, onnx, onnxruntime, torch\n"
        "before = set(sys.modules)\n"  # whatever torch itself pulls in is not ours
        "import onnx_sbs_nb.align.run, onnx_sbs_nb.align.devices, onnx_sbs_nb.summary\n"
        "import onnx_sbs_nb.evaluator.evaluator\n"
        "new = set(sys.modules) - before\n"
        "bad = sorted(m for m in new if m.split('.')[0] in ('tqdm', 'pandas', 'plotly',\n"
        "             'anywidget', 'ipywidgets', 'IPython') or m in ('onnx_sbs_nb.widget',\n"
        "             'onnx_sbs_nb.cli', 'onnx_sbs_nb.session', 'onnx_sbs_nb.report'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", out.stdout
