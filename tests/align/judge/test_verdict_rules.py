"""The verdicts that are not the model's fault, each rule called alone (align/judge/rules.py),
and the weight blame (align/judge/weights.py)."""

from __future__ import annotations

import pytest
import torch

from onnx_sbs_nb.align.judge.rules import (
    BEFORE_VALUES,
    ON_VALUES,
    FixedOnExampleInputs,
    RandomDraw,
    RuleContext,
    UninitialisedMemory,
    first_verdict,
)
from onnx_sbs_nb.align.judge.weights import agrees_at_its_scale, settle_weight
from onnx_sbs_nb.align.pairing.pairs import Pair
from onnx_sbs_nb.align.source.specialized import Specialized
from onnx_sbs_nb.records import (
    KIND_NODE,
    KIND_WEIGHT,
    STATUS_FAIL,
    STATUS_NOT_COMPARED,
    STATUS_OK,
    STATUS_SHAPE_MISMATCH,
    STATUS_WEIGHT_DIFFERS,
    Record,
)

PAIR = Pair("y", "add", "name", KIND_NODE)


def test_rules_are_named_once_and_ordered():
    names = [r.name for r in (*BEFORE_VALUES, *ON_VALUES)]
    assert len(names) == len(set(names))
    assert isinstance(BEFORE_VALUES[0], FixedOnExampleInputs)


def test_random_draw_checks_shape_and_type_only():
    ctx = RuleContext(name="y", random={"y"})
    rec = Record()
    a, b = torch.rand(2, 3), torch.rand(2, 3)
    assert RandomDraw().applies(PAIR, ctx)
    assert RandomDraw().judge(rec, a, b, ctx)
    assert rec.status == STATUS_NOT_COMPARED and "random" in rec.comment
    other = Record()
    assert not RandomDraw().judge(other, a, torch.rand(3, 2), ctx)  # another shape: compare
    assert other.status != STATUS_NOT_COMPARED
    assert not RandomDraw().applies(PAIR, RuleContext(name="z", random={"y"}))


def test_uninitialised_memory_and_the_first_verdict():
    ctx = RuleContext(name="y", undefined={"y"}, random={"y"})
    rec = Record()
    rule = first_verdict(ON_VALUES, rec, PAIR, torch.zeros(4), torch.ones(4), ctx)
    assert isinstance(rule, UninitialisedMemory)  # first in order wins
    assert rec.status == STATUS_NOT_COMPARED
    ints = Record()
    assert (
        first_verdict(ON_VALUES, ints, PAIR, torch.zeros(4), torch.ones(4, dtype=torch.int64), ctx)
        is None
    )


def test_shape_fixed_on_the_example_inputs():
    fixed = Specialized("view", "float32[1x4]")
    ctx = RuleContext(name="y", fx_name="add", specialized={"add": fixed})
    rec = Record()
    assert first_verdict(BEFORE_VALUES, rec, PAIR, None, None, ctx) is not None
    assert rec.status == STATUS_SHAPE_MISMATCH and rec.ep_shape_type == "float32[1x4]"
    assert not FixedOnExampleInputs().applies(PAIR, RuleContext(name="y", fx_name="add"))


def _consumer(passed: bool, err: float, rtol: float = 1e-3) -> Record:
    return Record(
        onnx_name="c",
        kind=KIND_NODE,
        status=STATUS_OK if passed else STATUS_FAIL,
        passed=passed,
        err_abs=err,
        rtol=rtol,
    )


def test_weight_whose_consumer_agrees_is_the_exporters_change():
    # the consumer agrees given this weight and disagrees given torch's: a fold it makes up for
    w = Record(onnx_name="w", kind=KIND_WEIGHT, status=STATUS_FAIL, passed=False)
    assert settle_weight(w, _consumer(True, 1e-7), torch.ones(3), lambda: False)
    assert w.status == STATUS_WEIGHT_DIFFERS and "makes up for it" in w.comment
    assert w.decided_by == "weight_blame"


def test_weight_whose_consumer_agrees_either_way_is_not_read():
    # agreeing given torch's parameter too: what differs is not read by these inputs
    w = Record(onnx_name="w", kind=KIND_WEIGHT, status=STATUS_FAIL, passed=False)
    where = lambda: " in rows 2-3 of 4"  # noqa: E731
    assert settle_weight(w, _consumer(True, 1e-7), torch.ones(3), lambda: True, differs_where=where)
    assert w.status == STATUS_FAIL and "rows 2-3 of 4" in w.comment
    assert "does not read what differs" in w.comment


