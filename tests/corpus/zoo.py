"""A zoo of architectures that are not in tests/, built in code with random weights.

Each entry builds a tiny model (transformers configs, never ``from_pretrained``, or
torch.nn) and its inputs; :func:`export_entry` exports it with the real exporter.  The
kinds follow issue 10: encoder-decoders, state-space, mixture-of-experts, conv nets with
BatchNorm (folded into Conv by the exporter's optimizer), upsampling decoders (Resize with
``sizes`` and ``scales``, ConvTranspose), RNNs (bidirectional, multi-layer), fp16,
dynamic shapes, and others (GPT-2, BERT, ConvNeXt, GroupNorm, EmbeddingBag,
gather/scatter/index_put, split/chunk, einsum, cumsum, masked_fill, topk, sort).

Not in the zoo, and why: a tiny T5 (transformers 5.x) does not export on torch 2.13: the
exporter's decomposition step fails on the attention output ``view`` (strides of a
transposed tensor), so BART and Whisper stand for the encoder-decoders.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@dataclass
class ZooEntry:
    name: str
    kind: str  # the category
    build: Callable[[], tuple[nn.Module, tuple]]  # (model, args), seeded
    dynamic_shapes: Any = None
    # op types the attribute fault prefers (first found wins), e.g. ("Resize", "Conv")
    attribute_ops: tuple[str, ...] = ()
    notes: str = ""
    tags: tuple[str, ...] = field(default_factory=tuple)


@dataclass
class Exported:
    entry: ZooEntry
    ep: torch.export.ExportedProgram
    onx: Any  # onnx.ModelProto
    args: tuple


def export_entry(entry: ZooEntry) -> Exported:
    torch.manual_seed(0)
    model, args = entry.build()
    model = model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.no_grad():
            ep = torch.export.export(model, args, dynamic_shapes=entry.dynamic_shapes)
            onx = torch.onnx.export(ep, args, dynamo=True, verbose=False).model_proto
    return Exported(entry, ep, onx, args)


# --------------------------------------------------------------------------- transformers


class _Logits(nn.Module):
    """A transformers model returning only its logits (no cache objects)."""

    def __init__(self, model: nn.Module, *names: str):
        super().__init__()
        self.model = model
        self.names = names

    def forward(self, *args):
        out = self.model(**dict(zip(self.names, args)), use_cache=False)
        return out.logits


def _bart():
    import transformers

    cfg = transformers.BartConfig(
        vocab_size=64,
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=32,
        use_cache=False,
    )
    model = _Logits(
        transformers.BartForConditionalGeneration(cfg), "input_ids", "decoder_input_ids"
    )
    return model, (torch.randint(3, 64, (1, 7)), torch.randint(3, 64, (1, 5)))


def _whisper():
    import transformers

    cfg = transformers.WhisperConfig(
        vocab_size=64,
        num_mel_bins=8,
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_source_positions=16,
        max_target_positions=16,
        use_cache=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    )
    model = _Logits(
        transformers.WhisperForConditionalGeneration(cfg), "input_features", "decoder_input_ids"
    )
    return model, (torch.randn(1, 8, 32), torch.randint(3, 64, (1, 5)))


def _causal_lm(config: str, model: str, **kw):
    """A tiny transformers causal LM (vocabulary 64, hidden 32) and 6 token ids."""
    import transformers

    experts = kw.pop("experts_implementation", None)
    cfg = getattr(transformers, config)(vocab_size=64, use_cache=False, **kw)
    if experts:
        cfg._experts_implementation = experts
    ids = torch.randint(0, 64, (1, 6))
    return _Logits(getattr(transformers, model)(cfg), "input_ids"), (ids,)


def _mamba():
    return _causal_lm(
        "MambaConfig", "MambaForCausalLM",
        hidden_size=32, state_size=4, num_hidden_layers=2, expand=2, conv_kernel=4,
    )  # fmt: skip


_TINY_DECODER = dict(
    hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=64, num_experts_per_tok=2,
    # the default "grouped_mm" is a custom op the exporter cannot lower; "batched_mm"
    # runs every expert with plain bmm (routing weights select), which exports
    experts_implementation="batched_mm",
)  # fmt: skip


def _mixtral():
    return _causal_lm("MixtralConfig", "MixtralForCausalLM", num_local_experts=4, **_TINY_DECODER)


def _qwen2_moe():
    return _causal_lm(
        "Qwen2MoeConfig", "Qwen2MoeForCausalLM", num_experts=4, moe_intermediate_size=16,
        shared_expert_intermediate_size=16, **_TINY_DECODER,
    )  # fmt: skip


def _gpt2():
    return _causal_lm(
        "GPT2Config", "GPT2LMHeadModel",
        n_embd=32, n_layer=2, n_head=4, n_positions=32, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip


class _BertClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        import transformers

        cfg = transformers.BertConfig(
            vocab_size=64,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=32,
        )
        self.model = transformers.BertForSequenceClassification(cfg)

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits


def _bert():
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    return _BertClassifier(), (torch.randint(0, 64, (2, 6)), mask)


# --------------------------------------------------------------------------- torch.nn


class ConvBNNet(nn.Module):
    """Conv + BatchNorm + ReLU with a residual block: the optimizer folds BN into Conv."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.conv3 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.bn3 = nn.BatchNorm2d(16)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 5)
        for bn in (self.bn1, self.bn2, self.bn3):  # non-trivial running statistics
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.data.uniform_(0.5, 1.5)
            bn.bias.data.uniform_(-0.5, 0.5)

    def forward(self, x):
        y = F.relu(self.bn1(self.stem(x)))
        y = F.relu(y + self.bn2(self.conv2(y)))
        y = F.relu(self.bn3(self.conv3(y)))
        return self.fc(self.pool(y).flatten(1))


