"""A second zoo: architectures and program features the first zoo (zoo.py) does not have.

Built in code with random weights (transformers configs, never ``from_pretrained``, or
torch.nn), exported with the real exporter by :func:`tests.corpus.zoo.export_entry`.

- vision transformers: ViT (patch conv, CLS token), Swin (window attention, ``roll``),
  CLIP (text and vision towers, several outputs)
- encoders: DistilBERT, ALBERT (one layer's weights shared by every layer)
- decoders with GQA and rotary: Phi (partial rotary, parallel attention and MLP),
  Gemma (RMSNorm with 1 + w, tanh GELU, tied lm_head), a Llama with dynamic batch and
  sequence, a padded attention mask
- speech: Wav2Vec2 (conv feature extractor, GroupNorm, a grouped positional conv)
- encoder-decoder: Marian (sinusoidal positions)
- conv nets: a UNet (skips, interpolate, cat), an EfficientNet block (SiLU, SE,
  depthwise, BatchNorm folded), a DETR-like detector (conv backbone, nn.Transformer,
  two heads returned as a dict)
- program features: ``torch.cond``, FFT, int64 outputs (argmax/topk indices), bool masks
  and scatter_reduce/index_copy/gather, embedding with ``padding_idx``, LayerNorm without
  affine, weight tying, bfloat16, buffers updated in forward, constants made in forward
  (``torch.tensor``, ``arange``), a 200-layer chain of tiny MLPs.
- more decoders and encoders: Gemma 2 (soft-capping, sliding window), Qwen3 (query/key
  RMSNorm), Mistral (sliding window), OPT, BLOOM (ALiBi), GPT-NeoX (parallel residual),
  Falcon (multi-query), DeBERTa-v2 (disentangled relative attention).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from .zoo import ZooEntry, _Logits

os.environ.setdefault("HF_HUB_OFFLINE", "1")


# --------------------------------------------------------------------------- transformers


class _Field(nn.Module):
    """A transformers model returning one or several named fields of its output."""

    def __init__(self, model: nn.Module, names: tuple[str, ...], fields: tuple[str, ...], **kw):
        super().__init__()
        self.model = model
        self.names = names
        self.fields = fields
        self.kw = kw

    def forward(self, *args):
        out = self.model(**dict(zip(self.names, args)), **self.kw)
        got = tuple(getattr(out, f) for f in self.fields)
        return got[0] if len(got) == 1 else got


def _vit():
    import transformers

    cfg = transformers.ViTConfig(
        image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=1,
        num_attention_heads=4, intermediate_size=64, num_labels=5,
    )  # fmt: skip
    model = _Field(transformers.ViTForImageClassification(cfg), ("pixel_values",), ("logits",))
    return model, (torch.randn(2, 3, 16, 16),)


def _swin():
    import transformers

    cfg = transformers.SwinConfig(
        image_size=16, patch_size=2, num_channels=3, embed_dim=16, depths=[2],
        num_heads=[2], window_size=4, mlp_ratio=2.0, num_labels=3,
    )  # fmt: skip
    model = _Field(transformers.SwinForImageClassification(cfg), ("pixel_values",), ("logits",))
    return model, (torch.randn(1, 3, 16, 16),)


def _clip():
    import transformers

    text = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=4, max_position_embeddings=16)  # fmt: skip
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=4, image_size=16, patch_size=8)  # fmt: skip
    cfg = transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)
    model = _Field(
        transformers.CLIPModel(cfg),
        ("input_ids", "pixel_values", "attention_mask"),
        ("logits_per_image", "text_embeds", "image_embeds"),
    )
    ids = torch.randint(1, 64, (2, 7))
    mask = torch.tensor([[1] * 7, [1] * 5 + [0] * 2])
    return model, (ids, torch.randn(3, 3, 16, 16), mask)


class _SequenceClassifier(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits


def _padded(batch: int = 2, seq: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(1, 64, (batch, seq))
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[1, seq - 2 :] = 0
    return ids, mask


def _distilbert():
    import transformers

    cfg = transformers.DistilBertConfig(
        vocab_size=64, dim=32, n_layers=1, n_heads=4, hidden_dim=64, max_position_embeddings=32,
    )  # fmt: skip
    return _SequenceClassifier(transformers.DistilBertForSequenceClassification(cfg)), _padded()


def _albert():
    import transformers

    cfg = transformers.AlbertConfig(
        vocab_size=64, embedding_size=16, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=64, max_position_embeddings=32,
    )  # fmt: skip
    return _SequenceClassifier(transformers.AlbertForSequenceClassification(cfg)), _padded()


def _decoder(config: str, model: str, **kw):
    import transformers

    cfg = getattr(transformers, config)(vocab_size=64, use_cache=False, **kw)
    return _Logits(getattr(transformers, model)(cfg), "input_ids"), (torch.randint(0, 64, (1, 6)),)


def _phi():
    return _decoder(
        "PhiConfig", "PhiForCausalLM", hidden_size=32, intermediate_size=64,
        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        partial_rotary_factor=0.5, max_position_embeddings=64,
    )  # fmt: skip


def _gemma():
    return _decoder(
        "GemmaConfig", "GemmaForCausalLM", hidden_size=32, intermediate_size=64,
        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=1, head_dim=8,
        max_position_embeddings=64, tie_word_embeddings=True,
    )  # fmt: skip


_SMALL_DECODER = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=64,
)  # fmt: skip


def _gemma2():
    # logit soft-capping (tanh) in attention and on the logits; a window of 4 over 6 tokens
    return _decoder(
        "Gemma2Config", "Gemma2ForCausalLM", head_dim=8, sliding_window=4, **_SMALL_DECODER
    )


def _qwen3():
    # RMSNorm on the queries and keys of each head
    return _decoder("Qwen3Config", "Qwen3ForCausalLM", head_dim=8, **_SMALL_DECODER)


def _mistral():
    return _decoder("MistralConfig", "MistralForCausalLM", sliding_window=4, **_SMALL_DECODER)


def _opt():
    return _decoder(
        "OPTConfig", "OPTForCausalLM", hidden_size=32, ffn_dim=64, num_hidden_layers=2,
        num_attention_heads=4, word_embed_proj_dim=32, max_position_embeddings=64,
    )  # fmt: skip


def _bloom():
    # ALiBi: a per-head linear bias on the attention scores, no position embedding
    return _decoder("BloomConfig", "BloomForCausalLM", hidden_size=32, n_layer=2, n_head=4)


def _gpt_neox():
    # parallel residual (attention and MLP from the same input), partial rotary
    return _decoder(
        "GPTNeoXConfig", "GPTNeoXForCausalLM", hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64,
    )  # fmt: skip


def _falcon():
    # multi-query attention, parallel attention and MLP
    return _decoder(
        "FalconConfig", "FalconForCausalLM", hidden_size=32, num_hidden_layers=2,
        num_attention_heads=4,
    )  # fmt: skip


def _deberta_v2():
    # disentangled attention: content-to-position and position-to-content terms from
    # relative position embeddings, gathered per query/key pair
    import transformers

    cfg = transformers.DebertaV2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=64, relative_attention=True,
        pos_att_type=["p2c", "c2p"],
    )  # fmt: skip
    model = _Field(transformers.DebertaV2Model(cfg), ("input_ids",), ("last_hidden_state",))
    return model, (torch.randint(0, 64, (1, 7)),)


class _MaskedLM(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        return out.logits


def _llama_dynamic():
    import transformers

    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        use_cache=False,
    )  # fmt: skip
    ids = torch.randint(1, 64, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.int64)
    mask[1, 5:] = 0  # right padding: no query row is fully masked
    return _MaskedLM(transformers.LlamaForCausalLM(cfg)), (ids, mask)


_batch = torch.export.Dim("batch", min=1, max=32)
_seq = torch.export.Dim("seq", min=2, max=64)


def _wav2vec2():
    import transformers

    cfg = transformers.Wav2Vec2Config(
        vocab_size=12, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
        intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
        num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=4,
        feat_extract_norm="group", do_stable_layer_norm=False,
    )  # fmt: skip
    model = _Field(transformers.Wav2Vec2ForCTC(cfg), ("input_values",), ("logits",))
    return model, (torch.randn(1, 400),)


def _marian():
    import transformers

    cfg = transformers.MarianConfig(
        vocab_size=64, d_model=32, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_position_embeddings=32, pad_token_id=0,
        decoder_start_token_id=0, use_cache=False,
    )  # fmt: skip
    model = _Logits(transformers.MarianMTModel(cfg), "input_ids", "decoder_input_ids")
    return model, (torch.randint(1, 64, (1, 7)), torch.randint(1, 64, (1, 5)))


# --------------------------------------------------------------------------- torch.nn


class UNet(nn.Module):
    """Two down steps, a bottleneck, two up steps with bilinear interpolate and skips."""

    def __init__(self, c=8):
        super().__init__()

        def block(i, o):
            return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.GroupNorm(2, o), nn.SiLU())

        self.d1, self.d2 = block(3, c), block(c, 2 * c)
        self.mid = block(2 * c, 2 * c)
        self.u2, self.u1 = block(4 * c, c), block(2 * c, c)
        self.head = nn.Conv2d(c, 2, 1)

    def forward(self, x):
        s1 = self.d1(x)  # 16
        s2 = self.d2(F.max_pool2d(s1, 2))  # 8
        m = self.mid(F.avg_pool2d(s2, 2))  # 4
        m = F.interpolate(m, scale_factor=2.0, mode="bilinear", align_corners=False)
        y = self.u2(torch.cat([m, s2], 1))
        y = F.interpolate(y, size=s1.shape[-2:], mode="nearest")
        return self.head(self.u1(torch.cat([y, s1], 1)))


def _unet():
    return UNet(), (torch.randn(1, 3, 16, 16),)


class MBConv(nn.Module):
    """EfficientNet's MBConv: expand 1x1, depthwise 3x3, squeeze-excite, project, BN."""

    def __init__(self, c=8, expand=4):
        super().__init__()
        h = c * expand
        self.expand = nn.Sequential(nn.Conv2d(c, h, 1, bias=False), nn.BatchNorm2d(h), nn.SiLU())
        self.dw = nn.Sequential(
            nn.Conv2d(h, h, 3, padding=1, groups=h, bias=False), nn.BatchNorm2d(h), nn.SiLU()
        )
        self.se1, self.se2 = nn.Conv2d(h, 4, 1), nn.Conv2d(4, h, 1)
        self.proj = nn.Sequential(nn.Conv2d(h, c, 1, bias=False), nn.BatchNorm2d(c))
        for m in self.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.3, 0.3)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.data.uniform_(0.5, 1.5)

    def forward(self, x):
        y = self.dw(self.expand(x))
        s = F.adaptive_avg_pool2d(y, 1)
        y = y * torch.sigmoid(self.se2(F.silu(self.se1(s))))
        return x + self.proj(y)


class EfficientNetTiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.SiLU())
        self.b1, self.b2 = MBConv(), MBConv()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        y = self.b2(self.b1(self.stem(x)))
        return self.fc(y.mean((2, 3)))


def _efficientnet():
    return EfficientNetTiny(), (torch.randn(2, 3, 16, 16),)


class DetrLike(nn.Module):
    """A conv backbone, a sine position embedding, nn.Transformer, learned queries, two
    heads returned in a dict (class logits, sigmoid boxes)."""

    def __init__(self, d=16, queries=5):
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(3, 8, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(8, d, 3, stride=2, padding=1),
        )
        self.transformer = nn.Transformer(
            d, nhead=2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=32,
            dropout=0.0, batch_first=True,
        )  # fmt: skip
        self.query = nn.Parameter(torch.randn(queries, d))
        self.cls = nn.Linear(d, 4)
        self.box = nn.Linear(d, 4)

    def forward(self, x):
        f = self.backbone(x)  # (b, d, h, w)
        b, d, h, w = f.shape
        pos = torch.arange(h * w, dtype=f.dtype)[:, None] / (h * w)
        freq = torch.arange(d, dtype=f.dtype)[None, :] + 1.0
        src = f.flatten(2).transpose(1, 2) + torch.sin(pos * freq)
        tgt = self.query.unsqueeze(0).expand(b, -1, -1)
        hs = self.transformer(src, tgt)
        return {"logits": self.cls(hs), "boxes": torch.sigmoid(self.box(hs))}


