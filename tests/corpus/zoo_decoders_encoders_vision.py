"""A fourth zoo: decoders, encoders and vision models the first three lack.

Built in code with random weights (transformers configs, never ``from_pretrained``),
exported with the real exporter by :func:`tests.corpus.zoo.export_entry`.

- decoders: StableLM (partial rotary, LayerNorm), Starcoder2 (biases, sliding window),
  OLMo2 (RMSNorm on queries and keys, after the attention and MLP), Granite (scaled
  embeddings, residuals and logits), Phi-3 (fused qkv and gate/up projections), Cohere
  (parallel attention and MLP, interleaved rotary), GPTBigCode (multi-query attention),
  GPT-Neo (local attention layers), XGLM (sinusoidal positions)
- encoders: ELECTRA (embeddings narrower than the hidden size, projected), MPNet
  (relative position bias), ConvBERT (span-based dynamic convolution), SqueezeBERT
  (grouped 1x1 convolutions), FNet (Fourier transform instead of attention), ERNIE,
  RemBERT (decoupled input and output embeddings), BigBird (full attention)
- encoder-decoders: Pegasus, M2M100 (sinusoidal positions, scaled embeddings),
  Speech2Text (strided 1-D convolutions over audio features)
- vision: ResNet (batch norm folded or not, shortcut projections), DeiT (class and
  distillation tokens), ConvNeXt V2 (global response normalization), PoolFormer
  (pooling as the token mixer), BEiT (relative position bias), Swin V2 (shifted windows,
  cosine attention), YOLOS (detection tokens)
"""

from __future__ import annotations

import os

import torch

from .zoo import ZooEntry, _causal_lm, _Logits

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# two layers: a fault "deep" in the graph sits in the second one
_DECODER = dict(
    hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=64,
)  # fmt: skip
_ENCODER = dict(
    hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
)  # fmt: skip


def _decoder(config: str, model: str, **kw):
    return lambda: _causal_lm(config, model, **{**_DECODER, **kw})


def _masked_lm(config: str, model: str, **kw):
    def build():
        import transformers

        cfg = getattr(transformers, config)(
            vocab_size=64, max_position_embeddings=64, **_ENCODER, **kw
        )
        ids = torch.randint(0, 64, (1, 7))
        return _Logits(getattr(transformers, model)(cfg), "input_ids"), (ids,)

    return build


_SEQ2SEQ = dict(
    vocab_size=64, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
    decoder_attention_heads=4, encoder_ffn_dim=37, decoder_ffn_dim=37, use_cache=False,
)  # fmt: skip


def _seq2seq(config: str, model: str):
    def build():
        import transformers

        cfg = getattr(transformers, config)(max_position_embeddings=64, **_SEQ2SEQ)
        ids, decoder_ids = torch.randint(3, 64, (1, 7)), torch.randint(3, 64, (1, 5))
        lm = _Logits(getattr(transformers, model)(cfg), "input_ids", "decoder_input_ids")
        return lm, (ids, decoder_ids)

    return build


def _speech2text():
    """Speech2Text: two strided 1-D convolutions subsample 20 frames of 16 features."""
    import transformers

    cfg = transformers.Speech2TextConfig(
        input_feat_per_channel=16, conv_channels=32, max_source_positions=64,
        max_target_positions=64, **_SEQ2SEQ,
    )  # fmt: skip
    model = transformers.Speech2TextForConditionalGeneration(cfg)
    features, decoder_ids = torch.randn(1, 20, 16), torch.randint(3, 64, (1, 5))
    return _Logits(model, "input_features", "decoder_input_ids"), (features, decoder_ids)


def _classifier(config: str, model: str, **kw):
    def build():
        import transformers

        cfg = getattr(transformers, config)(num_labels=5, **kw)
        image = torch.randn(1, 3, 32, 32)
        return _Logits(getattr(transformers, model)(cfg), "pixel_values"), (image,)

    return build


_gpt_bigcode = _decoder(
    "GPTBigCodeConfig", "GPTBigCodeForCausalLM", n_embd=32, n_layer=2, n_head=4, n_positions=64
)

