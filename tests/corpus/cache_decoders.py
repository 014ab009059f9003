"""Decoders taking the cache types transformers ships as the ``past_key_values``
keyword, returning logits and the grown cache (issue 46, item 4).

Built from small configs with random weights.  The caches are pytrees through
transformers' own export helper (``register_cache_pytrees_for_model``, which its
``DynamoExporter`` calls): without it torch.export refuses a cache object ("Cannot
associate shape ... to non-tensor type DynamicCache").  Each case exports with static
shapes or with dynamic batch / sequence / past dims (``Dim.DYNAMIC``, or ``Dim.AUTO``).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

Dim = torch.export.Dim


class CacheDecoder(torch.nn.Module):
    """``model(..., past_key_values=cache, use_cache=True)``: the logits and the cache."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, past_key_values):
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            past_key_values=past_key_values,
            use_cache=True,
        )
        return out.logits, out.past_key_values


class StaticCacheDecoder(torch.nn.Module):
    """A static cache is written at ``cache_position``; it keeps its length."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, cache_position, past_key_values):
        out = self.model(
            input_ids=input_ids,
            cache_position=cache_position,
            past_key_values=past_key_values,
            use_cache=True,
        )
        return out.logits, out.past_key_values


class Seq2SeqCacheDecoder(torch.nn.Module):
    """An encoder-decoder (BART) whose cache holds self- and cross-attention caches."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, decoder_input_ids, past_key_values):
        out = self.model(
            input_ids=input_ids,
            decoder_input_ids=decoder_input_ids,
            past_key_values=past_key_values,
            use_cache=True,
        )
        return out.logits, out.past_key_values


@dataclass
class CacheCase:
    name: str
    what: str
    build: Callable[[], tuple[torch.nn.Module, Callable[..., dict[str, Any]]]]
    # dynamic_shapes for a dimension kind (Dim.DYNAMIC or Dim.AUTO)
    shapes: Callable[[Any, dict[str, Any]], dict[str, Any]]
    sizes: tuple[int, int, int] = (2, 3, 5)  # batch, new tokens, past length


def _llama_config(**kw):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, **kw,
    )  # fmt: skip


def _register(model: torch.nn.Module) -> None:
    from transformers.exporters.exporter_dynamo import register_cache_pytrees_for_model

    register_cache_pytrees_for_model(model)


def _filled(cache: Any, config: Any, batch: int, past: int, seed: int = 1) -> Any:
    g = torch.Generator().manual_seed(seed)
    # GPT-2 has no key/value heads of its own and no head_dim: every head is a kv head
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    for i in range(config.num_hidden_layers):
        k = torch.randn(batch, heads, past, dim, generator=g)
        cache.update(k, torch.randn(batch, heads, past, dim, generator=g), i)
    return cache


