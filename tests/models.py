"""Small models built in code (random weights) and their exports, shared by tests."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import onnx
import onnx.numpy_helper
import torch


def export(model: torch.nn.Module, args: tuple, dynamic_shapes=None):
    """(ExportedProgram, ModelProto) exported with the real exporter."""
    model = model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(model, args, dynamic_shapes=dynamic_shapes)
        onx = torch.onnx.export(ep, args, dynamo=True, verbose=False).model_proto
    return ep, onx


class Chain(torch.nn.Module):
    def forward(self, x):
        return torch.log(torch.exp(torch.abs(x)) + 1)


class MLP(torch.nn.Module):
    def __init__(self, d_in=8, hidden=16, d_out=4):
        super().__init__()
        self.fc1 = torch.nn.Linear(d_in, hidden)
        self.fc2 = torch.nn.Linear(hidden, hidden)
        self.fc3 = torch.nn.Linear(hidden, d_out)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def mlp_export():
    """The MLP on a (5, 8) input, seeded: (ExportedProgram, ModelProto, args)."""
    torch.manual_seed(0)
    x = torch.randn(5, 8)
    ep, onx = export(MLP(), (x,))
    return ep, onx, (x,)


class ShapeOps(torch.nn.Module):
    def forward(self, x):
        b, s, d = x.shape
        y = x.reshape(b, s, 2, d // 2).transpose(1, 2)
        y = y * 2 + 1
        return y.transpose(1, 2).reshape(b, s * d).sum(-1, keepdim=True)


class Attention(torch.nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)

        def split(t):
            return t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2)

        y = torch.nn.functional.scaled_dot_product_attention(split(q), split(k), split(v))
        return self.out(y.transpose(1, 2).reshape(b, s, d))


class CausalAttention(torch.nn.Module):
    """Attention with a causal mask, heads split with view/transpose."""

    def __init__(self, dim: int = 16, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, c))


class NonZero(torch.nn.Module):
    def forward(self, x):
        return torch.nonzero(x > 0).to(torch.float32).sum(0) + x.sum()


class Cond(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        def yes(x):
            return torch.sin(x) + 1

        def no(x):
            return torch.cos(x) - 1

        y = self.lin(x)
        return torch.cond(y.sum() > 0, yes, no, (y,)) * 2


class CloneMemoryFormat(torch.nn.Module):
    def forward(self, x):
        y = torch.nn.functional.gelu(x).clone(memory_format=torch.contiguous_format)
        return y * 3


class LlamaLogits(torch.nn.Module):
    """A transformers LlamaForCausalLM returning only logits (no cache objects)."""

    def __init__(self, config):
        super().__init__()
        from transformers import LlamaForCausalLM

        self.model = LlamaForCausalLM(config)

    def forward(self, input_ids):
        return self.model(input_ids, use_cache=False).logits


def tiny_llama_config(hidden=64, layers=2, intermediate=None, heads=4, kv_heads=2, vocab=128):
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=hidden,
        intermediate_size=intermediate or 2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        vocab_size=vocab,
        max_position_embeddings=256,
    )


@functools.lru_cache(maxsize=4)
def tiny_llama(hidden=64, layers=2, seq=12, intermediate=None):
    """(ep, onx, args) of a tiny Llama, exported once per process."""
    torch.manual_seed(0)
    model = LlamaLogits(tiny_llama_config(hidden, layers, intermediate)).eval()
    ids = torch.randint(0, 128, (1, seq))
    ep, onx = export(model, (ids,))
    return ep, onx, (ids,)


class Cancellation(torch.nn.Module):
    """A cancellation that amplifies one rounding a millionfold, then a contraction that
    brings the value back to its scale: the output is as exact as the first division."""

    def __init__(self, contract: bool = True):
        super().__init__()
        self.contract = contract

    def forward(self, x):
        y = x / 10
        z = (y - 0.1) * 1e6
        return z * 1e-6 + 0.1 if self.contract else z


def _division_as_product(onx: onnx.ModelProto) -> onnx.ModelProto:
    """The export with its Div by 10 computed as a Mul by 0.1 (the float32 constant): a
    rewrite as faithful as an exporter's, one rounding away on some elements."""
    out = onnx.ModelProto()
    out.CopyFrom(onx)
    g = out.graph
    div = next(n for n in g.node if n.op_type == "Div")
    tenth = div.output[0] + "_tenth"
    g.initializer.append(onnx.numpy_helper.from_array(np.array(0.1, dtype=np.float32), tenth))
    div.op_type = "Mul"
    div.input[1] = tenth
    return out


def cancellation_run(contract: bool, **options):
    """Records (own errors included) of Cancellation exported with its division rewritten
    as a product, and that model."""
    from onnx_sbs_nb.align.run import AlignedRun

    torch.manual_seed(0)
    x = 1 + 1e-4 * torch.randn(64)
    ep, onx = export(Cancellation(contract), (x,))
    onx = _division_as_product(onx)
    return list(AlignedRun(ep, onx, (x,), own_error=True, **options)), onx