def _convbn():
    return ConvBNNet(), (torch.randn(2, 3, 12, 12),)


class UpsampleDecoder(nn.Module):
    """A small decoder: interpolate(size=), interpolate(scale_factor=), ConvTranspose."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.up1 = nn.ConvTranspose2d(8, 8, 4, stride=2, padding=1)
        self.mix = nn.Conv2d(16, 8, 3, padding=1)
        self.head = nn.Conv2d(8, 2, 1)

    def forward(self, x):
        e = torch.relu(self.enc(x))  # 8 x 8 -> 4 x 4
        u = torch.relu(self.up1(e))  # 8 x 8
        skip = F.interpolate(e, size=(8, 8), mode="nearest")
        y = torch.relu(self.mix(torch.cat([u, skip], dim=1)))
        y = F.interpolate(y, scale_factor=2.0, mode="bilinear", align_corners=False)
        return self.head(y)


def _upsample():
    return UpsampleDecoder(), (torch.randn(1, 3, 8, 8),)


class ResizeSizes(nn.Module):
    """interpolate(size=...) in bilinear and bicubic modes between convolutions."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(2, 4, 3, padding=1)
        self.c2 = nn.Conv2d(4, 2, 3, padding=1)

    def forward(self, x):
        y = torch.tanh(self.c1(x))
        y = F.interpolate(y, size=(9, 11), mode="bilinear", align_corners=True)
        y = F.interpolate(y, size=(6, 6), mode="bicubic", align_corners=False)
        return self.c2(y)


def _resize_sizes():
    return ResizeSizes(), (torch.randn(1, 2, 5, 7),)


