"""The culprit rules (align/blame/rules.py): one ordered registry, each rule named on the
culprit it chooses, and the culprit a view of its record, not a copy."""

from __future__ import annotations

import copy

import pytest
import torch

from onnx_sbs_nb.align.blame.context import STAGE_RECORD, STAGE_RUN, BlameContext, failed
from onnx_sbs_nb.align.blame.culprit import FAILURE_KEYS, RECORD_KEYS, Culprit
from onnx_sbs_nb.align.blame.rules import (
    CULPRIT_RULES,
    RECORD_RULES,
    RULE_NAMES,
    RUN_RULES,
    Amplified,
    FirstOwnFailure,
    NodeFailed,
    OwnRerun,
    by_stage,
    choose_culprit,
)
from onnx_sbs_nb.align.blame.summary import Summary, summarize
from onnx_sbs_nb.records import (
    KIND_INPUT,
    KIND_NODE,
    KIND_OUTPUT,
    KIND_WEIGHT,
    RECORD_FIELDS,
    STATUS_ERROR,
    STATUS_FAIL,
    STATUS_OK,
    STATUS_PRECISION_LOSS,
    STATUS_SHAPE_MISMATCH,
    STATUS_UNPAIRED_EP,
    STATUS_UNPAIRED_ONNX,
    STATUS_UNPAIRED_OUTPUT,
    Record,
)

from ...models import MLP, export


def rec(name: str, step: int, err: float | None = 0.0, **kw) -> Record:
    """A compared node record; its verdict follows err against atol 1e-4 unless given."""
    passed = kw.pop("passed", None if err is None else err <= 1e-4)
    err2 = kw.get("err_abs2")
    if err2 is not None and "passed2" not in kw:
        kw["passed2"] = err2 <= 1e-4
    base = dict(
        onnx_name=name,
        ep_name=name,
        onnx_node_name=f"node_{name}",
        onnx_op_type="Add",
        err_abs=err,
        passed=passed,
        status=STATUS_OK if passed is not False else STATUS_FAIL,
        step=step,
        atol=1e-4,
        rtol=1e-4,
        kind=KIND_NODE,
        paired_by="name",
    )
    base.update(kw)
    return Record(**base)


def context(records, node_inputs=None, record_rules=RECORD_RULES) -> BlameContext:
    """The blame context of ``records``, fed as the summary feeds it."""
    ctx = BlameContext(record_rules, node_inputs)
    for r in records:
        ctx.add(r, failed(r), r.status == STATUS_PRECISION_LOSS)
    return ctx


# -- the registry ----------------------------------------------------------------------


def test_the_registry_is_ordered_named_and_split_by_stage():
    names = [r.name for r in CULPRIT_RULES]
    assert names == [
        "precision_loss",
        "quantization_noise",
        "error",
        "unpaired_output",
        "weight_reader",
        "rerun",
        "leaf",
        "inputs_passed",
        "first_failure",
        "shape_origin",
        "first_own_failure",
        "amplified",
    ]
    assert len(set(names)) == len(names) and RULE_NAMES == set(names)
    # the summary's two stages are the registry's rules, in the registry's order
    assert by_stage() == {STAGE_RECORD: RECORD_RULES, STAGE_RUN: RUN_RULES}
    assert RECORD_RULES + RUN_RULES == CULPRIT_RULES  # the record stage comes first
    for rule in RECORD_RULES:
        assert callable(rule.qualifies) and callable(rule.why)
        assert isinstance(rule.folded_note, bool) and isinstance(rule.on_torch_inputs, bool)
    for rule in RUN_RULES:
        assert callable(rule.culprit)


def test_the_first_record_rule_that_decides_wins():
    # a node that failed to run and whose rerun failed: the registry tries "error" first
    both = rec("a", 0, None, status=STATUS_ERROR, passed=False, passed2=False, error="boom")
    c = summarize([both]).culprit
    assert c.rule == "error" and c.why.startswith("the node failed to run: boom")
    # the context asks the rules it is given, in their order
    rerun_first = (OwnRerun(), NodeFailed())
    c = choose_culprit(context([both], record_rules=rerun_first))
    assert c is not None and c.rule == "rerun"


def test_a_culprit_rule_is_one_class_and_one_entry():
    class LastOutput:
        """Blame the last output (a rule only a test would want)."""

        name = "last_output"
        stage = STAGE_RUN

        def culprit(self, ctx: BlameContext) -> Culprit | None:
            out = [c.record for c in ctx.candidates if c.record.kind == KIND_OUTPUT]
            return ctx.culprit(out[-1], self.name, "it is the last output", None) if out else None

    records = [rec("a", 0, 0.5), rec("y", 1, 0.5, kind=KIND_OUTPUT, err_abs2=0.5)]
    ctx = context(records)
    assert choose_culprit(ctx).onnx_name == "a"  # the registry: the first failure
    c = choose_culprit(ctx, rules=(LastOutput(), *RUN_RULES))
    assert c.onnx_name == "y" and c.rule == "last_output" and c.why == "it is the last output"


