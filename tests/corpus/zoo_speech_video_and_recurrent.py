"""A sixth zoo: architectures the first five lack, from another sweep of transformers'
model families that export with the real exporter.

Built in code with random weights (transformers configs, never ``from_pretrained``),
exported with the real exporter by :func:`tests.corpus.zoo.export_entry`.

- Whisper: log-mel features through two 1-D convs, an encoder-decoder with sinusoidal
  encoder positions and learned decoder positions
- BlenderbotSmall: an encoder-decoder with post-LayerNorm blocks
- XLNet: two-stream relative attention (content and position), relative segment biases
- RoBERTa-PreLayerNorm: LayerNorm before each sublayer
- CANINE: characters hashed into several embeddings, a local transformer, a strided
  convolution downsampling the sequence, and the deep stack on the shorter sequence
- PatchTST: a time series cut into patches, per-channel instance normalization, a
  transformer over patches with batch norms, a linear forecast head
- PVTv2: overlapping patch embeddings by strided convs, attention whose keys and values
  come from a spatially reduced sequence, depthwise convs inside the MLP
- SigLIP: text and vision towers, pairwise sigmoid logits
- speech encoders over raw audio: WavLM (gated relative position bias), SEW-D (squeezed
  sequence, disentangled attention), UniSpeechSat
- vision: SwiftFormer (efficient additive attention; layer scales of 1, not transformers'
  1e-5, and He initialization, or no fault would show in the logits), DPT and GLPN (depth
  estimation heads over reassembled multi-scale features)
- encoders: XLM, Megatron-BERT (LayerNorm before each sublayer)
- RWKV: a recurrent decoder whose first call in eval mode divides some of its weights in
  place: the program returns them as mutated parameters, which no ONNX model returns
- vision and video: Hiera (mask units, pooled queries), PVT, TimeSformer (divided
  space-time attention), ViViT (tubelets by a 3-D conv), VideoMAE
- encoder-decoders: mBART (pre-LayerNorm), UMT5 (relative position buckets per layer)
- RecurrentGemma: real-gated linear recurrences between local attention layers
"""

from __future__ import annotations

import os

import torch

from .zoo import ZooEntry, _causal_lm, _Logits
from .zoo_decoder_variants_and_mobile_vision import (
    _audio_ctc,
    _classifier,
    _masked_lm,
    _variance_preserving,
)
from .zoo_vision_and_program_features import _Field

os.environ.setdefault("HF_HUB_OFFLINE", "1")


_TOWER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
_SEQ2SEQ = dict(
    vocab_size=64, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
    decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, use_cache=False,
)  # fmt: skip


def _whisper():
    import transformers

    cfg = transformers.WhisperConfig(
        **{**_SEQ2SEQ, "encoder_layers": 2, "decoder_layers": 2},
        num_mel_bins=16, max_source_positions=16, max_target_positions=16, pad_token_id=1,
        bos_token_id=2, eos_token_id=3, decoder_start_token_id=2, begin_suppress_tokens=None,
        suppress_tokens=None,
    )  # fmt: skip
    model = transformers.WhisperForConditionalGeneration(cfg)
    features = torch.randn(1, 16, 32)  # 32 frames: two convs, the second strided, make 16
    decoder_ids = torch.randint(4, 64, (1, 5))
    net = _Field(model, ("input_features", "decoder_input_ids"), ("logits",), use_cache=False)
    return net, (features, decoder_ids)


def _canine():
    import transformers

    cfg = transformers.CanineConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        num_hash_functions=2, num_hash_buckets=64, downsampling_rate=2,
        local_transformer_stride=4,
    )  # fmt: skip
    chars = torch.randint(0, 200, (1, 8))
    net = _Field(transformers.CanineModel(cfg), ("input_ids",), ("last_hidden_state",))
    return net, (chars,)


def _patchtst():
    import transformers

    cfg = transformers.PatchTSTConfig(
        num_input_channels=3, context_length=32, patch_length=8, patch_stride=8, d_model=16,
        num_attention_heads=2, num_hidden_layers=2, ffn_dim=32, prediction_length=8,
    )  # fmt: skip
    series = torch.randn(1, 32, 3)
    # initialized as transformers does (std 0.02), the forecast is the series' mean to
    # 1e-5 whatever the layers compute: no fault could show in it
    model = _variance_preserving(transformers.PatchTSTForPrediction(cfg))
    return _Field(model, ("past_values",), ("prediction_outputs",)), (series,)


def _pvt_v2():
    import transformers

    cfg = transformers.PvtV2Config(
        hidden_sizes=[16, 32], depths=[1, 1], num_encoder_blocks=2, sr_ratios=[2, 1],
        num_attention_heads=[1, 2], patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2],
        num_labels=5,
    )  # fmt: skip
    image = torch.randn(1, 3, 32, 32)
    return _Logits(transformers.PvtV2ForImageClassification(cfg), "pixel_values"), (image,)


