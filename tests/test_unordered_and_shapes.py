"""Results whose order the program leaves free (``topk(sorted=False)``: compared as sets,
the nodes after them continue from torch's order; align/judge/unordered.py)."""

from __future__ import annotations

import copy
import functools

import onnx
import torch

from onnx_sbs_nb.align.run import AlignedRun
from onnx_sbs_nb.summary import summarize

from .models import export

SETS = "order unspecified (sorted=False): compared as sets"
CONTINUES = SETS + "; the ONNX side continues from torch's order"


class _Router(torch.nn.Module):
    """DeepSeek-V3 style routing: sigmoid scores, the top k experts in no order, their
    weights normalised, the experts' outputs summed by weight (order-free)."""

    def __init__(self, d: int = 16, n_experts: int = 8, k: int = 3) -> None:
        super().__init__()
        self.gate = torch.nn.Linear(d, n_experts, bias=False)
        self.experts = torch.nn.Parameter(torch.randn(n_experts, d, d) * 0.1)
        self.k = k

    def forward(self, x):
        scores = self.gate(x).sigmoid()
        w, idx = torch.topk(scores, self.k, dim=-1, sorted=False)
        w = w / w.sum(-1, keepdim=True)
        y = torch.einsum("td,tkde->tke", x, self.experts[idx])
        return (y * w.unsqueeze(-1)).sum(1)


class _Sampler(torch.nn.Module):
    """A top-k selection as a sampler or beam search makes it: the k best tokens of each
    row, in no order, mixed into the next embedding by their probabilities."""

    def __init__(self, vocab: int = 50, d: int = 8, k: int = 5) -> None:
        super().__init__()
        self.head = torch.nn.Linear(d, vocab)
        self.embed = torch.nn.Embedding(vocab, d)
        self.k = k

    def forward(self, h):
        logp = self.head(h).log_softmax(-1)
        top, tokens = logp.topk(self.k, dim=-1, sorted=False)
        p = top.softmax(-1)
        return (self.embed(tokens) * p.unsqueeze(-1)).sum(-2), p.max(-1).values


@functools.cache
def _router():
    torch.manual_seed(0)
    x = torch.randn(32, 16)
    return (*export(_Router(), (x,)), (x,))


@functools.cache
def _sampler():
    torch.manual_seed(1)
    h = torch.randn(6, 8)
    return (*export(_Sampler(), (h,)), (h,))


def _topk(onx: onnx.ModelProto) -> onnx.NodeProto:
    (node,) = [n for n in onx.graph.node if n.op_type == "TopK"]
    return node


def _run(ep, onx, args, **kw):
    records = list(AlignedRun(ep, onx, args, runner="onnxruntime", own_error=True, **kw))
    return records, summarize(records, node_inputs=onx)


def test_unsorted_topk_is_compared_as_a_set_and_the_run_goes_on_from_torch_order():
    for make in (_router, _sampler):
        ep, onx, args = make()
        records, s = _run(ep, onx, args)
        node = _topk(onx)
        top = [r for r in records if r.onnx_name in node.output]
        assert len(top) == 2
        # the runtimes list the k elements in other orders here: the note says so
        assert all(CONTINUES in (r.comment or "") for r in top), [r.comment for r in top]
        assert all(r.passed and r.passed2 and r.reset for r in top)
        assert not [r for r in records if r.failed], [
            (r.onnx_name, r.err_abs) for r in records if r.failed
        ]
        assert s.culprit is None


def test_a_topk_that_selects_other_elements_is_still_named():
    for make in (_router, _sampler):
        ep, onx, args = make()
        bad = copy.deepcopy(onx)
        node = _topk(bad)
        (largest,) = [a for a in node.attribute if a.name == "largest"]
        largest.i = 0  # the k smallest
        records, s = _run(ep, bad, args)
        top = [r for r in records if r.onnx_name in node.output]
        assert all(r.failed and not r.reset for r in top)
        assert all(SETS in r.comment and CONTINUES not in r.comment for r in top)
        assert s.culprit is not None and s.culprit.onnx_name in node.output


def _planted(onx: onnx.ModelProto, op: str, to: str) -> tuple[onnx.ModelProto, str]:
    """``onx`` with its last ``op`` node made a ``to`` (a fault after the TopK)."""
    bad = copy.deepcopy(onx)
    node = [n for n in bad.graph.node if n.op_type == op][-1]
    node.op_type = to
    return bad, node.output[0]


def test_a_fault_after_an_unsorted_topk_is_named_not_the_topk():
    for make, op in ((_router, "Mul"), (_sampler, "Mul")):
        ep, onx, args = make()
        bad, out = _planted(onx, op, "Sub")
        records, s = _run(ep, bad, args)
        assert s.culprit is not None and s.culprit.onnx_name == out, s.culprit
        node = _topk(bad)
        assert not [r for r in records if r.onnx_name in node.output and r.failed]


class _SortedRouter(_Router):
    def forward(self, x):
        scores = self.gate(x).sigmoid()
        w, idx = torch.topk(scores, self.k, dim=-1)
        y = torch.einsum("td,tkde->tke", x, self.experts[idx])
        return (y * w.unsqueeze(-1)).sum(1)


def test_only_a_program_that_leaves_the_order_free_is_compared_as_sets():
    # sorted=True: the order is the program's own; the model must keep it
    from onnx_sbs_nb.align.judge.unordered import order_free_groups

    x = torch.randn(4, 16)
    for model, free in ((_Router(), True), (_SortedRouter(), False)):
        ep, onx = export(model, (x,))
        run = AlignedRun(ep, onx, (x,), runner="onnxruntime")
        groups = order_free_groups(
            run.candidate.nodes,
            run.reference,
            {o: p.fx_name for o, p in run.pairing.by_onnx.items()},
        )
        node = _topk(onx)
        assert bool(groups) is free
        if free:
            assert set(groups) == set(node.output) and groups[node.output[0]].key == node.output[1]
