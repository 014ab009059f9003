"""Generation parity on decoders whose cache is plain tensors (``past_keys``/``past_values``
in, the grown keys/values out) and on decoders without a cache: each side must feed its
own outputs back (trial 3, finding 02: the first cache was rerun at every step and a
position-table fault past position 12 passed as "PASS over 20 steps")."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from torch import nn

from onnx_sbs_nb import generation_parity
from onnx_sbs_nb.align.generation import next_step_inputs
from onnx_sbs_nb.errors import SbsInputError

V, D, H, L, PAST = 40, 16, 2, 2, 5


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(D)
        self.qkv = nn.Linear(D, 3 * D)
        self.o = nn.Linear(D, D)

    def forward(self, x, pk, pv):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln(x)).split(D, -1)
        q, k, v = (a.reshape(b, t, H, D // H).transpose(1, 2) for a in (q, k, v))
        k, v = torch.cat([pk, k], 2), torch.cat([pv, v], 2)
        a = nn.functional.scaled_dot_product_attention(q, k, v)
        return x + self.o(a.transpose(1, 2).reshape(b, t, D)), k, v


class _TensorCacheGPT(nn.Module):
    """Learned positions, a cache of stacked tensors: (logits, keys, values)."""

    def __init__(self) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(64, D)
        self.blocks = nn.ModuleList([_Block() for _ in range(L)])
        self.head = nn.Linear(D, V, bias=False)

    def forward(self, input_ids, past_keys, past_values):
        p = past_keys.shape[3]
        x = self.wte(input_ids) + self.wpe(torch.arange(p, p + input_ids.shape[1]).unsqueeze(0))
        ks, vs = [], []
        for i, blk in enumerate(self.blocks):
            x, k, v = blk(x, past_keys[i], past_values[i])
            ks.append(k)
            vs.append(v)
        return self.head(x), torch.stack(ks), torch.stack(vs)


def _broken_positions(model: onnx.ModelProto, start: int) -> onnx.ModelProto:
    """The position table's rows from ``start`` on changed: a fault only a decode that
    reaches position ``start`` meets."""
    model = copy.deepcopy(model)
    for init in model.graph.initializer:
        if "wpe" in init.name:
            a = numpy_helper.to_array(init).copy()
            a[start:] += np.random.RandomState(0).randn(*a[start:].shape).astype(np.float32)
            init.CopyFrom(numpy_helper.from_array(a, init.name))
    return model


@pytest.fixture(scope="module")
def tensor_cache_export():
    torch.manual_seed(0)
    m = _TensorCacheGPT().eval()
    kwargs = {
        "input_ids": torch.randint(0, V, (1, 1)),
        "past_keys": torch.randn(L, 1, H, PAST, D // H),
        "past_values": torch.randn(L, 1, H, PAST, D // H),
    }
    dyn = {
        "input_ids": None,
        "past_keys": {3: torch.export.Dim.DYNAMIC},
        "past_values": {3: torch.export.Dim.DYNAMIC},
    }
    ep = torch.export.export(m, (), kwargs=kwargs, dynamic_shapes=dyn)
    onx = torch.onnx.export(ep, (), kwargs=kwargs, dynamic_shapes=dyn, dynamo=True)
    return m, ep, onx.model_proto, kwargs


def _greedy_by_hand(m: nn.Module, kwargs: dict, steps: int) -> list[int]:
    out, kw = [], dict(kwargs)
    with torch.no_grad():
        for _ in range(steps):
            logits, k, v = m(**kw)
            tok = logits[:, -1].argmax(-1)
            out.append(int(tok))
            kw = {"input_ids": tok.reshape(1, 1), "past_keys": k, "past_values": v}
    return out


def test_tensor_cache_is_fed_back(tensor_cache_export):
    m, ep, model, kwargs = tensor_cache_export
    parity = generation_parity(ep, model, kwargs, steps=10)
    assert parity.verdict == "pass", parity.to_text()
    assert [t[0] for t in parity.torch_tokens] == _greedy_by_hand(m, kwargs, 10)
    # the cache each side wrote was compared at every step
    assert all(s.cache_err_abs is not None for s in parity.steps)


def test_fault_past_the_first_cache_is_found(tensor_cache_export):
    _, ep, model, kwargs = tensor_cache_export
    start = PAST + 4  # the decode reaches it at step 4
    parity = generation_parity(ep, _broken_positions(model, start), kwargs, steps=10)
    assert parity.verdict == "fail"
    assert parity.diverged_at == start - PAST, parity.to_text()
    assert "wpe" in parity.to_text()


class _NoCache(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(64, D)
        self.head = nn.Linear(D, V)

    def forward(self, input_ids):
        pos = torch.arange(input_ids.shape[1]).unsqueeze(0)
        return self.head(torch.tanh(self.wte(input_ids) + self.wpe(pos)))


def test_decoder_without_cache_reads_the_whole_sequence():
    torch.manual_seed(1)
    m = _NoCache().eval()
    ids = torch.randint(0, V, (1, 3))
    dyn = {"input_ids": {1: torch.export.Dim.DYNAMIC}}
    ep = torch.export.export(m, (), kwargs={"input_ids": ids}, dynamic_shapes=dyn)
    model = torch.onnx.export(
        ep, (), kwargs={"input_ids": ids}, dynamic_shapes=dyn, dynamo=True
    ).model_proto
    want, seq = [], ids
    with torch.no_grad():
        for _ in range(6):
            tok = m(seq)[:, -1].argmax(-1, keepdim=True)
            want.append(int(tok))
            seq = torch.cat([seq, tok], 1)
    parity = generation_parity(ep, model, {"input_ids": ids}, steps=6)
    assert [t[0] for t in parity.torch_tokens] == want
    assert parity.verdict == "pass"
    # step k reads positions 0..k+2: a fault from position 6 on is met at step 4
    broken = generation_parity(ep, _broken_positions(model, 6), {"input_ids": ids}, steps=6)
    assert broken.diverged_at == 4, broken.to_text()


def test_a_cache_input_nothing_feeds_is_refused():
    kwargs = {"input_ids": torch.zeros(1, 1, dtype=torch.long), "past_keys": torch.zeros(2, 3)}
    with pytest.raises(SbsInputError, match="past_keys.*next_inputs"):
        next_step_inputs(kwargs, torch.tensor([1]), (torch.zeros(2, 3, 7),))


class _CacheFirst(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte, self.head = nn.Embedding(V, D), nn.Linear(D, V)

    def forward(self, input_ids, past):
        x = self.wte(input_ids)
        return torch.cat([past, x.unsqueeze(1)], 2), self.head(x)


def test_a_program_returning_the_cache_first_is_refused_clearly():
    """(cache, logits) instead of (logits, cache): a clear error, not an IndexError deep
    in the greedy step (trial 4, finding 11)."""
    kwargs = {"input_ids": torch.zeros(1, 1, dtype=torch.long), "past": torch.randn(1, 1, 3, D)}
    dyn = {"input_ids": None, "past": {2: torch.export.Dim.DYNAMIC}}
    ep = torch.export.export(_CacheFirst().eval(), (), kwargs=kwargs, dynamic_shapes=dyn)
    model = torch.onnx.export(ep, (), kwargs=kwargs, dynamic_shapes=dyn, dynamo=True).model_proto
    with pytest.raises(SbsInputError, match=r"logits \(\[batch, seq, vocab\]\) as the first"):
        generation_parity(ep, model, kwargs, steps=2)
