"""A second run of the same program and model: what it reuses, and what it must not.

Pairing and provenance are kept per prepared program (``align/engine/setup_cache.py``); the
torch side runs without autograd and reads each node's arguments through loaders built
once.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from onnx_sbs_nb.align.engine import setup_cache
from onnx_sbs_nb.align.run import AlignedRun
from onnx_sbs_nb.compare import diff, value_facts

from ...models import MLP, export, mlp_export


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


def test_record_fields_are_described_once_per_program_and_provenance(mlp):
    """The ep_*/onnx_* fields of a pair are the same at every run: kept with each side's
    tables, and made again for another provenance (another user program)."""
    from onnx_sbs_nb.align.engine.sides import FxSide

    ep, onx, args = mlp
    first = AlignedRun(ep, onx, args)
    list(first)
    second = AlignedRun(ep, onx, args)
    records = list(second)
    name = next(r.ep_name for r in records if r.kind == "node" and r.onnx_name)
    onnx_name = next(r.onnx_name for r in records if r.ep_name == name)
    ref = second.reference
    assert ref.describe(name) is first.reference.describe(name)
    assert second.candidate.describe_candidate(onnx_name) is (
        first.candidate.describe_candidate(onnx_name)
    )
    assert ref.describe(name)["ep_module"] == next(
        r.ep_module for r in records if r.ep_name == name
    )
    tables = setup_cache.cached_fx_tables(ref.program)
    other = FxSide(ref.program, ref.bound, {}, "cpu", tables)  # no provenance at all
    assert other.describe(name)["ep_module"] is None
    assert other.describe(name) is not ref.describe(name)


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


def test_a_constant_edited_in_place_is_run_again_not_from_the_kept_session():
    """A Constant node's tensor (and a subgraph) is part of the structure: the one-node
    session keys kept for the model's digest must not hand out the old value."""

    class WithBuffer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("c", torch.arange(6.0).reshape(2, 3))

        def forward(self, x):
            return (x + self.c).sin()

    x = torch.randn(2, 3)
    ep, onx = export(WithBuffer(), (x,))
    g = onx.graph
    (init,) = g.initializer
    value = onnx.numpy_helper.to_array(init)
    g.node.insert(
        0,
        onnx.helper.make_node(
            "Constant", [], [init.name], value=onnx.numpy_helper.from_array(value, init.name)
        ),
    )
    del g.initializer[:]
    digest = setup_cache.structure_digest(onx)
    first = {r.onnx_name: r.status for r in AlignedRun(ep, onx, (x,))}
    assert first["add"] == first["sin"] == "ok"
    tensor = g.node[0].attribute[0].t
    tensor.CopyFrom(onnx.numpy_helper.from_array(value * 2, tensor.name))
    assert setup_cache.structure_digest(onx) != digest
    second = {r.onnx_name: r.status for r in AlignedRun(ep, onx, (x,))}
    assert second["add"] == second["sin"] == "fail"


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


