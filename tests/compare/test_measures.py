"""The measures (cosine, SNR, L2, quantiles of |diff|, ulps) against numpy references,
on both comparison paths (the C module and numpy), and the verdicts and user checks
built on them, through a real export and the command line."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnx.numpy_helper as nh
import pytest
import torch

from onnx_sbs_nb import run_aligned
from onnx_sbs_nb.compare import diff, value_facts
from onnx_sbs_nb.compare.verdict_policy import VerdictPolicy, make_judge, parse_condition
from onnx_sbs_nb.errors import SbsInputError
from onnx_sbs_nb.native import NATIVE
from onnx_sbs_nb.records import KIND_OUTPUT, STATUS_CHECK_ERROR
from tests.models import export

SUMS = ("err_cos", "err_snr", "err_l2")
EXACT = ("err_p50", "err_p99", "err_ulp")


def _reference(e: np.ndarray, g: np.ndarray) -> dict[str, float | None]:
    """The measures written plainly with numpy, as measures.py defines them."""
    if e.dtype.kind == "f" or g.dtype.kind == "f":
        work = np.float64 if np.float64 in (e.dtype, g.dtype) else np.float32
    else:
        work = np.float64
    ef, gf = e.astype(work).reshape(-1), g.astype(work).reshape(-1)
    with np.errstate(all="ignore"):
        fin = np.isfinite(ef) & np.isfinite(gf)
        same = (ef == gf) | (np.isnan(ef) & np.isnan(gf))
        d = np.abs(ef - gf)
        keys = np.where(fin, d, np.where(same, 0.0, np.inf)).astype(np.float64)
    p50, p99 = np.quantile(keys, [0.5, 0.99]) if keys.size else (0.0, 0.0)
    if not keys.size:
        p50 = p99 = 0.0
    out: dict[str, float | None] = {"err_p50": float(p50), "err_p99": float(p99)}
    if g.dtype.kind == "f":
        width = g.dtype.itemsize
        ints = {2: np.int16, 4: np.int32, 8: np.int64}[width]
        ea = e.astype(g.dtype).reshape(-1).view(ints)[fin].astype(object)
        ga = g.reshape(-1).view(ints)[fin].astype(object)
        mag = (1 << (width * 8 - 1)) - 1

        def ordered(x):
            return [-(int(v) & mag) if v < 0 else int(v) for v in x]

        dist = [abs(a - b) for a, b in zip(ordered(ea), ordered(ga), strict=True)]
        out["err_ulp"] = float(max(dist, default=0))
    else:
        out["err_ulp"] = None
    if (~fin & ~same).any():
        out.update(err_cos=math.nan, err_snr=-math.inf, err_l2=math.inf)
        if out["err_ulp"] is not None:
            out["err_ulp"] = math.inf
        return out
    e64, g64 = np.where(fin, ef, 0).astype(np.float64), np.where(fin, gf, 0).astype(np.float64)
    d64 = np.where(fin, d, 0).astype(np.float64)
    ee, gg, eg, dd = e64 @ e64, g64 @ g64, e64 @ g64, d64 @ d64
    if ee > 0 and gg > 0:
        out["err_cos"] = float(eg / np.sqrt(ee * gg))
    else:
        out["err_cos"] = 1.0 if ee == gg == 0 else 0.0
    if dd == 0:
        out["err_snr"], out["err_l2"] = math.inf, 0.0
    elif ee == 0:
        out["err_snr"], out["err_l2"] = -math.inf, math.inf
    else:
        out["err_snr"] = float(10 * np.log10(ee / dd))
        out["err_l2"] = float(np.sqrt(dd / ee))
    return out


def _cases():
    rng = np.random.default_rng(0)
    for n in (1, 9, 300, 5000, 70000):
        e = rng.standard_normal(n).astype(np.float32)
        yield f"random-{n}", e, e + rng.standard_normal(n).astype(np.float32) * 1e-3
    e = rng.standard_normal((40, 50))
    yield "float64", e, e * (1 + 1e-9)
    yield "constant", np.full(100, 3.0, np.float32), np.full(100, 3.5, np.float32)
    yield "equal", np.full(100, 2.0, np.float32), np.full(100, 2.0, np.float32)
    yield "zeros", np.zeros(64, np.float32), np.zeros(64, np.float32)
    yield "zero-vs-value", np.zeros(64, np.float32), np.full(64, 1e-3, np.float32)
    yield "value-vs-zero", np.full(64, 1e-3, np.float32), np.zeros(64, np.float32)
    x = rng.standard_normal(64).astype(np.float32)
    y = x + 1e-4
    x[3] = y[3] = np.inf  # agreed infinity: no error there
    yield "agreed-inf", x, y
    z = x.copy()
    z[7] = np.nan
    yield "nan", x, z
    yield (
        "signed-zero",
        np.array([0.0, -0.0, 1.0], np.float32),
        np.array([-0.0, 0.0, 1.0], np.float32),
    )
    yield "int64", rng.integers(-50, 50, 200), rng.integers(-50, 50, 200)
    yield "int-equal", np.arange(10), np.arange(10)
    yield "bool", rng.random(64) > 0.5, rng.random(64) > 0.5
    h = rng.standard_normal(3000).astype(np.float16)
    yield "float16", h, (h.astype(np.float32) + 1e-2).astype(np.float16)
    yield "float16-vs-float32-expected", h.astype(np.float32) + 1e-3, h
    yield "empty", np.zeros(0, np.float32), np.zeros(0, np.float32)


def _check(got: diff.Diff, want: dict, name: str) -> None:
    for field, w in want.items():
        v = getattr(got, field)
        if w is None or v is None:
            assert v is w, (name, field, v, w)
        elif math.isnan(w):
            assert math.isnan(v), (name, field, v)
        else:
            # float precision: the sums are double, the selection exact
            assert v == pytest.approx(w, rel=1e-9, abs=1e-12), (name, field, v, w)


@pytest.mark.parametrize("fallback", [False, True])
def test_measures_agree_with_numpy_references(fallback, monkeypatch):
    if fallback:
        for module in (diff, value_facts):  # both read the C module
            monkeypatch.setattr(module, "NATIVE", None)
    for name, e, g in _cases():
        _check(diff.compare(torch.from_numpy(np.array(e)), g), _reference(e, g), name)


@pytest.mark.skipif(NATIVE is None, reason="the C module was not built")
def test_the_c_module_and_the_numpy_fallback_give_the_same_measures(monkeypatch):
    rng = np.random.default_rng(1)
    cases = list(_cases())
    big = rng.standard_normal((300, 700)).astype(np.float32)  # a histogram selection
    cases.append(("large", big, big + rng.standard_normal(big.shape).astype(np.float32) * 1e-4))
    native = {name: diff.compare(e, g) for name, e, g in cases}
    for module in (diff, value_facts):  # both read the C module
        monkeypatch.setattr(module, "NATIVE", None)
    for name, e, g in cases:
        a, b = native[name], diff.compare(e, g)
        for field in EXACT:  # selections and integer distances: bit for bit
            assert getattr(a, field) == getattr(b, field), (name, field)
        for field in SUMS:  # sums in another order: double rounding apart
            x, y = getattr(a, field), getattr(b, field)
            assert (math.isnan(x) and math.isnan(y)) or x == pytest.approx(y, rel=1e-12), (
                name,
                field,
            )


def test_measures_of_large_values_compared_in_blocks(monkeypatch):
    rng = np.random.default_rng(2)
    e = rng.standard_normal((64, 100)).astype(np.float16)  # numpy path: float16
    g = (e.astype(np.float32) + rng.standard_normal(e.shape).astype(np.float32) * 1e-2).astype(
        np.float16
    )
    whole = diff.compare(e, g)
    monkeypatch.setattr(diff, "_BLOCK", 700)  # blocks of 7 rows, a histogram selection
    monkeypatch.setattr("onnx_sbs_nb.compare.measures._SMALL", 100)
    blocks = diff.compare(e, g)
    _check(blocks, _reference(e, g), "blocks")
    assert (blocks.err_p50, blocks.err_p99, blocks.err_ulp) == (
        whole.err_p50,
        whole.err_p99,
        whole.err_ulp,
    )


def test_torch_path_measures_bfloat16_and_ulps_in_the_onnx_dtype():
    e = torch.linspace(-2, 2, 101)
    g = e.bfloat16()
    d = diff.compare(e.bfloat16(), g)
    assert d.err_ulp == 0 and d.err_cos == 1.0 and d.err_snr == math.inf
    g2 = (e + 0.05).bfloat16()
    d2 = diff.compare(e.bfloat16(), g2)
    ref = _reference(e.bfloat16().float().numpy(), g2.float().numpy())
    for field in ("err_cos", "err_snr", "err_l2", "err_p50", "err_p99"):
        assert getattr(d2, field) == pytest.approx(ref[field], rel=1e-9), field
    # ulps counted in bfloat16 (7 stored bits): far fewer than float32 would count
    bits = e.bfloat16().view(torch.int16).long(), g2.view(torch.int16).long()
    keys = [torch.where(b < 0, -(b & 0x7FFF), b) for b in bits]
    assert d2.err_ulp == float((keys[0] - keys[1]).abs().max())


def test_verdict_expressions_are_parsed_not_evaluated():
    c = parse_condition(" snr >= 30 ")
    assert (c.field, c.op, c.value) == ("err_snr", ">=", 30.0)
    assert parse_condition("err_cos>0.999").field == "err_cos"
    assert parse_condition("ulp<=inf").value == math.inf
    for bad in ("snr >= 30; import os", "__import__('os')", "snr=>30", "snr>=", "speed<3", 30):
        with pytest.raises(SbsInputError, match="snr>=30|verdict"):
            parse_condition(bad)
    with pytest.raises(SbsInputError, match="unknown measure 'speed'"):
        parse_condition("speed<3")
    policy = VerdictPolicy({"float16": "snr>=30", "*": ["abs<=1e-3", "cos>=0.99"]})
    assert [c.text for c in policy.conditions("float16")] == ["snr>=30"]
    assert len(policy.conditions("float32")) == 2
    assert VerdictPolicy({"float16": "snr>=30"}).conditions("float32") is None  # atol/rtol
    with pytest.raises(SbsInputError, match="function"):
        make_judge(None, "not a function")


def test_verdict_on_measures_and_nonfinite_values():
    judge = make_judge("snr>=30", None)
    e = np.ones(100, np.float32)
    assert diff.compare(e, e + 1e-3, judge=judge).passed  # 60 dB
    assert not diff.compare(e, e + 0.1, judge=judge).passed  # 20 dB
    g = e.copy()
    g[0] = np.nan
    assert not diff.compare(e, g, judge=make_judge("p50<=1", None)).passed  # NaN never passes
    # a per-dtype policy leaves other dtypes to atol/rtol
    per = make_judge({"float16": "snr>=30"}, None)
    assert not diff.compare(e, e + 0.1, judge=per).passed
    assert diff.compare(e.astype(np.float16), (e + 1e-2).astype(np.float16), judge=per).passed


class _Scale(torch.nn.Module):
    """relu(x) * scale: the ONNX model's scale (an initializer) is edited afterwards."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.full((16,), scale))

    def forward(self, x):
        return torch.relu(x) * self.scale + 1.0


