"""Exports one bug model into a folder: model.pt2, model.onnx, inputs.pt, versions.json.

Runs in whichever venv calls it (an old-exporter venv, or the main one), so it imports
torch only and the model module by path:

    <venv>/bin/python tests/corpus/export_bug.py MODEL_NAME OUT_DIR
"""

from __future__ import annotations

import importlib.util
import json
import sys
import warnings
from pathlib import Path


def main(name: str, out: str) -> None:
    import torch

    spec = importlib.util.spec_from_file_location(
        "bug_models", Path(__file__).with_name("bug_models.py")
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    model, args = mod.build(name)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        ep = torch.export.export(model, args)
        torch.export.save(ep, str(folder / "model.pt2"))
        prog = torch.onnx.export(ep, args, dynamo=True, verbose=False)
        prog.save(str(folder / "model.onnx"))
    torch.save(args, str(folder / "inputs.pt"))
    import onnxscript

    versions = {"torch": torch.__version__, "onnxscript": onnxscript.__version__}
    (folder / "versions.json").write_text(json.dumps(versions))
    print(json.dumps(versions))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
