"""A fifth zoo: architectures the first four lack, found by sweeping transformers' model
families that export with the real exporter.

Built in code with random weights (transformers configs, never ``from_pretrained``),
exported with the real exporter by :func:`tests.corpus.zoo.export_entry`.

- decoders: Gemma 3 (sliding and global layers, q/k norms, scaled embeddings), Nemotron
  (squared ReLU, LayerNorm1P), GPT-J and CodeGen (parallel attention and MLP, rotary on
  part of the head, interleaved), MPT (ALiBi), Persimmon (q/k LayerNorm, partial rotary),
  LFM2 (short gated convolutions between attention layers), BitNet (ternary-quantized
  linear layers, activations quantized per token), GLM (partial interleaved rotary),
  SmolLM3 (layers without rotary)
- encoders: ESM (rotary in an encoder, token dropout scaling), ModernBERT (alternating
  local and global attention, GeGLU), Funnel (pooling the sequence between blocks)
- speech: HuBERT and Data2VecAudio (a 1-D conv feature extractor over raw audio,
  a grouped positional convolution, weight norm)
- vision: MobileNetV2 (inverted residuals, ReLU6, depthwise convs), MobileViT (unfolding
  patches for attention between convolutions), RegNet (grouped convs, squeeze and
  excitation), LeViT (attention with a learned bias over offsets, batch norm after
  linear layers, attention that subsamples), DINOv2 (interpolated position embeddings,
  layer scale), FocalNet (focal modulation: gated depthwise convs at several levels),
  CvT (convolutional token embeddings and projections)
"""

from __future__ import annotations

import os

import torch
from torch import nn

from .zoo import ZooEntry, _causal_lm, _Logits
from .zoo_decoders_encoders_vision import _DECODER, _ENCODER, _decoder

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _masked_lm(config: str, model: str, vocab: int = 64, **kw):
    def build():
        import transformers

        # a None in kw drops that _ENCODER setting (Funnel sizes itself by blocks)
        given = {k: v for k, v in {**_ENCODER, **kw}.items() if v is not None}
        cfg = getattr(transformers, config)(vocab_size=vocab, **given)
        ids = torch.randint(4, vocab, (1, 7))
        return _Logits(getattr(transformers, model)(cfg), "input_ids"), (ids,)

    return build


def _variance_preserving(model: nn.Module) -> nn.Module:
    """He initialization of every convolution and linear layer, batch norms as identities.
    Deep, narrow conv nets initialized as transformers does (normal, std 0.02, batch norm
    scales too) output values of 1e-27 or 0: no fault could change such an output, and a
    pass on it would prove nothing."""
    for m in model.modules():
        if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    return model


def _classifier(config: str, model: str, size: int = 32, reinit: bool = False, **kw):
    def build():
        import transformers

        cfg = getattr(transformers, config)(num_labels=5, **kw)
        image = torch.randn(1, 3, size, size)
        net = getattr(transformers, model)(cfg)
        if reinit:
            _variance_preserving(net)
        return _Logits(net, "pixel_values"), (image,)

    return build


def _audio_ctc(config: str, model: str):
    """A wav2vec2-style speech encoder: 400 raw samples through a strided conv stack."""

    def build():
        import transformers

        cfg = getattr(transformers, config)(
            vocab_size=32, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
            num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, **_ENCODER,
        )  # fmt: skip
        audio = torch.randn(1, 400)
        return _Logits(getattr(transformers, model)(cfg), "input_values"), (audio,)

    return build


def _gemma3():
    import transformers

    cfg = transformers.Gemma3TextConfig(
        vocab_size=64, head_dim=8, sliding_window=4, use_cache=False, **_DECODER,
        layer_types=["sliding_attention", "full_attention"],
    )  # fmt: skip
    ids = torch.randint(0, 64, (1, 6))
    return _Logits(transformers.Gemma3ForCausalLM(cfg), "input_ids"), (ids,)


def _gptj_like(config: str, model: str):
    return lambda: _causal_lm(
        config, model, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64
    )


