"""Blame: the tool's limits are not the model's errors, the unit of blame is a lowering,
weights are blamed only through their consumers, wrong models never pass."""

from __future__ import annotations

import copy

import onnx
import pytest
import torch

from onnx_sbs_nb import run_aligned
from onnx_sbs_nb.align.blame.summary import summarize
from onnx_sbs_nb.errors import SbsInputError
from onnx_sbs_nb.records import (
    KIND_WEIGHT,
    STATUS_NOT_COMPARED,
    STATUS_UNPAIRED_EP,
    STATUS_UNPAIRED_OUTPUT,
    Record,
)

from ...models import ShapeOps, export


def _rec(step, name, fx, passed2, own_from=None, err=0.5):
    return Record(
        step=step,
        onnx_name=name,
        ep_name=name,
        onnx_id_node=step,
        onnx_node_name=f"node_{name}",
        onnx_fx_node=fx,
        status="fail",
        passed=False,
        passed2=passed2,
        err_abs=err,
        err_abs2=err if passed2 is False else 0.0,
        atol=1e-4,
        rtol=1e-4,
        own_inputs_from=own_from,
    )


def test_an_own_error_that_inherits_a_failing_lowering_is_not_the_culprit():
    # the GRU's inputs had no torch twin: recomputed through the LSTM lowering, which
    # fails on torch inputs alone (later in the stream): the LSTM is the culprit
    records = [
        _rec(0, "gru_out", "gru", False, own_from="lstm"),
        _rec(1, "lstm_out", "lstm", False),
    ]
    c = summarize(records).culprit
    assert c.ep_name == "lstm" and c.onnx_node == "node_lstm_out"
    # when the LSTM agrees, the GRU is the culprit, and the answer says what it relied on
    records = [_rec(0, "gru_out", "gru", False, own_from="lstm"), _rec(1, "lstm_out", "lstm", True)]
    c = summarize(records).culprit
    assert c.ep_name == "gru" and "recomputed through the lowering of lstm" in c.why


class _Two(torch.nn.Module):
    def forward(self, x, y):
        return torch.relu(x[:, :3]) + y


@pytest.fixture(scope="module")
def dynamic():
    x, y = torch.randn(2, 5), torch.randn(2, 3)
    b = torch.export.Dim("b", min=2, max=8)
    ep, onx = export(_Two(), (x, y), dynamic_shapes=({0: b}, {0: b}))
    return ep, onx


def test_input_shapes_are_checked_against_the_program_before_running(dynamic):
    ep, onx = dynamic
    list(run_aligned(ep, onx, (torch.randn(4, 5), torch.randn(4, 3))))  # inside the range
    with pytest.raises(SbsInputError, match="dimension 1 but the program was exported for 5"):
        run_aligned(ep, onx, (torch.randn(2, 6), torch.randn(2, 3)))
    with pytest.raises(SbsInputError, match=r"outside the range.*\[2, 8\]"):
        run_aligned(ep, onx, (torch.randn(9, 5), torch.randn(9, 3)))
    with pytest.raises(SbsInputError, match="requires them equal"):
        run_aligned(ep, onx, (torch.randn(3, 5), torch.randn(4, 3)))


def test_a_pairing_disproved_by_shapes_is_dropped_not_reported_as_the_export_error():
    x = torch.randn(2, 4, 6)
    ep, onx = export(ShapeOps(), (x,))
    m = copy.deepcopy(onx)
    # a transposed value loses its name and its declared shape: only metadata pairs it,
    # and the metadata now names an fx node of another shape (the exporter's optimizer
    # leaves such pairs when it merges transposes)
    node = next(n for n in m.graph.node if n.op_type == "Transpose")
    old = node.output[0]
    other = next(
        n.name
        for n in ep.graph.nodes
        if n.op == "call_function"
        and isinstance(n.meta.get("val"), torch.Tensor)
        and n.meta["val"].dim() == 4
        and n.name != old
    )
    fx_shapes = {
        n.name: tuple(n.meta["val"].shape)
        for n in ep.graph.nodes
        if "val" in n.meta and isinstance(n.meta["val"], torch.Tensor)
    }
    assert fx_shapes.get(other) != fx_shapes.get(old)
    new = old + "_renamed"
    for n in m.graph.node:
        for i, name in enumerate(n.input):
            if name == old:
                n.input[i] = new
    node.output[0] = new
    for p in node.metadata_props:
        if p.key == "pkg.torch.onnx.fx_node":
            p.value = f"%{other} : [num_users=1] = call_function[target=x](args = ())"
    keep = [vi for vi in m.graph.value_info if vi.name != old]
    del m.graph.value_info[:]
    m.graph.value_info.extend(keep)
    records = list(run_aligned(ep, m, (x,), own_error=True))
    rec = next(r for r in records if r.onnx_name == new)
    if rec.paired_by != "unpaired" or rec.status != "unpaired_onnx":
        assert rec.status == STATUS_NOT_COMPARED and "not the same value" in rec.comment
    s = summarize(records)
    assert s.verdict == "pass" and s.culprit is None, s.to_text()