ZOO4: list[ZooEntry] = [
    ZooEntry("stablelm", "decoder, partial rotary, LayerNorm",
             _decoder("StableLmConfig", "StableLmForCausalLM"), attribute_ops=("LayerNormalization",)),
    ZooEntry("starcoder2", "decoder, biases, sliding window",
             _decoder("Starcoder2Config", "Starcoder2ForCausalLM"), attribute_ops=("Softmax",)),
    ZooEntry("olmo2", "decoder, RMSNorm on queries and keys",
             _decoder("Olmo2Config", "Olmo2ForCausalLM"), attribute_ops=("Softmax",)),
    ZooEntry("granite", "decoder, scaled embeddings, residuals and logits",
             _decoder("GraniteConfig", "GraniteForCausalLM"), attribute_ops=("Softmax",)),
    ZooEntry("phi3", "decoder, fused qkv and gate/up projections",
             _decoder("Phi3Config", "Phi3ForCausalLM", pad_token_id=0), attribute_ops=("Softmax",)),
    ZooEntry("cohere", "decoder, parallel attention and MLP",
             _decoder("CohereConfig", "CohereForCausalLM"), attribute_ops=("Softmax",)),
    ZooEntry("gpt_bigcode", "decoder, multi-query attention", _gpt_bigcode,
             attribute_ops=("LayerNormalization",)),
    ZooEntry("electra", "encoder, projected embeddings",
             _masked_lm("ElectraConfig", "ElectraForMaskedLM", embedding_size=16),
             attribute_ops=("LayerNormalization",)),
    ZooEntry("mpnet", "encoder, relative position bias", _masked_lm("MPNetConfig", "MPNetForMaskedLM"),
             attribute_ops=("LayerNormalization",)),
    ZooEntry("resnet", "conv net, batch norm, shortcut projections",
             _classifier("ResNetConfig", "ResNetForImageClassification", embedding_size=8,
                         hidden_sizes=[8, 16], depths=[1, 1]),
             attribute_ops=("Conv",)),
    ZooEntry("deit", "vision transformer, class and distillation tokens",
             _classifier("DeiTConfig", "DeiTForImageClassification", image_size=32, patch_size=8,
                         **_ENCODER),
             attribute_ops=("LayerNormalization",)),
    ZooEntry("gpt_neo", "decoder, local attention layers",
             lambda: _causal_lm("GPTNeoConfig", "GPTNeoForCausalLM", hidden_size=32, num_layers=2,
                                num_heads=4, attention_types=[[["global", "local"], 1]],
                                window_size=4, max_position_embeddings=64),
             attribute_ops=("LayerNormalization",)),
    ZooEntry("xglm", "decoder, sinusoidal positions",
             lambda: _causal_lm("XGLMConfig", "XGLMForCausalLM", d_model=32, ffn_dim=37,
                                num_layers=2, attention_heads=4, max_position_embeddings=64),
             attribute_ops=("LayerNormalization",)),
    ZooEntry("convbert", "encoder, span-based dynamic convolution",
             _masked_lm("ConvBertConfig", "ConvBertForMaskedLM"), attribute_ops=("Softmax",)),
    ZooEntry("squeezebert", "encoder, grouped 1x1 convolutions",
             _masked_lm("SqueezeBertConfig", "SqueezeBertForMaskedLM", embedding_size=32,
                        q_groups=2, k_groups=2, v_groups=2, post_attention_groups=2,
                        intermediate_groups=1, output_groups=1),
             attribute_ops=("LayerNormalization",)),
    ZooEntry("fnet", "encoder, Fourier transform as the token mixer",
             _masked_lm("FNetConfig", "FNetForMaskedLM", use_tpu_fourier_optimizations=False),
             attribute_ops=("LayerNormalization",)),
    ZooEntry("ernie", "encoder", _masked_lm("ErnieConfig", "ErnieForMaskedLM"),
             attribute_ops=("LayerNormalization",)),
    ZooEntry("rembert", "encoder, decoupled input and output embeddings",
             _masked_lm("RemBertConfig", "RemBertForMaskedLM", input_embedding_size=16,
                        output_embedding_size=16),
             attribute_ops=("LayerNormalization",)),
    ZooEntry("bigbird", "encoder, BigBird with full attention",
             _masked_lm("BigBirdConfig", "BigBirdForMaskedLM", attention_type="original_full"),
             attribute_ops=("LayerNormalization",)),
    ZooEntry("pegasus", "encoder-decoder, sinusoidal positions",
             _seq2seq("PegasusConfig", "PegasusForConditionalGeneration"), attribute_ops=("Softmax",)),
    ZooEntry("m2m100", "encoder-decoder, scaled embeddings",
             _seq2seq("M2M100Config", "M2M100ForConditionalGeneration"), attribute_ops=("Softmax",)),
    ZooEntry("convnextv2", "conv net, global response normalization",
             _classifier("ConvNextV2Config", "ConvNextV2ForImageClassification", num_stages=2,
                         hidden_sizes=[8, 16], depths=[1, 1]),
             attribute_ops=("Conv",)),
    ZooEntry("poolformer", "pooling as the token mixer",
             _classifier("PoolFormerConfig", "PoolFormerForImageClassification", hidden_sizes=[8, 16],
                         depths=[1, 1], num_encoder_blocks=2, patch_sizes=[7, 3], strides=[4, 2],
                         padding=[2, 1]),
             attribute_ops=("Conv",)),
    ZooEntry("speech2text", "speech encoder-decoder, strided 1-D conv subsampling", _speech2text,
             attribute_ops=("Softmax",)),
    ZooEntry("beit", "vision transformer, relative position bias",
             _classifier("BeitConfig", "BeitForImageClassification", image_size=32, patch_size=8,
                         use_relative_position_bias=True, **_ENCODER),
             attribute_ops=("LayerNormalization",)),
    ZooEntry("swinv2", "shifted windows, cosine attention, log-spaced position bias",
             _classifier("Swinv2Config", "Swinv2ForImageClassification", image_size=32, patch_size=4,
                         embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4),
             attribute_ops=("LayerNormalization",)),
    ZooEntry("yolos", "vision transformer with detection tokens",
             _classifier("YolosConfig", "YolosForObjectDetection", image_size=[32, 32], patch_size=8,
                         num_detection_tokens=5, **_ENCODER),
             attribute_ops=("LayerNormalization",)),
]  # fmt: skip
ZOO4_BY_NAME = {e.name: e for e in ZOO4}