@pytest.mark.parametrize("native", [True, False])
def test_strided_twins_equal_in_value_are_answered_in_one_pass(monkeypatch, native):
    """A transposed weight against its twin is checked in one pass, without a relayout:
    by the C library's tiled byte comparison, or by value in torch, where the read-only
    arrays onnx gives reach torch through a read-only-safe alias (torch warns on a
    read-only array, once per process, the user's arrays too)."""
    if native and diff.NATIVE is None:
        pytest.skip("the C library was not built")
    if not native:
        for module in (diff, value_facts):  # both read the C module
            monkeypatch.setattr(module, "NATIVE", None)
    torch.manual_seed(0)
    w = torch.randn(512, 128)
    twin = np.frombuffer(w.t().contiguous().numpy().tobytes(), np.float32).reshape(128, 512)
    assert not twin.flags.writeable
    seen = []
    real = torch.from_numpy

    def from_numpy(a):
        seen.append(a.flags.writeable)
        return real(a)

    monkeypatch.setattr(torch, "from_numpy", from_numpy)
    relayouts = []
    monkeypatch.setattr(diff, "_c_order", lambda a: relayouts.append(1) or a)
    d = diff.compare(w.t(), twin)
    assert d.passed and d.err_abs == 0.0 and d.err_rel == 0.0
    assert all(seen) and not relayouts
    assert bool(seen) is not native  # the C library reads the arrays as they are
    monkeypatch.undo()
    # equal values, not bits: -0.0 against 0.0 is no difference; NaN against NaN goes
    # to the full comparison, which matches them
    signed = w.clone()
    signed[0, 0], signed[1, 1] = 0.0, float("nan")
    other = signed.t().contiguous().numpy().copy()
    other[0, 0] = -0.0
    d = diff.compare(signed.t(), other)
    assert d.passed and d.err_abs == 0.0 and d.err_nan == 0
    other[5, 9] += 1.0
    d = diff.compare(signed.t(), other)
    assert not d.passed and d.err_abs == pytest.approx(1.0, rel=1e-5)


@pytest.mark.parametrize("time_nodes", [True, False])
def test_a_dropped_run_is_freed_at_once_not_by_the_cyclic_collector(mlp, time_nodes):
    """A run holds its records, plan, values and sessions' wrappers: with no reference
    cycle through it, dropping it frees them all at once.  A cycle would leave them for
    the cyclic collector, whose full passes over a large program cost a run's time.
    Without ``time_nodes``, a second run runs stretches (their own-error batch too)."""
    import gc
    import weakref

    ep, onx, args = mlp
    options = {"own_error": True, "time_nodes": time_nodes}
    for _ in range(2):  # the program prepared, sessions built, stretches recorded
        list(AlignedRun(ep, onx, args, **options))
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    # Objects alive before the run are not the run's, even when they turn into garbage
    # during it: an earlier test's daemon thread (a widget's background run) may drop an
    # exported program, whose fake tensors sit in cycles, at any moment.
    before = {id(o) for o in gc.get_objects()}
    try:
        run = AlignedRun(ep, onx, args, **options)
        records = list(run)
        run.actions.find_node(records[-1])  # the actions do not hold on to the run
        if time_nodes:
            assert run.candidate._fns  # the one-node runners, freed with the run
        else:
            assert run.run_ahead.layout is not None and any(run.run_ahead.own_done)
        refs = [weakref.ref(o) for o in (run, run.candidate, run.reference)]
        # the plan (names and step numbers) is kept for the next run of this program
        kept = weakref.ref(run.plan)
        del run, records
        assert [r() for r in refs] == [None] * len(refs)
        # what is left for the collector (torch's own cycles, whose number depends on
        # what ran before in the process) holds nothing of the run: none of our objects,
        # no value, no session
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = [_run_owned(o) for o in gc.garbage if id(o) not in before]
        assert [k for k in left if k] == []
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was:
            gc.enable()
    # outside the collector's check: a new run makes garbage of torch's own
    again = AlignedRun(ep, onx, args, **options)
    list(again)
    assert again.plan is kept()


def _run_owned(o: object) -> str | None:
    """What kind of a run's object ``o`` is, or None for an object a run does not own."""
    kind = type(o)
    if kind.__module__.split(".")[0] in ("onnx_sbs_nb", "onnxruntime"):
        return f"{kind.__module__}.{kind.__qualname__}"
    if isinstance(o, (torch.Tensor, np.ndarray)):
        return kind.__qualname__
    return None


