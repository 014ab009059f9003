"""The C comparisons (onnx_sbs_nb/native) against the numpy path they replace: the same
numbers, bit for bit, on ordinary values and on every edge the numpy path handles."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch

from onnx_sbs_nb.compare import diff, measures
from onnx_sbs_nb.native import NATIVE

if NATIVE is None:
    if os.environ.get("CI"):
        pytest.fail(
            "the C module was not built (pip install -e . builds it with a C compiler)",
            pytrace=False,
        )
    pytest.skip("the C module was not built", allow_module_level=True)

FIELDS = ("err_abs", "err_rel", "err_nan", "err_h01", "err_h001", "passed")
# exact selections and integer distances: the same on both paths, bit for bit
EXACT_MEASURES = ("err_p50", "err_p99", "err_ulp")
# from sums accumulated in another order: the same to a few units of double rounding
SUM_MEASURES = ("err_cos", "err_snr", "err_l2")


def _numpy_diff(e, g, atol, rtol):
    r = diff.Diff()
    diff._compare_numpy_floats(e, g, atol, rtol, r)
    return r


def _native_diff(e, g, atol, rtol, fused=True):
    """The C path: its order statistics from the comparison's own pass (``fused``, as
    diff.compare takes them) or from a second call (ranks())."""
    r = diff.Diff()
    found = (
        diff._native_compare(e, g, atol, rtol, True) if fused else NATIVE.compare(e, g, atol, rtol)
    )
    diff._fill_native(r, found, atol, e, g)
    return r


def _same(a, b) -> bool:
    return (a == b) or (isinstance(a, float) and math.isnan(a) and math.isnan(b))


def _cases(dtype):
    rng = np.random.default_rng(0)
    f = np.dtype(dtype).type
    for n in (1, 7, 8, 9, 31, 1000, 16384 + 3):
        e = rng.standard_normal(n).astype(dtype)
        yield f"rounding-{n}", e, (e + rng.standard_normal(n).astype(dtype) * f(1e-6))
        yield f"equal-{n}", e, e.copy()
        yield f"far-{n}", e, e + f(0.05) * rng.standard_normal(n).astype(dtype)
        yield f"large-{n}", e * f(1e4), (e * f(1e4) + f(0.5))
    e = rng.standard_normal(64).astype(dtype)
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0], dtype=dtype)
    for k, a in enumerate(specials):
        for j, b in enumerate(specials):
            x, y = e.copy(), e.copy()
            x[5], y[5] = a, b
            x[40], y[40] = x[40] + f(0.2), y[40]
            yield f"special-{k}-{j}", x, y
    big = np.finfo(dtype).max
    yield "overflow", np.array([big, 1.0] * 9, dtype=dtype), np.array([-big, 1.0] * 9, dtype=dtype)
    # differences exactly at the thresholds of h01 / h001 and of the tolerance
    x = np.zeros(24, dtype=dtype)
    y = x.copy()
    y[:4] = (0.1, 0.01, 1e-4, 2e-4)
    yield "thresholds", x, y
    yield "thresholds-neg", -y, x


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("atol,rtol", [(1e-4, 1e-4), (0.0, 0.0), (1e-7, 1e-7), (0.5, 0.0)])
def test_native_comparison_equals_the_numpy_one(dtype, atol, rtol, fused):
    for name, e, g in _cases(dtype):
        want = _numpy_diff(e, g, atol, rtol)
        got = _native_diff(e, g, atol, rtol, fused)
        for field in FIELDS + EXACT_MEASURES:
            assert _same(getattr(got, field), getattr(want, field)), (
                name,
                field,
                getattr(got, field),
                getattr(want, field),
            )
        for field in SUM_MEASURES:
            a, b = getattr(got, field), getattr(want, field)
            assert _same(a, b) or a == pytest.approx(b, rel=1e-12, abs=1e-12), (name, field, a, b)


def _rank_cases(dtype, n):
    """Pairs of n values whose |e - g| puts the quantiles' ranks everywhere the selection
    treats apart: among zeros (few values differ), among ties, in bin 0 (differences of
    subnormals), at +inf (NaN/inf that disagree, finite values whose difference
    overflows), across the histogram's bins."""
    rng = np.random.default_rng(n)
    f = np.dtype(dtype).type
    tiny = np.finfo(dtype).smallest_subnormal
    e = rng.standard_normal(n).astype(dtype)
    yield "rounding", e, (e * (1 + rng.standard_normal(n) * 1e-7)).astype(dtype)
    yield "equal", e, e.copy()
    g = e.copy()
    g[rng.integers(0, n, max(1, n // 50))] += f(1e-3)
    yield "few-differ", e, g
    g = e.copy()
    g[rng.integers(0, n, max(1, n // 3))] += f(1e-3)
    yield "a-third-differ", e, g
    q = np.round(e * 4).astype(dtype) / f(4)
    yield "ties", q, q + f(0.25) * rng.integers(-2, 3, n).astype(dtype)
    s = (rng.integers(0, 1000, n) * tiny).astype(dtype)
    yield "subnormal", s, (s + rng.integers(0, 3, n).astype(dtype) * tiny).astype(dtype)
    x, y = e.copy(), e + f(1e-4) * rng.standard_normal(n).astype(dtype)
    y[rng.integers(0, n, max(1, n // 10))] = np.nan
    x[rng.integers(0, n, max(1, n // 20))] = np.inf
    x[: min(n, 3)] = y[: min(n, 3)] = -np.inf  # the same infinity: no disagreement
    yield "non-finite", x, y
    big = np.finfo(dtype).max
    o = np.where(rng.random(n) < 0.5, big, 1).astype(dtype)
    yield "overflow", o, -o
    z, w = e.copy(), e + f(0.05) * rng.standard_normal(n).astype(dtype)
    z[::7], w[::7] = 0.0, -0.0
    yield "signed-zeros", z, w


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "n", [1, 2, 7, 8, 9, 17, 3071, 3072, 3073, 3080, 4096, 16384 + 3, (1 << 16) + 5]
)
def test_the_comparison_pass_selects_the_ranks_exactly(dtype, n):
    """compare(..., ranks): the order statistics from the keys its own pass kept, equal
    to a sort of |e - g| (numpy's partition of the keys of measures.abs_diff_keys) and to
    ranks(); its first eleven values those of compare() without them.  Sizes around the
    vector width (8) and the histogram's threshold (3072)."""
    order, _plan = measures.ranks(n)
    for name, e, g in _rank_cases(dtype, n):
        want = np.partition(measures.abs_diff_keys(e, g).reshape(-1), order)[list(order)]
        for atol, rtol in ((1e-4, 1e-4), (0.0, 0.0)):
            found = NATIVE.compare(e, g, atol, rtol, True, order)
            assert all(_same(a, b) for a, b in zip(found[:11], NATIVE.compare(e, g, atol, rtol)))
            assert len(found) == 11 + len(order)
            assert list(found[11:]) == [float(x) for x in want], (name, atol)
            assert NATIVE.ranks(e, g, order) == found[11:], name
            # six values without the measures, whatever ranks are asked for
            assert len(NATIVE.compare(e, g, atol, rtol, False, order)) == 6


def test_the_comparison_pass_refuses_ranks_it_cannot_take():
    a = np.zeros(8, dtype=np.float32)
    with pytest.raises(ValueError, match="ranks must ascend"):
        NATIVE.compare(a, a, 1e-4, 1e-4, True, (3, 8))
    with pytest.raises(ValueError, match="ranks must ascend"):
        NATIVE.compare(a, a, 1e-4, 1e-4, True, (4, 3))
    with pytest.raises(TypeError, match="at most 8 ranks"):
        NATIVE.compare(a, a, 1e-4, 1e-4, True, tuple(range(9)))
    with pytest.raises(TypeError, match="at most 8 ranks"):
        NATIVE.compare(a, a, 1e-4, 1e-4, True, [1, 2])


@pytest.mark.parametrize("n", [(1 << 22) - 1, (1 << 22) + 1])
def test_ranks_beyond_the_kept_keys_are_computed_again_alike(n):
    """Beyond SBS_KEPT (2^22) keys the comparison keeps none and its ranks come from a
    selection that computes the keys in each pass: the same order statistics."""
    rng = np.random.default_rng(3)
    e = rng.standard_normal(n).astype(np.float32)
    g = (e * (1 + rng.standard_normal(n) * 1e-7)).astype(np.float32)
    g[rng.integers(0, n, 50)] = np.nan
    order, _plan = measures.ranks(n)
    want = np.partition(measures.abs_diff_keys(e, g), order)[list(order)]
    assert list(NATIVE.compare(e, g, 1e-4, 1e-4, True, order)[11:]) == [float(x) for x in want]


def test_a_comparison_with_measures_makes_one_pass(monkeypatch):
    """diff.compare takes the quantiles from the comparison's own pass: no second call
    (ranks()) reads the values again, and the quantiles are numpy's."""
    monkeypatch.setattr(NATIVE, "ranks", None)  # a call would raise
    rng = np.random.default_rng(4)
    for n in (64, 5000, 20000):
        e = rng.standard_normal(n).astype(np.float32)
        g = (e * (1 + rng.standard_normal(n) * 1e-6)).astype(np.float32)
        d = diff.compare(torch.from_numpy(e), g)
        keys = measures.abs_diff_keys(e, g).astype(np.float64)
        assert d.err_p50 == float(np.quantile(keys, 0.5)), n
        assert d.err_p99 == pytest.approx(float(np.quantile(keys, 0.99)), rel=1e-15, abs=0)
        assert d.err_p50 > 0 and d.err_ulp > 0


def test_compare_takes_the_native_path_for_contiguous_floats(monkeypatch):
    calls = []
    real = NATIVE.compare
    monkeypatch.setattr(NATIVE, "compare", lambda *a: calls.append(1) or real(*a))
    e = torch.randn(32, 64)
    d = diff.compare(e, (e + 1e-3).numpy())
    assert calls and not d.passed and d.err_abs == pytest.approx(1e-3, rel=1e-3)
    # a dtype the library does not take: numpy, the same verdict
    calls.clear()
    h = diff.compare(e.half(), (e + 1e-3).half().numpy())
    assert not calls and h.err_abs is not None


@pytest.mark.parametrize("itemsize", [1, 2, 4, 8])
@pytest.mark.parametrize("shape", [(1, 1), (1, 70), (70, 1), (33, 65), (256, 96)])
def test_transposed_bytes(itemsize, shape):
    dtype = {1: np.uint8, 2: np.float16, 4: np.float32, 8: np.float64}[itemsize]
    rng = np.random.default_rng(1)
    a = (rng.standard_normal(shape) * 100).astype(dtype)
    b = np.ascontiguousarray(a.T)
    assert NATIVE.equal_transposed(a, b) is True
    for i, j in {(0, 0), (shape[0] - 1, shape[1] - 1), (shape[0] // 2, shape[1] // 3)}:
        c = b.copy()
        c[j, i] = c[j, i] + 1 if dtype is np.uint8 else -(c[j, i] + 1)
        assert NATIVE.equal_transposed(a, c) is False, (i, j)
    z = np.zeros((2, 2), dtype=np.complex128)  # 16-byte items: not handled
    assert NATIVE.equal_transposed(z, z.copy()) is None


@pytest.mark.parametrize("shape", [(8, 8), (16, 16), (24, 40), (40, 24), (33, 17), (80, 72)])
def test_transposed_float32_blocks_catch_a_change_at_every_position(shape):
    """4-byte items are compared in 8 x 8 blocks transposed in registers, tiles of 16 x
    16, strips of 8 and scalar edges: a change at any one position must be seen."""
    rng = np.random.default_rng(2)
    a = rng.standard_normal(shape).astype(np.float32)
    b = np.ascontiguousarray(a.T)
    assert NATIVE.equal_transposed(a, b) is True
    assert NATIVE.equal_transposed(b, a) is True
    for j, i in np.ndindex(*b.shape):
        c = b.copy()
        c[j, i] = np.nextafter(c[j, i], np.float32(np.inf))
        assert NATIVE.equal_transposed(a, c) is False, (i, j)


def test_a_transposed_weight_is_compared_natively_and_still_fails_when_it_differs():
    w = torch.randn(96, 40)  # a linear weight (out, in)
    twin = np.ascontiguousarray(w.numpy().T)  # the ONNX initializer (in, out)
    ok = diff.compare(w.t(), twin, constant=True)
    assert ok.passed and ok.err_abs == 0.0
    twin[3, 7] += 0.5
    bad = diff.compare(w.t(), twin, constant=True)
    assert not bad.passed and bad.err_abs == pytest.approx(0.5, rel=1e-3)
    # -0.0 against 0.0: other bytes, the same value
    z = torch.zeros(64, 64)
    zt = np.ascontiguousarray(-z.numpy().T)
    assert diff.compare(z.t(), zt).passed


def test_the_module_refuses_arrays_it_cannot_compare():
    """Arguments the C code cannot read are errors, never a read past an array's end."""
    a = np.zeros(8, dtype=np.float32)
    with pytest.raises(ValueError, match="differ in size"):
        NATIVE.compare(a, np.zeros(9, dtype=np.float32), 1e-4, 1e-4)
    with pytest.raises(ValueError, match="differ in size"):
        NATIVE.same_bytes(a, np.zeros(8, dtype=np.float64))
    with pytest.raises(TypeError, match="float32 or float64"):
        NATIVE.compare(a.view(np.int32), a.view(np.int32), 1e-4, 1e-4)
    with pytest.raises(TypeError, match="float32 or float64"):
        NATIVE.compare(a, a.view(np.int32), 1e-4, 1e-4)  # one float32, one int32
    with pytest.raises(ValueError, match="not C-contiguous"):
        NATIVE.compare(np.zeros((4, 4), np.float32).T, np.zeros((4, 4), np.float32), 0.0, 0.0)
    with pytest.raises(ValueError, match="2-D"):
        NATIVE.equal_transposed(a, a)


def test_same_bytes():
    a = np.arange(10000, dtype=np.float32)
    b = a.copy()
    assert NATIVE.same_bytes(a, b)
    b[-1] += 1
    assert not NATIVE.same_bytes(a, b)


def _hatch_build():
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(repo))
    try:
        import hatch_build
    finally:
        sys.path.remove(str(repo))
    return repo, hatch_build


def test_the_build_makes_a_module_this_interpreter_loads(tmp_path, monkeypatch, capsys):
    """hatch_build.build_native compiles the extension for the running interpreter, which
    native.load takes; without Python's headers it builds nothing and says why (the
    package then compares with numpy)."""
    import shutil

    from onnx_sbs_nb import native

    repo, hatch_build = _hatch_build()
    src = tmp_path / hatch_build.NATIVE_SOURCE
    src.parent.mkdir(parents=True)
    shutil.copy(repo / hatch_build.NATIVE_SOURCE, src)
    (src.parent / "_sbs_native.so").write_bytes(b"a ctypes library of an earlier version")
    built = hatch_build.build_native(tmp_path)
    assert built == tmp_path / hatch_build.native_library() and built.is_file()
    assert not (src.parent / "_sbs_native.so").exists()  # never loaded again
    module = native.load(built)
    assert module is not None and module.module.VERSION == native.VERSION
    e = np.linspace(-1, 1, 50, dtype=np.float32)
    assert module.compare(e, e + np.float32(1e-3), 1e-4, 1e-4) == NATIVE.compare(
        e, e + np.float32(1e-3), 1e-4, 1e-4
    )
    assert hatch_build.build_native(tmp_path) == built  # fresh: not built again
    built.unlink()
    no_headers = tmp_path / "include"
    no_headers.mkdir()
    real = hatch_build.sysconfig.get_paths
    monkeypatch.setattr(
        hatch_build.sysconfig, "get_paths", lambda *a: {**real(*a), "include": str(no_headers)}
    )
    assert hatch_build.build_native(tmp_path) is None
    assert "no Python.h" in capsys.readouterr().err


def _other_cpythons() -> list[str]:
    """CPython interpreters of a later minor version than this one, where installed
    (pyenv's shims left out: they fail for versions not selected)."""
    import glob
    import shutil
    import sys

    found = []
    for minor in range(sys.version_info[1] + 1, 20):
        pyenv = sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/3.{minor}*/bin/python")))
        exe = pyenv[0] if pyenv else shutil.which(f"python3.{minor}")
        if exe and "shims" not in exe:
            found.append(exe)
    return found


def test_the_module_is_built_for_the_stable_abi_and_loads_in_a_later_python(tmp_path):
    """One wheel per platform: on 3.11+ the module keeps to the stable ABI (abi3; the
    build defines Py_LIMITED_API, so anything else fails to compile), the wheel is tagged
    cp311-abi3-<platform>, and a later CPython loads the very same file."""
    import shutil
    import subprocess
    import sys

    repo, hatch_build = _hatch_build()
    if sys.version_info < (3, 11) or sys.platform == "win32":
        pytest.skip("the stable-ABI module is built from Python 3.11 on, not on Windows")
    src = tmp_path / hatch_build.NATIVE_SOURCE
    src.parent.mkdir(parents=True)
    shutil.copy(repo / hatch_build.NATIVE_SOURCE, src)
    stale = src.parent / "_sbs_native.cpython-311-x86_64-linux-gnu.so"
    stale.write_bytes(b"a module built for one interpreter only")
    built = hatch_build.build_native(tmp_path)
    assert built is not None and built.name == "_sbs_native.abi3.so"
    assert not stale.exists()  # import would have preferred it
    assert hatch_build.wheel_tag().startswith("cp311-abi3-")
    others = _other_cpythons()
    if not others:
        pytest.skip("no later CPython installed to load the abi3 module with")
    code = (
        "import array, importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('_sbs_native', {str(built)!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "e = array.array('f', [0.0, 0.5, 1.0]); g = array.array('f', [0.0, 0.5, 1.25])\n"
        "print(m.VERSION, m.compare(e, g, 1e-4, 1e-4))\n"
    )
    here = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert here.returncode == 0, here.stderr
    for exe in others:
        out = subprocess.run([exe, "-c", code], capture_output=True, text=True)
        assert out.returncode == 0, (exe, out.stderr)
        assert out.stdout == here.stdout, (exe, out.stdout, here.stdout)


def _sorted_keys(e: np.ndarray, g: np.ndarray) -> np.ndarray:
    """|e - g| as the C module keys it, sorted: 0 where both sides hold the same
    non-finite value, inf where they disagree."""
    with np.errstate(all="ignore"):
        d = np.abs(e - g)
    finite = np.isfinite(e) & np.isfinite(g)
    same = (e == g) | (np.isnan(e) & np.isnan(g))
    d = np.where(finite, d, np.where(same, 0, np.inf)).astype(e.dtype)
    return np.sort(d, kind="stable")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 7, 3072, 3073, 5000, 70_000])
@pytest.mark.parametrize("zeros", [0.0, 0.3, 0.6, 1.0])
def test_ranks_are_the_order_statistics_of_the_differences(dtype, n, zeros):
    """Every path of ``ranks`` (the small selection, the histogram, the zero keys counted
    instead of gathered, ranks in one bin and in several) against a sort."""
    _check_ranks(dtype, n, zeros)


def test_ranks_of_more_keys_than_the_module_keeps():
    """Beyond 2**22 keys the second pass computes them again instead of reading them."""
    _check_ranks(np.float32, (1 << 22) + 5, 0.6)


def _check_ranks(dtype, n, zeros):
    rng = np.random.default_rng(n + int(zeros * 10))
    e = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 3, n)).astype(dtype)
    g = (e + rng.standard_normal(n) * 1e-6 * np.abs(e)).astype(dtype)
    same = rng.random(n) < zeros
    g[same] = e[same]
    if n > 10:  # a NaN on both sides (0), an inf on one (inf), -0.0 against 0.0 (0)
        e[:3], g[:3] = (np.nan, np.inf, -0.0), (np.nan, 1.0, 0.0)
    keys = _sorted_keys(e, g)
    for picks in ([0], [n - 1], sorted({0, n // 2, n // 2, (99 * (n - 1)) // 100, n - 1})):
        wanted = tuple(picks)
        got = NATIVE.ranks(e, g, wanted)
        assert list(got) == [float(keys[r]) for r in wanted], (wanted, got)
    ranks, _ = measures.ranks(n)
    assert list(NATIVE.ranks(e, g, ranks)) == [float(keys[r]) for r in ranks]


def _layouts(dtype, rows, cols):
    """(torch value, ONNX value) pairs in the layouts a run meets: both in order, a
    transposed weight against its contiguous twin, a permuted attention head (rows in
    order, heads strided), the ONNX side strided."""
    rng = np.random.default_rng(rows * cols)
    e = rng.standard_normal((rows, cols)).astype(dtype)
    g = (e * (1 + rng.standard_normal((rows, cols)) * 1e-6)).astype(dtype)
    g[rng.integers(0, rows, 3), rng.integers(0, cols, 3)] = np.nan
    q = np.round(e * 4) / 4  # ties
    yield torch.from_numpy(e), g
    yield torch.from_numpy(q.astype(dtype)), (q + 0.25 * (rng.random(q.shape) < 0.3)).astype(dtype)
    yield torch.from_numpy(np.ascontiguousarray(e.T)).t(), g
    heads = torch.from_numpy(e).reshape(2, rows // 2, cols).permute(1, 0, 2)
    yield heads, np.ascontiguousarray(g.reshape(2, rows // 2, cols).transpose(1, 0, 2))
    yield torch.from_numpy(e), np.ascontiguousarray(g.T).T


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows,cols", [(2, 8), (48, 64), (64, 72), (128, 64), (256, 300)])
def test_diff_compare_equals_the_numpy_path_in_every_layout(dtype, rows, cols, monkeypatch):
    """diff.compare with the C module (its one pass and its ranks) against the same call
    on the numpy path, on values in order and out of it, around the histogram's
    threshold (3072 values) and the direct path's (65536)."""
    for e, g in _layouts(dtype, rows, cols):
        got = diff.compare(e, g)
        with monkeypatch.context() as m:
            m.setattr(diff, "NATIVE", None)
            want = diff.compare(e, g)
        for field in FIELDS + EXACT_MEASURES:
            assert _same(getattr(got, field), getattr(want, field)), (field, e.shape)
        for field in SUM_MEASURES:
            a, b = getattr(got, field), getattr(want, field)
            assert _same(a, b) or a == pytest.approx(b, rel=1e-12, abs=1e-12), (field, a, b)