def _scaled_export(scale: float, factor: float):
    torch.manual_seed(0)
    x = torch.rand(4, 16) + 0.5
    ep, onx = export(_Scale(scale), (x,))
    onx = onnx.ModelProto.FromString(onx.SerializeToString())
    for init in onx.graph.initializer:
        if init.name == "scale":
            init.CopyFrom(nh.from_array(nh.to_array(init) * np.float32(factor), init.name))
    return ep, onx, (x,)


def _output(records):
    (out,) = [r for r in records if r.kind == KIND_OUTPUT]
    return out


def test_snr_verdict_fails_what_atol_passes_and_passes_what_atol_fails():
    # tiny values twice too large: within atol, yet all noise (SNR 0 dB) ...
    # (the product itself: the +1.0 after it makes the output large)
    ep, onx, args = _scaled_export(1e-6, 2.0)
    mul = [r for r in run_aligned(ep, onx, args) if r.onnx_op_type == "Mul"]
    assert mul and mul[0].passed and mul[0].err_snr == pytest.approx(0.0, abs=1e-3)
    mul = [r for r in run_aligned(ep, onx, args, verdict="snr>=30") if r.onnx_op_type == "Mul"]
    assert mul[0].passed is False and mul[0].failed
    # ... and large values off by 2e-4 relative: beyond rtol, yet 74 dB
    ep, onx, args = _scaled_export(1e4, 1 + 2e-4)
    plain = _output(run_aligned(ep, onx, args))
    assert plain.failed and plain.err_snr > 60
    by_snr = _output(run_aligned(ep, onx, args, verdict="snr>=30"))
    assert by_snr.passed and not by_snr.failed