def test_a_trace_shared_by_many_nodes_gives_each_its_source_line():
    from onnx_sbs_nb.align.source.provenance import source_line

    def trace(line: int) -> str:
        return (
            f'  File "/work/model.py", line {line}, in forward\n    y = self.fc(x)\n'
            '  File "/site-packages/torch/nn/modules/module.py", line 9, in _call_impl\n'
            "    return f()\n"
        )

    assert source_line({"stack_trace": trace(12)}) == "/work/model.py:12 in forward: y = self.fc(x)"
    # the same text in another string object, and more distinct traces than are kept
    for line in range(1, 700):
        text = "".join(list(trace(line)))
        assert (
            source_line({"stack_trace": text})
            == f"/work/model.py:{line} in forward: y = self.fc(x)"
        )
    assert source_line({"stack_trace": trace(12)}) == "/work/model.py:12 in forward: y = self.fc(x)"
    assert source_line({}) is None and source_line({"stack_trace": "no frame"}) is None


def test_source_line_skips_a_wrapper_that_only_forwards_its_arguments():
    """A RoPE bug's node ran through a kernel hub's wrapper (`return func(*args,
    **kwargs)`): the source line is the model's call one frame up, not the wrapper."""
    from onnx_sbs_nb.align.source.provenance import source_line

    trace = (
        '  File "/venv/site-packages/transformers/models/qwen2/modeling_qwen2.py", line 204, '
        "in forward\n    query_states, key_states = apply_rotary_pos_emb(q, k, cos, sin)\n"
        '  File "/venv/site-packages/kernels/_internals/layer/layer.py", line 856, in forward\n'
        "    return func(*args, **kwargs)\n"
        '  File "/venv/site-packages/transformers/utils/generic.py", line 940, in wrapper\n'
        "    outputs = func(self, *args, **kwargs)\n"
        '  File "/venv/site-packages/torch/nn/modules/module.py", line 9, in _call_impl\n'
        "    return forward_call(*args, **kwargs)\n"
    )
    assert source_line({"stack_trace": trace}) == (
        "transformers/models/qwen2/modeling_qwen2.py:204 in forward: "
        "query_states, key_states = apply_rotary_pos_emb(q, k, cos, sin)"
    )
    # a stack of wrappers only still names its innermost frame outside torch
    only = trace.split('  File "/venv/site-packages/kernels')[1]
    assert source_line({"stack_trace": '  File "/venv/site-packages/kernels' + only}) == (
        "transformers/utils/generic.py:940 in wrapper: outputs = func(self, *args, **kwargs)"
    )


