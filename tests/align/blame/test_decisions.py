"""A decision (TopK, ArgMax) whose indices a tie or a near tie flipped is named as the
origin of the divergence, not as an export fault; a real fault before an ArgMax is still
the culprit (align/judge/decisions.py, align/blame/decisions.py)."""

from __future__ import annotations

import onnx
import torch

from onnx_sbs_nb.align.blame.summary import summarize
from onnx_sbs_nb.align.blame.text import drift_text, failing_text
from onnx_sbs_nb.align.run import AlignedRun
from onnx_sbs_nb.records import (
    KIND_NODE,
    KIND_OUTPUT,
    NEAR_TIE_NOTE,
    STATUS_FAIL,
    STATUS_OK,
    STATUS_PRECISION_LOSS,
    TIE_NOTE,
    Record,
)

from ...models import export

# what the summary must not say where nothing before the failing values fails
INHERITED = ("only inherit their error", "carried from upstream")


class MoE(torch.nn.Module):
    """Top-2 routing with (idx == e) masks; a zero router ties every expert."""

    def __init__(self, experts: int = 4, d: int = 8) -> None:
        super().__init__()
        self.r = torch.nn.Linear(d, experts)
        self.ex = torch.nn.ModuleList([torch.nn.Linear(d, d) for _ in range(experts)])
        with torch.no_grad():
            self.r.weight.zero_()
            self.r.bias.zero_()

    def forward(self, x):
        w, idx = torch.topk(torch.softmax(self.r(x), -1), 2, -1)
        out = torch.zeros_like(x)
        for e, ex in enumerate(self.ex):
            out = out + (w * (idx == e).to(x.dtype)).sum(-1, keepdim=True) * ex(x)
        return out


class Greedy(torch.nn.Module):
    """An argmax over logits picks an embedding row."""

    def __init__(self, vocab: int = 50, d: int = 16) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(d, 64)
        self.fc2 = torch.nn.Linear(64, vocab)
        self.emb = torch.nn.Embedding(vocab, d)

    def forward(self, x):
        logits = self.fc2(torch.tanh(self.fc1(x)))
        return self.emb(logits.argmax(-1)) + x


def _greedy(near_tie: bool) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    m = Greedy().eval()
    if near_tie:  # classes 3 and 7 score within float32 rounding of each other
        with torch.no_grad():
            m.fc2.weight[7] = m.fc2.weight[3] * (1 + 3e-7)
            m.fc2.bias[3] = 20
            m.fc2.bias[7] = 20
    return m, torch.randn(512, 16)


def _run(model: torch.nn.Module, x: torch.Tensor, onx: onnx.ModelProto | None = None):
    ep, exported = export(model, (x,))
    onx = onx if onx is not None else exported
    records = list(AlignedRun(ep, onx, (x,), runner="onnxruntime", own_error=True))
    return records, summarize(records, node_inputs=onx), onx


def test_a_topk_tie_broken_the_other_way_is_the_origin_not_a_fault():
    torch.manual_seed(0)
    records, s, _ = _run(MoE(), torch.randn(6, 8))
    (idx,) = [r for r in records if r.onnx_op_type == "TopK" and r.err_abs]
    assert idx.status == STATUS_OK and TIE_NOTE in idx.comment
    assert "on 6 of 6 rows" in idx.comment and "ONNX takes the lower index" in idx.comment
    assert [r for r in records if r.failed], "the tie should change the experts run"
    text = s.to_text()
    # the export is faithful: no culprit, and the verdict does not count the flip
    assert s.culprit is None and s.verdict == "pass", text
    assert [r.onnx_name for r in s.decision_flips] == [idx.onnx_name]
    assert "origin: topk" in text and "the model is unstable on these inputs" in text
    assert "only carry a flipped decision" in text
    assert not any(words in text for words in INHERITED), text
    back = type(s).from_dict(s.to_dict())
    assert [r.onnx_name for r in back.decision_flips] == [idx.onnx_name]


def test_an_argmax_near_tie_flipped_by_rounding_is_the_origin_not_a_fault():
    m, x = _greedy(near_tie=True)
    records, s, _ = _run(m, x)
    (arg,) = [r for r in records if r.onnx_op_type == "ArgMax" and r.kind == KIND_NODE]
    (logits,) = [r for r in records if r.ep_name == "linear_1"]
    assert logits.status == STATUS_OK, "the logits agree within tolerance"
    assert arg.status == STATUS_PRECISION_LOSS and arg.comment.startswith(NEAR_TIE_NOTE)
    assert arg.decided_by == "near_tie" and "rows" in arg.comment
    text = s.to_text()
    assert s.culprit is None and s.verdict == "pass", text
    assert "origin: argmax" in text and "no fault of the export" in text
    # a flipped decision is no precision loss to keep in float32
    assert not s.precision_losses and "precision loss:" not in text
    assert not any(words in text for words in INHERITED), text


def test_a_fault_that_flips_an_argmax_is_still_the_culprit():
    m, x = _greedy(near_tie=False)
    _, onx = export(m, (x,))
    bad = onnx.ModelProto()
    bad.CopyFrom(onx)
    (gemm,) = [n for n in bad.graph.node if n.op_type == "Gemm" and "fc2.bias" in n.input]
    # a planted fault in the node: its bias counted 40 times, the argmax flips on it
    kept = [a for a in gemm.attribute if a.name != "beta"]
    del gemm.attribute[:]
    gemm.attribute.extend([*kept, onnx.helper.make_attribute("beta", 40.0)])
    records, s, _ = _run(m, x, bad)
    (arg,) = [r for r in records if r.onnx_op_type == "ArgMax" and r.kind == KIND_NODE]
    assert arg.status == STATUS_FAIL and NEAR_TIE_NOTE not in (arg.comment or "")
    assert s.verdict == "fail" and not s.decision_flips
    assert s.culprit is not None and s.culprit.ep_name == "linear_1", s.to_text()
    assert "it makes the error" in s.culprit.why


def _node(name: str, step: int, err: float, passed2: bool | None, **kw) -> Record:
    return Record(
        onnx_name=name,
        ep_name=name,
        onnx_op_type="Add",
        step=step,
        err_abs=err,
        err_abs2=0.0 if passed2 else None,
        passed=err <= 1e-4,
        passed2=passed2,
        status=STATUS_OK if err <= 1e-4 else STATUS_FAIL,
        atol=1e-4,
        rtol=1e-4,
        **kw,
    )


def test_the_summary_never_says_inherited_with_nothing_failing_before():
    records = [
        _node("a", 0, 1e-6, True),
        _node("b", 1, 0.5, True),
        _node("b", 2, 0.5, True, kind=KIND_OUTPUT),
    ]
    text = summarize(records).to_text()
    assert not any(words in text for words in INHERITED), text
    assert "no value before them fails" in text
    # with a failing value before them, the words stay
    assert failing_text(3, 2) == "3 failing, of which 2 only inherit their error"
    assert "carried from upstream" in drift_text(2, "fail")
    assert "carried from upstream" not in drift_text(2, "fail", carried="none")