class RNNStack(nn.Module):
    """A bidirectional 2-layer LSTM then a GRU, with a projection."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Linear(6, 8)
        self.lstm = nn.LSTM(8, 8, num_layers=2, bidirectional=True, batch_first=True)
        self.gru = nn.GRU(16, 8, batch_first=True)
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        y, _ = self.lstm(torch.tanh(self.emb(x)))
        y, h = self.gru(y)
        return self.out(y + h.transpose(0, 1))


def _rnn():
    return RNNStack(), (torch.randn(2, 5, 6),)


class HalfBlock(nn.Module):
    """A transformer block in float16: LayerNorm, attention, GELU MLP."""

    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q, k, v = (t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        a = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def _fp16():
    return HalfBlock().half(), (torch.randn(2, 6, 32, dtype=torch.float16),)


class DynamicAttention(nn.Module):
    """Attention with a padding mask and a mean pool, exported with dynamic batch and seq."""

    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.norm = nn.RMSNorm(dim)

    def forward(self, x, mask):
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        bias = (1.0 - mask[:, None, None, :].to(x.dtype)) * -1e4
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        y = self.out(y.transpose(1, 2).reshape(b, s, d)) + x
        w = mask.to(x.dtype).unsqueeze(-1)
        return (y * w).sum(1) / w.sum(1)


def _dynamic():
    mask = torch.ones(3, 7, dtype=torch.int64)
    mask[1, 5:] = 0
    mask[2, 3:] = 0
    return DynamicAttention(), (torch.randn(3, 7, 16), mask)


_batch, _seq = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("seq", min=2, max=64)


class ConvNeXtBlock(nn.Module):
    """Depthwise 7x7 conv, channels-last LayerNorm, GELU MLP, layer scale."""

    def __init__(self, dim=16):
        super().__init__()
        self.stem = nn.Conv2d(3, dim, 2, stride=2)
        self.dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pw1 = nn.Linear(dim, 4 * dim)
        self.pw2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 0.5))
        self.head = nn.Linear(dim, 4)

    def forward(self, x):
        x = self.stem(x)
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.pw2(F.gelu(self.pw1(self.norm(y)))) * self.gamma
        x = x + y.permute(0, 3, 1, 2)
        return self.head(x.mean((-2, -1)))


def _convnext():
    return ConvNeXtBlock(), (torch.randn(2, 3, 16, 16),)


class GroupNormResBlock(nn.Module):
    """A diffusion-style ResBlock: GroupNorm + SiLU + Conv, a time embedding, a skip."""

    def __init__(self, c_in=8, c_out=16, groups=4):
        super().__init__()
        self.n1 = nn.GroupNorm(groups, c_in)
        self.c1 = nn.Conv2d(c_in, c_out, 3, padding=1)
        self.t = nn.Linear(12, c_out)
        self.n2 = nn.GroupNorm(groups, c_out)
        self.c2 = nn.Conv2d(c_out, c_out, 3, padding=1)
        self.skip = nn.Conv2d(c_in, c_out, 1)
        for n in (self.n1, self.n2):
            n.weight.data.uniform_(0.5, 1.5)
            n.bias.data.uniform_(-0.5, 0.5)

    def forward(self, x, temb):
        h = self.c1(F.silu(self.n1(x)))
        h = h + self.t(F.silu(temb))[:, :, None, None]
        h = self.c2(F.silu(self.n2(h)))
        return (self.skip(x) + h) / 2**0.5


def _groupnorm():
    return GroupNormResBlock(), (torch.randn(2, 8, 6, 6), torch.randn(2, 12))


class MobileNetBlock(nn.Module):
    """Depthwise separable conv, hardswish, squeeze-excite, max/avg pooling."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.pw = nn.Conv2d(8, 16, 1)
        self.se1 = nn.Conv2d(16, 4, 1)
        self.se2 = nn.Conv2d(4, 16, 1)
        self.fc = nn.Linear(16, 3)

    def forward(self, x):
        x = F.hardswish(self.stem(x))
        x = F.max_pool2d(x, 2)
        x = F.relu6(self.pw(F.hardswish(self.dw(x))))
        s = torch.sigmoid(self.se2(F.relu(self.se1(F.adaptive_avg_pool2d(x, 1)))))
        x = x * s
        return self.fc(F.avg_pool2d(x, 2).flatten(1).reshape(x.shape[0], 16, -1).mean(-1))


def _mobilenet():
    return MobileNetBlock(), (torch.randn(2, 3, 16, 16),)


class SparseFeatures(nn.Module):
    """EmbeddingBag, gather, scatter_add, index_put and index_select on a feature table."""

    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(20, 8, mode="mean")
        self.table = nn.Parameter(torch.randn(10, 8))
        self.lin = nn.Linear(8, 8)

    def forward(self, ids, offsets, rows):
        bag = self.bag(ids, offsets)  # (n_bags, 8)
        picked = self.table.index_select(0, rows)  # (n_bags, 8)
        idx = torch.argsort(picked, dim=-1)[:, :4]
        g = torch.gather(picked, 1, idx)  # (n_bags, 4)
        acc = torch.zeros(bag.shape[0], 8).scatter_add(1, idx, g * 2.0)
        out = self.lin(bag + acc)
        out = out.index_put((rows % out.shape[0],), out[:, :1].expand(-1, 8), accumulate=True)
        return torch.tanh(out)


def _sparse():
    ids = torch.tensor([1, 4, 7, 2, 3, 19, 11, 0, 5, 6])
    offsets = torch.tensor([0, 3, 4, 8])
    rows = torch.tensor([2, 9, 0, 5])
    return SparseFeatures(), (ids, offsets, rows)


