"""The precision advisor: nodes that cannot run in float16/bfloat16, found and kept in float32.

Models built here with random weights, exported with the real exporter, converted with
onnxconverter-common; nothing mocked.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import onnx
import pytest
import torch

pytest.importorskip("onnxconverter_common")

from onnxconverter_common import float16  # noqa: E402

from onnx_sbs_nb.align.precision_advice import save_advised_model, write_advice  # noqa: E402
from onnx_sbs_nb.align.precision_advisor import advise_precision  # noqa: E402
from onnx_sbs_nb.align.precision_convert import convert_model  # noqa: E402
from onnx_sbs_nb.errors import SbsInputError  # noqa: E402

from ..models import export  # noqa: E402


class Overflow(torch.nn.Module):
    """A hand-made RMS normalization: its sum of squares (~2e5) overflows float16."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 8)
        self.fc3 = torch.nn.Linear(16, 8)

    def forward(self, x):
        h = self.fc1(x) * 100.0
        sq = (h * h).sum(-1, keepdim=True)
        return self.fc2(h / torch.sqrt(sq)) + self.fc3(x)


class Cancel(torch.nn.Module):
    """``(h + 3000) - 3000``: float16 keeps h to ~1 ulp of 3000 (2), bfloat16 to 16."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 8)

    def forward(self, x):
        big = self.fc1(x) + 3000.0
        return self.fc2(big - 3000.0)


class Faithful(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


@functools.cache
def exported(name):
    torch.manual_seed(0)
    model = {"overflow": Overflow, "cancel": Cancel, "faithful": Faithful}[name]()
    x = torch.randn(4, 16)
    ep, onx = export(model, (x,))
    return ep, onx, (x,)


FINE_FX = {"linear", "linear_1", "linear_2", "mul", "div", "add"}


def test_overflowing_nodes_are_named_first_and_their_block_list_makes_outputs_agree():
    ep, onx, args = exported("overflow")
    advice = advise_precision(ep, onx, args, dtype="float16")
    named = [n.fx_node for n in advice.nodes]
    assert named[0] == "sum_1", advice.to_text()  # the largest overflow first
    # the Sqrt is fed the overflowing sum: it must stay in float32 with it
    assert "sqrt" in named and set(named) <= {"sum_1", "mul_1", "sqrt"}
    assert not set(named) & FINE_FX
    first = advice.nodes[0]
    assert first.overflow and first.scale > 65504 and first.own_error == float("inf")
    by_name = {n.name: n for n in onx.graph.node}
    assert by_name[advice.node_block_list[0]].op_type == "ReduceSum"
    assert advice.op_block_list[0] == "ReduceSum"
    # the plain conversion does not agree, the advised one does
    assert not advice.before.passed
    assert advice.after is not None and advice.after.passed and advice.agrees
    assert advice.after.err_abs < advice.before.err_abs
    # the block list in the converter's format does what the advice says
    again = float16.convert_float_to_float16(onx, **advice.convert_kwargs())
    assert {n.name for n in again.graph.node} >= set(advice.node_block_list)
    text = advice.to_text()
    assert "AGREES" in text and "node_block_list" in text and "sum_1" in text


def test_a_faithful_model_needs_no_block_list():
    ep, onx, args = exported("faithful")
    advice = advise_precision(ep, onx, args, dtype="float16")
    assert advice.nodes == [] and advice.node_block_list == [] and advice.op_block_list == []
    assert advice.after is None and advice.before.passed and advice.agrees
    assert advice.compared >= 3
    json.dumps(advice.to_dict())


def test_an_attention_mask_of_float32s_lowest_is_no_overflow_that_matters():
    # the mask (-3.4e38) is -inf in float16: the Softmax it feeds gives the same zeros
    from ..models import CausalAttention

    torch.manual_seed(0)
    x = torch.randn(2, 5, 16)
    ep, onx = export(CausalAttention(), (x,))
    advice = advise_precision(ep, onx, (x,), dtype="float16")
    assert advice.nodes == [] and advice.node_block_list == [], advice.to_text()
    assert advice.agrees


def test_a_cancellation_is_named_and_its_input_kept_in_float32_in_bfloat16():
    ep, onx, args = exported("cancel")
    advice = advise_precision(ep, onx, args, dtype="bfloat16")
    assert advice.nodes[0].fx_node == "sub", advice.to_text()
    assert advice.nodes[0].reason == "error" and advice.nodes[0].relative_error > 0.05
    # rounding h + 3000 to bfloat16 loses h: the Sub alone in float32 is not enough
    assert {n.fx_node for n in advice.nodes} == {"sub", "add"}
    assert not advice.before.passed and advice.after.passed and advice.rounds == 2
    model = advice.model
    types = {i.data_type for i in model.graph.initializer}
    assert onnx.TensorProto.BFLOAT16 in types


class Amplified(torch.nn.Module):
    """A Linear whose absolute error in bfloat16 (~1e-2, within atol 5e-2) is multiplied by
    1e5: no node fails its own check, the outputs do not agree."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(x) * 1e5


