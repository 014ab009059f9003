"""The third zoo (tests/corpus/zoo_kv_cache_and_popular_exports.py): a decoder with its KV
cache in and out, a float16 decoder, T5, RoBERTa, ConvNeXt, SegFormer, a bidirectional LSTM;
the fourth (tests/corpus/zoo_decoders_encoders_vision.py): 27 decoders, encoders,
encoder-decoders and vision models the first three lack; and the fifth
(tests/corpus/zoo_decoder_variants_and_mobile_vision.py): 22 more (Gemma 3, GPT-J, MPT with
ALiBi, LFM2's gated convolutions, BitNet, ModernBERT, Funnel, HuBERT, MobileNetV2,
MobileViT, LeViT, CvT...); and the sixth (tests/corpus/zoo_speech_video_and_recurrent.py):
25 more (Whisper, BlenderbotSmall, XLNet, CANINE, PatchTST, PVTv2, SigLIP, WavLM, SEW-D,
SwiftFormer, DPT, GLPN, RWKV, TimeSformer, UMT5, RecurrentGemma...).

Same checks as tests/corpus/test_zoo.py: each model is exported once per session; the
faithful export has no failing pair, verdict "pass" and a summary that names nothing;
three faults (a weight, an attribute, a swapped op, at rotating depths), each alone, are
each named by the summary.  Cases that fail on today's engine are xfail(strict=True)
with what goes wrong (tests/corpus/known.py).
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tests.corpus.checks import assert_faithful, assert_named, case  # noqa: E402
from tests.corpus.evaluate import ZooSession, fault_plan, run  # noqa: E402
from tests.corpus.zoo_decoder_variants_and_mobile_vision import ZOO5  # noqa: E402
from tests.corpus.zoo_decoders_encoders_vision import ZOO4  # noqa: E402
from tests.corpus.zoo_kv_cache_and_popular_exports import ZOO3  # noqa: E402
from tests.corpus.zoo_speech_video_and_recurrent import ZOO6  # noqa: E402

pytestmark = pytest.mark.corpus

# (entry, test id prefix): one session exports each model once, whichever zoo it is in
ENTRIES = [
    *((e, "zoo3-") for e in ZOO3),
    *((e, "zoo4-") for e in ZOO4),
    *((e, "zoo5-") for e in ZOO5),
    *((e, "zoo6-") for e in ZOO6),
]
FAITHFUL = [case(e.name, "faithful", prefix=prefix) for e, prefix in ENTRIES]
FAULTS = [
    case(e.name, f"{kind}-{depth}", kind, depth, prefix=prefix)
    for i, (e, prefix) in enumerate(ENTRIES)
    for kind, depth in fault_plan(i)
]


@pytest.fixture(scope="session")
def zoo3() -> ZooSession:
    return ZooSession()


@pytest.mark.parametrize("model", FAITHFUL)
def test_faithful_export_names_nothing(zoo3, model):
    assert_faithful(zoo3.faithful(model))


@pytest.mark.parametrize("model,kind,depth", FAULTS)
def test_injected_fault_is_named(zoo3, model, kind, depth):
    zoo3.fault(model, kind, depth)
    assert_named(zoo3.faulted(model, kind, depth))


@pytest.mark.parametrize("model", [pytest.param(e.name, id=f"{p}{e.name}") for e, p in ENTRIES])
def test_every_output_is_compared(zoo3, model):
    """The KV-cache decoder returns the logits and every grown key and value tensor:
    each graph output has a record that compared it."""
    out = zoo3.faithful(model)
    onx = zoo3.exported(model).onx
    missing = [o.name for o in onx.graph.output if o.name not in out.compared_outputs]
    assert not missing, f"outputs never compared: {missing}"


def test_kv_cache_decoder_other_sizes(zoo3):
    """The cached decoder run on another batch, step length and past length than it was
    exported with (and another padding pattern): one export serves every step."""
    import torch

    ex = zoo3.exported("llama_kv_cache")
    torch.manual_seed(1)
    batch, seq, past = 3, 1, 7
    ids = torch.randint(0, 64, (batch, seq))
    mask = torch.ones(batch, past + seq, dtype=torch.int64)
    mask[0, :4] = 0
    kv = [torch.randn(batch, 2, past, 8) for _ in range(4)]
    other = type(ex)(ex.entry, ex.ep, ex.onx, (ids, mask, *kv))
    out = run(other, ex.onx)
    assert not out.bad and out.verdict == "pass" and out.named is None, out.summary_text
    assert out.paired > 100