def _detr():
    return DetrLike(), (torch.randn(2, 3, 16, 16),)


class CondBranches(nn.Module):
    """torch.cond on a data-dependent predicate: ONNX If with two subgraphs."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 8)
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        h = torch.tanh(self.inp(x))

        def yes(t):
            return torch.relu(self.a(t)) * 2.0

        def no(t):
            return torch.sigmoid(self.b(t)) - 1.0

        y = torch.cond(h.sum() > 0, yes, no, (h,))
        return self.out(y + h)


def _cond():
    torch.manual_seed(3)
    m = CondBranches()
    x = torch.randn(4, 8)
    with torch.no_grad():  # take the "yes" branch
        if torch.tanh(m.inp(x)).sum() <= 0:
            x = -x
    return m, (x,)


class SpectralFilter(nn.Module):
    """rfft, a learned spectral gain, irfft, and a magnitude spectrum feature."""

    def __init__(self, n=16, c=4):
        super().__init__()
        self.gain = nn.Parameter(torch.rand(n // 2 + 1) + 0.5)
        self.mix = nn.Linear(n, n)
        self.head = nn.Linear(n // 2 + 1, c)

    def forward(self, x):
        spec = torch.fft.rfft(self.mix(x), dim=-1)
        filtered = torch.fft.irfft(spec * self.gain, n=x.shape[-1], dim=-1)
        mag = spec.abs()
        return filtered + x, F.leaky_relu(self.head(torch.log1p(mag)), 0.1)


def _fft():
    return SpectralFilter(), (torch.randn(2, 3, 16),)


class IndexOutputs(nn.Module):
    """int64 and bool outputs beside float ones: argmax, topk indices, a mask, a count."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 10)

    def forward(self, x):
        scores = self.lin(x)
        probs = torch.softmax(scores, -1)
        best = scores.argmax(-1)
        top, idx = torch.topk(scores, 3, dim=-1)
        keep = probs > 0.1
        count = keep.sum(-1)
        return probs, best, idx * 2 + 1, keep, count, top


