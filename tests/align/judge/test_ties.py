"""TopK indices among tied values: judged by the values they select (align/judge/ties.py)."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import torch

from onnx_sbs_nb.align.judge.ties import TIE_NOTE, same_choice, tie_axes
from onnx_sbs_nb.align.run import AlignedRun

from ...models import export

TIES = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0, 0.0], [2.0, 2.0, 2.0, 1.0, 1.0, 5.0]])


class _TopIndices(torch.nn.Module):
    def forward(self, x):
        top = torch.topk(x.exp(), 3, dim=1)
        return top.indices, top.values


def test_indices_that_differ_among_ties_pass_with_a_note_first_run_and_rerun():
    ep, onx = export(_TopIndices(), (TIES,))
    records = list(AlignedRun(ep, onx, (TIES,), runner="onnxruntime", own_error=True))
    (idx,) = [
        r for r in records if r.onnx_op_type == "TopK" and r.ep_shape_type.startswith("int64")
    ]
    assert idx.err_abs > 0, "the runtimes should order the ties differently here"
    assert idx.passed and idx.passed2 and idx.status == "ok" and idx.comment.count(TIE_NOTE) == 1
    assert not [r for r in records if r.failed]


def test_indices_that_select_other_values_still_fail():
    ep, onx = export(_TopIndices(), (TIES,))
    bad = copy.deepcopy(onx)
    (node,) = [n for n in bad.graph.node if n.op_type == "TopK"]
    node.attribute.append(onnx.helper.make_attribute("largest", 0))  # the smallest three
    records = list(AlignedRun(ep, bad, (TIES,), runner="onnxruntime"))
    (idx,) = [r for r in records if r.onnx_name == node.output[1]]
    assert idx.failed and TIE_NOTE not in (idx.comment or "")


def test_same_choice_reads_values_and_refuses_a_repeated_index():
    x = np.array([[1.0, 3.0, 3.0, 2.0]])
    assert same_choice(x, np.array([[1, 2]]), np.array([[2, 1]]), -1)
    assert same_choice(x, np.array([[1, 3]]), np.array([[2, 3]]), 1)  # 3, 2 both
    assert not same_choice(x, np.array([[1, 2]]), np.array([[1, 1]]), 1)  # 3.0 twice
    assert not same_choice(x, np.array([[1, 0]]), np.array([[2, 3]]), 1)  # 3, 1 vs 3, 2
    assert not same_choice(x, np.array([[1, 2]]), np.array([[2, 4]]), 1)  # out of range
    nodes = [
        onnx.helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=0),
        onnx.helper.make_node("TopK", ["x", "k"], ["w", ""]),
        onnx.helper.make_node("TopK", ["x", "k"], ["u"]),
    ]
    assert tie_axes(nodes) == {0: 0}