class TensorOps(nn.Module):
    """Split/chunk multi-outputs, einsum, cumsum, masked_fill, topk, sort, where, clamp."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(12, 12)
        self.w = nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        a, b, c = self.lin(x).split([4, 4, 4], dim=-1)
        m = torch.einsum("bsi,ij,btj->bst", a, self.w, b)
        top, idx = torch.topk(m, 3, dim=-1)  # on random values: no ties to break
        m = m.masked_fill(torch.triu(torch.ones_like(m, dtype=torch.bool), 1), -3.0)
        top = top + m.softmax(-1)[..., :3]
        srt, _ = torch.sort(c, dim=-1, descending=True)
        cs = torch.cumsum(srt, dim=1)
        p, q = cs.chunk(2, dim=-1)
        mix = torch.where(p > q, p * 2, q - 1).clamp(-2.0, 2.0)
        return torch.cat([top.softmax(-1), idx.to(x.dtype) / 5, mix], dim=-1)


def _tensorops():
    return TensorOps(), (torch.randn(2, 6, 12),)


class ConvTransposeLeaky(nn.Module):
    """A 1-D audio-style decoder: Conv1d, ConvTranspose1d with output padding, LeakyReLU,
    InstanceNorm, PixelShuffle-like reshapes."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv1d(4, 8, 5, padding=2, dilation=1)
        self.up = nn.ConvTranspose1d(8, 8, 3, stride=2, padding=1, output_padding=1)
        self.norm = nn.InstanceNorm1d(8, affine=True)
        self.c2 = nn.Conv1d(8, 2, 3, padding=2, dilation=2)
        self.ps = nn.PixelShuffle(2)

    def forward(self, x):
        y = F.leaky_relu(self.c1(x), 0.2)
        y = F.elu(self.norm(self.up(y)))
        y = self.c2(y)  # (b, 2, 2L)
        b, c, n = y.shape
        z = self.ps(y.reshape(b, c * 4, 2, n // 8))
        return z.flatten(1)


def _convtranspose1d():
    return ConvTransposeLeaky(), (torch.randn(2, 4, 8),)


ZOO: list[ZooEntry] = [
    ZooEntry("bart", "encoder-decoder", _bart, attribute_ops=("Softmax", "LayerNormalization")),
    ZooEntry(
        "whisper", "encoder-decoder (conv front end)", _whisper, attribute_ops=("Conv", "Softmax")
    ),
    ZooEntry("mamba", "state-space", _mamba, attribute_ops=("Conv", "Softplus", "CumSum")),
    ZooEntry("mixtral", "mixture-of-experts", _mixtral, attribute_ops=("Softmax", "TopK")),
    ZooEntry("qwen2_moe", "mixture-of-experts", _qwen2_moe, attribute_ops=("Softmax", "TopK")),
    ZooEntry("gpt2", "decoder-only transformer", _gpt2, attribute_ops=("LayerNormalization",)),
    ZooEntry("bert", "encoder + padding mask", _bert, attribute_ops=("LayerNormalization",)),
    ZooEntry("convbn", "conv net with BatchNorm", _convbn, attribute_ops=("Conv",)),
    ZooEntry(
        "upsample_decoder",
        "upsampling decoder (Resize sizes/scales, ConvTranspose)",
        _upsample,
        attribute_ops=("Resize", "ConvTranspose"),
    ),
    ZooEntry("resize_sizes", "Resize with sizes", _resize_sizes, attribute_ops=("Resize",)),
    ZooEntry(
        "rnn_stack", "RNN (bidirectional 2-layer LSTM, GRU)", _rnn, attribute_ops=("GRU", "LSTM")
    ),  # fmt: skip
    ZooEntry(
        "fp16_block",
        "float16 transformer block",
        _fp16,
        attribute_ops=("LayerNormalization", "Softmax"),
    ),  # fmt: skip
    ZooEntry(
        "dynamic_attention",
        "dynamic shapes (batch, seq)",
        _dynamic,
        dynamic_shapes=({0: _batch, 1: _seq}, {0: _batch, 1: _seq}),
        attribute_ops=("Softmax",),
    ),
    ZooEntry(
        "convnext",
        "depthwise conv + LayerNorm",
        _convnext,
        attribute_ops=("Conv", "LayerNormalization"),
    ),  # fmt: skip
    ZooEntry(
        "groupnorm_resblock",
        "GroupNorm conv block",
        _groupnorm,
        attribute_ops=("GroupNormalization", "InstanceNormalization", "Conv"),
    ),  # fmt: skip
    ZooEntry(
        "mobilenet",
        "depthwise separable + SE + pooling",
        _mobilenet,
        attribute_ops=("Conv", "HardSwish", "MaxPool"),
    ),  # fmt: skip
    ZooEntry(
        "sparse_features",
        "EmbeddingBag, gather, scatter, index_put",
        _sparse,
        attribute_ops=("ScatterElements", "GatherElements", "ScatterND"),
    ),  # fmt: skip
    ZooEntry(
        "tensor_ops",
        "split/chunk, einsum, cumsum, masked_fill, topk, sort",
        _tensorops,
        attribute_ops=("Einsum", "CumSum", "TopK", "Softmax"),
    ),  # fmt: skip
    ZooEntry(
        "conv1d_decoder",
        "Conv1d, ConvTranspose1d, InstanceNorm, PixelShuffle",
        _convtranspose1d,
        attribute_ops=("ConvTranspose", "LeakyRelu", "Conv"),
    ),  # fmt: skip
]

ZOO_BY_NAME = {e.name: e for e in ZOO}