def test_weight_whose_consumer_agrees_untried_says_it_does_not_know():
    w = Record(onnx_name="w", kind=KIND_WEIGHT, status=STATUS_FAIL, passed=False)
    assert settle_weight(w, _consumer(True, 1e-7), torch.ones(3), lambda: None)
    assert w.status == STATUS_WEIGHT_DIFFERS and "own_error=True tells which" in w.comment


def test_weight_blamed_only_when_the_torch_parameter_fixes_its_consumer():
    w = Record(onnx_name="w", kind=KIND_WEIGHT, status=STATUS_FAIL, passed=False)
    assert settle_weight(w, _consumer(False, 1.0), torch.ones(3), lambda: True)
    assert "agrees once given the torch parameter" in w.comment
    w2 = Record(onnx_name="w", kind=KIND_WEIGHT, status=STATUS_FAIL, passed=False)
    assert not settle_weight(w2, _consumer(False, 1.0), torch.ones(3), lambda: False)
    assert "the consumer's own" in w2.comment


def test_agreeing_by_the_absolute_tolerance_only_is_no_agreement():
    small = torch.full((4,), 0.01)
    assert not agrees_at_its_scale(_consumer(True, 0.04, rtol=1e-2), small)
    assert agrees_at_its_scale(_consumer(True, 1e-6, rtol=1e-2), small)


def test_pairing_strengths_are_declared_once():
    from onnx_sbs_nb.align.pairing.rules import (
        PAIRED_BY_METADATA,
        PAIRED_BY_NAME,
        PAIRED_BY_POSITION,
        RULES,
        linking_rules,
        proven_rules,
    )

    assert len({r.name for r in RULES}) == len(RULES)
    assert PAIRED_BY_NAME in proven_rules() and PAIRED_BY_METADATA not in proven_rules()
    assert proven_rules() <= linking_rules() and PAIRED_BY_POSITION not in linking_rules()


class _TiesAndNoise(torch.nn.Module):
    """TopK indices among tied values, a draw at random and ordinary nodes."""

    def forward(self, x):
        top = torch.topk(x.exp(), 3, dim=1)
        return top.indices, top.values * 2.0, torch.tanh(x) * torch.rand_like(x)


def test_each_record_names_the_rule_that_decided_it():
    from onnx_sbs_nb.align.judge.rules import RULES
    from onnx_sbs_nb.align.run import AlignedRun

    from ...models import export

    x = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0, 0.0], [2.0, 2.0, 2.0, 1.0, 1.0, 5.0]])
    ep, onx = export(_TiesAndNoise(), (x,))
    records = list(AlignedRun(ep, onx, (x,), runner="onnxruntime", own_error=True))
    names = {r.name for r in RULES}
    paired = [r for r in records if r.paired_by != "unpaired"]
    assert paired and all(r.decided_by in names for r in paired), paired
    assert all(r.decided_by is None for r in records if r.paired_by == "unpaired")
    by_op = {r.onnx_op_type: r for r in paired}
    assert by_op["Tanh"].decided_by == "tolerance" and by_op["Tanh"].status == STATUS_OK
    assert by_op["RandomUniformLike"].decided_by == "random_draw"
    (idx,) = [r for r in paired if r.onnx_op_type == "TopK" and "int64" in r.ep_shape_type]
    assert idx.err_abs > 0, "the runtimes should order the ties differently here"
    assert idx.decided_by == "topk_ties" and idx.passed


def test_a_rule_called_alone_decides_and_first_verdict_names_it():
    from onnx_sbs_nb.align.judge.context import RuleContext as Ctx
    from onnx_sbs_nb.align.judge.failed import ReferenceFailed
    from onnx_sbs_nb.align.judge.shapes import UnprovenPair
    from onnx_sbs_nb.align.judge.tolerance import Tolerance
    from onnx_sbs_nb.compare.diff import compare

    guess = Pair("y", "add", "position", KIND_NODE)
    ctx = Ctx()
    ctx.start("y", guess)
    a, b = torch.zeros(2, 3), torch.zeros(3, 2)
    ctx.diff = compare(a, b)
    assert UnprovenPair().applies(guess, ctx)
    rec = Record(paired_by="position")
    assert first_verdict((UnprovenPair(), Tolerance()), rec, guess, a, b, ctx) is not None
    assert rec.decided_by == "unproven_pair" and rec.status == STATUS_NOT_COMPARED
    assert rec.paired_by == "unpaired" and "y" in ctx.unproven
    # a pair proven by name is compared: the default rule fills the shape mismatch
    ctx.start("y", PAIR)
    ctx.diff = compare(a, b)
    assert not UnprovenPair().applies(PAIR, ctx)
    rec = Record()
    assert first_verdict((UnprovenPair(), Tolerance()), rec, PAIR, a, b, ctx) is not None
    assert rec.decided_by == "tolerance" and rec.status == STATUS_SHAPE_MISMATCH
    # a side that failed: no values at all
    ctx.start("y", PAIR)
    ctx.ref_error = "RuntimeError: boom"
    rec = Record()
    assert ReferenceFailed().applies(PAIR, ctx) and ReferenceFailed().judge(rec, None, None, ctx)
    assert rec.status == "error" and "boom" in rec.error


