"""Results whose order the program leaves free (``topk(sorted=False)``: compared as sets,
the nodes after them continue from torch's order; align/judge/unordered.py), and a wrong
shape made by a node without metadata (an optimizer's), blamed where it starts
(shape_origin.py)."""

from __future__ import annotations

import copy
import functools

import numpy as np
import onnx
import torch

from onnx_sbs_nb.align.blame.summary import summarize
from onnx_sbs_nb.align.run import AlignedRun
from onnx_sbs_nb.align.two_models import run_aligned_onnx

from ...models import export

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


def test_an_onnx_reference_that_leaves_the_order_free_is_compared_as_sets():
    # the model against itself with its TopK sorted: the reference's sorted=0 order is free
    _, onx, args = _router()
    b = copy.deepcopy(onx)
    (flag,) = [a for a in _topk(b).attribute if a.name == "sorted"]
    flag.i = 1
    records = list(run_aligned_onnx(onx, b, args, runner="onnxruntime"))
    top = [r for r in records if r.onnx_op_type == "TopK"]
    note = "order unspecified (sorted=0): compared as sets; the ONNX side continues from "
    assert len(top) == 2 and all(note + "the reference model's order" in r.comment for r in top)
    assert not [r for r in records if r.failed]


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


class _GroupLimitedGate(torch.nn.Module):
    """DeepSeek-V3's gate: experts in groups, the best groups chosen in no order, then the
    top k experts of those in no order (only the indices used), weights gathered."""

    def __init__(self, d=16, n=16, groups=4, topk_group=2, k=4) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n, d) * 0.3)
        self.bias = torch.nn.Parameter(torch.randn(n) * 0.01)
        self.experts = torch.nn.Parameter(torch.randn(n, d, d) * 0.1)
        self.g, self.tg, self.k = groups, topk_group, k

    def forward(self, x):
        t = x.shape[0]
        scores = torch.nn.functional.linear(x, self.weight).sigmoid()
        s = scores + self.bias
        groups = s.view(t, self.g, -1).topk(2, dim=-1)[0].sum(dim=-1)
        chosen = groups.topk(self.tg, dim=-1, sorted=False)[1]
        mask = torch.ones_like(groups).scatter_(1, chosen, 0.0).bool()
        s = s.view(t, self.g, -1).masked_fill(mask.unsqueeze(-1), float("-inf")).flatten(1)
        idx = torch.topk(s, self.k, dim=-1, sorted=False)[1]
        w = scores.gather(1, idx)
        w = w / w.sum(-1, keepdim=True)
        y = torch.einsum("td,tkde->tke", x, self.experts[idx])
        return (y * w.unsqueeze(-1)).sum(1)


def test_group_limited_routing_passes_and_a_fault_in_its_weighted_sum_is_named():
    torch.manual_seed(0)
    x = torch.randn(64, 16)
    ep, onx = export(_GroupLimitedGate(), (x,))
    records, s = _run(ep, onx, (x,))
    unsorted = [r for r in records if CONTINUES in (r.comment or "")]
    assert len(unsorted) == 2 and all(r.reset for r in unsorted)  # both unsorted TopKs
    assert s.culprit is None and not [r for r in records if r.failed]
    bad, out = _planted(onx, "Mul", "Sub")
    _, s = _run(ep, bad, (x,))
    assert s.culprit.onnx_name == out


# ---------------------------------------------------------------- where a wrong shape starts


