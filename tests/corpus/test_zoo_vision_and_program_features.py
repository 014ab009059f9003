"""The second zoo (tests/corpus/zoo_vision_and_program_features.py): more architectures and
program features nobody here tuned for (vision transformers, shared and tied weights, GQA
with rotary, speech, UNet, torch.cond, FFT, int64/bool outputs, bfloat16, buffers mutated in
forward, a 200-layer chain).

Same checks as tests/corpus/test_zoo.py: each model is exported once per session; the
faithful export has no failing pair, verdict "pass" and a summary that names nothing;
three faults (a weight, an attribute, a swapped op, at rotating depths), each alone, are
each named by the summary (the injected node, or the fx node whose lowering holds it).
Cases that fail on today's engine are xfail(strict=True) with what goes wrong
(tests/corpus/known.py).
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tests.corpus.checks import assert_faithful, assert_named, case  # noqa: E402
from tests.corpus.evaluate import ZooSession, fault_plan  # noqa: E402
from tests.corpus.zoo_vision_and_program_features import ZOO2  # noqa: E402

pytestmark = pytest.mark.corpus

FAITHFUL = [case(e.name, "faithful", prefix="zoo2-") for e in ZOO2]
FAULTS = [
    case(e.name, f"{kind}-{depth}", kind, depth, prefix="zoo2-")
    for i, e in enumerate(ZOO2)
    for kind, depth in fault_plan(i)
]


@pytest.fixture(scope="session")
def zoo2() -> ZooSession:
    return ZooSession()


@pytest.mark.parametrize("model", FAITHFUL)
def test_faithful_export_names_nothing(zoo2, model, record_property):
    out = zoo2.faithful(model)
    record_property("paired", out.paired)
    record_property("unpaired_ep", out.unpaired_ep)
    record_property("unpaired_onnx", out.unpaired_onnx)
    assert_faithful(out)


@pytest.mark.parametrize("model,kind,depth", FAULTS)
def test_injected_fault_is_named(zoo2, model, kind, depth):
    zoo2.fault(model, kind, depth)
    assert_named(zoo2.faulted(model, kind, depth))


@pytest.mark.parametrize("model", [pytest.param(e.name, id=e.name) for e in ZOO2])
def test_every_output_is_compared(zoo2, model):
    """Each graph output of the export (several for clip, detr, fft, index_outputs) has a
    record that compared it: a multi-output model is checked on all it returns."""
    out = zoo2.faithful(model)
    onx = zoo2.exported(model).onx
    missing = [o.name for o in onx.graph.output if o.name not in out.compared_outputs]
    assert not missing, f"outputs never compared: {missing}"


def test_dynamic_llama_other_sizes(zoo2):
    """The dynamic-shape Llama, run on another batch and sequence length (and another
    padding pattern) than it was exported with."""
    import torch

    from tests.corpus.evaluate import run

    ex = zoo2.exported("llama_dynamic")
    torch.manual_seed(1)
    ids = torch.randint(1, 64, (3, 4))
    mask = torch.ones(3, 4, dtype=torch.int64)
    mask[2, 3:] = 0
    other = type(ex)(ex.entry, ex.ep, ex.onx, (ids, mask))
    out = run(other, ex.onx)
    assert not out.bad and out.verdict == "pass" and out.named is None, out.summary_text
