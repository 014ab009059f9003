"""`onnx-sbs` exit codes on faithful models a first check got wrong (trial 5): a float16
conversion keeping float32 outputs (`diff`), and a node the reference evaluator's own
kernel cannot run (`run --runner reference`).  Real export, real files."""

from __future__ import annotations

import contextlib
import copy
import io
import warnings

import onnx
import pytest
import torch

from onnx_sbs_nb.cli.main import EXIT_INCOMPLETE, EXIT_PASS, main


def _quiet_export(m, args):
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        ep = torch.export.export(m, args)
        return ep, torch.onnx.export(ep, args, dynamo=True).model_proto


def _main(argv):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main([*argv, "--no-progress"])
    return code, buf.getvalue()


def test_diff_of_a_float16_conversion_with_float32_outputs_passes(tmp_path):
    """`onnx-sbs diff a.onnx a_fp16.onnx` (onnxconverter-common, keep_io_types=True):
    exit 0, no culprit (it was exit 1, the graph output named culprit)."""
    float16 = pytest.importorskip("onnxconverter_common.float16")
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.LayerNorm(32), torch.nn.Linear(32, 32)).eval()
    x = torch.randn(2, 6, 32)
    _, a = _quiet_export(m, (x,))
    b = float16.convert_float_to_float16(copy.deepcopy(a), keep_io_types=True)
    assert b.graph.node[-1].op_type == "Cast"  # the converter's Cast makes the output
    onnx.save(a, tmp_path / "a.onnx")
    onnx.save(b, tmp_path / "b.onnx")
    torch.save((x,), tmp_path / "in.pt")
    code, out = _main(
        [
            "diff",
            str(tmp_path / "a.onnx"),
            str(tmp_path / "b.onnx"),
            "--inputs",
            str(tmp_path / "in.pt"),
            "-o",
            str(tmp_path / "d.jsonl"),
        ]
    )
    assert code == EXIT_PASS, out
    assert "verdict: PASS" in out and "culprit" not in out, out


def test_run_with_a_runner_that_fails_where_onnxruntime_runs_is_incomplete(tmp_path):
    """`onnx-sbs run ... --runner reference` on a grouped ConvTranspose the reference
    evaluator's kernel cannot run (onnxruntime runs it): exit 3, no culprit (it was exit 1
    naming the faithful node)."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2),
        torch.nn.ReLU(),
    ).eval()
    b = torch.randn(1, 4, 9, 9)
    ep, onx = _quiet_export(m, (b,))
    torch.export.save(ep, tmp_path / "m.pt2")
    onnx.save(onx, tmp_path / "m.onnx")
    torch.save((b,), tmp_path / "in.pt")
    files = [str(tmp_path / n) for n in ("m.pt2", "m.onnx", "in.pt")]
    code, out = _main(["run", *files, "--runner", "reference", "-o", str(tmp_path / "r.jsonl")])
    assert code == EXIT_INCOMPLETE, out
    assert "verdict: INCOMPLETE" in out and "culprit" not in out, out
    assert "runner failed: " in out and "ValueError" in out, out
