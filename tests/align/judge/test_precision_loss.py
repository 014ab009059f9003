"""Precision loss (align/judge/precision_loss.py): a node whose error is its inputs'
rounding to float16, amplified by the op (cos/sin of large arguments, a high power), is
reported as precision loss, never as the culprit; faults after it are still named.

Models built here with random weights, exported with the real exporter, converted with
onnxconverter-common's ``convert_float_to_float16(keep_io_types=True)``, run in
onnxruntime; faults planted in the converted graph.
"""

from __future__ import annotations

import copy
import math

import onnx
import pytest
import torch
from torch import nn

pytest.importorskip("onnxconverter_common")

from onnxconverter_common import float16  # noqa: E402

from onnx_sbs_nb import run_aligned  # noqa: E402
from onnx_sbs_nb.align.blame.summary import Summary, summarize  # noqa: E402
from onnx_sbs_nb.records import STATUS_PRECISION_LOSS  # noqa: E402

from ...models import export  # noqa: E402


class TimestepBlock(nn.Module):
    """A DiT block's conditioning: sinusoidal timestep embedding (cos/sin of t * freqs,
    t up to 999), its MLP, and adaLN modulation of the tokens."""

    def __init__(self, dim: int = 64, hidden: int = 32):
        super().__init__()
        self.dim = dim
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
        self.ada = nn.Linear(hidden, 2 * hidden)
        self.norm = nn.LayerNorm(hidden, elementwise_affine=False)
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x, t):
        half = self.dim // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)
        args = t[:, None] * freqs[None]
        c = self.mlp(torch.cat([torch.cos(args), torch.sin(args)], dim=-1))
        shift, scale = self.ada(nn.functional.silu(c)).chunk(2, dim=-1)
        h = self.norm(x) * (1 + scale[:, None]) + shift[:, None]
        return self.out(torch.relu(h)) + x


class RopeAttention(nn.Module):
    """Attention with rotary embeddings at positions 3000 and on (a long KV cache)."""

    def __init__(self, d: int = 32, heads: int = 2):
        super().__init__()
        self.h, self.dh = heads, d // heads
        self.qkv = nn.Linear(d, 3 * d)
        self.o = nn.Linear(d, d)
        inv = 1.0 / (10000 ** (torch.arange(0, self.dh, 2).float() / self.dh))
        self.register_buffer("inv", inv)

    def forward(self, x, pos):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.h, self.dh).transpose(1, 3).unbind(2)
        f = pos[:, None] * self.inv[None]
        emb = torch.cat([f, f], -1)
        cos, sin = emb.cos(), emb.sin()

        def rot(t):
            a, c = t.chunk(2, -1)
            return torch.cat([-c, a], -1)

        q = q * cos + rot(q) * sin
        k = k * cos + rot(k) * sin
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.dh), -1) @ v
        return self.o(a.transpose(1, 2).reshape(b, s, d))


