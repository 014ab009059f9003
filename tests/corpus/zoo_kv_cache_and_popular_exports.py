"""A third zoo: what people export most and the first two zoos (zoo.py,
zoo_vision_and_program_features.py) lack.

Built in code with random weights (transformers configs, never ``from_pretrained``, or
torch.nn), exported with the real exporter by :func:`tests.corpus.zoo.export_entry`.

- a decoder with its key/value cache as inputs and outputs (the usual LLM export: past
  keys and values in, the grown cache out), a padded batch, dynamic batch/sequence/past
- a Llama in float16 and one in bfloat16 (RMSNorm upcast to float32, softmax in
  float32; onnxruntime has few bfloat16 kernels on CPU)
- T5 (relative position buckets, encoder-decoder, no LayerNorm bias)
- RoBERTa (position ids counted from the padding mask with a cumulative sum)
- ConvNeXt (7x7 depthwise conv, LayerNorm over channels through permutes, layer scale)
- SegFormer (attention over a spatially reduced sequence, depthwise conv in the MLP,
  a decode head upsampling and concatenating four scales)
- a two-layer bidirectional LSTM
"""

from __future__ import annotations

import os

import torch
from torch import nn

from .zoo import ZooEntry, _Logits
from .zoo_vision_and_program_features import _Field

os.environ.setdefault("HF_HUB_OFFLINE", "1")


class _CachedDecoder(nn.Module):
    """A causal LM fed its past keys and values as tensors, returning the logits and the
    grown cache (what an LLM export for generation looks like)."""

    def __init__(self, model: nn.Module, layers: int):
        super().__init__()
        self.model = model
        self.layers = layers

    def forward(self, ids, mask, *past):
        from transformers.cache_utils import DynamicCache

        cache = DynamicCache(config=self.model.config)
        for k in range(self.layers):
            cache.update(past[2 * k], past[2 * k + 1], k)
        out = self.model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True)
        grown = out.past_key_values
        kv = [t for layer in grown.layers for t in (layer.keys, layer.values)]
        return (out.logits, *kv)


_KV_LAYERS = 2


def _llama_kv_cache():
    import transformers

    model = _CachedDecoder(transformers.LlamaForCausalLM(_llama_config(_KV_LAYERS)), _KV_LAYERS)
    batch, seq, past = 2, 3, 5
    ids = torch.randint(0, 64, (batch, seq))
    mask = torch.ones(batch, past + seq, dtype=torch.int64)
    mask[1, :2] = 0  # the second row is left-padded
    kv = [torch.randn(batch, 2, past, 8) for _ in range(2 * _KV_LAYERS)]
    return model, (ids, mask, *kv)


def _kv_dynamic_shapes():
    dim = torch.export.Dim
    batch, seq, past = dim("batch", max=16), dim("seq", max=32), dim("past", max=32)
    # forward(ids, mask, *past): the past tensors are one tuple argument
    return (
        {0: batch, 1: seq},
        {0: batch, 1: dim.DYNAMIC},
        ({0: batch, 2: past},) * (2 * _KV_LAYERS),
    )


def _llama_config(layers: int, **kw):
    """The tiny Llama every decoder of this zoo uses (vocabulary 64, hidden 32, GQA)."""
    import transformers

    return transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, **kw,
    )  # fmt: skip


def _llama_in(dtype: torch.dtype, layers: int):
    import transformers

    model = transformers.LlamaForCausalLM(_llama_config(layers, use_cache=False))
    return _Logits(model, "input_ids").to(dtype), (torch.randint(0, 64, (1, 6)),)


def _llama_fp16():
    return _llama_in(torch.float16, layers=2)


def _llama_bf16():
    return _llama_in(torch.bfloat16, layers=1)


def _t5():
    import transformers

    cfg = transformers.T5Config(
        vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=1,
        num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=16,
        use_cache=False, decoder_start_token_id=0,
    )  # fmt: skip
    model = _Logits(transformers.T5ForConditionalGeneration(cfg), "input_ids", "decoder_input_ids")
    return model, (torch.randint(1, 64, (1, 7)), torch.randint(1, 64, (1, 5)))


def _roberta():
    import transformers

    cfg = transformers.RobertaConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=32, pad_token_id=1,
    )  # fmt: skip
    model = _Field(
        transformers.RobertaModel(cfg, add_pooling_layer=False),
        ("input_ids", "attention_mask"),
        ("last_hidden_state",),
    )
    ids = torch.randint(3, 64, (2, 7))
    ids[1, 5:] = 1  # padding tokens: their position ids stay at the padding index
    mask = (ids != 1).to(torch.int64)
    return model, (ids, mask)


def _convnext():
    import transformers

    cfg = transformers.ConvNextConfig(
        num_channels=3, hidden_sizes=[8, 16], depths=[1, 1], patch_size=2, num_labels=4,
        layer_scale_init_value=0.5,
    )  # fmt: skip
    model = _Field(transformers.ConvNextForImageClassification(cfg), ("pixel_values",), ("logits",))
    return model, (torch.randn(1, 3, 16, 16),)


def _segformer():
    import transformers

    cfg = transformers.SegformerConfig(
        num_channels=3, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
        hidden_sizes=[8, 16], patch_sizes=[3, 3], strides=[2, 2], num_attention_heads=[1, 2],
        mlp_ratios=[2, 2], decoder_hidden_size=16, num_labels=3,
    )  # fmt: skip
    model = _Field(
        transformers.SegformerForSemanticSegmentation(cfg), ("pixel_values",), ("logits",)
    )
    return model, (torch.randn(1, 3, 16, 16),)


class _BiLSTM(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 12, num_layers=2, bidirectional=True, batch_first=True)
        self.head = nn.Linear(24, 3)

    def forward(self, x):
        y, _ = self.lstm(x)
        return self.head(y)


def _lstm():
    return _BiLSTM(), (torch.randn(2, 5, 8),)


ZOO3: list[ZooEntry] = [
    ZooEntry(
        "llama_kv_cache", "decoder with its KV cache in and out, padded, dynamic",
        _llama_kv_cache, dynamic_shapes=_kv_dynamic_shapes(), attribute_ops=("Softmax",),
    ),
    ZooEntry("llama_fp16", "float16 decoder", _llama_fp16, attribute_ops=("Softmax",)),
    ZooEntry("llama_bf16", "bfloat16 decoder", _llama_bf16, attribute_ops=("Softmax",)),
    ZooEntry("t5", "encoder-decoder, relative position buckets", _t5, attribute_ops=("Softmax",)),
    ZooEntry(
        "roberta", "encoder, positions from the padding mask", _roberta,
        attribute_ops=("LayerNormalization",),
    ),
    ZooEntry("convnext", "depthwise 7x7 conv, channel LayerNorm", _convnext, attribute_ops=("Conv",)),
    ZooEntry("segformer", "reduced-sequence attention, multi-scale head", _segformer,
             attribute_ops=("Conv",)),
    ZooEntry("lstm", "two-layer bidirectional LSTM", _lstm),
]  # fmt: skip
ZOO3_BY_NAME = {e.name: e for e in ZOO3}
