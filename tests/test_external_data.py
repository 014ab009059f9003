"""A model given by path keeps its large weights in its external data file until a node or
a comparison reads them (onnx_sbs_nb/external.py): the same records as the model loaded
whole, one copy of the weights fewer, and every reference checked."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from onnx_sbs_nb.align.run import AlignedRun
from onnx_sbs_nb.errors import SbsInputError
from onnx_sbs_nb.external import DEFERRED_BYTES, is_deferred

from .models import export


class Big(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(512, 768)  # 1.5 MB of weights: left in the file
        self.b = torch.nn.Linear(768, 64)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    torch.manual_seed(0)
    x = torch.randn(3, 512)
    ep, onx = export(Big(), (x,))
    folder = tmp_path_factory.mktemp("external")
    path = folder / "model.onnx"
    copy = onnx.ModelProto()
    copy.CopyFrom(onx)  # onnx.save moves the weights of what it saves out of it
    onnx.save(copy, str(path), save_as_external_data=True, location="model.onnx.data",
              size_threshold=0)  # fmt: skip
    return ep, onx, (x,), path


def _rows(records):
    return [(r.ep_name, r.onnx_name, r.status, r.err_abs, r.err_abs2, r.kind) for r in records]


def test_a_model_by_path_reads_its_large_weights_in_place(saved):
    ep, onx, args, path = saved
    run = AlignedRun(ep, str(path), args, own_error=True, time_nodes=True)
    got = list(run)
    deferred = [t for t in run.candidate.model.graph.initializer if is_deferred(t)]
    assert deferred and all(not t.raw_data for t in deferred)
    assert all(np.prod(t.dims) * 4 >= DEFERRED_BYTES for t in deferred)
    want = list(AlignedRun(ep, onx, args, own_error=True, time_nodes=True))
    assert _rows(got) == _rows(want)
    weights = [r for r in got if r.kind == "weight"]
    assert weights and all(r.status == "ok" for r in weights)
    # nothing read was loaded into the model: the weights are still only in the file
    assert all(is_deferred(t) and not t.raw_data for t in deferred)


def test_a_changed_weight_in_the_file_is_found(saved, tmp_path):
    ep, onx, args, path = saved
    model = onnx.load(str(path), load_external_data=False)
    big = next(t for t in model.graph.initializer if np.prod(t.dims) * 4 >= DEFERRED_BYTES)
    offset = int(next(e.value for e in big.external_data if e.key == "offset"))
    data = bytearray((path.parent / "model.onnx.data").read_bytes())
    data[offset : offset + 4] = np.float32(7.0).tobytes()
    (tmp_path / "model.onnx.data").write_bytes(bytes(data))
    (tmp_path / "model.onnx").write_bytes(path.read_bytes())
    records = list(AlignedRun(ep, str(tmp_path / "model.onnx"), args))
    bad = [r for r in records if r.onnx_name == big.name]
    assert bad and bad[0].failed, bad


def _hostile(path, tmp_path, **change):
    model = onnx.load(str(path), load_external_data=False)
    big = next(t for t in model.graph.initializer if is_deferred(t))
    for e in big.external_data:
        if e.key in change:
            e.value = change[e.key]
    (tmp_path / "model.onnx.data").write_bytes((path.parent / "model.onnx.data").read_bytes())
    onnx.save(model, str(tmp_path / "model.onnx"))
    return tmp_path / "model.onnx"


@pytest.mark.parametrize(
    "change,message",
    [
        ({"location": "../outside.data"}, "outside the model's folder"),
        ({"location": "/etc/passwd"}, "outside the model's folder"),
        ({"location": "missing.data"}, "does not exist"),
        ({"offset": "999999999"}, "truncated"),
        ({"length": "12"}, "not this model's"),
    ],
)
def test_a_bad_reference_is_refused_before_anything_runs(saved, tmp_path, change, message):
    ep, _, args, path = saved
    bad = _hostile(path, tmp_path, **change)
    with pytest.raises(SbsInputError, match=message):
        AlignedRun(ep, str(bad), args)


def test_a_replay_bundle_of_a_model_by_path_holds_its_weights(saved, tmp_path):
    ep, _, args, path = saved
    run = AlignedRun(ep, str(path), args, own_error=True)
    records = list(run)
    node = next(r for r in records if r.onnx_op_type in ("Gemm", "MatMul"))
    folder = run.actions.save_replay(node, tmp_path)
    model = onnx.load(str(next(folder.glob("*.onnx"))))
    assert any(np.prod(t.dims) * 4 >= DEFERRED_BYTES for t in model.graph.initializer)


def test_an_optimized_run_of_a_model_by_path_loads_it_whole(saved):
    ep, _, args, path = saved
    run = AlignedRun(ep, str(path), args, optimize="basic")
    records = list(run)
    assert not any(r.failed for r in records)