# -- one situation per rule ------------------------------------------------------------


def test_precision_loss_is_never_a_candidate():
    # its own rerun fails, by its inputs' rounding alone: no fault, so no culprit
    lost = rec("cos", 0, 0.5, status=STATUS_PRECISION_LOSS, err_abs2=0.5)
    s = summarize([lost])
    assert s.culprit is None and s.first_own_failure is None
    # without the rule, its failed rerun would make it one
    without = tuple(r for r in RECORD_RULES if r.name != "precision_loss")
    assert choose_culprit(context([lost], record_rules=without)).rule == "rerun"


def test_error_a_node_that_failed_to_run():
    records = [rec("a", 0), rec("b", 1, None, status=STATUS_ERROR, passed=False, error="bad")]
    c = summarize(records).culprit
    assert (c.onnx_name, c.rule) == ("b", "error") and "failed to run: bad" in c.why


def test_unpaired_output_an_output_only_one_side_computes():
    out = rec("y", 0, None, kind=KIND_OUTPUT, status=STATUS_UNPAIRED_OUTPUT, passed=None)
    c = summarize([out]).culprit
    assert (c.onnx_name, c.rule) == ("y", "unpaired_output")
    assert "only one side computes" in c.why


def test_rerun_the_node_that_makes_the_error_not_the_first_failure():
    records = [
        rec("a", 0, 1e-3, err_abs2=1e-6),  # fails, but only inherits: its rerun passes
        rec("b", 1, 0.2, err_abs2=0.1),  # makes its own
        rec("c", 2, 0.3, err_abs2=0.0),
    ]
    c = summarize(records).culprit
    assert (c.onnx_name, c.rule) == ("b", "rerun")
    assert "it makes the error, it does not inherit it" in c.why
    assert c.own_error == 0.1 and c.own_measured is True


def test_leaf_a_weight_that_differs():
    w = rec("w", 0, 0.5, kind=KIND_WEIGHT, onnx_op_type="initializer", ep_name="fc.weight")
    c = summarize([w, rec("a", 1, 0.7)]).culprit
    assert (c.onnx_name, c.rule) == ("w", "leaf")
    assert c.why.startswith("the weight differs from the torch parameter fc.weight by 0.5")


def test_inputs_passed_with_the_graph_a_failure_whose_inputs_agree():
    graph = {"b": ["x"], "c": ["b"], "e": ["x", "no_twin"]}
    records = [
        rec("x", 0, kind=KIND_INPUT, onnx_op_type="input"),
        rec("b", 1, 0.0),
        rec("c", 2, 0.0),
        rec("e", 3, 0.5),
    ]
    c = summarize(records, node_inputs=graph).culprit
    assert (c.onnx_name, c.rule) == ("e", "inputs_passed")
    assert "while every compared input agrees" in c.why


def test_first_failure_without_the_graph():
    records = [rec("a", 0), rec("b", 1, 0.5), rec("c", 2, 0.7)]
    c = summarize(records).culprit
    assert (c.onnx_name, c.rule) == ("b", "first_failure")
    assert c.why.startswith("it is the first value that differs (0.5, beyond atol")


def test_shape_origin_a_node_without_twin_made_the_wrong_shape():
    # x (840 rows) -> Split_opt -> s (420 rows, no torch twin) -> m: the program's 500
    graph = {"s": ["x"], "m": ["s"]}
    records = [
        rec("x", 0, kind=KIND_INPUT, onnx_op_type="input", ep_shape_type="float32[840x6]"),
        Record(
            step=1,
            onnx_name="s",
            onnx_node_name="Split_opt",
            onnx_op_type="Split",
            onnx_shape_type="float32[420x6]",
            status=STATUS_UNPAIRED_ONNX,
        ),
        Record(step=2, ep_name="boxes", ep_shape_type="float32[500x6]", status=STATUS_UNPAIRED_EP),
        rec(
            "m",
            3,
            None,
            passed=False,
            status=STATUS_SHAPE_MISMATCH,
            onnx_op_type="Sigmoid",
            ep_shape_type="float32[500x6]",
            onnx_shape_type="float32[420x6]",
        ),
    ]
    s = summarize(records, node_inputs=graph)
    c = s.culprit
    assert (c.onnx_node, c.rule) == ("Split_opt", "shape_origin"), c
    assert s.first_own_failure is c.record and s.first_own_failure_rule == "shape_origin"
    assert "matches no torch value" in c.why and "only carries it on" in c.why
    # without the graph, the node that shows the mismatch is all there is to blame
    assert summarize(records).culprit.onnx_name == "m"