class PowerGate(nn.Module):
    """A sharpened gate: sigmoid(.) ** 256 multiplies its input's relative rounding by
    256."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)
        self.c = nn.Linear(16, 8)

    def forward(self, x):
        g = torch.sigmoid(self.a(x) + 6.0) ** 256
        h = torch.relu(self.b(x)) * g + x
        return self.c(h * torch.sigmoid(h))


def _dit():
    torch.manual_seed(0)
    return TimestepBlock(), (torch.randn(2, 8, 32), torch.tensor([999.0, 517.0]))


def _rope():
    torch.manual_seed(0)
    return RopeAttention(), (torch.randn(1, 6, 32), torch.arange(3000, 3006).float())


def _pow():
    torch.manual_seed(0)
    return PowerGate(), (torch.randn(4, 16),)


# each model, and the op types that lose precision in it
MODELS = {"dit": (_dit, {"Cos", "Sin"}), "rope": (_rope, {"Cos", "Sin"}), "pow": (_pow, {"Pow"})}


_CACHE: dict[str, tuple] = {}


def _converted(name: str):
    """(program, float16 model, inputs, op types that lose precision) of model ``name``."""
    if name not in _CACHE:
        make, op = MODELS[name]
        model, args = make()
        ep, onx = export(model, args)
        half = float16.convert_float_to_float16(copy.deepcopy(onx), keep_io_types=True)
        _CACHE[name] = (ep, half, args, op)
    return _CACHE[name]


def _run(ep, model, args, own_error: bool):
    records = list(run_aligned(ep, model, args, own_error=own_error))
    return records, summarize(records, node_inputs=model)


# a planted fault: the op a node is changed to (its inputs and shapes unchanged)
_FAULTS = {"Add": "Sub", "Sub": "Add", "Mul": "Add", "Sigmoid": "Tanh", "Relu": "Abs"}


def _downstream(model: onnx.ModelProto, start: str) -> list[onnx.NodeProto]:
    """The nodes computed from node ``start``'s outputs, in the model's order."""
    reached = set(next(n for n in model.graph.node if n.name == start).output)
    after = []
    for n in model.graph.node:
        if any(i in reached for i in n.input):
            reached.update(n.output)
            after.append(n)
    return after


def _planted(model: onnx.ModelProto, loss_node: str) -> list[str]:
    """Three nodes after the precision-loss node to plant a fault in: the first, middle
    and last of those a fault can change."""
    can = [n.name for n in _downstream(model, loss_node) if n.op_type in _FAULTS]
    assert len(can) >= 3, can
    return [can[0], can[len(can) // 2], can[-1]]


def _with_fault(model: onnx.ModelProto, node: str) -> onnx.ModelProto:
    bad = copy.deepcopy(model)
    n = next(n for n in bad.graph.node if n.name == node)
    n.op_type = _FAULTS[n.op_type]
    return bad


def _losses(records) -> list:
    return [r for r in records if r.status == STATUS_PRECISION_LOSS]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_precision_loss_is_a_finding_not_the_culprit(name):
    ep, half, args, op = _converted(name)
    records, s = _run(ep, half, args, True)
    losses = _losses(records)
    assert losses and {r.onnx_op_type for r in losses} == op, [
        (r.onnx_name, r.status, r.err_abs2) for r in records if r.failed or r.passed2 is False
    ]
    for r in losses:
        assert r.decided_by == "precision_loss" and r.passed2 is False and not r.failed
        assert "precision loss: its inputs rounded to float16" in r.comment
    # faithful: no culprit, the losses listed apart, in the text and the dict; the
    # outputs may still differ by what the loss becomes there
    assert s.culprit is None, s.to_text()
    failing = [r for r in records if r.failed and not r.drifted]
    assert all(r.kind == "output" for r in failing), s.to_text()
    assert s.verdict == ("fail" if failing else "pass")
    if failing:
        assert "the loss reaches the outputs" in s.to_text()
    assert [r.onnx_name for r in s.precision_losses] == [r.onnx_name for r in losses]
    assert "precision loss: " in s.to_text() and s.totals["precision_loss"] == len(losses)
    back = Summary.from_dict(s.to_dict())
    assert [r.onnx_name for r in back.precision_losses] == [r.onnx_name for r in losses]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_without_own_errors_a_precision_loss_is_never_the_culprit(name):
    """The rule reruns the failing node itself: a loss is told apart in the default mode
    too (the values after it still fail; the summary says own errors tell them apart)."""
    ep, half, args, op = _converted(name)
    records, s = _run(ep, half, args, False)
    losses = {r.onnx_name for r in _losses(records)}
    # the values after it are rerun on torch's inputs (through their lowering's nodes
    # without a twin, up to the output's Cast): they drift, no false culprit
    assert s.culprit is None, s.to_text()
    # onnxruntime may run a stretch of float16 nodes in float32 (no failure to explain)
    assert losses or not any(r.failed and r.onnx_op_type in op for r in records)
    if losses and s.culprit is None and s.totals.get("failed_nodes"):
        assert "no rerun on torch's inputs told apart" in s.to_text()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_faults_after_a_precision_loss_are_named(name):
    ep, half, args, op = _converted(name)
    loss = next(n.name for n in half.graph.node if n.op_type in op)
    for node in _planted(half, loss):
        bad = _with_fault(half, node)
        for own_error in (True, False):
            records, s = _run(ep, bad, args, own_error)
            assert s.verdict == "fail" and s.culprit is not None, (node, s.to_text())
            # the planted node, or the lowering it belongs to (a SiLU's Sigmoid and Mul)
            assert node in s.culprit.onnx_nodes, (node, own_error, s.to_text())
            assert s.culprit.onnx_name not in {r.onnx_name for r in _losses(records)}


def test_a_wrong_op_that_loses_precision_too_is_the_culprit():
    """Cos changed to Sin (the same sensitivity to its argument's rounding): computed
    exactly on torch's inputs it still differs, so it is a fault, not precision loss."""
    ep, half, args, _ = _converted("dit")
    bad = copy.deepcopy(half)
    cos = next(n for n in bad.graph.node if n.op_type == "Cos")
    cos.op_type = "Sin"
    for own_error in (True, False):
        records, s = _run(ep, bad, args, own_error)
        assert s.culprit is not None and s.culprit.onnx_node == cos.name, s.to_text()
        assert cos.output[0] not in {r.onnx_name for r in _losses(records)}


def test_a_float32_export_has_no_precision_loss():
    """Nothing is rounded when the model computes in the program's precision: the rule
    never applies (the DiT block exported as is)."""
    ep, _, args, _ = _converted("dit")
    make, _ = MODELS["dit"]
    model, args = make()
    ep, onx = export(model, args)
    records, s = _run(ep, onx, args, True)
    assert not _losses(records) and s.verdict == "pass", s.to_text()


# ---------------------------------------------------------------- the advisor's model


class ExpTwoConsumers(nn.Module):
    """exp of large values read by a sum and a division (a softmax without its max)."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 8)

    def forward(self, x):
        e = torch.exp(self.fc1(x) * 4.0)
        s = e.sum(-1, keepdim=True)
        return self.fc2(e / s) + torch.log(s)


class FourthPower(nn.Module):
    """x ** 4 of values of ~100, read by a mean and a division."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 8)

    def forward(self, x):
        p = (self.fc1(x) * 30.0) ** 4
        m = p.mean(-1, keepdim=True)
        return self.fc2(p / m) + torch.sqrt(torch.sqrt(m))


class ExpAttention(nn.Module):
    """Softmax-free attention: exp of the scores, its product with v and its row sums."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(16, 16) for _ in range(4))

    def forward(self, x):
        w = torch.exp((self.q(x) @ self.k(x).transpose(-1, -2)) * 2.0)
        return self.o((w @ self.v(x)) / w.sum(-1, keepdim=True))


def _ort(model: onnx.ModelProto, feeds: dict) -> list:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _round_trips(model: onnx.ModelProto) -> list[str]:
    """Casts up reading a Cast down of a float32 value (rounded between two float32 nodes)."""
    f32, f16 = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16
    producer = {o: n for n in model.graph.node for o in n.output}
    cast = {n.name: n.attribute[0].i for n in model.graph.node if n.op_type == "Cast"}
    return [
        n.name
        for n in model.graph.node
        if cast.get(n.name) == f32
        and n.input[0] in producer
        and cast.get(producer[n.input[0]].name) == f16
    ]


@pytest.mark.parametrize("cls", [ExpTwoConsumers, FourthPower, ExpAttention])
def test_the_advised_model_runs_and_agrees(cls):
    """Values that overflow float16 feed several blocked nodes: the advised model keeps
    them in float32 between those nodes (no round trip through float16), agrees with the
    float32 model in the torch evaluator and in onnxruntime, with the overflowing nodes
    and their readers only."""
    from onnx_sbs_nb.align.precision_advisor import advise_precision
    from onnx_sbs_nb.align.precision_convert import convert_model

    torch.manual_seed(0)
    x = torch.randn(2, 6, 16) * 2
    ep, onx = export(cls().eval(), (x,))
    advice = advise_precision(ep, onx, (x,))
    assert advice.agrees, advice.to_text()
    assert advice.model is not None and not _round_trips(advice.model)
    assert len(advice.node_block_list) <= 4, advice.to_text()
    assert all(n.reason in ("overflow", "inputs_overflow") for n in advice.nodes)
    feeds = {onx.graph.input[0].name: x.numpy()}
    ref = _ort(onx, feeds)[0]
    got = _ort(advice.model, feeds)[0]
    plain = _ort(convert_model(onx, "float16"), feeds)[0]
    assert torch.isfinite(torch.from_numpy(got)).all()
    err = float(abs(got - ref).max())
    assert err <= max(2 * float(abs(plain - ref).max()), 1e-2), (err, advice.to_text())
    # minimal: without any one of its nodes, the conversion disagrees again, run as the
    # advisor runs it (the torch evaluator rounds each float16 node's result, where
    # onnxruntime's CPU computes a chain of them in float32)
    from onnx_sbs_nb.align.precision_advisor import _run_model

    for node in advice.node_block_list:
        fewer = [n for n in advice.node_block_list if n != node]
        out = _run_model(convert_model(onx, "float16", fewer), feeds, True)[0]
        assert not (abs(out - ref) <= 1e-2 + 1e-2 * abs(ref)).all(), (node, advice.to_text())


def test_the_advisor_lists_precision_losses():
    """The DiT block's cos/sin lose precision in float16: named as such, with the op."""
    from onnx_sbs_nb.align.precision_advisor import advise_precision

    make, _ = MODELS["dit"]
    model, args = make()
    ep, onx = export(model, args)
    advice = advise_precision(ep, onx, args)
    lost = {n.op_type for n in advice.nodes if n.reason == "precision_loss"}
    assert lost == {"Cos", "Sin"}, advice.to_text()
    assert "precision loss" in advice.to_text()


class OverflowingOutput(nn.Module):
    def forward(self, x):
        return torch.exp(x * 20.0) * 1e-3


def test_when_nothing_helps_the_advisor_says_why_and_which_op():
    """A float16 graph output (keep_io_types=False) whose values do not fit float16: no
    block list helps, and the advice says so, naming the output and its op."""
    from onnx_sbs_nb.align.precision_advisor import advise_precision

    torch.manual_seed(0)
    x = torch.randn(4, 8)
    ep, onx = export(OverflowingOutput(), (x,))
    advice = advise_precision(ep, onx, (x,), keep_io_types=False)
    assert not advice.agrees
    assert advice.unresolved and "keep_io_types=True" in advice.unresolved
    assert "(Cast)" in advice.unresolved or "(Mul)" in advice.unresolved
    assert "why it still disagrees" in advice.to_text()
    assert advice.to_dict()["unresolved"] == advice.unresolved
    from onnx_sbs_nb.reports.precision import advice_html

    assert "why it still disagrees" in advice_html(advice)


def test_reports_and_many_inputs_list_the_loss_apart():
    """The HTML report carries the summary's precision-loss line; over several inputs the
    loss stays a loss (the worst input's record), never the culprit."""
    from onnx_sbs_nb.reports.html import report_html

    ep, half, args, _ = _converted("dit")
    records, s = _run(ep, half, args, True)
    page = report_html(records, s, title="dit")
    assert "precision loss: " in page and "precision_loss" in page
    x, t = args
    inputs = [(x, t), (x, torch.tensor([801.0, 333.0])), (x, torch.tensor([640.0, 999.0]))]
    many = list(run_aligned(ep, half, inputs=inputs, own_error=True))
    s = summarize(many, node_inputs=half)
    assert s.culprit is None and _losses(many), s.to_text()
    assert all(r.inputs_total == 3 for r in _losses(many))
