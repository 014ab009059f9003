"""The own error's extra facts (largest element error, zero sign mismatches): the numpy
path CPU float32/float64 values take against the torch path every other value takes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from onnx_sbs_nb.compare import value_facts as vf


def _pairs(dtype):
    rng = np.random.default_rng(3)
    e = (rng.standard_normal(500) * 10.0 ** rng.integers(-40, 3, 500)).astype(dtype)
    g = (e * (1 + rng.standard_normal(500) * 1e-5)).astype(dtype)
    e[:6] = (np.nan, np.inf, 0.0, -0.0, np.finfo(dtype).tiny / 4, 1.0)
    g[:6] = (np.nan, np.inf, -0.0, -0.0, 0.0, np.inf)
    yield e, g  # every edge: non-finite, signed zeros, a subnormal, an infinite got
    yield e[6:], g[6:]  # finite values only
    yield e[2:5], g[2:5]  # no normal expected value: None
    yield e[:0], g[:0]  # empty
    yield e.copy(), e.copy()  # equal bits


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_numpy_path_gives_the_torch_paths_facts(dtype, monkeypatch):
    cases = list(_pairs(dtype))
    assert all(vf._numpy_float_pair(e, g) is not None for e, g in cases)
    fast = [(vf.largest_element_error(e, g), vf.zero_sign_mismatches(e, g)) for e, g in cases]
    fast_torch = [
        (
            vf.largest_element_error(torch.from_numpy(e), g),
            vf.zero_sign_mismatches(torch.from_numpy(e), g),
        )
        for e, g in cases
    ]
    monkeypatch.setattr(vf, "_numpy_float_pair", lambda e, g: None)
    slow = [(vf.largest_element_error(e, g), vf.zero_sign_mismatches(e, g)) for e, g in cases]
    assert fast == slow == fast_torch
    assert slow[0][1] == 1 and slow[2][0] is None and slow[3] == (None, 0)
    assert slow[1][0] is not None and slow[1][0] > 0


def test_zero_signs_counted_when_the_bytes_differ_only_there():
    e = np.array([0.0, -0.0, 1.0, 0.0], dtype=np.float32)
    g = np.array([-0.0, 0.0, 1.0, 0.0], dtype=np.float32)
    assert vf.zero_sign_mismatches(e, g) == 2
    assert vf.zero_sign_mismatches(e, e.copy()) == 0


def test_largest_magnitude_of_a_cpu_tensor_is_torchs():
    t = torch.tensor([1.5, -3.25, 2.0])
    assert vf.largest_magnitude(t) == float(t.abs().max().double()) == 3.25
    assert np.isnan(vf.largest_magnitude(torch.tensor([1.0, float("nan")])))
    assert vf.largest_magnitude(torch.tensor([1.0, -2.0], dtype=torch.bfloat16)) == 2.0
    assert vf.largest_magnitude(torch.zeros(0)) is None
