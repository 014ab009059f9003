"""A second run of the same model skips the checks its structure passed
(``setup_cache.checked_model``): its records are those of a first run, and a model edited
in place between runs (a weight truncated, a constant, the node order, the metadata, a
local function) is checked and read again, never served what the first run found."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper
import pytest

from onnx_sbs_nb.align.engine import setup_cache
from onnx_sbs_nb.align.run import AlignedRun
from onnx_sbs_nb.errors import SbsInputError
from onnx_sbs_nb.records import FAILING_STATUSES

from ...models import mlp_export

# what differs between two runs of the same model whatever the engine keeps
_TIMES = {"ep_time_run", "onnx_time_run"}


@pytest.fixture(scope="module")
def mlp():
    return mlp_export()


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def _fields(records) -> list[dict]:
    return [{k: v for k, v in dataclasses.asdict(r).items() if k not in _TIMES} for r in records]


def _cold(ep, onx, args, **options) -> list[dict]:
    """The records of a run that finds no model checked before."""
    setup_cache._CHECKED.clear()
    return _fields(AlignedRun(ep, _copy(onx), args, **options))


def _counting_checks(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = setup_cache.check_model

    def counted(model, **kwargs):
        calls.append(1)
        return real(model, **kwargs)

    monkeypatch.setattr(setup_cache, "check_model", counted)
    return calls


def _faulty(onx: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its first weight matrix off by 0.5: that weight and what it feeds
    fail."""
    faulty = _copy(onx)
    init = next(i for i in faulty.graph.initializer if len(i.dims) == 2)
    values = onnx.numpy_helper.to_array(init) + np.float32(0.5)
    init.CopyFrom(onnx.numpy_helper.from_array(values, init.name))
    return faulty


@pytest.mark.parametrize("own_error", [False, True])
@pytest.mark.parametrize("which", ["exported", "faulty"])
def test_a_warm_run_gives_every_field_of_a_cold_run(mlp, monkeypatch, which, own_error):
    ep, onx, args = mlp
    model = onx if which == "exported" else _faulty(onx)
    cold = _cold(ep, model, args, own_error=own_error)
    assert any(r["status"] in FAILING_STATUSES for r in cold) == (which == "faulty")
    checks = _counting_checks(monkeypatch)
    for _ in range(2):
        assert _fields(AlignedRun(ep, model, args, own_error=own_error)) == cold
    assert len(checks) <= 1  # the first of them may have checked it, not the second


def test_a_weight_changed_between_runs_is_read_again(mlp):
    ep, onx, args = mlp
    model = _copy(onx)
    passing = _fields(AlignedRun(ep, model, args))
    assert _fields(AlignedRun(ep, model, args)) == passing
    model.CopyFrom(_faulty(onx))  # the same structure, other weight values
    warm = _fields(AlignedRun(ep, model, args))
    assert warm != passing
    assert warm == _cold(ep, model, args)


def test_a_weight_truncated_between_runs_is_refused(mlp):
    ep, onx, args = mlp
    model = _copy(onx)
    list(AlignedRun(ep, model, args))
    list(AlignedRun(ep, model, args))
    init = next(i for i in model.graph.initializer if len(i.dims) == 2)
    init.raw_data = init.raw_data[:-4]  # dims, type, name: the structure digest's, unchanged
    with pytest.raises(SbsInputError, match="holds"):
        AlignedRun(ep, model, args)


def test_a_constant_truncated_between_runs_is_refused(mlp):
    ep, onx, args = mlp
    model = _copy(onx)
    x = model.graph.node[0].input[0]
    value = oh.make_tensor("c", onnx.TensorProto.FLOAT, [2], [1.0, 2.0])
    model.graph.node.insert(0, oh.make_node("Constant", [], ["unused_c"], value=value))
    list(AlignedRun(ep, model, args))
    list(AlignedRun(ep, model, args))
    assert model.graph.node[1].input[0] == x
    del model.graph.node[0].attribute[0].t.float_data[1:]
    with pytest.raises(SbsInputError, match="holds 1"):
        AlignedRun(ep, model, args)


def test_nodes_reordered_between_runs_are_run_in_order(mlp):
    ep, onx, args = mlp
    model = _copy(onx)
    in_order = _fields(AlignedRun(ep, model, args))
    list(AlignedRun(ep, model, args))
    nodes = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend([nodes[-1], *nodes[:-1]])  # the last node first: out of order
    run = AlignedRun(ep, model, args)
    assert run.model is not model  # a sorted copy, not the model as the user holds it
    assert [n.name for n in run.model.graph.node] == [n.name for n in nodes]
    assert _fields(run) == in_order


def test_metadata_dropped_between_runs_is_read_again(mlp):
    ep, onx, args = mlp
    model = _copy(onx)
    list(AlignedRun(ep, model, args))
    list(AlignedRun(ep, model, args))
    for node in model.graph.node:
        del node.metadata_props[:]
    warm = AlignedRun(ep, model, args)
    assert not any(warm.candidate.tables.lowering) or warm.candidate.tables.lowering_inferred
    assert _fields(warm) == _cold(ep, model, args)


