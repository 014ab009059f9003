"""Honest answers on what a new user brings first: NaN inputs and folded weights,
constants the program computes, the user's verdict and compare function deciding own
errors and weight blame, one count per record, certainty that matches the evidence.

Each mechanism is proven on two models of its own (a CNN whose BatchNorms the exporter
folds into its Convs, an MLP whose BatchNorm1d it folds into a Gemm, a residual block)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from onnx_sbs_nb import run_aligned
from onnx_sbs_nb.align.blame.summary import summarize
from onnx_sbs_nb.records import KIND_OUTPUT, STATUS_FAIL, STATUS_WEIGHT_DIFFERS, Record

from ..models import export
from ..reports.test_html_offline import Page, browser  # noqa: F401 (the browser fixture)
from .honest import (
    CNN,
    MLPBN,
    Affine,
    ConvOnly,
    Floor64,
    NanToNum64,
    Residual,
    changed,
    random_bn,
    torchscript,
    with_nan,
)


def _exported(model: torch.nn.Module, x: torch.Tensor):
    torch.manual_seed(1)
    model = random_bn(model)
    ep, onx = export(model, (x,))
    return ep, onx, x, model


@pytest.fixture(scope="module")
def cnn():
    return _exported(CNN(), torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1)))


@pytest.fixture(scope="module")
def mlp():
    return _exported(MLPBN(), torch.randn(6, 8, generator=torch.Generator().manual_seed(1)))


@pytest.fixture(scope="module")
def residual():
    return _exported(
        Residual(), torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(1))
    )


def _folded_weights(records: list[Record]) -> list[Record]:
    return [r for r in records if r.kind == "weight" and r.status == STATUS_WEIGHT_DIFFERS]


# -- 1. non-finite values are data ------------------------------------------------------


@pytest.mark.parametrize("model", ["cnn", "mlp", "residual"])
def test_a_nan_input_on_a_model_with_folded_weights_passes(model, request):
    # torch and onnxruntime make the same NaN pattern: every value agrees; the folded
    # weights differ by design and their consumers agree on their finite part
    ep, onx, x, _ = request.getfixturevalue(model)
    records = list(run_aligned(ep, onx, (with_nan(x),)))
    s = summarize(records, node_inputs=onx)
    assert s.verdict == "pass" and s.culprit is None, s.to_text()
    folded = _folded_weights(records)
    assert folded and all("the exporter folded" in (r.comment or "") for r in folded)
    # a weight that differs by design is no error: not the run's worst
    assert s.max_err_name not in {r.onnx_name for r in folded}


def test_a_nan_in_one_of_many_inputs_is_no_failure(cnn):
    ep, onx, x, _ = cnn
    gen = torch.Generator().manual_seed(3)
    inputs = [(torch.randn(x.shape, generator=gen),) for _ in range(6)]
    inputs[4] = (with_nan(inputs[4][0]),)
    s = summarize(run_aligned(ep, onx, inputs=inputs), node_inputs=onx)
    assert s.verdict == "pass" and s.culprit is None, s.to_text()


@pytest.mark.parametrize("model", [NanToNum64, Floor64])
def test_a_constant_is_judged_by_what_its_consumers_make_of_it(model):
    # float64's smallest number becomes -inf in the model (a live exporter bug): the
    # constant differs on every input, the model's values only where it is selected
    x = torch.rand(4, 8, dtype=torch.float64) + 0.5
    ep, onx = export(model(), (x,))
    gen = torch.Generator().manual_seed(0)
    inputs = [(torch.rand(4, 8, dtype=torch.float64, generator=gen) + 0.5,) for _ in range(8)]
    s = summarize(run_aligned(ep, onx, inputs=inputs), node_inputs=onx)
    assert s.verdict == "pass" and s.culprit is None, s.to_text()
    bad = inputs[5][0].clone()
    bad[0, 0] = 0.0 if model is NanToNum64 else -1.0
    inputs[5] = (bad,)
    s = summarize(run_aligned(ep, onx, inputs=inputs), node_inputs=onx)
    c = s.culprit
    assert s.verdict == "fail" and c is not None, s.to_text()
    assert c.input_index == 5 and c.inputs_failing == 1 and c.inputs_total == 8
    assert "1 of 8 inputs failing" in c.why
    assert "-inf where torch has -1.798e+308" in c.why, c.why  # what differs, plainly


# -- 2. weight blame that knows folding -------------------------------------------------


_FAULTS = {  # model -> a folded initializer to move
    "cnn": "blocks.1.conv.bias",
    "mlp": "fc1.bias",
    "residual": "b.0.weight",
}


@pytest.mark.parametrize("model", ["cnn", "mlp", "residual"])
def test_a_fault_in_a_folded_weight_blames_its_consumer_not_the_weight(model, request):
    ep, onx, x, _ = request.getfixturevalue(model)
    bad = changed(onx, _FAULTS[model], 0.05)
    for own_error in (False, True):
        records = list(run_aligned(ep, bad, (x,), own_error=own_error))
        s = summarize(records, node_inputs=bad)
        c = s.culprit
        assert s.verdict == "fail" and c is not None, s.to_text()
        assert c.kind != "weight" and c.onnx_op_type in ("Conv", "Gemm"), s.to_text()
        assert "folded" in c.why, c.why
        # the folded weight that was changed is named, whichever was settled first
        assert _FAULTS[model] in c.why, c.why
        assert ("it makes the error" in c.why) == own_error, c.why
        weight = next(r for r in records if r.onnx_name == _FAULTS[model])
        assert weight.status == STATUS_WEIGHT_DIFFERS


@pytest.mark.parametrize("model", ["cnn", "mlp"])
def test_the_verdict_policy_decides_weight_blame_as_it_decides_the_values(model, request):
    # the policy judges the weight's consumer as it judges every value: the answer is
    # the consumer where the policy fails it, and a pass where it accepts every value
    ep, onx, x, _ = request.getfixturevalue(model)
    seen_failing = False
    for delta in (0.5, 0.05, 0.002):
        bad = changed(onx, _FAULTS[model], delta)
        for own_error in (False, True):
            records = list(run_aligned(ep, bad, (x,), own_error=own_error, verdict="snr>=30"))
            failing = [r for r in records if r.kind != "weight" and r.status == STATUS_FAIL]
            s = summarize(records, node_inputs=bad)
            c = s.culprit
            if failing:
                seen_failing = True
                assert c is not None and c.kind != "weight", s.to_text()
                assert c.onnx_op_type in ("Conv", "Gemm") and "folded" in c.why, c.why
                # the why cites what failed it: the policy, not atol/rtol
                assert "failing the verdict snr>=30" in c.why and "atol" not in c.why, c.why
            else:
                assert s.verdict == "pass" and c is None, s.to_text()
            weight = next(r for r in records if r.onnx_name == _FAULTS[model])
            assert weight.status == STATUS_WEIGHT_DIFFERS
    assert seen_failing


# -- the user's compare function decides own errors too ---------------------------------


def _few_off(expected: torch.Tensor, got: torch.Tensor) -> dict:
    """Passes while at most one element in eight is off (the user's own rule)."""
    off = ((expected.double() - got.double()).abs() > 1e-3).double().mean().item()
    return {"passed": off <= 1 / 8, "off": off}


@pytest.mark.parametrize(
    "model,x,bias",
    [(Affine, torch.randn(6, 8), "fc.bias"), (ConvOnly, torch.randn(1, 3, 8, 8), "conv.bias")],
)
def test_the_compare_function_decides_own_errors_too(model, x, bias):
    # one output channel of 16 (of 8) is off: the user's function passes every value
    torch.manual_seed(0)
    ep, onx = export(model(), (x,))
    bad = changed(onx, bias, 0.5)
    records = list(run_aligned(ep, bad, (x,), own_error=True, compare=_few_off))
    s = summarize(records, node_inputs=bad)
    assert s.verdict == "pass" and s.culprit is None, s.to_text()
    assert all(r.passed2 is not False for r in records)


# -- 9. one count per record --------------------------------------------------------------


def _many(step, name, kind="node", **fields) -> Record:
    base = dict(
        step=step,
        kind=kind,
        onnx_name=name,
        ep_name=name,
        onnx_node_name=f"n_{name}",
        onnx_op_type="Exp" if name == "exp" else "Sub",
        onnx_shape_type="float32[4]",
        atol=1e-4,
        rtol=1e-4,
        input_index=3,
        inputs_total=20,
    )
    base.update(fields)
    return Record(**base)


def test_an_amplified_culprit_gives_the_count_its_text_gives():
    # an Exp whose own error passes, large for its values, amplified by the Sub after it
    # that fails on 2 inputs of 20: the culprit's fields and its why say the same count
    records = [
        _many(
            0,
            "exp",
            status="ok",
            passed=True,
            passed2=True,
            err_abs=1e-5,
            err_abs2=1e-5,
            err_scale2=1e-3,
            inputs_failing=0,
            input_index=0,
        ),
        _many(
            1,
            "sub",
            kind=KIND_OUTPUT,
            status="fail",
            passed=False,
            passed2=True,
            err_abs=0.5,
            err_abs2=0.0,
            inputs_failing=2,
        ),
    ]
    c = summarize(records).culprit
    assert c is not None and c.ep_name == "exp" and c.rule == "amplified"
    assert "2 of 20 inputs failing" in c.why
    assert (c.inputs_failing, c.inputs_total, c.input_index) == (2, 20, 3)


# -- 10. certainty matches evidence -------------------------------------------------------


def test_a_culprit_on_a_guessed_pairing_or_little_coverage_says_so():
    records = [
        Record(
            step=0,
            kind="node",
            onnx_name="a",
            ep_name="a",
            onnx_node_name="na",
            onnx_op_type="Relu",
            status="ok",
            passed=True,
            paired_by="metadata",
        ),
        Record(
            step=1,
            kind="node",
            onnx_name="b",
            ep_name="b",
            onnx_node_name="nb",
            onnx_op_type="Add",
            status="fail",
            passed=False,
            err_abs=1.0,
            atol=1e-4,
            rtol=1e-4,
            paired_by="structure",
        ),
    ] + [
        Record(
            step=2 + k,
            kind="node",
            onnx_name=f"u{k}",
            onnx_node_name=f"nu{k}",
            onnx_op_type="Mul",
            status="unpaired_onnx",
        )
        for k in range(5)
    ]
    c = summarize(records).culprit
    assert c is not None and c.ep_name == "b"
    assert "found by the graph's structure" in c.why and "not a proven one" in c.why
    assert c.why.count("structure") == 1, c.why  # said once
    assert "only 2 of 7 ONNX nodes were compared" in c.why
    # proven pairings over most of the graph: nothing to add
    records[1].paired_by = "metadata"
    c = summarize(records[:2]).culprit
    assert "not a proven" not in c.why and "were compared" not in c.why


@pytest.mark.parametrize("model", ["cnn", "mlp"])
def test_a_pass_on_less_than_half_says_so_whatever_made_the_model(model, request):
    # the TorchScript exporter writes no fx metadata: the ONNX nodes feeding a compared
    # output are not the lowering of its fx node, and compare nothing
    ep, _, x, eager = request.getfixturevalue(model)
    onx = torchscript(eager, x)
    records = list(run_aligned(ep, onx, (x,)))
    s = summarize(records, node_inputs=onx)
    cov = s.coverage
    if cov.onnx_covered < cov.onnx_nodes / 2:
        assert s.partial and f"PASS on {cov.onnx_covered} of {cov.onnx_nodes}" in s.to_text()
        assert summarize(records, node_inputs=onx, strict=True).verdict == "fail"


def test_max_error_of_a_passing_folded_model_is_no_folded_weight(cnn):
    ep, onx, x, _ = cnn
    records = list(run_aligned(ep, onx, (x,)))
    s = summarize(records, node_inputs=onx)
    assert s.verdict == "pass"
    assert s.max_err_abs is not None and s.max_err_abs < 1e-3, s.to_text()
    assert np.isfinite(s.max_err_abs)


def test_a_report_of_a_passing_folded_model_shows_folded_weights_as_folded(cnn, tmp_path):
    # issue 48: its worst error was a folded bias, its footer said "none differs" while
    # 6 weights were weight_differs, and the static table's worst rows were those weights
    import re

    from onnx_sbs_nb.reports.report import write_report

    ep, onx, x, _ = cnn
    records = list(run_aligned(ep, onx, (x,)))
    s = summarize(records, node_inputs=onx)
    folded = _folded_weights(records)
    assert s.verdict == "pass" and len(folded) == 6
    path = write_report(records, tmp_path / "folded.html", s)
    text = path.read_text()
    worst = float(re.search(r"worst err_abs ([0-9.e+-]+)", text).group(1))
    assert worst < 1e-3, worst
    table = text[text.index('<table class="onnx-sbs-worst"') :]
    first_row = table[table.index("<tbody>") : table.index("</tr>")]
    assert "weight_differs" not in first_row, first_row


def test_the_widget_footer_counts_folded_weights_apart(cnn, tmp_path, browser):  # noqa: F811
    from onnx_sbs_nb.reports.report import write_report

    ep, onx, x, _ = cnn
    records = list(run_aligned(ep, onx, (x,)))
    path = write_report(records, tmp_path / "folded.html", summarize(records, node_inputs=onx))
    p = Page(browser)
    try:
        p.page.goto(path.as_uri())
        line = p.page.locator(".sbs-constants")
        line.wait_for(timeout=20000)
        text = line.inner_text()
        assert "none fails, 6 differ by design" in text, text
        constants = sum(1 for r in records if r.kind == "weight" and r.status != "unpaired_ep")
        compared = sum(1 for r in records if r.kind == "weight" and r.status in ("ok", "fail"))
        assert f"({compared + 6} compared)" in text, (text, constants)
        assert p.errors == []
    finally:
        p.close()


@pytest.mark.parametrize(
    "model,node,op", [("cnn", "/blocks/blocks.0/Add", "Sub"), ("mlp", "/Relu", "Sigmoid")]
)
def test_a_culprit_says_no_more_than_its_evidence(model, node, op, request):
    # a TorchScript export with a planted fault: its values mostly have no torch twin,
    # so an own error is recomputed through nodes nobody compared, over little coverage
    ep, _, x, eager = request.getfixturevalue(model)
    onx = torchscript(eager, x)
    planted = next(n for n in onx.graph.node if n.name == node)
    planted.op_type = op
    records = list(run_aligned(ep, onx, (x,), own_error=True))
    s = summarize(records, node_inputs=onx)
    c, rec = s.culprit, s.first_own_failure
    assert s.verdict == "fail" and c is not None, s.to_text()
    if s.coverage.low:
        assert f"only {s.coverage.onnx_covered} of {s.coverage.onnx_nodes}" in c.why, c.why
    if rec.own_inputs_from:
        assert "it makes the error" not in c.why, c.why
        assert "recomputed through" in c.why, c.why
    # certain only where it is right (old: "/head/Gemm ... it makes the error")
    if "it makes the error" in c.why:
        assert c.onnx_node == node, c.why


@pytest.mark.parametrize("model", ["cnn", "mlp"])
def test_the_culprit_of_a_folded_weight_fault_replays_it(model, request, tmp_path):
    # the culprit was the weight: no ONNX node, so --replay-culprit wrote no bundle
    from onnx_sbs_nb.align.run import AlignedRun
    from onnx_sbs_nb.reports.culprit_bundle import save_culprit_bundle

    ep, onx, x, _ = request.getfixturevalue(model)
    bad = changed(onx, _FAULTS[model], 0.05)
    run = AlignedRun(ep, bad, (x,))  # the default options: no own errors
    list(run)
    bundle = save_culprit_bundle(run, tmp_path)
    assert bundle is not None and bundle.reproduced, bundle
    assert bundle.nodes == 1 and bundle.replayed_error == pytest.approx(0.05, rel=0.05)
