"""The evidence of a near tie (align/judge/decisions.py): every flipped row's two choices
no further apart in torch's input than the inputs differ there, within tolerance."""

from __future__ import annotations

import numpy as np

from onnx_sbs_nb.align.judge.decisions import near_tie


def test_near_tie_needs_the_gap_within_the_inputs_difference_and_tolerance():
    x_t = np.array([[1.0, 2.0, 2.0 + 1e-6], [0.0, 5.0, 1.0]], dtype=np.float32)
    x_o = x_t.copy()
    x_o[0, 1] += 2e-6  # within tolerance: the ONNX side now puts column 1 first
    e, g = np.array([2, 1]), np.array([1, 1])
    tie = near_tie(x_t, x_o, e, g, 1, False, 1e-5, 1e-4)
    assert tie is not None and (tie.rows, tie.total) == (1, 2)
    assert near_tie(x_t, None, e, g, 1, False, 1e-5, 1e-4) is not None  # tolerance bounds it
    assert near_tie(x_t, x_o, e, e, 1, False, 1e-5, 1e-4) is None  # nothing flipped
    far = x_o.copy()
    far[0, 1] += 1.0  # the input is off beyond tolerance: an error upstream, no tie
    assert near_tie(x_t, far, e, g, 1, False, 1e-5, 1e-4) is None
    apart = np.array([[1.0, 2.0, 2.5], [0.0, 5.0, 1.0]], dtype=np.float32)
    assert near_tie(apart, None, e, g, 1, False, 1e-5, 1e-4) is None  # no near tie


def test_near_tie_reads_indices_that_keep_the_axis():
    x_t = np.array([[3.0, 3.0, 1.0], [0.0, 1.0, 2.0]], dtype=np.float32)
    e, g = np.array([[0], [2]]), np.array([[1], [2]])  # ArgMax with keepdims: a tie
    tie = near_tie(x_t, x_t, e, g, -1, True, 1e-5, 1e-4)
    assert tie is not None and tie.gap == 0 and (tie.rows, tie.total) == (1, 2)
    assert "equal in torch's input (a tie)" in tie.note("ArgMax")