def _protobuf_objects(obj, seen=None) -> list:
    """The protobuf messages reachable from ``obj`` through containers and dataclasses."""
    import dataclasses

    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, onnx.ModelProto | onnx.NodeProto | onnx.TensorProto | onnx.GraphProto):
        return [obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        items = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    elif isinstance(obj, dict):
        items = [*obj.keys(), *obj.values()]
    elif isinstance(obj, list | tuple | set | frozenset):
        items = list(obj)
    else:
        return []
    return [p for item in items for p in _protobuf_objects(item, seen)]


def test_a_second_run_reuses_the_tables_keys_and_plan_and_finds_the_same(mlp):
    ep, onx, args = mlp
    for own_error in (False, True):
        # time_nodes: one node at a time, the plan as kept (stretches: test_stretches.py)
        first = AlignedRun(ep, onx, args, own_error=own_error, time_nodes=True)
        first_records = list(first)
        second = AlignedRun(ep, onx, args, own_error=own_error, time_nodes=True)
        assert second.candidate.tables is first.candidate.tables
        assert second.reference.graph is first.reference.graph
        assert second.plan is first.plan
        second_records = list(second)
        assert _pairs(first_records) == _pairs(second_records)
        assert [r.err_abs for r in first_records] == [r.err_abs for r in second_records]
        assert [r.err_abs2 for r in first_records] == [r.err_abs2 for r in second_records]
    # each node's session key was kept as the node first ran
    tables = second.candidate.tables
    assert all(k is not None for k in tables.node_keys)
    # own-error runs wait for torch inputs: a plan of their own
    assert AlignedRun(ep, onx, args).plan is not AlignedRun(ep, onx, args, own_error=True).plan
    # nothing kept holds a protobuf object (it would keep the model's weights alive)
    assert _protobuf_objects(tables) == []


def test_another_opset_or_local_function_gets_its_own_tables(mlp):
    ep, _, args = mlp
    onx = onnx.ModelProto()
    onx.CopyFrom(mlp[1])
    before = AlignedRun(ep, onx, args).candidate.tables
    assert AlignedRun(ep, onx, args).candidate.tables is before
    onx.ir_version = onx.ir_version - 1  # not read by the digest: read by the sessions
    lowered = AlignedRun(ep, onx, args).candidate.tables
    assert lowered is not before
    # a function onnxruntime would load (one without a body or opsets it refuses)
    identity = onnx.helper.make_node("Identity", ["a"], ["b"])
    unused = onnx.helper.make_function(
        "local", "unused", ["a"], ["b"], [identity], [onnx.helper.make_opsetid("", 18)]
    )
    onx.functions.add().CopyFrom(unused)
    assert AlignedRun(ep, onx, args).candidate.tables is not lowered


def test_the_kept_tables_go_with_their_program():
    """The tables are kept per program, weakly: they hold the program's fx nodes, never
    the program itself, so dropping the program drops them."""
    import gc
    import weakref

    ep, onx, args = mlp_export()
    run = AlignedRun(ep, onx, args)
    list(run)
    prepared = weakref.ref(run.program)
    assert prepared() in setup_cache._FX_TABLES and prepared() in setup_cache._ONNX_TABLES
    fx_tables = weakref.ref(setup_cache._FX_TABLES[prepared()])
    del run, ep
    gc.collect()
    assert prepared() is None and fx_tables() is None


def test_a_second_run_with_the_torch_runner_compiles_no_node(mlp):
    """The torch evaluator's compiled nodes are shared like onnxruntime's sessions: a
    second run compiles none (each compilation generates and compiles Python source), and
    finds the same; a runner with custom kernels compiles its own, and they run."""
    from onnx_sbs_nb.align.engine.runners import TorchRunner

    ep, onx, args = mlp
    first = AlignedRun(ep, onx, args, runner="torch")
    records = list(first)
    second = AlignedRun(ep, onx, args, runner="torch")
    again = list(second)
    assert second.candidate.runner.nodes_compiled == 0
    assert _pairs(again) == _pairs(records)
    assert [r.err_abs for r in again] == [r.err_abs for r in records]
    assert all(r.status == "ok" for r in again if r.err_abs is not None)
    broken = TorchRunner("cpu", custom_kernels={("", "Relu"): lambda a: torch.relu(a) * 1.5})
    custom = AlignedRun(ep, onx, args, runner=broken)
    found = list(custom)
    assert broken.nodes_compiled > 0
    assert any(r.onnx_op_type == "Relu" and r.status == "fail" for r in found)
    # and the shared nodes were not replaced by the custom ones
    assert all(r.status == "ok" for r in AlignedRun(ep, onx, args, runner="torch") if r.err_abs)


def test_a_digest_taken_again_is_that_of_the_model_as_it_is_now(mlp):
    """structure_digest answers a structure digested lately from the bytes it kept: a
    node renamed in place (the same length of bytes) gets another digest, the one a
    fresh hash gives, and the original structure its original digest."""
    from onnx_sbs_nb.align.source.prepare import check

    onx = onnx.ModelProto()
    onx.CopyFrom(mlp[1])
    first = setup_cache.structure_digest(onx)
    assert setup_cache.structure_digest(onx) == first  # kept: a memcmp
    name = onx.graph.node[0].name
    onx.graph.node[0].name = name[:-1] + ("x" if name[-1] != "x" else "y")
    renamed = setup_cache.structure_digest(onx)
    assert renamed != first
    check._DIGESTED.clear()
    assert setup_cache.structure_digest(onx) == renamed
    onx.graph.node[0].name = name
    assert setup_cache.structure_digest(onx) == first