def test_a_function_calling_itself_added_between_runs_is_refused(mlp):
    ep, onx, args = mlp
    model = _copy(onx)
    list(AlignedRun(ep, model, args))
    list(AlignedRun(ep, model, args))
    call = oh.make_node("loop", ["a"], ["b"], domain="local")
    model.functions.append(
        oh.make_function("local", "loop", ["a"], ["b"], [call], [oh.make_opsetid("", 18)])
    )
    with pytest.raises(SbsInputError, match="calls itself|call each other"):
        AlignedRun(ep, model, args)


def test_the_kept_checks_hold_no_protobuf_object(mlp):
    ep, onx, args = mlp
    list(AlignedRun(ep, onx, args))
    assert setup_cache._CHECKED
    for names in setup_cache._CHECKED.values():
        assert all(n is None or isinstance(n, str) for n in names)


def test_order_free_values_are_found_again_on_a_warm_run():
    """The order-free groups (topk sorted=False) are kept beside the plan: a warm run
    compares them as sets exactly as the first run did, with a dict of its own."""
    from ..judge.test_unordered_and_shapes import _sampler

    ep, onx, args = _sampler()
    first = AlignedRun(ep, onx, args, own_error=True)
    cold = _fields(first)
    second = AlignedRun(ep, onx, args, own_error=True)
    assert second._order_free and second._order_free == first._order_free
    assert second._order_free is not first._order_free
    assert _fields(second) == cold
    assert any("compared as sets" in (r["comment"] or "") for r in cold)


def test_a_run_takes_its_weights_from_the_bytes_its_check_read(mlp):
    """The check reads every initializer's bytes (a copy per read): the run takes its
    weights from that read, cold or warm, and reads nothing the check did not."""
    ep, onx, args = mlp
    model = _copy(onx)
    for _ in range(2):  # cold, then warm
        run = AlignedRun(ep, model, args)
        reads = run.candidate._checked_reads
        assert set(reads) == {i.name for i in model.graph.initializer}
        for init in model.graph.initializer:
            assert np.array_equal(reads[init.name], onnx.numpy_helper.to_array(init))
        list(run)


def test_read_weights_are_handed_to_one_run_only(mlp):
    """What a check read goes to the run that checked: neither the tables kept for later
    runs nor another side of the same model hand it out again, so a weight changed in
    place after that check is read as it is now."""
    from onnx_sbs_nb.align.engine.sides import OnnxSide

    ep, onx, args = mlp
    model = _copy(onx)
    run = AlignedRun(ep, model, args)
    tables = run.candidate.tables
    assert run.candidate._checked_reads and tables._handed is None
    init = next(i for i in model.graph.initializer if len(i.dims) == 2)
    values = onnx.numpy_helper.to_array(init) + np.float32(0.5)
    init.raw_data = values.tobytes()
    side = OnnxSide(model, run.candidate.runner, "cpu", tables=tables)
    assert not side._checked_reads
    assert np.array_equal(side.initializer(init.name), values)
    # metadata a run over many inputs keeps hands its reads out once
    metadata = setup_cache.checked_model(model)[2]
    assert metadata.take_reads() and metadata.take_reads() is None


def test_reads_follow_the_last_initializer_of_a_name(mlp):
    """A name given to two initializers: the run reads the last one (OnnxSide's); where
    the check cannot keep the last one (not raw bytes), it keeps none for that name."""
    from onnx_sbs_nb.align.source import model_check

    ep, onx, args = mlp
    model = _copy(onx)
    init = next(i for i in model.graph.initializer if len(i.dims) == 2)
    twin = model.graph.initializer.add()
    twin.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(init) * 2, init.name))
    reads: dict = {}
    model_check.check_tensors(model, initializers_only=True, reads=reads)
    assert np.array_equal(reads[init.name], onnx.numpy_helper.to_array(twin))
    zeros = [0.0] * int(np.prod(init.dims))
    twin.CopyFrom(oh.make_tensor(init.name, init.data_type, init.dims, zeros))
    model_check.check_tensors(model, initializers_only=True, reads=reads)
    assert init.name not in reads  # float_data: read by numpy_helper, where used


def test_a_check_keeps_no_more_bytes_than_its_budget(mlp, monkeypatch):
    """A model with more weights than the check keeps: they are read where used."""
    from onnx_sbs_nb.align.source import model_check

    ep, onx, args = mlp
    model = _copy(onx)
    monkeypatch.setattr(model_check, "READS_KEPT_BYTES", 1)
    reads: dict = {}
    model_check.check_tensors(model, initializers_only=True, reads=reads)
    assert len(reads) == 1
    monkeypatch.setattr(model_check, "READS_KEPT_BYTES", 0)
    run = AlignedRun(ep, model, args)
    assert not run.candidate._checked_reads
    assert _fields(run) == _fields(AlignedRun(ep, _copy(onx), args))
