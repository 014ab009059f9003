"""A second run of the same program and model: what it reuses, and what it must not.

Pairing and provenance are kept per prepared program (``align/setup_cache.py``); the
torch side runs without autograd and reads each node's arguments through loaders built
once.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from onnx_sbs_nb import diff
from onnx_sbs_nb.align import setup_cache
from onnx_sbs_nb.align.run import AlignedRun

from .models import MLP, export, mlp_export


@pytest.fixture(scope="module")
def mlp():
    return mlp_export()


def _pairs(records):
    return [(r.onnx_name, r.ep_name, r.paired_by, r.status) for r in records]


def _counting(monkeypatch, name):
    calls = []
    real = getattr(setup_cache, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(setup_cache, name, counted)
    return calls


def test_second_run_pairs_once_and_finds_the_same(mlp, monkeypatch):
    ep, onx, args = mlp
    pairings = _counting(monkeypatch, "pair_values")
    provenances = _counting(monkeypatch, "program_provenance")
    first = list(AlignedRun(ep, onx, args))
    second = list(AlignedRun(ep, onx, args))
    assert _pairs(first) == _pairs(second)
    assert [r.ep_user_name for r in first] == [r.ep_user_name for r in second]
    assert [r.err_abs for r in first] == [r.err_abs for r in second]
    # the module fixture may have been paired by an earlier test: at most one new pairing
    assert len(pairings) <= 1 and len(provenances) <= 1
    list(AlignedRun(ep, onx, args))
    assert len(pairings) <= 1 and len(provenances) <= 1


def test_a_model_edited_in_place_is_paired_again(mlp, monkeypatch):
    ep, _, args = mlp
    onx = onnx.ModelProto()
    onx.CopyFrom(mlp[1])
    before = {r.onnx_name: r for r in AlignedRun(ep, onx, args)}
    # rename one computed value everywhere: it no longer shares its fx node's name
    node = next(n for n in onx.graph.node if n.op_type == "Relu")
    old = node.output[0]
    assert before[old].paired_by == "name"
    new = "renamed_by_the_user"
    for n in onx.graph.node:
        n.output[:] = [new if o == old else o for o in n.output]
        n.input[:] = [new if i == old else i for i in n.input]
    for vi in onx.graph.value_info:
        if vi.name == old:
            vi.name = new
    pairings = _counting(monkeypatch, "pair_values")
    after = {r.onnx_name: r for r in AlignedRun(ep, onx, args)}
    assert len(pairings) == 1
    assert old not in after and new in after
    assert after[new].paired_by != "name"  # found through the node's metadata, or not at all


def test_each_run_gets_its_own_pairing_tables(mlp):
    ep, onx, args = mlp
    run = AlignedRun(ep, onx, args)
    name = next(iter(run.pairing.by_onnx))
    run.pairing.by_onnx.pop(name)
    run.pairing.by_fx.clear()
    again = AlignedRun(ep, onx, args)
    assert name in again.pairing.by_onnx and again.pairing.by_fx


def test_structure_digest_reads_structure_not_weight_values(mlp):
    onx = onnx.ModelProto()
    onx.CopyFrom(mlp[1])
    digest = setup_cache.structure_digest(onx)
    init = onx.graph.initializer[0]
    values = onnx.numpy_helper.to_array(init) + 1
    init.CopyFrom(onnx.numpy_helper.from_array(values.astype(values.dtype), init.name))
    assert setup_cache.structure_digest(onx) == digest
    onx.graph.output[0].type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
    assert setup_cache.structure_digest(onx) != digest
    retyped = setup_cache.structure_digest(onx)
    onx.graph.node[0].input[0] = "another_value"
    renamed = setup_cache.structure_digest(onx)
    assert renamed != retyped
    # nodes are read whole: metadata and attributes count too
    onx.graph.node[-1].metadata_props.add(key="pkg.torch.onnx.fx_node", value="%x : ...")
    assert setup_cache.structure_digest(onx) != renamed
    annotated = setup_cache.structure_digest(onx)
    onx.graph.node[-1].attribute.append(onnx.helper.make_attribute("alpha", 0.5))
    assert setup_cache.structure_digest(onx) != annotated


def test_torch_side_records_no_autograd_and_reads_nested_arguments():
    class Nested(MLP):
        def forward(self, x):
            y = self.fc1(x)
            return torch.cat([y, x * 2, y], dim=-1).sum(dim=[0])  # a list of inputs

    x = torch.randn(3, 4)
    model = Nested(d_in=4, hidden=4)
    ep, onx = export(model, (x,))
    run = AlignedRun(ep, onx, (x,))
    side = run.reference
    assert any(p.requires_grad for p in ep.parameters())
    env: dict = {}
    for idx, node in enumerate(side.nodes):
        (env[node.name],) = side.run(idx, env)
    computed = [env[n.name] for n in side.nodes if n.op == "call_function"]
    assert computed and not any(v.requires_grad for v in computed)
    with torch.no_grad():
        torch.testing.assert_close(env[side.graph_outputs[0]], model(x))
    # a missing input is an upstream failure, named
    last = len(side.nodes) - 1
    with pytest.raises(RuntimeError, match="not available"):
        side.run(last, {})
    # the grad mode is the caller's again after every node, a failing one too
    linear = next(i for i, n in enumerate(side.nodes) if "linear" in str(n.target))
    bad = {**env, side.nodes[linear].args[0].name: torch.randn(3, 5)}
    assert torch.is_grad_enabled()
    with pytest.raises(RuntimeError):
        side.run(linear, bad)
    assert torch.is_grad_enabled()
    with torch.no_grad():
        side.run(linear, env)
        assert not torch.is_grad_enabled()


def test_transposed_weight_against_its_contiguous_twin():
    torch.manual_seed(0)
    w = torch.randn(1024, 256)
    twin = w.t().contiguous().numpy().copy()
    assert diff.compare(w.t(), twin).err_abs == 0.0
    twin[3, 700] += 0.5
    twin[200, 5] = np.nan
    d = diff.compare(w.t(), twin)
    assert d.err_nan == 1 and d.err_abs == float("inf") and not d.passed
    twin[200, 5] = w[5, 200].item()
    d = diff.compare(w.t(), twin)
    assert d.err_abs == pytest.approx(0.5, abs=1e-6) and d.err_h01 == 1 and not d.passed
    strided = diff.compare(w.t(), np.ascontiguousarray(twin.T).T)  # both strided: as is
    assert strided.err_abs == d.err_abs and strided.err_rel == d.err_rel


def test_a_dropped_run_is_freed_at_once_not_by_the_cyclic_collector(mlp):
    """A run holds its records, plan, values and sessions' wrappers: with no reference
    cycle through it, dropping it frees them all at once.  A cycle would leave them for
    the cyclic collector, whose full passes over a large program cost a run's time."""
    import gc
    import weakref

    ep, onx, args = mlp
    list(AlignedRun(ep, onx, args, own_error=True))  # the program prepared, sessions built
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        run = AlignedRun(ep, onx, args, own_error=True)
        records = list(run)
        run.actions.find_node(records[-1])  # the actions do not hold on to the run
        assert run.candidate._fns  # the one-node runners, freed with the run
        refs = [weakref.ref(o) for o in (run, run.candidate, run.reference, run.plan)]
        del run, records
        assert [r() for r in refs] == [None] * len(refs)
        # what is left for the collector (torch's own cycles, whose number depends on
        # what ran before in the process) holds nothing of the run: none of our objects,
        # no value, no session
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = [_run_owned(o) for o in gc.garbage]
        assert [k for k in left if k] == []
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was:
            gc.enable()


def _run_owned(o: object) -> str | None:
    """What kind of a run's object ``o`` is, or None for an object a run does not own."""
    kind = type(o)
    if kind.__module__.split(".")[0] in ("onnx_sbs_nb", "onnxruntime"):
        return f"{kind.__module__}.{kind.__qualname__}"
    if isinstance(o, (torch.Tensor, np.ndarray)):
        return kind.__qualname__
    return None
