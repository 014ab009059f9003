"""Issue 52: inputs that torch's own module and onnxruntime both run are compared, not
refused.  torch gives a dynamic dimension the lower bound 2 by convention (its 0/1
specialization) and ``ep.module()`` runs 1 and 0 there all the same: batch 1, one new
token and an empty past are compared, through the API, many inputs, the CLI and the
widget, and a fault is still named there.  What the program really guards is refused,
naming the guard and the line that made it, exactly where torch refuses."""

from __future__ import annotations

import copy
import functools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from onnx_sbs_nb import aligned_over_inputs, run_aligned, summarize
from onnx_sbs_nb.errors import SbsInputError
from tests.models import export

Dim = torch.export.Dim


class _Decoder(torch.nn.Module):
    """One attention step over a past: the concat, the softmax over the grown length and
    the mean over the sequence read every size that can be 0 or 1."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.q = torch.nn.Linear(d, d)
        self.norm = torch.nn.LayerNorm(d)

    def forward(self, x, past):
        h = self.q(x)
        k = torch.cat([past, h], 1)
        a = torch.softmax(h @ k.transpose(1, 2) / 8**0.5, -1)
        out = self.norm(a @ k + x)
        return torch.tanh(out.mean(1, keepdim=True) + out), k


_EXPORT_ARGS = (torch.randn(2, 3, 8), torch.randn(2, 4, 8))


def _shapes(kind: str) -> dict:
    if kind == "named":
        batch, seq, past = Dim("batch", min=1, max=8), Dim("seq", min=1), Dim("past", min=0)
        return {"x": {0: batch, 1: seq}, "past": {0: batch, 1: past}}
    d = Dim.DYNAMIC if kind == "dynamic" else Dim.AUTO
    return {"x": {0: d, 1: d}, "past": {0: d, 1: d}}


@functools.lru_cache(maxsize=3)
def _exported(kind: str) -> tuple:
    torch.manual_seed(0)
    ep, onx = export(_Decoder(), _EXPORT_ARGS, dynamic_shapes=_shapes(kind))
    return kind, ep, onx


@pytest.fixture(params=["dynamic", "auto", "named"])
def decoder(request):
    return _exported(request.param)


# batch 1, one new token, an empty past; and one token over a past of one
_SMALL = [
    (torch.randn(1, 1, 8), torch.randn(1, 0, 8)),
    (torch.randn(1, 1, 8), torch.randn(1, 1, 8)),
    (torch.randn(1, 5, 8), torch.randn(1, 0, 8)),
]


def _onnxruntime(onx: onnx.ModelProto, args: tuple) -> list[np.ndarray]:
    sess = ort.InferenceSession(onx.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    return sess.run(None, {n: a.numpy() for n, a in zip(names, args)})


def test_batch_1_one_token_and_an_empty_past_are_compared(decoder):
    kind, ep, onx = decoder
    for args in _SMALL:
        # both sides run it, and agree: the program's graph is right at these sizes
        expected = ep.module()(*args)
        got = _onnxruntime(onx, args)
        for e, g in zip(expected, got):
            np.testing.assert_allclose(e.detach().numpy(), g, atol=1e-5)
        s = summarize(list(run_aligned(ep, onx, args)))
        assert s.verdict == "pass", (kind, [a.shape for a in args], s.to_text())
        assert s.coverage.torch_compared == s.coverage.torch_nodes, s.coverage.to_text()


def test_a_fault_is_named_at_batch_1_and_sequence_1(decoder):
    kind, ep, onx = decoder
    bad = copy.deepcopy(onx)
    node = next(n for n in bad.graph.node if n.op_type == "Tanh")
    node.op_type = "Sigmoid"
    s = summarize(list(run_aligned(ep, bad, _SMALL[1])), node_inputs=bad)
    assert s.verdict == "fail" and s.culprit is not None, (kind, s.to_text())
    assert s.culprit.ep_user_name == "tanh", s.to_text()


def test_many_inputs_of_sizes_0_1_and_more_are_compared_together(decoder):
    kind, ep, onx = decoder
    inputs = [*_SMALL, (torch.randn(3, 2, 8), torch.randn(3, 6, 8))]
    run = aligned_over_inputs(ep, onx, inputs)
    s = summarize(list(run))
    assert s.verdict == "pass", (kind, s.to_text())
    assert not run.failing_inputs


class _Branch(torch.nn.Module):
    """A real guard: the program computes the long branch only."""

    def forward(self, x):
        if x.shape[0] > 4:
            return x * 2
        return x + 1


class _Longer(torch.nn.Module):
    """A guard between two inputs, no range: x longer than y."""

    def forward(self, x, y):
        if x.shape[0] > y.shape[0]:
            return x[: y.shape[0]] * y
        return x * 2


class _Shifted(torch.nn.Module):
    """A derived dimension: x has one row more than y (s1 = s0 + 1)."""

    def forward(self, x, y):
        return x[1:] + y


def _refusal(ep, onx, args) -> str:
    """The run's refusal, checked against torch's own module: it refuses too."""
    with pytest.raises(Exception):  # noqa: B017 (torch raises AssertionError or RuntimeError)
        ep.module()(*args)
    with pytest.raises(SbsInputError) as e:
        run_aligned(ep, onx, args)
    return str(e.value)


def test_a_real_guard_is_refused_naming_the_line_that_made_it():
    ep, onx = export(_Branch(), (torch.randn(6, 4),), dynamic_shapes={"x": {0: Dim.DYNAMIC}})
    text = _refusal(ep, onx, (torch.randn(1, 4),))
    assert "exported for ([5, int_oo])" in text, text  # no name given: no symbol shown
    assert "test_dynamic_sizes.py" in text and "in forward" in text, text
    list(run_aligned(ep, onx, (torch.randn(5, 4),)))  # the guard holds: it runs


def test_a_minimum_given_in_dynamic_shapes_is_refused_below_it():
    ds = {"x": {0: Dim("b", min=3, max=8)}, "past": {0: Dim("b", min=3, max=8)}}
    ep, onx = export(_Decoder(), (torch.randn(3, 3, 8), torch.randn(3, 4, 8)), dynamic_shapes=ds)
    text = _refusal(ep, onx, (torch.randn(2, 3, 8), torch.randn(2, 4, 8)))
    # the dimension under the user's name, not torch's symbol (trial 5, finding 04)
    assert "(b in [3, 8])" in text and "dynamic_shapes given to the export" in text, text
    text = _refusal(ep, onx, (torch.randn(9, 3, 8), torch.randn(9, 4, 8)))
    assert "(b in [3, 8])" in text, text


def test_a_range_of_a_loaded_program_names_no_line_of_torch(tmp_path):
    """A ``.pt2`` keeps the ranges, not their origins: its deserializer's line is torch's
    code, not where the bound comes from (trial 5, finding 04)."""
    ds = {"x": {0: Dim("b", min=3, max=8)}, "past": {0: Dim("b", min=3, max=8)}}
    ep, onx = export(_Decoder(), (torch.randn(3, 3, 8), torch.randn(3, 4, 8)), dynamic_shapes=ds)
    torch.export.save(ep, tmp_path / "m.pt2")
    loaded = torch.export.load(tmp_path / "m.pt2")
    text = _refusal(loaded, onx, (torch.randn(9, 3, 8), torch.randn(9, 4, 8)))
    assert "exported for ([3, 8])" in text and "the ranges the program was saved with" in text
    assert "serialize.py" not in text and "_process_sym_expr" not in text, text


def test_a_guard_between_inputs_is_refused_where_torch_refuses_it():
    ds = {"x": {0: Dim.DYNAMIC}, "y": {0: Dim.DYNAMIC}}
    ep, onx = export(_Longer(), (torch.randn(3, 4), torch.randn(2, 4)), dynamic_shapes=ds)
    # sizes in range, the guard between them broken: named with its line
    text = _refusal(ep, onx, (torch.randn(4, 4), torch.randn(4, 4)))
    assert "guard" in text and "L['x'].size()[0]" in text, text
    assert "test_dynamic_sizes.py" in text, text
    # y of size 1 holds every guard: compared
    s = summarize(list(run_aligned(ep, onx, (torch.randn(5, 4), torch.randn(1, 4)))))
    assert s.verdict == "pass", s.to_text()


def test_a_derived_dimension_is_refused_only_where_torch_refuses_it():
    ds = {"x": {0: Dim.DYNAMIC}, "y": {0: Dim.DYNAMIC}}
    ep, onx = export(_Shifted(), (torch.randn(5, 4), torch.randn(4, 4)), dynamic_shapes=ds)
    text = _refusal(ep, onx, (torch.randn(3, 4), torch.randn(1, 4)))
    assert "requires them equal" in text or "related" in text, text
    s = summarize(list(run_aligned(ep, onx, (torch.randn(4, 4), torch.randn(3, 4)))))
    assert s.verdict == "pass", s.to_text()


def test_the_cli_compares_batch_1(tmp_path, capsys):
    from onnx_sbs_nb.cli.main import EXIT_PASS, main

    _, ep, onx = _exported("dynamic")
    torch.export.save(ep, str(tmp_path / "m.pt2"))
    onnx.save(onx, str(tmp_path / "m.onnx"))
    torch.save(_SMALL[0], str(tmp_path / "in.pt"))
    args = ["run", "--ep", str(tmp_path / "m.pt2"), "--onnx", str(tmp_path / "m.onnx")]
    code = main([*args, "--inputs", str(tmp_path / "in.pt"), "-o", str(tmp_path / "r.csv")])
    out = capsys.readouterr().out
    assert code == EXIT_PASS and "verdict: PASS" in out, out


def test_the_widget_compares_batch_1():
    from onnx_sbs_nb.notebook.widget import SbsWidget

    _, ep, onx = _exported("auto")
    w = SbsWidget(ep, onx, _SMALL[0], batch_interval=0)
    assert w.records and w.session.state == "finished", w.status
    assert w.summary.verdict == "pass", w.summary.to_text()


@pytest.mark.parametrize(
    "hostile",
    [
        "2 ** 2 ** 64 > L['x'].size()[0]",  # hours of big-integer arithmetic
        "len('a' * 10 ** 11) > 0",  # names len: refused by the vetting
        "L['x'].size()[0] < 'aaaa' * 99999999999",  # 400 GB of string
        "L['x'].size()[0] < 1 << 10 ** 9",  # a 125 MB integer, then worse
        "L['x'].size()[0] < 99999999999999999999999999 ** 8",
    ],
)
def test_a_guard_from_a_file_is_evaluated_only_where_its_cost_is_bounded(hostile):
    # guards come from the .pt2 (untrusted): the engine evaluates those it vetted; one
    # whose arithmetic could take the machine's time or memory is left to torch's module
    from onnx_sbs_nb.align.source.guards import check_input_shapes

    ep = torch.export.export(
        _Branch(), (torch.randn(6, 4),), dynamic_shapes={"x": {0: Dim.DYNAMIC}}
    )
    ep._guards_code = [hostile]
    user = [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    x = torch.randn(5, 4)
    check_input_shapes(ep, {user[0]: x}, user)  # returns at once, refusing nothing