class _DetectHead(torch.nn.Module):
    """A detection head: 840 anchors split 500/340 (boxes, then the rest)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(6, 6)

    def forward(self, x):
        boxes, rest = torch.split(self.proj(x), 500, dim=1)
        return boxes.sigmoid(), rest * 2


class _QKSplit(torch.nn.Module):
    """Queries and keys of unequal widths split from one projection."""

    def __init__(self) -> None:
        super().__init__()
        self.qk = torch.nn.Linear(8, 16)

    def forward(self, x):
        q, k = torch.split(self.qk(x), [12, 4], dim=-1)
        return q.relu() + 1, k.exp()


def _as_an_optimizer_leaves_it(onx: onnx.ModelProto, sizes: list[int] | int) -> onnx.ModelProto:
    """The model's Split rewritten into ``sizes`` (equal parts, as ``num_outputs`` makes
    them; an int: ``num_outputs`` itself) by a tool that keeps no exporter metadata and
    names its values anew."""
    bad = copy.deepcopy(onx)
    g = bad.graph
    (node,) = [n for n in g.node if n.op_type == "Split"]
    if isinstance(sizes, int):
        del node.input[1:]
        node.attribute.append(onnx.helper.make_attribute("num_outputs", sizes))
    else:
        (t,) = [i for i in g.initializer if i.name == node.input[1]]
        t.CopyFrom(onnx.numpy_helper.from_array(np.array(sizes, dtype=np.int64), t.name))
    del node.metadata_props[:]
    node.name = "Split_opt"
    for k, old in enumerate(list(node.output)):
        new = f"opt_split_{k}"
        for n in g.node:
            n.input[:] = [new if i == old else i for i in n.input]
            n.output[:] = [new if o == old else o for o in n.output]
        for v in [v for v in g.value_info if v.name == old]:
            g.value_info.remove(v)
    onnx.checker.check_model(bad)
    return bad


def test_a_wrong_split_without_metadata_is_blamed_not_the_node_after_it():
    cases = (
        # Split(num_outputs=2) makes 420/420 of 840 rows
        (_DetectHead(), torch.randn(1, 840, 6), 2, [420, 420], "420", ("500", "340"), "no torch"),
        # 2x3x8 is the input's shape too: only not the torch value the Split's output is
        (_QKSplit(), torch.randn(2, 3, 8), [8, 8], [8, 8], "8", ("12", "4"), "torch twin's"),
    )
    for model, x, rewrite, equal, wrong, program, said in cases:
        ep, onx = export(model, (x,))
        bad = _as_an_optimizer_leaves_it(onx, rewrite)
        records, s = _run(ep, bad, (x,))
        c = s.culprit
        assert c is not None and c.onnx_node == "Split_opt", c
        assert c.rule == "shape_origin"
        assert "matched" in c.why and "only carries it on" in c.why
        assert wrong in c.why and all(p in c.why for p in program), c.why
        assert said in c.why

        # the exporter's Split, paired by name, with the wrong sizes: the Split itself
        _wrong_shape_of_its_own_node_is_blamed_on_it(ep, onx, x, equal)


def _wrong_shape_of_its_own_node_is_blamed_on_it(ep, onx, x, sizes):
    bad = copy.deepcopy(onx)
    (node,) = [n for n in bad.graph.node if n.op_type == "Split"]
    (t,) = [i for i in bad.graph.initializer if i.name == node.input[1]]
    t.CopyFrom(onnx.numpy_helper.from_array(np.array(sizes, dtype=np.int64), t.name))
    _, s = _run(ep, bad, (x,))
    assert s.culprit.onnx_node == node.name and s.culprit.rule == "rerun"


class _GroupedQKV(torch.nn.Module):
    """Grouped-query attention: q, k, v split 16/8/8 from one projection, then in heads."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(16, 32)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = torch.split(self.qkv(x), [16, 8, 8], dim=-1)
        q = q.reshape(b, s, 4, 4).transpose(1, 2)
        k = k.reshape(b, s, 2, 4).transpose(1, 2).repeat_interleave(2, dim=1)
        v = v.reshape(b, s, 2, 4).transpose(1, 2).repeat_interleave(2, dim=1)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return y.transpose(1, 2).reshape(b, s, 16)


def test_a_node_failing_on_a_wrong_split_blames_the_split_and_a_failing_reshape_itself():
    x = torch.randn(2, 5, 16)
    ep, onx = export(_GroupedQKV(), (x,))
    # the optimizer's equal thirds (11/11/10): the Reshape into heads cannot run on them
    _, s = _run(ep, _as_an_optimizer_leaves_it(onx, [11, 11, 10]), (x,))
    c = s.culprit
    assert c.onnx_node == "Split_opt" and c.rule == "shape_origin", c
    assert "float32[2x5x11] matches no torch value" in c.why and "fails to run on it" in c.why
    # a Reshape of the attention's own lowering given a wrong target: that Reshape, not
    # the node making its input (an intermediate of the lowering, no torch value's shape)
    for node in [n for n in onx.graph.node if n.op_type == "Reshape"][-3:-1]:
        bad = copy.deepcopy(onx)
        (t,) = [i for i in bad.graph.initializer if i.name == node.input[1]]
        target = onnx.numpy_helper.to_array(t).copy()
        target[-1] = 3
        t.CopyFrom(onnx.numpy_helper.from_array(target, t.name))
        _, s = _run(ep, bad, (x,))
        assert s.culprit.onnx_node == node.name and s.culprit.rule == "error", s.culprit