ZOO5: list[ZooEntry] = [
    ZooEntry("gemma3", "decoder, sliding and global layers, q/k norms", _gemma3,
             attribute_ops=("Softmax",)),
    ZooEntry("nemotron", "decoder, squared ReLU, LayerNorm1P",
             _decoder("NemotronConfig", "NemotronForCausalLM", head_dim=8),
             attribute_ops=("LayerNormalization",)),
    ZooEntry("gptj", "decoder, parallel attention and MLP, interleaved partial rotary",
             _gptj_like("GPTJConfig", "GPTJForCausalLM"), attribute_ops=("LayerNormalization",)),
    ZooEntry("codegen", "decoder, fused qkv, interleaved partial rotary",
             _gptj_like("CodeGenConfig", "CodeGenForCausalLM"),
             attribute_ops=("LayerNormalization",)),
    ZooEntry("mpt", "decoder, ALiBi",
             lambda: _causal_lm("MptConfig", "MptForCausalLM", d_model=32, n_heads=4, n_layers=2,
                                max_seq_len=64),
             attribute_ops=("LayerNormalization",)),
    ZooEntry("persimmon", "decoder, q/k LayerNorm, partial rotary",
             _decoder("PersimmonConfig", "PersimmonForCausalLM", num_key_value_heads=4),
             attribute_ops=("LayerNormalization",)),
    ZooEntry("lfm2", "hybrid decoder, short gated convolutions and attention",
             _decoder("Lfm2Config", "Lfm2ForCausalLM", layer_types=["conv", "full_attention"],
                      block_auto_adjust_ff_dim=False),
             attribute_ops=("Softmax",)),
    ZooEntry("bitnet", "decoder, ternary weights, activations quantized per token",
             _decoder("BitNetConfig", "BitNetForCausalLM"), attribute_ops=("Softmax",)),
    ZooEntry("glm", "decoder, partial interleaved rotary",
             _decoder("GlmConfig", "GlmForCausalLM", head_dim=8, pad_token_id=0),
             attribute_ops=("Softmax",)),
    ZooEntry("smollm3", "decoder, layers without rotary",
             _decoder("SmolLM3Config", "SmolLM3ForCausalLM", pad_token_id=0,
                      no_rope_layers=[1, 0]),
             attribute_ops=("Softmax",)),
    ZooEntry("esm", "encoder, rotary, token dropout scaling",
             _masked_lm("EsmConfig", "EsmForMaskedLM", vocab=33, pad_token_id=1, mask_token_id=32,
                        position_embedding_type="rotary", max_position_embeddings=64,
                        token_dropout=True),
             attribute_ops=("LayerNormalization",)),
    ZooEntry("modernbert", "encoder, alternating local and global attention, GeGLU",
             _masked_lm("ModernBertConfig", "ModernBertForMaskedLM", pad_token_id=0,
                        bos_token_id=1, eos_token_id=2, sep_token_id=2, cls_token_id=1,
                        global_attn_every_n_layers=2, local_attention=4,
                        max_position_embeddings=64),
             attribute_ops=("LayerNormalization",)),
    ZooEntry("funnel", "encoder, sequence pooled between blocks",
             _masked_lm("FunnelConfig", "FunnelForMaskedLM", num_hidden_layers=None,
                        hidden_size=None, intermediate_size=None, num_attention_heads=None,
                        d_model=32, n_head=4, d_head=8, d_inner=37, block_sizes=[1, 1],
                        num_decoder_layers=1),
             attribute_ops=("LayerNormalization",)),
    ZooEntry("hubert", "speech encoder, conv feature extractor, grouped positional conv",
             _audio_ctc("HubertConfig", "HubertForCTC"), attribute_ops=("Conv",)),
    ZooEntry("data2vec_audio", "speech encoder, conv positional layers",
             _audio_ctc("Data2VecAudioConfig", "Data2VecAudioForCTC"), attribute_ops=("Conv",)),
    ZooEntry("mobilenet_v2", "conv net, inverted residuals, ReLU6, depthwise convs",
             _classifier("MobileNetV2Config", "MobileNetV2ForImageClassification",
                         image_size=32, depth_multiplier=0.25, reinit=True),
             attribute_ops=("Conv",)),
    ZooEntry("mobilevit", "convolutions with attention over unfolded patches",
             _classifier("MobileViTConfig", "MobileViTForImageClassification", image_size=32, reinit=True,
                         hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 32],
                         patch_size=2, num_attention_heads=2),
             attribute_ops=("Conv",)),
    ZooEntry("regnet", "conv net, grouped convs, squeeze and excitation",
             _classifier("RegNetConfig", "RegNetForImageClassification", embedding_size=8,
                         hidden_sizes=[8, 16], depths=[1, 1], groups_width=8, layer_type="y"),
             attribute_ops=("Conv",)),
    ZooEntry("levit", "attention with a learned offset bias, subsampling attention",
             _classifier("LevitConfig", "LevitForImageClassification", size=64, reinit=True,
                         image_size=64,
                         patch_size=16, hidden_sizes=[32, 48], num_attention_heads=[2, 3],
                         depths=[1, 1], key_dim=[8, 8], drop_path_rate=0,
                         mlp_ratio=[2, 2], attention_ratio=[2, 2],
                         down_ops=[["Subsample", 8, 32 // 8, 4, 2, 2]]),
             attribute_ops=("Conv",)),
    ZooEntry("dinov2", "vision transformer, interpolated positions, layer scale",
             _classifier("Dinov2Config", "Dinov2ForImageClassification", image_size=32,
                         patch_size=8, **_ENCODER),
             attribute_ops=("LayerNormalization",)),
    ZooEntry("focalnet", "focal modulation, gated depthwise convs at several levels",
             _classifier("FocalNetConfig", "FocalNetForImageClassification", image_size=32,
                         patch_size=4, embed_dim=16, depths=[1, 1], focal_levels=[2, 2],
                         focal_windows=[3, 3]),
             attribute_ops=("Conv",)),
    # depth grows by stage: CvtStage indexes its drop-path rates by the stage number
    ZooEntry("cvt", "convolutional token embeddings and projections",
             _classifier("CvtConfig", "CvtForImageClassification", embed_dim=[8, 16, 32],
                         num_heads=[1, 2, 2], depth=[1, 2, 3], mlp_ratio=[2.0, 2.0, 2.0],
                         drop_path_rate=[0.0, 0.0, 0.0]),
             attribute_ops=("Conv",)),
]  # fmt: skip
ZOO5_BY_NAME = {e.name: e for e in ZOO5}
