"""A corpus of quantized ONNX models against their float torch programs (issue 51):
four architectures, each exported with the real exporter and quantized by onnxruntime's
own tools, and the faults a broken quantization plants.

- ``cnn``: convolutions, a residual, a pooling and a linear head;
- ``encoder``: a tiny transformers ``BertModel`` (embeddings, LayerNorm, attention, GELU);
- ``decoder``: a tiny transformers ``LlamaForCausalLM`` (RMSNorm, rotary, grouped-query
  attention, SwiGLU), no cache;
- ``diffusion``: a UNet ResBlock as diffusion models build it (GroupNorm, SiLU, Conv2d,
  a timestep embedding added) and a self-attention over the spatial positions.

The quantizations (:func:`quantized`): ``dynamic`` (``quantize_dynamic``: MatMulInteger /
ConvInteger with activations quantized at run time), ``static`` (``quantize_static``, QDQ,
per-channel weights, calibrated on 8 seeded inputs) and ``int4`` (weight-only int4 blocks,
``MatMulNBitsQuantizer``: MatMulNBits, of the decoder only).  Everything built in code
with random weights, exported and quantized once per session.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import tempfile
import warnings
from collections.abc import Callable

import numpy as np
import onnx
import onnx.numpy_helper
import torch
from torch import nn

from ..quant_models import ort_quantize

os.environ.setdefault("HF_HUB_OFFLINE", "1")

N_CALIBRATION = 8


# --------------------------------------------------------------------------- architectures


class CNN(nn.Module):
    """Conv -> ReLU -> Conv + residual -> ReLU -> MaxPool -> Linear."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1)
        self.c3 = nn.Conv2d(8, 16, 3, padding=1, stride=2)
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        x = torch.relu(self.c1(x))
        x = torch.relu(self.c2(x) + x)
        x = torch.relu(self.c3(x))
        return self.fc(x.flatten(1))


class Encoder(nn.Module):
    """A tiny BertModel's last hidden state (two layers, hidden 32)."""

    def __init__(self):
        super().__init__()
        from transformers import BertConfig, BertModel

        cfg = BertConfig(
            vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=32,
        )  # fmt: skip
        self.bert = BertModel(cfg, add_pooling_layer=False)

    def forward(self, input_ids):
        return self.bert(input_ids=input_ids).last_hidden_state