def _siglip():
    import transformers

    text = dict(vocab_size=64, max_position_embeddings=16, **_TOWER)
    vision = dict(image_size=32, patch_size=8, **_TOWER)
    model = transformers.SiglipModel(
        transformers.SiglipConfig(text_config=text, vision_config=vision)
    )
    ids, image = torch.randint(0, 64, (2, 16)), torch.randn(1, 3, 32, 32)
    return _Field(model, ("input_ids", "pixel_values"), ("logits_per_image",)), (ids, image)


def _dpt():
    import transformers

    cfg = transformers.DPTConfig(
        image_size=32, patch_size=8, backbone_out_indices=[0, 1, 2, 3],
        neck_hidden_sizes=[8, 16, 32, 32], fusion_hidden_size=16,
        reassemble_factors=[4, 2, 1, 0.5], head_in_index=-1, **{**_TOWER, "num_hidden_layers": 4},
    )  # fmt: skip
    model = _variance_preserving(transformers.DPTForDepthEstimation(cfg))
    image = torch.randn(1, 3, 32, 32)
    return _Field(model, ("pixel_values",), ("predicted_depth",)), (image,)


def _glpn():
    import transformers

    cfg = transformers.GLPNConfig(
        num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
        patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
        decoder_hidden_size=16,
    )  # fmt: skip
    model = transformers.GLPNForDepthEstimation(cfg)
    image = torch.randn(1, 3, 32, 32)
    return _Field(model, ("pixel_values",), ("predicted_depth",)), (image,)


def _video(config: str, model: str, **kw):
    """A video classifier over 4 frames of 32x32 (random weights)."""

    def build():
        import transformers

        cfg = getattr(transformers, config)(
            num_labels=5, image_size=32, num_frames=4, **_TOWER, **kw
        )
        frames = torch.randn(1, 4, 3, 32, 32)
        return _Logits(getattr(transformers, model)(cfg), "pixel_values"), (frames,)

    return build


def _seq2seq(config: str, model: str, **kw):
    """An encoder-decoder (T5-style sizes when given) on 6 input and 5 decoder tokens."""

    def build():
        import transformers

        given = {k: v for k, v in {**_SEQ2SEQ, **kw}.items() if v is not None}
        net = getattr(transformers, model)(getattr(transformers, config)(**given))
        ids, decoder_ids = torch.randint(4, 64, (1, 6)), torch.randint(4, 64, (1, 5))
        return _Field(net, ("input_ids", "decoder_input_ids"), ("logits",), use_cache=False), (
            ids,
            decoder_ids,
        )

    return build