def test_a_compare_function_decides_and_its_fields_reach_the_csv(tmp_path):
    from onnx_sbs_nb.reports.report import read_csv, write_csv

    ep, onx, args = _scaled_export(1e4, 1 + 2e-4)
    calls = []

    def mine(expected, got):
        calls.append((type(expected), type(got)))
        close = bool(torch.allclose(expected, got, rtol=1e-3))
        return {"passed": close, "max_ratio": float((got / expected).nan_to_num(1).max())}

    recs = list(run_aligned(ep, onx, args, compare=mine))
    assert calls and all(t == (torch.Tensor, torch.Tensor) for t in calls)
    out = _output(recs)
    assert out.passed and not out.failed and out.extra["max_ratio"] > 1
    path = write_csv(recs, tmp_path / "r.csv")
    header = path.read_text().splitlines()[0].split(",")
    assert "extra.max_ratio" in header and "err_snr" in header and "err_ulp" in header
    back = _output(read_csv(path))
    assert back.extra["max_ratio"] == pytest.approx(out.extra["max_ratio"])
    assert back.err_snr == pytest.approx(out.err_snr)


def test_a_compare_function_that_raises_is_that_records_error():
    ep, onx, args = _scaled_export(1e-6, 1.0)

    def broken(expected, got):
        if expected.shape == (4, 16):
            raise ValueError("not on my watch")
        return {"seen": expected.numel()}

    recs = list(run_aligned(ep, onx, args, compare=broken))
    # the compare function's failure, never the model's (issue 47 row 9)
    errors = [r for r in recs if r.status == STATUS_CHECK_ERROR]
    assert errors and all("not on my watch" in r.error for r in errors)
    assert any(r.extra.get("seen") == 16 for r in recs)  # the run went on


@pytest.mark.parametrize("fallback", [False, True])
def test_measures_off_leave_the_other_metrics_as_they_are(fallback, monkeypatch):
    if fallback:
        for module in (diff, value_facts):  # both read the C module
            monkeypatch.setattr(module, "NATIVE", None)
    off = make_judge(None, None, measures=False)
    for name, e, g in _cases():
        a, b = diff.compare(e, g), diff.compare(e, g, judge=off)
        assert all(getattr(b, f) is None for f in SUMS + EXACT), name
        for f in ("err_abs", "err_rel", "err_nan", "err_h01", "err_h001", "passed"):
            x, y = getattr(a, f), getattr(b, f)
            assert x == y or (math.isnan(x) and math.isnan(y)), (name, f)
    with pytest.raises(SbsInputError, match="measures=False"):
        make_judge("snr>=30", None, measures=False)
    assert make_judge("abs<=1e-3", None, measures=False) is not None