class Decoder(nn.Module):
    """A tiny LlamaForCausalLM's logits, no cache (two layers, hidden 32)."""

    def __init__(self):
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
            use_cache=False,
        )  # fmt: skip
        self.lm = LlamaForCausalLM(cfg)

    def forward(self, input_ids):
        return self.lm(input_ids=input_ids, use_cache=False).logits


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """The sinusoidal embedding of diffusion timesteps (DDPM's)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / half)
    args = t[:, None].float() * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class DiffusionBlock(nn.Module):
    """A UNet ResBlock (GroupNorm, SiLU, Conv2d, the timestep embedding added, a 1x1
    shortcut) followed by a self-attention block over the H·W spatial positions."""

    def __init__(self, c_in: int = 8, c: int = 16, t_dim: int = 16):
        super().__init__()
        self.t_dim = t_dim
        self.t_mlp = nn.Sequential(nn.Linear(t_dim, 32), nn.SiLU(), nn.Linear(32, c))
        self.norm1, self.conv1 = nn.GroupNorm(4, c_in), nn.Conv2d(c_in, c, 3, padding=1)
        self.norm2, self.conv2 = nn.GroupNorm(4, c), nn.Conv2d(c, c, 3, padding=1)
        self.skip = nn.Conv2d(c_in, c, 1)
        self.norm_a = nn.GroupNorm(4, c)
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)

    def forward(self, x, t):
        emb = self.t_mlp(timestep_embedding(t, self.t_dim))
        h = self.conv1(nn.functional.silu(self.norm1(x)))
        h = h + emb[:, :, None, None]
        h = self.conv2(nn.functional.silu(self.norm2(h)))
        h = h + self.skip(x)
        b, c, hh, ww = h.shape
        seq = self.norm_a(h).flatten(2).transpose(1, 2)  # (b, hw, c)
        q, k, v = self.qkv(seq).chunk(3, dim=-1)
        att = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(c), dim=-1)
        out = self.proj(att @ v).transpose(1, 2).reshape(b, c, hh, ww)
        return h + out


ARCHS: dict[str, Callable[[], nn.Module]] = {
    "cnn": CNN,
    "encoder": Encoder,
    "decoder": Decoder,
    "diffusion": DiffusionBlock,
}


def inputs(arch: str, k: int = 0) -> tuple[torch.Tensor, ...]:
    """The ``k``-th seeded input of ``arch``: 0 is the one compared, all 8 calibrate."""
    g = torch.Generator().manual_seed(100 + k)
    if arch == "cnn":
        return (torch.randn(2, 3, 8, 8, generator=g),)
    if arch in ("encoder", "decoder"):
        return (torch.randint(0, 64, (2, 8), generator=g),)
    x = torch.randn(2, 8, 4, 4, generator=g)
    return x, torch.randint(0, 1000, (2,), generator=g).float()


def _trained_norms(model: nn.Module) -> nn.Module:
    """Norm weights and biases away from their initial 1 and 0, as training leaves them:
    a LayerNorm of weight 1 and bias 0 gives rows that sum to zero, on which a weight
    zero point that is off shifts nothing a dynamic quantization's MatMulInteger
    computes."""
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower():
                base = 1.0 if name.endswith("weight") else 0.0
                p.copy_(base + 0.2 * torch.randn(p.shape, generator=g))
    return model


@functools.cache
def exported(arch: str) -> tuple[torch.export.ExportedProgram, onnx.ModelProto]:
    """(program, float ONNX model) of ``arch``, seeded random weights, exported once."""
    torch.manual_seed(0)
    model = _trained_norms(ARCHS[arch]()).eval()
    args = inputs(arch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.no_grad():
            ep = torch.export.export(model, args)
            onx = torch.onnx.export(ep, args, dynamo=True, verbose=False).model_proto
    return ep, onx


# --------------------------------------------------------------------------- quantizations

MODES = ("dynamic", "static", "int4")


def _feeds(arch: str, onx: onnx.ModelProto) -> list[dict[str, np.ndarray]]:
    names = [i.name for i in onx.graph.input]
    return [{n: a.numpy() for n, a in zip(names, inputs(arch, k))} for k in range(N_CALIBRATION)]


@functools.cache
def quantized(arch: str, mode: str) -> onnx.ModelProto:
    """onnxruntime's own quantization of ``arch``'s float export (module docstring)."""

    _, onx = exported(arch)
    logging.getLogger("onnxruntime.quantization").setLevel(logging.WARNING)
    if mode == "int4":
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        model = onnx.ModelProto()
        model.CopyFrom(onx)
        quantizer = MatMulNBitsQuantizer(model, block_size=16, is_symmetric=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quantizer.process()
        return quantizer.model.model
    with tempfile.TemporaryDirectory() as tmp:
        return ort_quantize(onx, tmp, "float", mode, _feeds(arch, onx))


# --------------------------------------------------------------------------- planted faults


def _init(onx: onnx.ModelProto, name: str) -> np.ndarray:
    return next(onnx.numpy_helper.to_array(i) for i in onx.graph.initializer if i.name == name)


def _new_init(onx: onnx.ModelProto, name: str, value: np.ndarray) -> str:
    onx.graph.initializer.append(onnx.numpy_helper.from_array(value, name))
    return name


def _middle(nodes: list[onnx.NodeProto]) -> onnx.NodeProto:
    """The node halfway down the list: a fault deep enough to have paired values around."""
    assert nodes, "no node to plant the fault in"
    return nodes[len(nodes) // 2]


def _is_init(onx: onnx.ModelProto, name: str) -> bool:
    return any(i.name == name for i in onx.graph.initializer)


def plant_scale_x2(onx: onnx.ModelProto) -> str:
    """A weight's DequantizeLinear (QDQ) scales doubled; MatMulNBits' block scales in
    int4."""
    nbits = [n for n in onx.graph.node if n.op_type == "MatMulNBits"]
    if nbits:
        node = _middle(nbits)
        node.input[2] = _new_init(onx, "planted_scale", _init(onx, node.input[2]) * 2)
        return node.name
    dqs = [
        n
        for n in onx.graph.node
        if n.op_type == "DequantizeLinear"
        and _is_init(onx, n.input[0])
        and _init(onx, n.input[0]).ndim >= 2
    ]
    node = _middle(dqs)
    node.input[1] = _new_init(onx, "planted_scale", _init(onx, node.input[1]) * 2)
    return node.name


def _shifted(zp: np.ndarray) -> np.ndarray:
    """``zp`` 10 steps up (down where that would leave the integer type's range)."""
    info = np.iinfo(zp.dtype)
    moved = np.clip(zp.astype(np.int32) + 10, info.min, info.max)
    if np.array_equal(moved, zp):
        moved = zp.astype(np.int32) - 10
    return moved.astype(zp.dtype)


def plant_zero_point(onx: onnx.ModelProto) -> str:
    """An activation's DequantizeLinear (its input computed, not a constant) reads a zero
    point 10 steps off, its own copy (the QuantizeLinear before it keeps the right one);
    in a dynamic quantization, where activations' zero points are computed at run time,
    a MatMulInteger's or ConvInteger's weight zero point."""
    integer = [
        n
        for n in onx.graph.node
        if n.op_type in ("MatMulInteger", "ConvInteger")
        and len(n.input) > 3
        and _is_init(onx, n.input[3])
    ]
    if integer and not any(n.op_type == "QuantizeLinear" for n in onx.graph.node):
        node = _middle(integer)
        node.input[3] = _new_init(onx, "planted_zp", _shifted(_init(onx, node.input[3])))
        return node.name
    dqs = [
        n
        for n in onx.graph.node
        if n.op_type == "DequantizeLinear"
        and not _is_init(onx, n.input[0])
        and len(n.input) > 2
        and _is_init(onx, n.input[2])
    ]
    node = _middle(dqs)
    node.input[2] = _new_init(onx, "planted_zp", _shifted(_init(onx, node.input[2])))
    return node.name


def _constant_values(onx: onnx.ModelProto) -> set[str]:
    """The values computed from initializers and constants alone."""
    const = {i.name for i in onx.graph.initializer}
    for n in onx.graph.node:
        if all(i in const for i in n.input if i):
            const.update(n.output)
    return const


def plant_sub(onx: onnx.ModelProto) -> str:
    """An Add of two computed values (a residual, the timestep embedding added) halfway
    down the graph computes Sub; an Add of a constant (an epsilon, a bias) can be too
    small a change to tell from the noise."""
    const = _constant_values(onx)
    adds = [
        n for n in onx.graph.node if n.op_type == "Add" and not any(i in const for i in n.input)
    ]
    node = _middle(adds)
    node.op_type = "Sub"
    return node.name


PLANTS: dict[str, Callable[[onnx.ModelProto], str]] = {
    "scale_x2": plant_scale_x2,
    "zero_point": plant_zero_point,
    "sub": plant_sub,
}


def planted(arch: str, mode: str, fault: str) -> tuple[onnx.ModelProto, str]:
    """A copy of ``quantized(arch, mode)`` with ``fault`` planted, and the planted node."""
    onx = onnx.ModelProto()
    onx.CopyFrom(quantized(arch, mode))
    return onx, PLANTS[fault](onx)


def upstream_nodes(onx: onnx.ModelProto, value: str, stop: set[str]) -> set[str]:
    """The nodes computing ``value`` from values in ``stop`` (the paired values its rerun
    starts from) or initializers: the lowering the rerun covers."""
    producer = {o: n for n in onx.graph.node for o in n.output}
    found, todo = set(), [value]
    while todo:
        v = todo.pop()
        n = producer.get(v)
        if n is None or n.name in found:
            continue
        found.add(n.name)
        todo.extend(i for i in n.input if i and i not in stop)
    return found


__all__ = [
    "upstream_nodes",
    "ARCHS",
    "MODES",
    "PLANTS",
    "exported",
    "inputs",
    "planted",
    "quantized",
    "timestep_embedding",
]