def test_first_own_failure_passes_over_an_own_error_fed_by_a_failing_lowering():
    # the GRU's rerun was fed through the LSTM's lowering, which fails on torch inputs
    # alone (later in the stream): the LSTM is the first own failure
    gru = rec("gru", 0, 0.5, err_abs2=0.5, onnx_fx_node="gru", own_inputs_from="lstm")
    lstm = rec("lstm", 1, 0.5, err_abs2=0.5, onnx_fx_node="lstm")
    ctx = context([gru, lstm])
    assert [c.record for c in ctx.candidates] == [gru, lstm]
    c = FirstOwnFailure().culprit(ctx)
    assert c.record is lstm and c.rule == "rerun"  # named by the record rule that proved it
    assert summarize([gru, lstm]).culprit.onnx_name == "lstm"


def test_amplified_an_error_under_tolerance_a_later_node_makes_visible():
    records = [
        rec("exp", 0, 1e-5, err_abs2=1e-5, err_scale2=1e-3),  # passes, large for its values
        rec("sub", 1, 0.5, kind=KIND_OUTPUT, err_abs2=0.0),  # fails, its own rerun agrees
    ]
    c = summarize(records).culprit
    assert (c.onnx_name, c.rule) == ("exp", "amplified")
    assert "is amplified by sub" in c.why
    assert Amplified().chosen(context(records)) is records[0]
    assert c.explains is records[1]  # the failure it explains


def test_every_culprit_names_a_registered_rule():
    situations = [
        [rec("a", 0, None, status=STATUS_ERROR, passed=False)],
        [rec("a", 0, 0.5, err_abs2=0.5)],
        [rec("a", 0, 0.5, kind=KIND_INPUT, onnx_op_type="input")],
        [rec("a", 0, 0.5)],
        [rec("y", 0, None, kind=KIND_OUTPUT, status=STATUS_UNPAIRED_OUTPUT, passed=None)],
        [
            rec("a", 0, 1e-5, err_abs2=1e-5, err_scale2=1e-3),
            rec("b", 1, 0.5, kind=KIND_OUTPUT, err_abs2=0.0),
        ],
    ]
    chosen = set()
    for records in situations:
        s = summarize(records)
        assert s.culprit.rule in RULE_NAMES and s.first_own_failure_rule == s.culprit.rule
        chosen.add(s.culprit.rule)
    assert chosen == {"error", "rerun", "leaf", "first_failure", "unpaired_output", "amplified"}


# -- the culprit is a view of its record ----------------------------------------------


def test_the_culprit_reads_its_record_and_keeps_its_dict():
    r = rec(
        "b",
        1,
        0.5,
        err_abs2=0.4,
        onnx_fx_node="linear",
        ep_user_name="fc1",
        ep_module="model.fc1",
        onnx_fuses="a,b",
        input_index=2,
        inputs_total=5,
        inputs_failing=1,
    )
    c = summarize([rec("a", 0), r]).culprit
    assert c.record is r
    # every Record field reads through, a field added to Record included
    for name in RECORD_FIELDS:
        if name != "ep_name":  # the culprit's fx node is the one its lowering belongs to
            assert getattr(c, name) == getattr(r, name), name
    assert c.ep_name == "linear" and c.onnx_node == "node_b" and c.fuses == "a,b"
    assert set(RECORD_KEYS.values()) | set(FAILURE_KEYS) <= set(RECORD_FIELDS)
    d = c.to_dict()
    # the keys every view and saved file reads, in their order
    assert list(d) == [
        "rule",
        "why",
        "step",
        "kind",
        "ep_name",
        "ep_user_name",
        "ep_module",
        "ep_source",
        "onnx_name",
        "onnx_node",
        "onnx_op_type",
        "onnx_nodes",
        "own_error",
        "own_measured",
        "atol",
        "rtol",
        "fuses",
        "bundle",
        "input_index",
        "input_name",
        "inputs_failing",
        "inputs_total",
    ]
    for key, field in RECORD_KEYS.items():
        assert d[key] == getattr(r, field), key
    assert Culprit.from_dict(d).to_dict() == d
    assert Summary.from_dict(summarize([r]).to_dict()).culprit.label() == c.label()
    with pytest.raises(AttributeError):
        c.no_such_field  # noqa: B018
    assert copy.copy(c).record is r


def test_a_real_fault_is_chosen_by_the_rerun_rule_on_a_view_of_its_record():
    from onnx_sbs_nb.align.run import run_aligned

    torch.manual_seed(0)
    x = torch.randn(5, 8)
    ep, onx = export(MLP(), (x,))
    bad = copy.deepcopy(onx)
    relu = [n for n in bad.graph.node if n.op_type == "Relu"][-1]
    relu.op_type = "Sigmoid"  # the second ReLU computes another function
    records = list(run_aligned(ep, bad, (x,), own_error=True))
    s = summarize(records, node_inputs=bad)
    c = s.culprit
    assert c is not None and c.rule == "rerun" and c.rule in RULE_NAMES, s.to_text()
    assert c.onnx_node == relu.name and relu.name in c.onnx_nodes
    assert any(c.record is r for r in records)  # the run's record itself, not a copy
    assert c.onnx_op_type == "Sigmoid" and c.ep_module == c.record.ep_module
