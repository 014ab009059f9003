"""summarize(): the first node that makes an error, suspects, NaNs, unpaired values, totals."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import torch

from onnx_sbs_nb.align.blame.context import BlameContext, failed
from onnx_sbs_nb.align.blame.rules import RECORD_RULES
from onnx_sbs_nb.align.blame.summary import Summarizer, Summary, summarize
from onnx_sbs_nb.records import (
    KIND_INPUT,
    KIND_NODE,
    KIND_OUTPUT,
    KIND_WEIGHT,
    STATUS_ERROR,
    STATUS_FAIL,
    STATUS_OK,
    STATUS_SHAPE_MISMATCH,
    STATUS_UNPAIRED_EP,
    STATUS_UNPAIRED_ONNX,
    Record,
)


def rec(name: str, step: int, err: float | None = 0.0, *, atol: float = 1e-4, **kw) -> Record:
    """A compared node record whose verdict follows err vs atol unless given."""
    passed = kw.pop("passed", None if err is None else (err <= atol))
    status = kw.pop("status", STATUS_OK if passed is not False else STATUS_FAIL)
    err2 = kw.get("err_abs2")
    if err2 is not None and "passed2" not in kw:
        kw["passed2"] = not (err2 > atol or math.isnan(err2))
    return Record(
        onnx_name=name,
        ep_name=name,
        onnx_op_type=kw.pop("op", "Add"),
        err_abs=err,
        passed=passed,
        status=status,
        step=step,
        atol=atol,
        kind=kw.pop("kind", KIND_NODE),
        paired_by="name",
        **kw,
    )


def test_empty_stream_passes():
    s = summarize([])
    assert s.verdict == "pass"
    assert s.first_own_failure is None and s.first_failure is None and s.first_nan is None
    assert s.totals["records"] == 0
    assert "PASS" in s.to_text()


def test_rerun_picks_the_node_that_makes_the_error_not_the_first_failure():
    # a (ok) -> b (inherits a tiny error that already fails) -> c (own error) -> d (inherits)
    records = [
        rec("a", 0, 0.0, err_abs2=0.0),
        rec("b", 1, 1e-3, err_abs2=1e-6),  # fails, but its own error passes: inherited
        rec("c", 2, 0.5, err_abs2=0.4, op="MatMul"),
        rec("d", 3, 0.6, err_abs2=0.0),
    ]
    s = summarize(records)
    assert s.first_failure.onnx_name == "b"
    assert s.first_own_failure.onnx_name == "c"
    assert s.first_own_failure_rule == "rerun"
    assert s.verdict == "fail"
    # ranked by own error: c first, then the others that failed by their first error
    assert [r.onnx_name for r in s.top_suspects] == ["c", "b", "d"]
    assert s.totals["reran"] == 4 and s.totals["own_failed"] == 1
    assert s.max_own_err == 0.4 and s.max_own_err_name == "c"
    assert s.max_err_abs == 0.6 and s.max_err_name == "d"


def test_without_rerun_and_graph_the_first_failure_is_the_culprit():
    records = [rec("a", 0), rec("b", 1, 0.3), rec("c", 2, 0.9)]
    s = summarize(records)
    assert s.first_own_failure.onnx_name == "b"
    assert s.first_own_failure_rule == "first_failure"
    # top suspects fall back on err_abs
    assert [r.onnx_name for r in s.top_suspects] == ["c", "b"]


def test_without_rerun_graph_inputs_rule_finds_a_second_independent_culprit():
    # two branches: x -> b (fails) -> d ; x -> c (passes) ; e = f(c) fails by itself
    graph = {"b": ["x"], "c": ["x"], "d": ["b"], "e": ["c", "w_no_partner"]}
    records = [
        rec("x", 0, kind=KIND_INPUT, op="input"),
        rec("b", 1, 0.2),
        rec("c", 2, 0.0),
        rec("d", 3, 0.3),  # inherits from b
        rec("e", 4, 0.5),  # its inputs passed (or were never compared): makes its own
    ]
    s = summarize(records, node_inputs=graph)
    assert s.first_own_failure.onnx_name == "b"
    assert s.first_own_failure_rule == "inputs_passed"
    # the blame context says which records qualify, record by record; e does, d does not
    ctx = BlameContext(RECORD_RULES, node_inputs=graph)
    rules = {}
    for r in records:
        rule = ctx.own_rule(r, failed(r))
        rules[r.onnx_name] = rule.name if rule is not None else None
        ctx.add(r, failed(r), lost=False)
    assert rules == {"x": None, "b": "inputs_passed", "c": None, "d": None, "e": "inputs_passed"}


def test_node_inputs_from_an_onnx_model():
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["b"], name="nb"),
            helper.make_node("Neg", ["b"], ["d"], name="nd"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("d", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(g)
    onnx.checker.check_model(model)
    # b passes, d fails: d's input passed, so d is its own culprit
    s = summarize([rec("x", 0, kind=KIND_INPUT), rec("b", 1), rec("d", 2, 1.0)], node_inputs=model)
    assert s.first_own_failure.onnx_name == "d"
    assert s.first_own_failure_rule == "inputs_passed"


def test_weight_and_error_records_are_their_own_culprits():
    w = rec("w", 0, 0.1, kind=KIND_WEIGHT, op="initializer")
    s = summarize([w, rec("y", 1, 0.2)])
    assert s.first_own_failure is w and s.first_own_failure_rule == "leaf"

    boom = rec("z", 1, None, status=STATUS_ERROR, passed=False, error="kernel crashed")
    s = summarize([rec("a", 0, err_abs2=0.0), boom])
    assert s.first_own_failure is boom and s.first_own_failure_rule == "error"
    assert s.errors == [boom] and s.totals["errors"] == 1


def test_passed2_true_never_qualifies_even_when_first_comparison_fails():
    out = rec("out", 2, 0.7, kind=KIND_OUTPUT, op="Identity")
    s = summarize([rec("a", 0, 0.5, err_abs2=0.0), rec("b", 1, 0.6, err_abs2=0.0), out])
    assert s.first_own_failure is None and s.culprit is None
    assert s.first_failure.onnx_name == "a"
    assert s.verdict == "fail"  # the outputs differ, though no node makes an error
    assert s.totals["drifted"] == 2 and s.totals["failed"] == 3
    # nothing before them fails: nothing to inherit, no "carried from upstream"
    assert "no node" not in s.to_text() and "carried from upstream" not in s.to_text()
    assert "no value before them fails" in s.to_text()


def test_drift_alone_fails_no_verdict():
    """Values beyond tolerance whose nodes agree on torch's inputs, with outputs that
    agree: rounding a deep graph amplified, not an error of the export."""
    drifted = [rec("a", 0, 3e-4, err_abs2=1e-7), rec("b", 1, 2e-4, err_abs2=0.0)]
    out = rec("out", 2, 1e-5, kind=KIND_OUTPUT, op="Identity")
    s = summarize([*drifted, out])
    assert [r.drifted for r in (*drifted, out)] == [True, True, False]
    assert s.verdict == "pass" and s.culprit is None
    assert s.totals["failed"] == 2 and s.totals["drifted"] == 2
    text = s.to_text()
    assert "verdict: PASS" in text and "2 failing, of which 2 agree with torch" in text
    assert "only inherit" not in text  # nothing before them fails
    assert "the outputs agree" in text
    assert Summary.from_dict(json.loads(json.dumps(s.to_dict()))).verdict == "pass"


def test_drift_is_no_excuse_where_the_node_was_not_rerun_or_is_an_output():
    # a failing node whose own error was not measured may be the one making the error
    not_rerun = rec("b", 1, 3e-4)
    assert not not_rerun.drifted
    assert summarize([rec("a", 0, 0.0, err_abs2=0.0), not_rerun]).verdict == "fail"
    # an output beyond tolerance fails the verdict, whatever its own error
    out = rec("out", 1, 3e-4, err_abs2=0.0, kind=KIND_OUTPUT)
    assert not out.drifted and summarize([out]).verdict == "fail"
    # a node whose own error fails: the culprit, downstream drift changes nothing
    s = summarize([rec("a", 0, 0.5, err_abs2=0.5), rec("b", 1, 0.6, err_abs2=0.0)])
    assert s.verdict == "fail" and s.culprit.onnx_name == "a"
    assert s.totals["drifted"] == 1


def test_first_nan_unpaired_totals_and_out_of_order_steps():
    records = [
        rec("c", 3, float("nan"), err_nan=2.0, passed=False, status=STATUS_FAIL),
        rec("a", 0),
        Record(ep_name="only_torch", status=STATUS_UNPAIRED_EP, step=1, kind=KIND_NODE),
        Record(onnx_name="only_onnx", status=STATUS_UNPAIRED_ONNX, step=2, kind=KIND_NODE),
        rec("s", 4, None, status=STATUS_SHAPE_MISMATCH, passed=False),
        rec("out", 5, 0.0, kind=KIND_OUTPUT),
    ]
    s = summarize(records)
    assert s.first_nan.onnx_name == "c"
    assert s.first_own_failure.onnx_name == "c"  # sorted by step: c is the first failure
    assert s.unpaired_ep == ["only_torch"] and s.unpaired_onnx == ["only_onnx"]
    t = s.totals
    assert t["records"] == 6
    assert t["compared"] == 3  # ok / fail statuses only
    assert t["passed"] == 2 and t["failed"] == 2
    assert t["by_status"] == {"fail": 1, "ok": 2, "unpaired_ep": 1, "unpaired_onnx": 1,
                              "shape_mismatch": 1}  # fmt: skip
    assert t["by_kind"] == {"node": 5, "output": 1}
    # a NaN error is the worst error
    assert s.top_suspects[0].onnx_name == "c"
    assert math.isnan(s.max_err_abs)


def test_top_suspects_keep_ten_largest_in_order_ties_by_step():
    records = [
        rec(f"n{i}", i, 0.01 * (i % 7) + 0.01, err_abs2=0.01 * (i % 7) + 0.01) for i in range(40)
    ]
    s = summarize(records)
    assert len(s.top_suspects) == 10
    errs = [r.err_abs2 for r in s.top_suspects]
    assert errs == sorted(errs, reverse=True)
    # among equal own errors, earlier steps first
    top = [r for r in s.top_suspects if r.err_abs2 == s.top_suspects[0].err_abs2]
    assert [r.step for r in top] == sorted(r.step for r in top)
    assert summarize(records, top=3).top_suspects == s.top_suspects[:3]


def test_to_dict_is_json_safe_and_round_trips():
    records = [
        rec("a", 0, 0.0, err_abs2=0.0),
        rec("b", 1, float("inf"), err_abs2=float("nan"), err_nan=1.0),
        Record(onnx_name="u", status=STATUS_UNPAIRED_ONNX, step=2),
    ]
    s = summarize(records)
    d = s.to_dict()
    text = json.dumps(d, allow_nan=False)  # raises on NaN/Inf left as floats
    for key in ("first_own_failure", "first_failure", "top_suspects", "first_nan",
                "unpaired_ep", "unpaired_onnx", "totals", "verdict"):  # fmt: skip
        assert key in d
    back = Summary.from_dict(json.loads(text))
    assert back.first_own_failure.onnx_name == "b"
    assert math.isnan(back.first_own_failure.err_abs2)
    assert back.verdict == s.verdict == "fail"
    assert back.unpaired_onnx == ["u"]
    assert back.totals == json.loads(json.dumps(s.totals))
    assert back.to_text() == s.to_text()


def test_to_text_names_the_culprit_and_counts():
    s = summarize([rec("a", 0, err_abs2=0.0), rec("bad<node>", 1, 0.5, err_abs2=0.5, op="Gemm")])
    text = s.to_text()
    assert text.splitlines()[0].startswith("verdict: FAIL")
    assert "culprit: bad<node> [Gemm]" in text
    assert "it makes the error, it does not inherit it" in text
    assert len(text.splitlines()) < 15


def test_incremental_summarizer_matches_batch_and_snapshots_are_frozen():
    records = [rec(f"n{i}", i, 0.1 * (i % 3), err_abs2=0.05 * (i % 2)) for i in range(30)]
    b = Summarizer()
    snaps = []
    for r in records:
        b.add(r)
        snaps.append(b.summary())
    assert snaps[-1].to_dict() == summarize(records).to_dict()
    assert snaps[0].totals["records"] == 1  # not mutated by later adds
    assert snaps[5].to_dict() == summarize(records[:6]).to_dict()


def test_summary_module_stays_free_of_heavy_imports():
    code = (
        "import sys; import onnx_sbs_nb.align.blame.summary; "
        "bad = [m for m in ('pandas', 'plotly', 'tqdm', 'anywidget', 'torch', 'onnx') "
        "if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_to_text_escapes_control_characters_in_model_names():
    evil = "x\x1b[2J\x00y"
    s = summarize([rec(evil, 0, 0.5, op="Op\x07")])
    text = s.to_text()
    assert "\x1b" not in text and "\x00" not in text and "\x07" not in text
    assert "x\\x1b[2J\\x00y" in text
    assert s.to_dict()["first_own_failure"]["onnx_name"] == evil  # data keeps the raw name


# ---- what the counts and the culprit's name claim ---------------------------------------


def _planted_bias_run():
    """fc1's bias +0.5 in the ONNX file: fc1 makes the error, relu, the scaling, fc2 and
    the graph output (the +1 after fc2) only carry it."""
    import torch
    from onnx import numpy_helper

    from onnx_sbs_nb.align.run import run_aligned

    from ...models import export

    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.b(torch.relu(self.a(x)) * 2.0) + 1.0

    x = torch.randn(2, 8)
    ep, onx = export(Two().eval(), (x,))
    bias = next(i for i in onx.graph.initializer if i.name == "a.bias")
    bias.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(bias) + 0.5, bias.name))
    return list(run_aligned(ep, onx, (x,), own_error=True))


def test_a_failing_graph_output_that_only_carries_the_error_counts_as_inheriting():
    records = _planted_bias_run()
    out = [r for r in records if r.kind == KIND_OUTPUT and r.failed]
    assert out and all(r.passed2 is True for r in out)
    s = summarize(records)
    inherit = sum(1 for r in records if r.failed and r.passed2 is True)
    assert s.totals["inherited"] == inherit == s.totals["drifted"] + len(out)
    assert f"of which {inherit} only inherit their error" in str(s)
    # the output still fails the verdict: an error that reaches the outputs is no drift
    assert s.verdict == "fail"


def test_a_culprit_in_a_lowering_of_several_nodes_names_the_lowering_not_its_last_node():
    import torch

    from onnx_sbs_nb.align.run import run_aligned

    from ...models import export

    class Sdpa(torch.nn.Module):
        def forward(self, q, k, v):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v) * 2

    torch.manual_seed(0)
    args = tuple(torch.randn(1, 2, 4, 8) for _ in range(3))
    ep, onx = export(Sdpa(), args)
    softmax = next(n for n in onx.graph.node if n.op_type == "Softmax")
    next(a for a in softmax.attribute if a.name == "axis").i = -2  # the fault: not the last node
    c = summarize(list(run_aligned(ep, onx, args, own_error=True))).culprit
    assert c is not None and c.ep_name == "scaled_dot_product_attention"
    assert softmax.name in c.onnx_nodes and c.onnx_nodes[-1] != softmax.name
    label = c.label()
    assert "made by its lowering" in label and f"{len(c.onnx_nodes)} ONNX nodes" in label
    assert f"ONNX node {c.onnx_node}" not in label


class _Masked(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return (self.fc(x) > 0).to(torch.float32)


def test_failures_inside_a_graph_whose_outputs_agree_are_said_so():
    """Without own errors, values failing inside while every output agrees: rounding drift
    or an error masked further on, the run cannot say which (and says how to tell)."""
    import copy

    from onnx import numpy_helper

    from onnx_sbs_nb import run_aligned

    torch.manual_seed(0)
    x = torch.randn(2, 8)
    ep = torch.export.export(_Masked().eval(), (x,))
    model = copy.deepcopy(torch.onnx.export(ep, (x,), dynamo=True).model_proto)
    for init in model.graph.initializer:  # every weight x1.5: no sign changes
        init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.5, init.name))
    text = summarize(list(run_aligned(ep, model, (x,)))).to_text()
    assert "verdict: FAIL" in text
    assert "outputs: the graph output agrees with torch" in text, text
    assert "own_error=True tells which" in text
    # with own errors the culprit is named, and the line says its error does not reach
    # the outputs here (trial 4, finding 01: weights rescaled across layers)
    text = summarize(list(run_aligned(ep, model, (x,), own_error=True))).to_text()
    assert "culprit:" in text and "cancel out or are masked" in text, text


def test_drift_between_two_onnx_models_speaks_of_the_reference_model():
    """onnx-sbs diff has no torch in it: its drift line names the reference model, and
    counts the output the error reaches (trial 3, findings 03 and 08)."""
    import copy

    from onnx_sbs_nb import run_aligned_onnx

    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.Tanh()
    ).eval()
    x = torch.randn(4, 16)
    a = torch.onnx.export(torch.export.export(m, (x,)), (x,), dynamo=True).model_proto
    b = copy.deepcopy(a)
    for n in b.graph.node:
        if n.op_type == "Relu":
            n.op_type = "Sigmoid"
    text = summarize(list(run_aligned_onnx(a, b, (x.numpy(),), own_error=True))).to_text()
    assert "drift:" in text, text
    assert "torch" not in text.split("drift:")[1].splitlines()[0]
    assert "agrees with the reference model" in text
    assert "graph output" in text.split("drift:")[1].splitlines()[0]


class _ConvHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.fc = torch.nn.Linear(4 * 6 * 6, 5)

    def forward(self, x):
        return self.fc(torch.relu(self.c(x)).reshape(x.shape[0], -1))


def test_outputs_after_a_node_that_failed_to_run_are_not_said_to_agree():
    """A node that cannot run (a Reshape to a shape the input does not divide into): the
    run goes on from torch's value, so the graph output's record agrees, but the ONNX
    model produces nothing; the summary must not say it agrees (trial 5, finding 05)."""
    import copy

    import numpy as np
    from onnx import numpy_helper

    from onnx_sbs_nb import run_aligned

    torch.manual_seed(0)
    x = torch.randn(2, 3, 6, 6)
    ep = torch.export.export(_ConvHead().eval(), (x,))
    model = copy.deepcopy(torch.onnx.export(ep, (x,), dynamo=True).model_proto)
    reshape = next(n for n in model.graph.node if n.op_type == "Reshape")
    for init in model.graph.initializer:
        if init.name == reshape.input[1]:  # 288 elements do not split into 5 rows
            init.CopyFrom(numpy_helper.from_array(np.array([5, -1], dtype=np.int64), init.name))
    recs = list(run_aligned(ep, model, (x,), own_error=True))
    assert any(r.status == STATUS_ERROR for r in recs)
    text = summarize(recs).to_text()
    assert "verdict: FAIL" in text and "culprit:" in text, text
    assert "agrees with torch" not in text and "cancel out" not in text, text
    assert "1 node failed to run" in text and "not what the ONNX model computes" in text, text


def test_outputs_off_by_quantization_noise_are_not_said_to_agree():
    """A failing run whose graph output is only within the quantization's noise: the
    output does not agree with torch (trial 5, finding 03: "the graph output agrees" for an
    output 19x the faithful model's error)."""
    from onnx_sbs_nb.records import STATUS_QUANTIZATION_NOISE

    recs = [
        rec("dq", 0, 0.5, op="DequantizeLinear", err_abs2=0.5),
        rec("y", 1, 0.3, kind=KIND_OUTPUT, passed=False, status=STATUS_QUANTIZATION_NOISE),
    ]
    text = summarize(recs).to_text()
    assert "verdict: FAIL" in text, text
    assert "agrees with torch" not in text, text
    assert "the graph output is beyond tolerance, within what the model's quantization" in text
