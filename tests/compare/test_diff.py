"""Comparison metrics."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from onnx_sbs_nb.compare.diff import compare
from onnx_sbs_nb.compare.tolerances import default_tolerance
from onnx_sbs_nb.compare.value_facts import shape_type


@pytest.mark.parametrize("as_torch", [False, True])
def test_metrics(as_torch):
    e = np.array([0.0, 1.0, 2.0, 100.0], np.float32)
    g = np.array([0.0, 1.05, 2.0, 100.5], np.float32)
    if as_torch:  # the torch path is the one used off-CPU
        e, g = torch.from_numpy(e).to(torch.bfloat16).float(), torch.from_numpy(g)
        e = e.to(torch.float32)
    d = compare(e, g, atol=1e-3, rtol=1e-3)
    assert d.err_abs == pytest.approx(0.5)
    assert d.err_h01 == 1 and d.err_h001 == 2
    assert d.err_rel == pytest.approx(0.05 / (1 + 1e-3), rel=1e-3)
    assert d.passed is False and d.err_nan == 0


def test_rel_error_bounded_near_zero():
    d = compare(np.zeros(3, np.float32), np.full(3, 1e-6, np.float32))
    assert d.err_rel == pytest.approx(1e-6 / 1e-4, rel=1e-3)
    assert d.passed


@pytest.mark.parametrize("as_torch", [False, True])
def test_nan_positions(as_torch):
    e = np.array([np.nan, 1.0, np.inf, 2.0], np.float32)
    g = np.array([np.nan, np.nan, np.inf, -np.inf], np.float32)
    if as_torch:
        e, g = torch.from_numpy(e), torch.from_numpy(g).to(torch.float64)
    d = compare(e, g)
    assert d.err_nan == 2 and d.passed is False
    # NaN against a number, +inf against -inf: an infinite error, never 0
    assert d.err_abs == d.err_rel == math.inf and d.err_h01 == 2


@pytest.mark.parametrize("as_torch", [False, True])
def test_non_finite_against_finite_is_an_infinite_error(as_torch):
    e = np.array([np.inf, 1.0], np.float32)
    g = np.array([1e38, 1.0], np.float32)
    if as_torch:
        e, g = torch.from_numpy(e), torch.from_numpy(g)
    d = compare(e, g)
    assert d.err_abs == math.inf and d.err_nan == 1 and d.passed is False
    same = compare(e, e.copy() if isinstance(e, np.ndarray) else e.clone())
    assert same.err_abs == 0 and same.passed  # inf against inf agrees


# torch has no uint64 arithmetic: its path is tested on int64
@pytest.mark.parametrize("as_torch, dtype", [(False, "int64"), (False, "uint64"), (True, "int64")])
def test_integers_compare_as_integers(as_torch, dtype):
    big = 2**60
    e = np.array([big, 7], dtype)
    g = np.array([big + 1, 7], dtype)
    if as_torch:  # the torch path is the one used off-CPU
        e, g = torch.from_numpy(e), torch.from_numpy(g)
    d = compare(e, g)
    # in float64, 2**60 and 2**60 + 1 are the same number
    assert d.passed is False and d.err_abs == 1 and d.err_h01 == 1 and d.err_nan == 0
    assert compare(e, e).passed
    lo, hi = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    extreme = compare(np.array([lo]), np.array([hi]))  # no overflow in the difference
    assert extreme.err_abs == float(2**64 - 1) and extreme.passed is False
    top = np.array([2**64 - 1], np.uint64)
    assert compare(top, top - np.uint64(1)).err_abs == 1


def test_float8_compared_upcast():
    t = torch.tensor([1.0, 2.0, -0.5]).to(torch.float8_e4m3fn)
    d = compare(t, t.clone())
    assert d.passed and d.err_abs == 0
    other = (t.float() * 2).to(torch.float8_e4m3fn)
    d = compare(t, other)
    assert d.err_abs == pytest.approx(2.0) and d.passed is False


def test_shape_and_dtype_mismatch():
    d = compare(np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32))
    assert d.shape_mismatch and d.passed is False
    d = compare(np.zeros(3, np.float32), np.zeros(3, np.float64))
    assert d.dtype_mismatch and d.passed is False and d.err_abs == 0


def test_integers_exact_and_tolerances_by_dtype():
    d = compare(np.array([1, 2, 3]), np.array([1, 2, 4]), atol=10, rtol=10)
    assert d.err_abs == 1 and d.passed is False and d.atol == 0
    assert default_tolerance("float16") == (1e-2, 1e-2)
    assert default_tolerance("bfloat16")[0] > default_tolerance("float16")[0]
    assert default_tolerance("float32") == (1e-4, 1e-4)


def test_bfloat16_compared_on_torch_path():
    e = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    d = compare(e, e.clone())
    assert d.passed and d.err_abs == 0 and d.atol == default_tolerance("bfloat16")[0]


def test_shape_type():
    assert shape_type(torch.zeros(2, 3)) == "float32[2x3]"
    assert shape_type(np.zeros((), np.int64)) == "int64[]"


def test_zero_dimensional_values():
    d = compare(np.float32(2.0), np.array(2.5, np.float32))
    assert d.err_abs == pytest.approx(0.5) and d.passed is False
    d = compare(torch.tensor(3.0), np.array(3.0, np.float32))
    assert d.err_abs == 0 and d.passed


@pytest.mark.parametrize("case", ["equal", "close", "far", "nan", "inf", "transposed"])
def test_large_values_compared_in_blocks_give_the_same_answer(case, monkeypatch):
    """Large floats are compared block by block (bounded temporaries): every field of
    the answer is the one a single pass gives."""
    from onnx_sbs_nb.compare import diff

    rng = np.random.default_rng(0)
    e = rng.standard_normal((37, 11)).astype(np.float32)
    g = e.copy()
    if case == "close":
        g += 1e-6
    elif case == "far":
        g[30, 5] += 0.5
        g[3] += 0.02
    elif case == "nan":
        g[20, 1] = np.nan
        e[2, 2] = g[2, 2] = np.inf
    elif case == "inf":
        g[36, 10] = -np.inf
    elif case == "transposed":
        e, g = e.T, (g + 1e-3).T  # non-contiguous views
    whole = diff.compare(e, g, 1e-4, 1e-4)
    monkeypatch.setattr(diff, "_BLOCK", 40)  # blocks of 3 rows
    blocks = diff.compare(e, g, 1e-4, 1e-4)
    # sums of blocks round in another order: cosine, SNR and L2 agree to double rounding
    for name in ("err_cos", "err_snr", "err_l2"):
        a, b = getattr(blocks, name), getattr(whole, name)
        assert a == pytest.approx(b, rel=1e-12) or (math.isnan(a) and math.isnan(b)), name
        setattr(blocks, name, b)
    assert blocks == whole


@pytest.mark.parametrize(
    "case", ["same", "same_specials", "signed_zero", "last_slice", "first_slice", "strided", "ints"]
)
def test_identical_bits_give_the_full_comparisons_answer(case, monkeypatch):
    """Bit-identical values are answered by a byte comparison, in slices for large ones:
    the answer is the full comparison's, and a value that differs anywhere (in any
    slice, or only in the sign of a zero) still goes through the full comparison."""
    from onnx_sbs_nb.compare import diff, value_facts

    monkeypatch.setattr(value_facts, "_BITS_SLICE", 64)  # 16 floats per slice: 7 slices
    monkeypatch.setattr(value_facts, "_BITS_PREFIX", 16)  # and a prefix shorter than a slice
    rng = np.random.default_rng(1)
    e = rng.standard_normal((10, 11)).astype(np.float32)
    g = e.copy()
    if case == "same_specials":
        e[1, 1] = g[1, 1] = np.nan
        e[2, 2] = g[2, 2] = -np.inf
    elif case == "signed_zero":
        e[0, 0], g[0, 0] = 0.0, -0.0
    elif case == "last_slice":
        g[9, 10] += 0.25
    elif case == "first_slice":
        g[0, 0] = np.nan
    elif case == "strided":
        e, g = e.T, g.T
    elif case == "ints":
        e = g = rng.integers(-5, 5, (10, 11))
        g = g.copy()
    fast = diff.compare(torch.from_numpy(np.ascontiguousarray(e)), g)
    monkeypatch.setattr(diff, "_same_bits", lambda a, b: False)
    full = diff.compare(torch.from_numpy(np.ascontiguousarray(e)), g)
    assert fast == full
    if case in ("last_slice", "first_slice"):
        assert not fast.passed and fast.err_abs > 0
    else:
        assert fast.passed and fast.err_abs == 0 and fast.err_nan == 0


def test_same_bits_reads_every_slice(monkeypatch):
    from onnx_sbs_nb.compare import value_facts

    monkeypatch.setattr(value_facts, "_BITS_SLICE", 64)
    monkeypatch.setattr(value_facts, "_BITS_PREFIX", 16)
    a = np.arange(1000, dtype=np.float64)
    assert value_facts._same_bits(a, a.copy())
    for k in (0, 500, 999):
        b = a.copy()
        b[k] = np.nextafter(b[k], np.inf)
        assert not value_facts._same_bits(a, b)
    assert not value_facts._same_bits(a[::2], a[::2].copy())  # strided: left to the full path


@pytest.mark.parametrize("k", [0, 511, 512, 513, 999])
def test_same_bits_prefix_only_rejects(k):
    """The first bytes (512 float64) reject a differing value early; equal first bytes
    never accept alone: a difference just past them, or at the end, is still found."""
    from onnx_sbs_nb.compare import diff, value_facts

    assert value_facts._BITS_PREFIX == 4096
    a = np.arange(1000, dtype=np.float64)  # 8 000 bytes: one slice, past the prefix
    b = a.copy()
    b[k] = np.nextafter(b[k], np.inf)
    assert value_facts._same_bits(a, a.copy())
    assert not value_facts._same_bits(a, b)
    assert diff.compare(a, b).err_abs > 0


def test_a_weight_is_not_passed_by_an_absolute_tolerance_above_its_values():
    torch.manual_seed(0)
    w = (torch.randn(64, 32) * 0.02).to(torch.bfloat16)
    changed = w * 1.5
    # as an activation, bfloat16's atol (5e-2) covers a change of 0.01s
    assert compare(w, changed).passed
    d = compare(w, changed, constant=True)
    assert not d.passed and d.atol < 5e-2 * 0.2
    # a weight stored in a lower precision rounds within rtol of each value
    w32 = torch.randn(64, 32) * 0.02
    rounded = w32.half().float()
    assert compare(w32, rounded, rtol=1e-2, constant=True).passed
    # the user's atol wins
    assert compare(w, changed, atol=5e-2, constant=True).passed
    # a weight of zeros is compared exactly
    z = torch.zeros(8)
    assert not compare(z, z + 1e-6, constant=True).passed