def test_an_error_within_tolerance_that_the_graph_amplifies_is_found_by_its_relative_size():
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    ep, onx = export(Amplified(), (x,))
    advice = advise_precision(ep, onx, (x,), dtype="bfloat16")
    assert not advice.before.passed and advice.agrees, advice.to_text()
    first = advice.nodes[0]
    assert (first.fx_node, first.reason) == ("linear", "largest")
    assert first.own_error < advice.atol and "amplify" in first.why


def test_the_advised_model_keeps_its_blocked_weights_and_output_in_float32():
    # 1e5 * fc(x) overflows float16; onnxconverter-common converts (and clamps to 1e4) the
    # blocked Mul's 1e5 anyway and leaves the blocked graph output in float16
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    ep, onx = export(Amplified(), (x,))
    advice = advise_precision(ep, onx, (x,), dtype="float16")
    assert advice.nodes[0].fx_node == "mul" and advice.nodes[0].overflow
    assert advice.agrees, advice.to_text()
    model = advice.model
    assert model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    weights = {
        float(onnx.numpy_helper.to_array(i).ravel()[0])
        for i in model.graph.initializer
        if i.data_type == onnx.TensorProto.FLOAT and not i.dims
    }
    assert 1e5 in weights


class Determinant(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(9, 9)

    def forward(self, x):
        return torch.linalg.det(self.fc(x).reshape(-1, 3, 3)) + 1


def test_a_node_that_does_not_run_in_bfloat16_is_kept_in_float32():
    # torch has no bfloat16 LU on the CPU: the converted model does not run at all
    torch.manual_seed(0)
    x = torch.randn(4, 9)
    ep, onx = export(Determinant(), (x,))
    advice = advise_precision(ep, onx, (x,), dtype="bfloat16")
    assert advice.before.error and "BFloat16" in advice.before.error and not advice.before.passed
    first = advice.nodes[0]
    assert (first.op_type, first.reason, first.fx_node) == ("Det", "fails", "linalg_det")
    assert advice.node_block_list == [first.node] and advice.agrees
    assert "FAILED to run" in advice.to_text()


def test_the_users_own_conversion_is_the_first_candidate():
    ep, onx, args = exported("overflow")
    theirs = float16.convert_float_to_float16(onx, keep_io_types=True)
    advice = advise_precision(None, onx, args, dtype="float16", converted=theirs)
    assert not advice.converted_here and advice.keep_io_types
    assert advice.nodes[0].fx_node == "sum_1"
    assert advice.agrees and not advice.before.passed
    # a conversion that already keeps a node in float32: it stays in the block list
    gemm = next(n.name for n in onx.graph.node if n.op_type == "Gemm")
    theirs = float16.convert_float_to_float16(onx, keep_io_types=True, node_block_list=[gemm])
    advice = advise_precision(None, onx, args, dtype="float16", converted=theirs)
    assert gemm in advice.kept and gemm in advice.node_block_list and advice.agrees


def test_a_half_precision_export_of_the_same_module_is_a_conversion_too():
    import copy

    torch.manual_seed(0)
    module = Overflow()
    x = torch.randn(4, 16)
    _, onx = export(module, (x,))
    _, onx16 = export(copy.deepcopy(module).half(), (x.half(),))
    advice = advise_precision(None, onx, (x,), converted=onx16)
    assert not advice.keep_io_types and not advice.before.passed and advice.agrees
    assert advice.nodes and {n.fx_node for n in advice.nodes} <= {"sum_1", "mul_1", "sqrt"}


def test_without_the_converter_the_error_says_what_to_install(monkeypatch):
    ep, onx, args = exported("faithful")
    monkeypatch.setitem(sys.modules, "onnxconverter_common", None)  # import fails
    with pytest.raises(SbsInputError, match=r"pip install 'onnx_sbs_nb\[precision\]'"):
        advise_precision(ep, onx, args)


def test_bad_inputs_say_what_to_fix():
    ep, onx, args = exported("faithful")
    half = convert_model(onx, "float16")
    with pytest.raises(SbsInputError, match="already in float16"):
        advise_precision(ep, half, args)
    with pytest.raises(SbsInputError, match="dtype"):
        advise_precision(ep, onx, args, dtype="float8")
    with pytest.raises(SbsInputError, match="not bfloat16|pass dtype"):
        advise_precision(ep, onx, args, dtype="bfloat16", converted=half)


def test_the_advice_and_its_model_are_written_through_links_not_followed(tmp_path):
    ep, onx, args = exported("overflow")
    advice = advise_precision(ep, onx, args)
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    target = tmp_path / "advice.json"
    os.symlink(outside, target)
    write_advice(advice, target)
    assert not target.is_symlink() and outside.read_text() == "keep me"
    saved = json.loads(target.read_text())
    assert saved["node_block_list"] == advice.node_block_list
    assert saved["verdict"] == "agrees" and saved["nodes"][0]["fx_node"] == "sum_1"
    model_path = tmp_path / "advised.onnx"
    save_advised_model(advice, model_path)
    onnx.checker.check_model(onnx.load(str(model_path)))


def _cli(*argv, cwd):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-m", "onnx_sbs_nb", "precision", *argv, "--no-progress"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_cli_writes_the_block_list_and_exits_by_the_verdict(tmp_path):
    ep, onx, args = exported("overflow")
    model = tmp_path / "m.onnx"
    onnx.save(onx, str(model))
    inputs = tmp_path / "in.pt"
    torch.save(args, str(inputs))
    prog = tmp_path / "m.pt2"
    torch.export.save(ep, str(prog))
    out = tmp_path / "advice" / "blocklist.json"  # its folder is made
    out.parent.mkdir()
    os.symlink(tmp_path / "elsewhere.json", out)
    saved, report = tmp_path / "new" / "m16.onnx", tmp_path / "r.html"
    records = tmp_path / "r.jsonl"
    r = _cli(
        "--onnx", str(model), "--inputs", str(inputs), "--ep", str(prog),
        "-o", str(out), str(report), str(records), "--save-model", str(saved), cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "AGREES" in r.stdout and "node_block_list" in r.stdout
    assert not out.is_symlink() and not (tmp_path / "elsewhere.json").exists()
    assert json.loads(out.read_text())["node_block_list"][0] == "node_sum_1"
    assert onnx.load(str(saved)).graph.node
    # the report: the advice's section above the run of the float32 model against the
    # conversion, whose records show the overflowing sum
    page = report.read_text()
    section = page[page.index('<section class="onnx-sbs-precision"') :]
    section = section[: section.index("</section>")]
    assert "AGREES" in section and "node_sum_1" in section and "node_block_list=" in section
    assert "sum_1" in records.read_text()

    # one round is not enough for the cancellation in bfloat16: still disagrees
    ep, onx, args = exported("cancel")
    onnx.save(onx, str(model))
    torch.save(args, str(inputs))
    r = _cli(
        "--onnx", str(model), "--inputs", str(inputs), "--dtype", "bfloat16",
        "--max-rounds", "1", cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 1, r.stdout + r.stderr
    assert "DISAGREES" in r.stdout

    # bad input: a missing file, a float16 model as the reference, a wrong suffix
    r = _cli("--onnx", str(tmp_path / "none.onnx"), "--inputs", str(inputs), cwd=tmp_path)
    assert r.returncode == 2 and "no such file" in r.stderr and "Traceback" not in r.stderr
    onnx.save(convert_model(onx, "float16"), str(model))
    r = _cli("--onnx", str(model), "--inputs", str(inputs), cwd=tmp_path)
    assert r.returncode == 2 and "already in float16" in r.stderr
    r = _cli("--onnx", str(model), "--inputs", str(inputs), "-o", "x.txt", cwd=tmp_path)
    assert r.returncode == 2 and ".json" in r.stderr and not (tmp_path / "x.txt").exists()
