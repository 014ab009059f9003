"""The zoo (tests/corpus/zoo.py): architectures nobody here tuned for, issue 10.

For each model, exported once per session: the faithful export has no failing pair,
verdict "pass" and a summary that names nothing; then three faults, each alone (a weight,
an attribute, a swapped op, at rotating depths), each must be named by the summary: the
injected node, or the fx node whose lowering holds it.  Cases that fail on today's engine
are xfail(strict=True) with their defect class (tests/corpus/known.py).
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tests.corpus.checks import assert_faithful, assert_named, case  # noqa: E402
from tests.corpus.evaluate import ZooSession, fault_plan  # noqa: E402
from tests.corpus.zoo import ZOO  # noqa: E402

pytestmark = pytest.mark.corpus


FAITHFUL = [case(e.name, "faithful") for e in ZOO]
FAULTS = [
    case(e.name, f"{kind}-{depth}", kind, depth)
    for i, e in enumerate(ZOO)
    for kind, depth in fault_plan(i)
]


@pytest.fixture(scope="session")
def zoo() -> ZooSession:
    return ZooSession()


@pytest.mark.parametrize("model", FAITHFUL)
def test_faithful_export_names_nothing(zoo, model, record_property):
    out = zoo.faithful(model)
    record_property("paired", out.paired)
    record_property("unpaired_ep", out.unpaired_ep)
    record_property("unpaired_onnx", out.unpaired_onnx)
    assert_faithful(out)


@pytest.mark.parametrize("model", [pytest.param(e.name, id=e.name) for e in ZOO])
def test_pairing_covers_outputs_and_most_nodes(zoo, model):
    """Every graph output is compared, and the paired values outnumber the unpaired."""
    out = zoo.faithful(model)
    onx = zoo.exported(model).onx
    assert out.paired >= len(onx.graph.output) + len(onx.graph.input)
    assert out.paired > out.unpaired_ep + out.unpaired_onnx or out.paired >= 10, (
        out.paired,
        out.unpaired_ep,
        out.unpaired_onnx,
    )


@pytest.mark.parametrize("model,kind,depth", FAULTS)
def test_injected_fault_is_named(zoo, model, kind, depth):
    zoo.fault(model, kind, depth)
    assert_named(zoo.faulted(model, kind, depth))


def test_dynamic_shapes_other_input_sizes(zoo):
    """The dynamic-shape export, run on inputs of another batch and sequence length."""
    import torch

    from tests.corpus.evaluate import run

    ex = zoo.exported("dynamic_attention")
    torch.manual_seed(1)
    mask = torch.ones(2, 4, dtype=torch.int64)
    mask[0, 3:] = 0
    other = type(ex)(ex.entry, ex.ep, ex.onx, (torch.randn(2, 4, 16), mask))
    out = run(other, ex.onx)
    assert not out.bad and out.verdict == "pass" and out.named is None, out.summary_text