def _causal(model_cls: Any, config: Any) -> tuple[torch.nn.Module, Callable[..., dict]]:
    from transformers import DynamicCache

    torch.manual_seed(0)
    lm = model_cls(config).eval()
    _register(lm)

    def inputs(batch: int, seq: int, past: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(2)
        mask = torch.ones(batch, past + seq, dtype=torch.int64)
        return {
            "input_ids": torch.randint(0, config.vocab_size, (batch, seq), generator=g),
            "attention_mask": mask,
            "past_key_values": _filled(DynamicCache(config=config), config, batch, past),
        }

    return CacheDecoder(lm), inputs


def _kv_shapes(dim: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    leaves = torch.utils._pytree.tree_leaves(kwargs["past_key_values"])
    return {
        "input_ids": {0: dim, 1: dim},
        "attention_mask": {0: dim, 1: dim},
        "past_key_values": [{0: dim, 2: dim}] * len(leaves),
    }


def _dynamic_cache():
    from transformers import LlamaForCausalLM

    return _causal(LlamaForCausalLM, _llama_config())


def _sliding_cache():
    """Mistral with a sliding window: DynamicSlidingWindowLayer in every layer."""
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        sliding_window=16,
    )  # fmt: skip
    return _causal(MistralForCausalLM, config)


def _hybrid_cache():
    """Qwen2 with one sliding and one full layer: a DynamicCache of mixed layers."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        use_sliding_window=True, sliding_window=16, max_window_layers=1,
        layer_types=["sliding_attention", "full_attention"],
    )  # fmt: skip
    return _causal(Qwen2ForCausalLM, config)


def _phi3_cache():
    """Phi-3: one fused qkv projection and one fused gate/up projection, sliced apart."""
    from transformers import Phi3Config, Phi3ForCausalLM

    config = Phi3Config(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    return _causal(Phi3ForCausalLM, config)


def _gpt2_cache():
    """GPT-2: no rotary embedding (learned absolute positions), full multi-head attention,
    Conv1D projections, the head tied to the embedding."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=256,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return _causal(GPT2LMHeadModel, config)


_STATIC_LEN = 16


def _static_cache():
    from transformers import LlamaForCausalLM, StaticCache

    config = _llama_config()
    torch.manual_seed(0)
    lm = LlamaForCausalLM(config).eval()
    _register(lm)

    def inputs(batch: int, seq: int, past: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(2)
        cache = StaticCache(config=config, max_cache_len=_STATIC_LEN)
        heads, dim = config.num_key_value_heads, config.hidden_size // config.num_attention_heads
        for layer in cache.layers:
            k = torch.zeros(batch, heads, _STATIC_LEN, dim)
            v = torch.zeros(batch, heads, _STATIC_LEN, dim)
            k[:, :, :past] = torch.randn(batch, heads, past, dim, generator=g)
            v[:, :, :past] = torch.randn(batch, heads, past, dim, generator=g)
            layer.lazy_initialization(k, v)
            layer.keys.copy_(k)
            layer.values.copy_(v)
        return {
            "input_ids": torch.randint(0, config.vocab_size, (batch, seq), generator=g),
            "cache_position": torch.arange(past, past + seq),
            "past_key_values": cache,
        }

    return StaticCacheDecoder(lm), inputs


def _static_shapes(dim: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    leaves = torch.utils._pytree.tree_leaves(kwargs["past_key_values"])
    return {
        "input_ids": {0: dim, 1: dim},
        "cache_position": {0: dim},
        "past_key_values": [{0: dim} if leaf.dim() == 4 else None for leaf in leaves],
    }


def _encoder_decoder_cache():
    from transformers import BartConfig, BartForConditionalGeneration, DynamicCache
    from transformers.cache_utils import EncoderDecoderCache

    config = BartConfig(
        vocab_size=128, d_model=64, encoder_layers=1, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
        max_position_embeddings=256,
    )  # fmt: skip
    torch.manual_seed(0)
    lm = BartForConditionalGeneration(config).eval()
    _register(lm)

    def inputs(batch: int, seq: int, past: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(2)
        source = 7
        self_attn, cross = DynamicCache(), DynamicCache()
        for i in range(config.decoder_layers):
            for cache, length in ((self_attn, past), (cross, source)):
                k = torch.randn(batch, 4, length, 16, generator=g)
                cache.update(k, torch.randn(batch, 4, length, 16, generator=g), i)
        return {
            "input_ids": torch.randint(3, config.vocab_size, (batch, source), generator=g),
            "decoder_input_ids": torch.randint(3, config.vocab_size, (batch, seq), generator=g),
            "past_key_values": EncoderDecoderCache(self_attn, cross),
        }

    return Seq2SeqCacheDecoder(lm), inputs


def _seq2seq_shapes(dim: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    cache = kwargs["past_key_values"]
    n_self = len(torch.utils._pytree.tree_leaves(cache.self_attention_cache))
    n_cross = len(torch.utils._pytree.tree_leaves(cache.cross_attention_cache))
    return {
        "input_ids": {0: dim, 1: dim},
        "decoder_input_ids": {0: dim, 1: dim},
        "past_key_values": [{0: dim, 2: dim}] * n_self + [{0: dim, 2: dim}] * n_cross,
    }


CACHE_CASES = [
    CacheCase("dynamic_cache", "Llama, DynamicCache", _dynamic_cache, _kv_shapes),
    CacheCase("sliding_cache", "Mistral, sliding-window DynamicCache", _sliding_cache, _kv_shapes),
    CacheCase("hybrid_cache", "Qwen2, sliding and full layers", _hybrid_cache, _kv_shapes),
    CacheCase("static_cache", "Llama, StaticCache", _static_cache, _static_shapes),
    CacheCase("phi3_cache", "Phi-3, DynamicCache", _phi3_cache, _kv_shapes),
    CacheCase("gpt2_cache", "GPT-2, DynamicCache", _gpt2_cache, _kv_shapes),
    CacheCase(
        "encoder_decoder_cache",
        "BART, EncoderDecoderCache",
        _encoder_decoder_cache,
        _seq2seq_shapes,
    ),
]
CACHE_CASES_BY_NAME = {c.name: c for c in CACHE_CASES}
#: the decoders generation parity is measured on (issue 51, item 4): three architectures
#: that export with a DynamicCache and dynamic dims
GENERATION_DECODERS = ("dynamic_cache", "phi3_cache", "gpt2_cache")


@dataclass
class ExportedCase:
    case: CacheCase
    ep: torch.export.ExportedProgram
    onx: onnx.ModelProto
    inputs: Callable[..., dict[str, Any]]  # fresh kwargs (a cache is written in place)
    dims: str

    def kwargs(self, batch: int | None = None, seq: int | None = None, past: int | None = None):
        b, s, p = self.case.sizes
        return self.inputs(b if batch is None else batch, s if seq is None else seq,
                           p if past is None else past)  # fmt: skip


def export_case(case: CacheCase | str, dims: str = "dynamic") -> ExportedCase:
    """``dims``: "static", "dynamic" (Dim.DYNAMIC) or "auto" (Dim.AUTO)."""
    if isinstance(case, str):
        case = CACHE_CASES_BY_NAME[case]
    module, inputs = case.build()
    kwargs = inputs(*case.sizes)
    shapes = None
    if dims != "static":
        shapes = case.shapes(Dim.DYNAMIC if dims == "dynamic" else Dim.AUTO, kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.no_grad():
            ep = torch.export.export(module, (), kwargs, dynamic_shapes=shapes, strict=False)
            onx = torch.onnx.export(ep, (), kwargs=inputs(*case.sizes), dynamo=True, verbose=False)
    return ExportedCase(case, ep, onx.model_proto, inputs, dims)


def feeds(onx: onnx.ModelProto, kwargs: dict[str, Any]) -> dict[str, np.ndarray]:
    """The ONNX graph inputs: the flattened keyword inputs, in order."""
    inits = {i.name for i in onx.graph.initializer}
    names = [i.name for i in onx.graph.input if i.name not in inits]
    flat = [a for a in torch.utils._pytree.tree_leaves(kwargs) if isinstance(a, torch.Tensor)]
    return {n: a.detach().numpy() for n, a in zip(names, flat)}


# ---- faults planted in an exported decoder (generation parity) ----------------------------
# Each works on any decoder exported with a DynamicCache: the graph returns the logits first,
# then each layer's keys and values in layer order (the cache's pytree order), so layer
# ``i`` writes outputs ``1 + 2 i`` (keys) and ``2 + 2 i`` (values), whatever the model.


def _copy(onx: onnx.ModelProto) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(onx)
    return m


def cache_output(onx: onnx.ModelProto, layer: int, which: str = "values") -> str:
    """The graph output holding one layer's keys or values."""
    n_cache = len(onx.graph.output) - 1
    if which not in ("keys", "values") or not -n_cache // 2 <= layer < n_cache // 2:
        raise ValueError(f"no {which} of layer {layer}: the graph writes {n_cache // 2} layers")
    index = (layer % (n_cache // 2)) * 2 + (which == "values")
    return onx.graph.output[1 + index].name


def scaled_cache_output(
    onx: onnx.ModelProto, scale: float, layer: int = -1, which: str = "values"
) -> onnx.ModelProto:
    """The model with one layer's cache output (default: the last layer's values) scaled on
    its way out only, by a Mul named ``planted_mul``: the step itself reads the right
    values, later steps read the wrong cache."""
    from onnx import helper, numpy_helper

    m = _copy(onx)
    output = cache_output(m, layer, which)
    raw = output + "_raw"
    for node in m.graph.node:
        node.input[:] = [raw if x == output else x for x in node.input]
        node.output[:] = [raw if x == output else x for x in node.output]
    m.graph.initializer.append(numpy_helper.from_array(np.array(scale, np.float32), "scale"))
    m.graph.node.append(helper.make_node("Mul", [raw, "scale"], [output], name="planted_mul"))
    return m


def late_key_fault(
    onx: onnx.ModelProto, layer: int = 0, onset: int = 16, slope: float = 0.5
) -> onnx.ModelProto:
    """The model with one layer's attention reading its keys at positions past ``onset``
    scaled by ``1 + slope * (position - onset)``, by a Mul named ``planted_keys``; the
    cache it writes stays right.  Nothing differs while the cache is at most ``onset + 1``
    long: the fault shows at the first step whose cache holds position ``onset + 1``,
    grows a step at a time, and each step makes it anew (a position-dependent bug, as a
    rotary or a sliding-window fault is)."""
    from onnx import helper, numpy_helper

    m = _copy(onx)
    keys = cache_output(m, layer, "keys")
    read = keys + "_planted"
    for node in m.graph.node:
        node.input[:] = [read if x == keys else x for x in node.input]
    p = "planted_"
    consts = {
        p + "zero": np.array(0, np.int64),
        p + "one": np.array(1, np.int64),
        p + "onset": np.array(onset, np.float32),
        p + "slope": np.array(slope, np.float32),
        p + "fone": np.array(1, np.float32),
        p + "last_axis": np.array([-1], np.int64),
    }
    m.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in consts.items())
    make = helper.make_node
    planted = [
        make("Shape", [keys], [p + "len1"], name=p + "len", start=-2, end=-1),
        make("Squeeze", [p + "len1"], [p + "n"], name=p + "n"),
        make("Range", [p + "zero", p + "n", p + "one"], [p + "pos_i"], name=p + "pos"),
        make("Cast", [p + "pos_i"], [p + "pos"], name=p + "cast", to=onnx.TensorProto.FLOAT),
        make("Sub", [p + "pos", p + "onset"], [p + "past_onset"], name=p + "sub"),
        make("Relu", [p + "past_onset"], [p + "over"], name=p + "relu"),
        make("Mul", [p + "over", p + "slope"], [p + "off"], name=p + "off"),
        make("Add", [p + "off", p + "fone"], [p + "ramp1"], name=p + "ramp1"),
        make("Unsqueeze", [p + "ramp1", p + "last_axis"], [p + "ramp"], name=p + "ramp"),
        make("Mul", [keys, p + "ramp"], [read], name="planted_keys"),
    ]
    # right after the node writing the keys: the graph stays in topological order
    at = 1 + next(i for i, n in enumerate(m.graph.node) if keys in n.output)
    nodes = list(m.graph.node)
    del m.graph.node[:]
    m.graph.node.extend(nodes[:at] + planted + nodes[at:])
    return m


def rotary_frequency_off(onx: onnx.ModelProto, factor: float) -> onnx.ModelProto:
    """The model with its rotary embedding's frequencies multiplied by ``factor`` (a
    decoder with a rotary embedding: Llama, Phi-3, not GPT-2)."""
    from onnx import numpy_helper

    m = _copy(onx)
    found = False
    for init in m.graph.initializer:
        if init.name.endswith("rotary_emb.inv_freq"):
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * factor, init.name))
            found = True
    if not found:
        raise ValueError("the model has no rotary_emb.inv_freq initializer")
    return m


def export_model_output_case(name: str = "dynamic_cache") -> ExportedCase:
    """The transformers model itself exported, as a user exports it: the cache under the
    keyword transformers 5 names it (``cache``), a ``ModelOutput`` returned (its cache under
    ``cache``, the old key a deprecated alias)."""
    case = CACHE_CASES_BY_NAME[name]
    wrapper, old_inputs = case.build()

    def inputs(batch: int, seq: int, past: int) -> dict[str, Any]:
        kw = old_inputs(batch, seq, past)
        kw["cache"] = kw.pop("past_key_values")
        return kw

    kwargs = inputs(*case.sizes)
    shapes = case.shapes(Dim.DYNAMIC, {"past_key_values": kwargs["cache"]})
    shapes["cache"] = shapes.pop("past_key_values")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.no_grad():
            ep = torch.export.export(wrapper.model, (), kwargs, dynamic_shapes=shapes, strict=False)
            onx = torch.onnx.export(ep, (), kwargs=inputs(*case.sizes), dynamo=True, verbose=False)
    return ExportedCase(case, ep, onx.model_proto, inputs, "dynamic")


def mistyped_node(onx: onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    """The model with its first float Mul fed a float16 input (a Cast named
    ``planted_cast`` before it), as a float16 converter that leaves a float32 node does:
    onnxruntime refuses to build a session.  Returns the model and the Mul's name."""
    from onnx import helper

    m = _copy(onx)
    mul = next(n for n in m.graph.node if n.op_type == "Mul" and n.name)
    cast_out = mul.input[0] + "_planted_f16"
    cast = helper.make_node(
        "Cast", [mul.input[0]], [cast_out], name="planted_cast", to=onnx.TensorProto.FLOAT16
    )
    mul.input[0] = cast_out
    index = list(m.graph.node).index(mul)
    m.graph.node.insert(index, cast)
    return m, mul.name
