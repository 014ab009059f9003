"""What is deployed: run_aligned(optimize=...), two ONNX models side by side, the views.

Real exports, real onnxruntime optimizations (the QDQ cases of tests/quant_models.py),
real files through the command line.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys

import onnx
import pytest
import torch

from onnx_sbs_nb import run_aligned, run_aligned_onnx
from onnx_sbs_nb.align.blame.summary import summarize
from onnx_sbs_nb.cli.main import EXIT_BAD_INPUT, EXIT_FAIL, EXIT_PASS, main
from onnx_sbs_nb.errors import SbsInputError
from onnx_sbs_nb.notebook.session import SbsSession
from onnx_sbs_nb.records import STATUS_INTERNAL, STATUS_UNPAIRED_EP
from onnx_sbs_nb.reports.model_explorer import VALUE_PREFIX, read_node_data, value_keys

from ...quant_models import exported

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def failing(recs):
    return [r for r in recs if r.failed]


# ---------------------------------------------------------------- optimize=


_CPU = "on CPUExecutionProvider"


@pytest.mark.parametrize(
    "name, level, value, node, op, says",
    [
        # DequantizeLinear x2, Gemm and QuantizeLinear fused into one integer kernel
        (
            "linear",
            "all",
            "quantize_per_tensor_2",
            "node_linear",
            "QGemm",
            f"fused by onnxruntime (level 'all' {_CPU}): com.microsoft::QGemm replaces "
            "node_dequantize_per_tensor, node_dequantize_per_tensor_1, node_linear, "
            "node_quantize_per_tensor_2",
        ),
        # the Gemm now adds a bias quantized to int32 (WeightBiasQuantization)
        (
            "linear",
            "basic",
            "linear",
            "node_linear",
            "Gemm",
            f"rewritten by onnxruntime (level 'basic' {_CPU}) from node_linear",
        ),
        # the value is written by the NHWC Transpose after the QLinearConv
        (
            "conv",
            "all",
            "quantize_per_tensor_2",
            "node_conv2d_token_1",
            "Transpose",
            f"Transpose inserted by onnxruntime (level 'all' {_CPU}) as part of fused node "
            "node_conv2d_token_1 (com.microsoft::QLinearConv)",
        ),
    ],
)
def test_optimize_names_the_node_onnxruntime_made(name, level, value, node, op, says):
    ep, onx, args = exported(name)
    assert not failing(run_aligned(ep, onx, args)), "the export itself is faithful"
    recs = list(run_aligned(ep, onx, args, optimize=level))
    first = failing(recs)[0]
    assert first.onnx_name == value
    assert first.err_abs >= (1 if value.startswith("quantize") else 1e-4)  # uint8 steps
    assert first.onnx_op_type == op and says in first.comment, first.comment
    if op != "Transpose":
        assert first.onnx_node_name == node
    culprit = summarize(recs, node_inputs=onx).culprit
    assert culprit is not None and culprit.onnx_name == first.onnx_name
    # what the fusion swallowed is internal to it, not an unpaired torch value
    assert not [r for r in recs if r.status == STATUS_UNPAIRED_EP and r.kind == "node"]
    internal = [r for r in recs if r.status == STATUS_INTERNAL]
    assert bool(internal) == (level == "all")
    assert all(f"internal to fused node {node!r}" in r.comment for r in internal)
    assert not any(r.failed for r in internal)


def test_a_control_whose_optimized_graph_agrees_has_no_failing_pair():
    ep, onx, args = exported("mlp")
    recs = list(run_aligned(ep, onx, args, optimize="all"))
    assert not failing(recs)
    (internal,) = [r for r in recs if r.status == STATUS_INTERNAL]
    assert internal.ep_name == "linear" and "FusedGemm" in internal.comment
    fused = next(r for r in recs if r.onnx_op_type == "FusedGemm")
    assert "replaces node_linear, node_relu" in fused.comment
    assert summarize(recs).verdict == "pass"


def test_float16_values_onnxruntime_renamed_pair_through_a_cast():
    ep, onx, args = exported("mlp16")
    recs = list(run_aligned(ep, onx, args, optimize="basic", own_error=True))
    assert not failing(recs) and not [r for r in recs if r.status == STATUS_UNPAIRED_EP]
    renamed = {r.ep_name: r for r in recs if r.comment and "paired through it" in r.comment}
    assert set(renamed) == {"linear", "relu"}
    for r in renamed.values():
        assert r.ep_shape_type.startswith("float16") and r.onnx_shape_type.startswith("float32")
        assert "float16 vs float32: compared in float16" in r.comment
        assert r.passed and r.passed2  # the own-error run was fed float32 through the cast


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"optimize": "everything"}, "is not a level"),
        ({"providers": ["CPUExecutionProvider"]}, "give optimize= too"),
        ({"optimize": "all", "providers": ["TensorrtExecutionProvider"]}, "not available"),
    ],
)
def test_bad_deployment_options_are_refused_at_the_call(kwargs, message):
    ep, onx, args = exported("mlp")
    with pytest.raises(SbsInputError, match=message):
        run_aligned(ep, onx, args, **kwargs)


# ---------------------------------------------------------------- two ONNX models


def _changed(onx: onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    other = onnx.ModelProto()
    other.CopyFrom(onx)
    relu = next(n for n in other.graph.node if n.op_type == "Relu")
    relu.op_type = "Sigmoid"
    return other, relu.name


def test_a_model_against_itself_is_clean():
    _, onx, args = exported("mlp")
    recs = list(run_aligned_onnx(onx, onx, {"x": args[0]}))
    assert recs and not failing(recs)
    assert {r.status for r in recs} == {"ok"}  # every value, weights included, compared
    assert len(recs) == len(onx.graph.initializer) + 1 + sum(len(n.output) for n in onx.graph.node)
    assert summarize(recs).verdict == "pass"


def test_a_changed_node_is_named():
    _, onx, args = exported("mlp")
    changed, node = _changed(onx)
    recs = list(run_aligned_onnx(onx, changed, args, own_error=True))
    culprit = summarize(recs, node_inputs=changed).culprit
    assert culprit is not None and culprit.onnx_node == node and culprit.onnx_op_type == "Sigmoid"
    assert culprit.rule == "rerun"  # its own error: it makes the difference
    later = next(r for r in recs if r.onnx_name == "linear_1")
    assert later.failed and later.passed2  # downstream only inherits it


def test_float32_against_float16_pairs_every_value_through_a_cast():
    _, onx, args = exported("mlp")
    _, onx16, _ = exported("mlp16")  # the same weights in float16
    recs = list(run_aligned_onnx(onx, onx16, args, own_error=True))
    assert recs and {r.status for r in recs} == {"ok"}, [r.comment for r in recs if r.failed]
    assert all("float32 vs float16: compared in float16" in r.comment for r in recs)
    x = next(r for r in recs if r.ep_name == "x")  # the feed, cast for the float16 model
    assert (x.ep_shape_type, x.onnx_shape_type, x.err_abs) == ("float32[8x32]", "float16[8x32]", 0)
    assert all(r.passed2 for r in recs if r.onnx_id_node >= 0)


def test_a_model_against_the_graph_onnxruntime_runs():
    _, onx, args = exported("linear")
    recs = list(run_aligned_onnx(onx, onx, args, optimize="all"))
    first = failing(recs)[0]
    assert (first.onnx_node_name, first.onnx_op_type) == ("node_linear", "QGemm")
    assert {r.ep_name for r in recs if r.status == STATUS_INTERNAL} == {
        "linear",
        "dequantize_per_tensor",
        "dequantize_per_tensor_1",
    }


def test_two_model_input_errors():
    _, onx, args = exported("mlp")
    x = onnx.helper.make_tensor_value_info("inp", onnx.TensorProto.FLOAT, [8, 32])
    y = onnx.helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, [8, 32])
    node = onnx.helper.make_node("Neg", ["inp"], ["out"])
    other = onnx.helper.make_model(onnx.helper.make_graph([node], "g", [x], [y]))
    with pytest.raises(SbsInputError, match="lack the model inputs"):
        run_aligned_onnx(onx, onx, {})
    with pytest.raises(SbsInputError, match="expects torch.float32"):
        run_aligned_onnx(onx, onx, (args[0].double(),))
    with pytest.raises(SbsInputError, match="name no input"):
        run_aligned_onnx(onx, onx, {"x": args[0], "y": args[0]})
    with pytest.raises(SbsInputError, match="not two exports of one program"):
        run_aligned_onnx(onx, other, {"x": args[0]})
    with pytest.raises(SbsInputError, match="replay"):
        run_aligned_onnx(onx, onx, args, replay={"names": ["x"]}, replay_dir="d")


# ---------------------------------------------------------------- views


@pytest.fixture(scope="module")
def qdq_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("qdq")
    ep, onx, args = exported("linear")
    torch.export.save(ep, str(d / "qdq.pt2"))
    onnx.save(onx, str(d / "qdq.onnx"))
    torch.save(args, str(d / "inputs.pt"))
    return d


def _assert_node_data_names_the_qgemm(node_data, model_path):
    model = onnx.load(str(model_path))
    values = read_node_data(node_data)
    outputs = {VALUE_PREFIX + o.name for o in model.graph.output}
    assert set(values) <= set(value_keys(model).values()) | outputs
    assert values["node_linear"] == 1.0  # the QGemm: one uint8 step
    assert any(n.op_type == "QGemm" for n in model.graph.node)


def test_cli_run_optimize_bisect_node_data(qdq_files, tmp_path):
    """In a fresh process: the quantized .pt2 loads, the run names the fused node, the
    bisection names the optimizer, Model Explorer gets the optimized graph and its data."""
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    d = qdq_files
    node_data = tmp_path / "run.node_data.json"
    argv = ["run", "--ep", str(d / "qdq.pt2"), "--onnx", str(d / "qdq.onnx")]
    argv += ["--inputs", str(d / "inputs.pt"), "--optimize", "all", "--bisect"]
    argv += ["-o", str(node_data), str(tmp_path / "report.csv")]
    proc = subprocess.run(
        [sys.executable, "-m", "onnx_sbs_nb", *argv], env=env, capture_output=True, text=True
    )
    out = proc.stdout
    assert proc.returncode == EXIT_FAIL, out + proc.stderr[-3000:]
    culprit = next(line for line in out.splitlines() if line.startswith("culprit:"))
    assert "node_linear [QGemm]" in culprit
    assert "bisect: found: disabling WeightBiasQuantization" in out
    assert "disabled_optimizers=['WeightBiasQuantization']" in out
    assert "bisect:" in proc.stderr  # its progress bar, one step per session
    assert "sessions [" in proc.stderr and "session/s" not in proc.stderr  # no bogus rate
    model_path = tmp_path / "run.optimized.onnx"
    assert f"--node_data_paths={node_data}" in out and str(model_path) in out
    _assert_node_data_names_the_qgemm(node_data, model_path)


def test_cli_diff(qdq_files, tmp_path):
    _, onx, _ = exported("mlp")
    changed, node = _changed(onx)
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    onnx.save(onx, str(a))
    onnx.save(changed, str(b))
    inputs = tmp_path / "inputs.pt"
    torch.save({"x": exported("mlp")[2][0]}, str(inputs))

    def cli(*argv):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            code = main(["diff", *argv, "--inputs", str(inputs), "--no-progress"])
        return code, buf.getvalue()

    code, out = cli(str(a), str(a), "-o", str(tmp_path / "same.jsonl"))
    assert code == EXIT_PASS and "verdict: PASS" in out, out
    code, out = cli(str(a), str(b), "--own-error", "-o", str(tmp_path / "diff.node_data.json"))
    assert code == EXIT_FAIL, out
    assert f"ONNX node {node} [Sigmoid]" in out
    assert (tmp_path / "diff.node_data.jsonl").is_file()  # records stream beside the output
    assert read_node_data(tmp_path / "diff.node_data.json")[node] > 0.1
    code, _ = cli(str(a), str(tmp_path / "missing.onnx"))
    assert code == EXIT_BAD_INPUT


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--optimize", "everything"], "invalid choice"),
        (["--providers", "CPUExecutionProvider"], "give optimize= too"),
        (["-o", "folder.json/"], "is a folder"),
    ],
)
def test_cli_deployment_input_errors(qdq_files, tmp_path, capsys, extra, message, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder.json").mkdir()
    d = qdq_files
    argv = ["run", "--ep", str(d / "qdq.pt2"), "--onnx", str(d / "qdq.onnx")]
    code = main([*argv, "--inputs", str(d / "inputs.pt"), "--no-progress", *extra])
    assert code == EXIT_BAD_INPUT
    assert message in capsys.readouterr().err


def test_session_and_widget_save_node_data(tmp_path):
    ep, onx, args = exported("linear")
    session = SbsSession(ep, onx, args, optimize="all").start()
    files = session.save_node_data(tmp_path / "s.node_data.json")
    assert files.model == tmp_path / "s.optimized.onnx"
    assert "model_explorer_onnx" in files.command()
    _assert_node_data_names_the_qgemm(files.node_data, files.model)
    # the plain run: the user's own graph, nothing else written
    plain = SbsSession(ep, onx, args).start().save_node_data(tmp_path / "p.node_data.json")
    assert plain.model is None and json.loads(plain.node_data.read_text())

    from onnx_sbs_nb.notebook.widget import SbsWidget

    w = SbsWidget(ep, onx, args, optimize="all")
    w.wait()
    assert w.session.options.optimize == "all"
    assert w.save_node_data(tmp_path / "w.node_data.json").model.is_file()


def test_magic_flags_reach_the_options():
    from onnx_sbs_nb.notebook.magic import parse_line

    ep, onx, args = exported("mlp")
    kwargs, _ = parse_line("ep onx args --optimize extended", {"ep": ep, "onx": onx, "args": args})
    assert kwargs["options"].optimize == "extended"
    assert kwargs["options"].providers == ("CPUExecutionProvider",)