ZOO6: list[ZooEntry] = [
    ZooEntry("whisper", "speech encoder-decoder, conv front end over log-mel features",
             _whisper, attribute_ops=("Conv",)),
    ZooEntry("blenderbot_small", "encoder-decoder, post-LayerNorm blocks",
             _seq2seq("BlenderbotSmallConfig", "BlenderbotSmallForConditionalGeneration"),
             attribute_ops=("LayerNormalization",)),
    ZooEntry("xlnet", "two-stream relative attention, relative segment biases",
             _masked_lm("XLNetConfig", "XLNetLMHeadModel", d_model=32, n_layer=2, n_head=4,
                        d_inner=64, hidden_size=None, num_hidden_layers=None,
                        num_attention_heads=None, intermediate_size=None),
             attribute_ops=("Softmax",)),
    ZooEntry("roberta_prelayernorm", "encoder, LayerNorm before each sublayer",
             _masked_lm("RobertaPreLayerNormConfig", "RobertaPreLayerNormForMaskedLM"),
             attribute_ops=("LayerNormalization",)),
    ZooEntry("canine", "hashed character embeddings, downsampling conv, local transformer",
             _canine, attribute_ops=("Conv",)),
    ZooEntry("patchtst", "time-series patches, instance normalization, forecast head",
             _patchtst, attribute_ops=("Softmax",)),
    ZooEntry("pvt_v2", "overlapping patch convs, spatially reduced attention",
             _pvt_v2, attribute_ops=("Conv",)),
    ZooEntry("siglip", "text and vision towers, sigmoid pairwise logits", _siglip,
             attribute_ops=("LayerNormalization",)),
    ZooEntry("wavlm", "speech encoder, gated relative position bias", _audio_ctc("WavLMConfig", "WavLMForCTC"),
             attribute_ops=("Conv",)),
    ZooEntry("sew_d", "speech encoder, squeezed sequence, disentangled attention",
             _audio_ctc("SEWDConfig", "SEWDForCTC"), attribute_ops=("Conv",)),
    ZooEntry("unispeech_sat", "speech encoder, conv feature extractor",
             _audio_ctc("UniSpeechSatConfig", "UniSpeechSatForCTC"), attribute_ops=("Conv",)),
    ZooEntry("swiftformer", "conv net with efficient additive attention",
             _classifier("SwiftFormerConfig", "SwiftFormerForImageClassification",
                         depths=[1, 1, 1, 1], embed_dims=[8, 16, 24, 32],
                         layer_scale_init_value=1.0, reinit=True),
             attribute_ops=("Conv",)),
    ZooEntry("dpt", "ViT backbone, reassembled multi-scale features, depth head", _dpt,
             attribute_ops=("Conv",)),
    ZooEntry("glpn", "hierarchical encoder, selective feature fusion, depth head", _glpn,
             attribute_ops=("Conv",)),
    ZooEntry("xlm", "encoder, post-LayerNorm, learned positions",
             _masked_lm("XLMConfig", "XLMWithLMHeadModel", emb_dim=32, n_layers=2, n_heads=4,
                        hidden_size=None, num_hidden_layers=None, num_attention_heads=None,
                        intermediate_size=None),
             attribute_ops=("LayerNormalization",)),
    ZooEntry("megatron_bert", "encoder, pre-LayerNorm BERT", _masked_lm("MegatronBertConfig", "MegatronBertForMaskedLM"),
             attribute_ops=("LayerNormalization",)),
    ZooEntry("rwkv", "recurrent decoder, time mixing, weights rescaled in place when called",
             lambda: _causal_lm("RwkvConfig", "RwkvForCausalLM", hidden_size=32,
                                num_hidden_layers=2, attention_hidden_size=32,
                                intermediate_size=64, context_length=16),
             attribute_ops=("LayerNormalization",)),
    ZooEntry("hiera", "hierarchical vision transformer, mask units, pooled queries",
             _classifier("HieraConfig", "HieraForImageClassification", size=64,
                         image_size=[64, 64], embed_dim=16, num_heads=[1, 2, 4, 8],
                         depths=[1, 1, 1, 1], patch_stride=[4, 4], masked_unit_size=[8, 8],
                         query_stride=[2, 2]),
             attribute_ops=("LayerNormalization",)),
    ZooEntry("pvt", "pyramid vision transformer, spatially reduced attention",
             _classifier("PvtConfig", "PvtForImageClassification", image_size=32,
                         hidden_sizes=[16, 32, 48, 64], depths=[1, 1, 1, 1],
                         num_attention_heads=[1, 2, 2, 4]),
             attribute_ops=("Conv",)),
    ZooEntry("timesformer", "video transformer, divided space-time attention",
             _video("TimesformerConfig", "TimesformerForVideoClassification", patch_size=16),
             attribute_ops=("LayerNormalization",)),
    ZooEntry("vivit", "video transformer, tubelet embeddings by a 3-D conv",
             _video("VivitConfig", "VivitForVideoClassification", tubelet_size=[2, 16, 16]),
             attribute_ops=("LayerNormalization",)),
    ZooEntry("videomae", "video transformer, tubelets, fixed sinusoidal positions",
             _video("VideoMAEConfig", "VideoMAEForVideoClassification", patch_size=16,
                    tubelet_size=2),
             attribute_ops=("LayerNormalization",)),
    ZooEntry("mbart", "encoder-decoder, pre-LayerNorm, scaled embeddings",
             _seq2seq("MBartConfig", "MBartForConditionalGeneration", pad_token_id=1,
                      bos_token_id=0, eos_token_id=2, decoder_start_token_id=2),
             attribute_ops=("LayerNormalization",)),
    ZooEntry("umt5", "encoder-decoder, relative position buckets per layer",
             _seq2seq("UMT5Config", "UMT5ForConditionalGeneration", d_kv=8, d_ff=64,
                      num_layers=2, num_decoder_layers=2, num_heads=4, encoder_layers=None,
                      decoder_layers=None, encoder_attention_heads=None,
                      decoder_attention_heads=None, encoder_ffn_dim=None,
                      decoder_ffn_dim=None, pad_token_id=1, decoder_start_token_id=0),
             attribute_ops=("Softmax",)),
    ZooEntry("recurrent_gemma", "hybrid decoder, real-gated linear recurrences and local attention",
             lambda: _causal_lm("RecurrentGemmaConfig", "RecurrentGemmaForCausalLM",
                                hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                num_attention_heads=4, num_key_value_heads=2, lru_width=32,
                                attention_window_size=4, head_dim=8,
                                block_types=["recurrent", "attention"]),
             attribute_ops=("Softmax",)),
]  # fmt: skip
ZOO6_BY_NAME = {e.name: e for e in ZOO6}