def test_a_node_the_runner_cannot_run_is_not_computed_not_blamed():
    """The ONNX reference evaluator has no com.microsoft kernels: a fused model under it
    is incomplete (exit 3), not a FAIL naming the fused node (trial 3, finding 07)."""
    import onnx

    from onnx_sbs_nb import run_aligned, summarize

    class Act(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x):
            return torch.nn.functional.gelu(self.fc(x)) * 2.0

    x = torch.randn(2, 8)
    ep = torch.export.export(Act().eval(), (x,))
    model = torch.onnx.export(ep, (x,), dynamo=True).model_proto
    gelu = next(n for n in model.graph.node if n.op_type == "Gelu")
    gelu.domain = "com.microsoft"
    for a in list(gelu.attribute):
        gelu.attribute.remove(a)
    model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    records = list(run_aligned(ep, model, (x,), runner="reference"))
    s = summarize(records)
    assert s.verdict == "incomplete" and s.culprit is None, s.to_text()
    limit = [r for r in records if "no implementation of this node" in (r.comment or "")]
    assert limit and limit[0].onnx_op_type == "Gelu"


def test_an_unpaired_fused_node_the_runner_cannot_run_is_not_blamed(tmp_path):
    """onnxruntime's saved optimized graph (FusedMatMul inside an attention's lowering, a
    value with no torch twin) under the reference evaluator: incomplete, no culprit
    (trial 4, finding 04)."""
    import onnx
    import onnxruntime as ort

    from onnx_sbs_nb import run_aligned, summarize

    torch.manual_seed(0)

    class Attn(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mha = torch.nn.MultiheadAttention(16, 2, batch_first=True)

        def forward(self, x):
            return self.mha(x, x, x, need_weights=False)[0]

    x = torch.randn(1, 5, 16)
    ep = torch.export.export(Attn().eval(), (x,))
    plain = tmp_path / "m.onnx"
    torch.onnx.export(ep, (x,), dynamo=True).save(str(plain))
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.optimized_model_filepath = str(tmp_path / "fused.onnx")
    ort.InferenceSession(str(plain), opts, providers=["CPUExecutionProvider"])
    fused = onnx.load(str(tmp_path / "fused.onnx"))
    if not any(n.domain == "com.microsoft" for n in fused.graph.node):
        pytest.skip("this onnxruntime fused no contrib op here")
    s = summarize(list(run_aligned(ep, fused, (x,), runner="reference")))
    assert s.verdict == "incomplete" and s.culprit is None, s.to_text()


def test_rules_that_apply_to_no_pair_of_the_run_are_left_out():
    """A run of a model that quantizes nothing asks no quantization rule about any pair
    (verdict.Verdicts drops the rules whose ``inert`` says so); a quantized model's run
    keeps them, and a model with QDQ pairs keeps the saturation rule."""
    from onnx_sbs_nb.align.judge.context import STAGE_AFTER
    from onnx_sbs_nb.align.judge.quantization_noise import QuantizationNoise
    from onnx_sbs_nb.align.judge.quantization_step import QuantizationStep
    from onnx_sbs_nb.align.judge.rules import RULES
    from onnx_sbs_nb.align.judge.saturation import Saturation
    from onnx_sbs_nb.align.judge.verdict import Verdicts

    quantized = (QuantizationStep, QuantizationNoise, Saturation)

    def after(ctx: RuleContext) -> set[type]:
        return {type(r) for r in Verdicts(ctx).stages[STAGE_AFTER]}

    plain = after(RuleContext())
    assert not plain & set(quantized)
    # every other rule is still there, in the registry's order
    kept = [r for r in RULES if type(r) not in quantized]
    assert [r for stage in Verdicts(RuleContext()).stages.values() for r in stage] == kept
    assert after(RuleContext(quant_bits=8)) & set(quantized) == {
        QuantizationStep,
        QuantizationNoise,
    }
    with_pairs = RuleContext(quant_bits=8, clip_ranges={"v": None})
    assert set(quantized) <= after(with_pairs)