class _BN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


def test_folded_weights_differ_harmlessly_and_unpaired_program_weights_are_listed():
    torch.manual_seed(0)
    model = _BN().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-1, 1)
        model.bn.running_var.uniform_(0.5, 2)
        model.bn.weight.uniform_(0.5, 2)
    x = torch.randn(1, 3, 8, 8)
    ep, onx = export(model, (x,))
    records = list(run_aligned(ep, onx, (x,), own_error=True))
    s = summarize(records)
    assert s.verdict == "pass" and s.culprit is None, s.to_text()
    weights = [r for r in records if r.kind == KIND_WEIGHT]
    differs = [r for r in weights if r.status == "weight_differs"]
    if differs:  # the exporter folded the BatchNorm into the Conv
        assert all("agrees with torch" in r.comment for r in differs)
        assert all(r.decided_by == "weight_blame" for r in differs)
        listed = {r.ep_name for r in weights if r.status == STATUS_UNPAIRED_EP}
        assert any("running_mean" in n for n in listed), listed


def test_a_folded_weight_whose_consumer_computes_subnormal_values_is_no_error():
    """Values that a deep, randomly initialised net shrinks below float32's smallest
    normal number (MobileViTV2's fifth stage: 1e-44) carry a few significant bits: a
    folded BatchNorm changes them by a large fraction of themselves, and that is no
    error of the export (their differences, 1e-44, say nothing at their scale)."""
    torch.manual_seed(0)
    model = _BN().eval()
    with torch.no_grad():
        model.bn.running_var.uniform_(0.5, 2)
        model.bn.weight.uniform_(-0.05, 0.05)
        model.bn.bias.zero_()
        model.conv.bias.zero_()
    x = torch.randn(1, 3, 8, 8) * 1e-40  # subnormal float32 inputs
    ep, onx = export(model, (x,))
    records = list(run_aligned(ep, onx, (x,), own_error=True))
    s = summarize(records)
    assert s.verdict == "pass" and s.culprit is None, s.to_text()
    differs = [r for r in records if r.status == "weight_differs"]
    if differs:  # the exporter folded the BatchNorm into the Conv
        assert all("agrees with torch" in r.comment for r in differs), differs


def test_an_output_the_model_does_not_compute_fails():
    x = torch.randn(2, 4, 6)
    ep, onx = export(ShapeOps(), (x,))
    m = copy.deepcopy(onx)
    out = m.graph.output[0]
    # the graph output now comes from another value: nothing computes the program output
    extra = onnx.helper.make_node("Identity", [m.graph.input[0].name], ["not_the_output"])
    m.graph.node.append(extra)
    new_out = onnx.helper.make_tensor_value_info("not_the_output", onnx.TensorProto.FLOAT, None)
    del m.graph.output[:]
    m.graph.output.append(new_out)
    records = list(run_aligned(ep, m, (x,)))
    s = summarize(records)
    assert s.verdict == "fail"
    statuses = {r.status for r in records}
    assert STATUS_UNPAIRED_OUTPUT in statuses, sorted(statuses)
    assert out.name  # (the original output value is still computed, just not an output)


def test_reset_and_replay_selection_take_the_users_own_names():
    from onnx_sbs_nb.align.post.replay import ReplayConfig

    from ...models import tiny_llama

    ep, onx, args = tiny_llama()
    records = list(run_aligned(ep, onx, args))
    renamed = next(
        r
        for r in records
        if r.onnx_id_node is not None
        and r.onnx_id_node >= 0
        and r.ep_user_name
        and r.ep_user_name != r.ep_name
        and r.status == "ok"
    )
    again = list(run_aligned(ep, onx, args, reset_names=[renamed.ep_user_name]))
    assert any(r.reset and r.ep_name == renamed.ep_name for r in again)
    assert ReplayConfig(names=[renamed.ep_user_name]).selects(renamed)
    with pytest.raises(SbsInputError, match="your own fx node names"):
        run_aligned(ep, onx, args, reset_names=["no_such_node"])


def test_an_onnx_model_exported_for_other_shapes_is_refused_naming_them():
    """Two exports in one folder, the wrong one passed: the error names both shapes (trial
    3, finding 04: "ONNX input 'x' matches no input of the program (program inputs: ['x'])")."""

    class Fc(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(16, 8)

        def forward(self, x):
            return torch.relu(self.fc(x))

    xa, xb = torch.randn(2, 8, 16), torch.randn(4, 64, 16)
    ep = torch.export.export(Fc().eval(), (xa,))
    other = torch.onnx.export(Fc().eval(), (xb,), dynamo=True, input_names=["x"]).model_proto
    with pytest.raises(
        SbsInputError, match=r"'x' has shape \[4, 64, 16\], the program's 'x' \[2, 8, 16\]"
    ):
        list(run_aligned(ep, other, (xa,)))