def _index_outputs():
    return IndexOutputs(), (torch.randn(3, 4, 8),)


class MaskedScatterOps(nn.Module):
    """Embedding with padding_idx, LayerNorm without affine, bool masks and where,
    scatter_reduce (amax), index_copy, gather, index_add, tied output projection."""

    def __init__(self, vocab=32, d=8):
        super().__init__()
        self.emb = nn.Embedding(vocab, d, padding_idx=0)
        self.norm = nn.LayerNorm(d, elementwise_affine=False)
        self.proj = nn.Linear(d, d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight  # weight tying

    def forward(self, ids, groups):
        h = self.norm(self.emb(ids))  # (b, s, d)
        pad = ids == 0
        h = torch.where(pad.unsqueeze(-1), torch.zeros_like(h), torch.relu(self.proj(h)))
        b, s, d = h.shape
        pooled = torch.full((b, 4, d), -1e4).scatter_reduce(
            1, groups.unsqueeze(-1).expand(-1, -1, d), h, reduce="amax", include_self=True
        )
        rows = torch.tensor([3, 0])
        pooled = pooled.index_copy(1, rows, pooled[:, :2] * 0.5)
        idx = groups.clamp(max=3).unsqueeze(-1).expand(-1, -1, d)
        back = torch.gather(pooled, 1, idx)
        h = (h + back).index_add(1, torch.tensor([0, 1]), h[:, -2:])
        return self.head(h)


def _masked_ops():
    ids = torch.tensor([[5, 7, 0, 9, 12, 0], [3, 3, 8, 0, 0, 0]])
    groups = torch.tensor([[0, 1, 1, 2, 3, 3], [2, 2, 0, 1, 3, 0]])
    return MaskedScatterOps(), (ids, groups)


class BFloat16Block(nn.Module):
    """An MLP block with RMSNorm and SiLU gating, in bfloat16."""

    def __init__(self, d=32):
        super().__init__()
        self.norm = nn.RMSNorm(d)
        self.gate = nn.Linear(d, 2 * d, bias=False)
        self.up = nn.Linear(d, 2 * d, bias=False)
        self.down = nn.Linear(2 * d, d, bias=False)
        self.out = nn.Linear(d, 4)

    def forward(self, x):
        h = self.norm(x)
        h = x + self.down(F.silu(self.gate(h)) * self.up(h))
        return torch.softmax(self.out(h), dim=-1)


def _bf16():
    return BFloat16Block().to(torch.bfloat16), (torch.randn(2, 5, 32, dtype=torch.bfloat16),)


class StatefulConstants(nn.Module):
    """A buffer updated in forward (a running sum), constants created in forward
    (torch.tensor, arange, full), a position-scaled output."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.register_buffer("running", torch.zeros(6))
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 6))

    def forward(self, x):
        h = self.lin(x) * self.scale
        self.running.add_(h.mean((0, 1)))
        pos = torch.arange(x.shape[1], dtype=x.dtype)[None, :, None]
        bias = torch.tensor([0.1, -0.2, 0.3, -0.4, 0.5, -0.6])
        y = torch.tanh(h + pos * 0.1 + bias) + self.running
        return torch.softmax(y * torch.full((1, 1, 6), 2.0), dim=-1)


def _stateful():
    return StatefulConstants(), (torch.randn(2, 5, 6),)


class DeepChain(nn.Module):
    """200 layers of a tiny MLP (4 -> 4, tanh): a long chain of small nodes."""

    def __init__(self, depth=200, d=4):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(d, d) for _ in range(depth))
        for lin in self.layers:  # near-orthogonal: values neither vanish nor saturate
            q, _ = torch.linalg.qr(torch.randn(d, d))
            lin.weight.data.copy_(1.5 * q)
            lin.bias.data.mul_(0.1)

    def forward(self, x):
        for lin in self.layers:
            x = torch.tanh(lin(x))
        return x


def _deep_chain():
    return DeepChain(), (torch.randn(3, 4),)


ZOO2: list[ZooEntry] = [
    ZooEntry("vit", "vision transformer (patch conv, CLS token)", _vit,
             attribute_ops=("LayerNormalization", "Conv", "Softmax")),
    ZooEntry("swin", "window attention with roll", _swin,
             attribute_ops=("Softmax", "LayerNormalization")),
    ZooEntry("clip", "text + vision towers, three outputs", _clip,
             attribute_ops=("LayerNormalization", "Softmax")),
    ZooEntry("distilbert", "encoder + padding mask", _distilbert,
             attribute_ops=("LayerNormalization",)),
    ZooEntry("albert", "shared layer weights", _albert, attribute_ops=("LayerNormalization",)),
    ZooEntry("phi", "decoder: partial rotary, GQA, parallel block", _phi,
             attribute_ops=("LayerNormalization", "Softmax")),
    ZooEntry("gemma", "decoder: MQA, RMSNorm(1+w), tied lm_head", _gemma,
             attribute_ops=("Softmax",)),
    ZooEntry("llama_dynamic", "Llama, dynamic batch/seq, padding mask", _llama_dynamic,
             dynamic_shapes=({0: _batch, 1: _seq}, {0: _batch, 1: _seq}),
             attribute_ops=("Softmax",)),
    ZooEntry("wav2vec2", "conv feature extractor, GroupNorm, grouped pos conv", _wav2vec2,
             attribute_ops=("Conv", "GroupNormalization", "InstanceNormalization")),
    ZooEntry("marian", "encoder-decoder, sinusoidal positions", _marian,
             attribute_ops=("Softmax", "LayerNormalization")),
    ZooEntry("unet", "UNet: skips, interpolate, cat", _unet,
             attribute_ops=("Resize", "Conv", "MaxPool")),
    ZooEntry("efficientnet", "MBConv: SiLU, SE, depthwise, BatchNorm", _efficientnet,
             attribute_ops=("Conv",)),
    ZooEntry("detr", "conv backbone + nn.Transformer, dict outputs", _detr,
             attribute_ops=("Softmax", "LayerNormalization", "Conv")),
    ZooEntry("cond", "torch.cond (ONNX If)", _cond, attribute_ops=("Gemm",)),
    ZooEntry("fft", "rfft/irfft, magnitude spectrum", _fft, attribute_ops=("LeakyRelu",)),
    ZooEntry("index_outputs", "int64/bool outputs (argmax, topk, mask, count)", _index_outputs,
             attribute_ops=("TopK", "Softmax")),
    ZooEntry("masked_ops", "padding_idx, LN w/o affine, where, scatter_reduce, tying",
             _masked_ops, attribute_ops=("ScatterElements", "GatherElements")),
    ZooEntry("bf16", "bfloat16 MLP block", _bf16, attribute_ops=("Softmax",)),
    ZooEntry("stateful", "buffer updated in forward, constants in forward", _stateful,
             attribute_ops=("Softmax",)),
    ZooEntry("deep_chain", "200 tiny MLP layers", _deep_chain),
    ZooEntry("gemma2", "decoder: soft-capping, sliding window", _gemma2,
             attribute_ops=("Softmax",)),
    ZooEntry("qwen3", "decoder: RMSNorm on queries and keys", _qwen3,
             attribute_ops=("Softmax",)),
    ZooEntry("mistral", "decoder: sliding window, GQA", _mistral, attribute_ops=("Softmax",)),
    ZooEntry("opt", "decoder: learned positions, ReLU MLP", _opt,
             attribute_ops=("LayerNormalization", "Softmax")),
    ZooEntry("bloom", "decoder: ALiBi biases", _bloom,
             attribute_ops=("LayerNormalization", "Softmax")),
    ZooEntry("gpt_neox", "decoder: parallel residual, partial rotary", _gpt_neox,
             attribute_ops=("LayerNormalization", "Softmax")),
    ZooEntry("falcon", "decoder: multi-query, parallel block", _falcon,
             attribute_ops=("LayerNormalization", "Softmax")),
    ZooEntry("deberta_v2", "encoder: disentangled relative attention", _deberta_v2,
             attribute_ops=("LayerNormalization", "Softmax")),
]  # fmt: skip

ZOO2_BY_NAME = {e.name: e for e in ZOO2}
