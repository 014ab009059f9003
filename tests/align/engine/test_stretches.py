"""Stretches (align/engine/stretches.py): a second run of a model on inputs of the same shapes runs
consecutive onnxruntime nodes as one session, and gives the records of one node at a time."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from onnx_sbs_nb.align import screen
from onnx_sbs_nb.align.engine.stretches import ALONE_OPS, MAX_NODES
from onnx_sbs_nb.align.run import AlignedRun
from onnx_sbs_nb.records import RECORD_FIELDS

from ...models import export

# timings, and the place in the stream: with own errors, a stretch's nodes wait together
# for the torch values they read, so a value only torch computes may be listed earlier
_NOT_COMPARED = ("ep_time_run", "onnx_time_run", "step")


@pytest.fixture(autouse=True)
def _engine_only(monkeypatch):
    """The warm runs here are the engine's (a warm run where every pair passes is
    otherwise the screen's, ``warm_screen.py``)."""
    monkeypatch.setattr(screen, "ENABLED", False)


def _fields(records):
    """Every field of every record but the timings and the place (NaN made comparable),
    in one order."""
    out = []
    for r in records:
        d = {
            k: ("nan" if isinstance(v, float) and v != v else v)
            for k, v in r.to_dict().items()
            if k not in _NOT_COMPARED
        }
        out.append(json.dumps(d, sort_keys=True, default=str))
    return sorted(out)


class Wide(torch.nn.Module):
    """Linears onnxruntime runs with threads (a weight of 256K elements and more) between
    ones it runs on one thread: a MatMul of N=128 rounds otherwise with two threads."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(256, 1024)
        self.down = torch.nn.Linear(1024, 256)
        self.kv = torch.nn.Linear(256, 128)
        self.out = torch.nn.Linear(128, 256)

    def forward(self, x):
        h = torch.nn.functional.silu(self.up(x))
        y = self.down(h) * torch.sigmoid(x)
        z = torch.tanh(self.kv(y)).reshape(*y.shape[:-1], 2, 64).transpose(-1, -2)
        z = z.reshape(*y.shape[:-1], 128)
        return self.out(z) + y.mean(-1, keepdim=True)


@pytest.fixture(scope="module")
def wide():
    torch.manual_seed(0)
    x = torch.randn(2, 64, 256)
    ep, onx = export(Wide(), (x,))
    return ep, onx, (x,)


def _run(ep, onx, args, **options):
    run = AlignedRun(ep, onx, args, **options)
    return run, list(run)


def test_a_second_run_runs_stretches_and_gives_the_same_records(wide):
    ep, onx, args = wide
    first, a = _run(ep, onx, args, own_error=True)
    second, b = _run(ep, onx, args, own_error=True)
    assert "stretches" not in first.status.extra
    assert second.status.extra["stretches"] >= 2
    # the same kernels on the same values: every field of every record, bit for bit
    # (a stretch that mixed one- and multi-threaded nodes would change errors here)
    assert _fields(a) == _fields(b)
    assert any(r.err_abs for r in b), "the test wants values that differ by rounding"
    covered = second.run_ahead.layout.covered
    nodes = [r for r in b if r.onnx_id_node is not None and r.onnx_id_node >= 0]
    in_stretch = [r for r in nodes if covered[r.onnx_id_node]]
    alone = [r for r in nodes if not covered[r.onnx_id_node]]
    assert in_stretch and alone
    assert all(r.onnx_time_run is None for r in in_stretch)
    assert all(r.onnx_time_run is not None for r in alone)
    assert all(
        r.onnx_time_run is not None for r in a if r.onnx_id_node is not None and r.onnx_id_node >= 0
    )
    # asked to, every node runs and is timed on its own
    timed, c = _run(ep, onx, args, own_error=True, time_nodes=True)
    assert "stretches" not in timed.status.extra and _fields(c) == _fields(a)
    assert all(
        r.onnx_time_run is not None for r in c if r.onnx_id_node is not None and r.onnx_id_node >= 0
    )


def test_stretches_keep_a_node_s_threading(wide):
    """A stretch holds nodes that ran with threads, or nodes that did not, never both."""
    ep, onx, args = wide
    _run(ep, onx, args)
    second, _ = _run(ep, onx, args)
    memo = next(iter(second.candidate.tables.stretch_memos.values()))
    assert any(memo.large) and not all(memo.large)
    for s in second.run_ahead.layout.starting.values():
        flags = {memo.large[k] for k in range(s.first, s.last + 1)}
        assert flags == {s.large}, (s.first, s.last, flags)
        assert s.last - s.first + 1 <= MAX_NODES


def test_inputs_of_other_shapes_are_run_node_by_node_first():
    torch.manual_seed(1)
    batch = torch.export.Dim("batch", min=1, max=64)
    x2 = torch.randn(2, 64, 256)
    ep, onx = export(Wide(), (x2,), dynamic_shapes=({0: batch},))
    x3 = torch.randn(3, 64, 256)
    runs = [_run(ep, onx, (x,)) for x in (x2, x2, x3, x3)]
    used = ["stretches" in run.status.extra for run, _ in runs]
    assert used == [False, True, False, True]
    for (_, recs), x in zip(runs, (x2, x2, x3, x3)):
        _, want = _run(ep, onx, (x,), time_nodes=True)
        assert _fields(recs) == _fields(want)


class Lookup(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(16, 8)
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, ids, x):
        return self.fc(torch.tanh(self.emb(ids) * 2 + x)) + 1


def test_a_stretch_that_fails_runs_node_by_node():
    """Indices out of range (same shapes): the stretch holding the Gather fails, its
    nodes run one by one, each failure its own record, as without stretches."""
    torch.manual_seed(2)
    ids, x = torch.randint(0, 16, (2, 5)), torch.randn(2, 5, 8)
    ep, onx = export(Lookup(), (ids, x))
    _run(ep, onx, (ids, x))
    bad = ids.clone()
    bad[1, 2] = 99
    run, got = _run(ep, onx, (bad, x))
    assert run.status.extra.get("stretches")
    broken = [s for s in run.run_ahead.layout.starting.values() if s.broken]
    assert broken, "the stretch with the Gather failed"
    _, want = _run(ep, onx, (bad, x), time_nodes=True)
    assert _fields(got) == _fields(want)
    assert any(r.status == "error" and r.onnx_op_type == "Gather" for r in got)
    # not tried again: the next run on good indices runs those nodes one by one
    again, recs = _run(ep, onx, (ids, x))
    assert all(r.status in ("ok", "unpaired_ep", "unpaired_onnx") for r in recs if r.onnx_name)
    assert broken[0] in again.run_ahead.layout.starting.values() and broken[0].broken


class Grow(torch.nn.Module):
    def forward(self, x, n):
        z = torch.zeros(n.shape[0], x.shape[-1]) + x.sum(0)
        return (z.expand(3, -1, -1) * 2).sin() + 1


def test_nodes_whose_size_values_set_run_alone():
    torch.manual_seed(3)
    x, n = torch.randn(4, 6), torch.zeros(5)
    ep, onx = export(Grow(), (x, n))
    _run(ep, onx, (x, n))
    run, recs = _run(ep, onx, (x, n))
    ops = [node.op_type for node in onx.graph.node]
    alone = [k for k, op in enumerate(ops) if op in ALONE_OPS]
    assert alone, ops
    if run.run_ahead.layout is not None:
        assert not any(run.run_ahead.layout.covered[k] for k in alone)
    _, want = _run(ep, onx, (x, n), time_nodes=True)
    assert _fields(recs) == _fields(want)


def test_consumers_of_reset_values_run_after_the_reset(wide):
    ep, onx, args = wide
    first, _ = _run(ep, onx, args, own_error=True)
    reset = next(
        r.onnx_name for r in _run(ep, onx, args, own_error=True)[1] if r.onnx_op_type == "Tanh"
    )
    _run(ep, onx, args, reset_names=[reset])  # records the memo
    run, got = _run(ep, onx, args, reset_names=[reset])
    assert run.status.extra.get("stretches")
    consumers = [k for k, n in enumerate(onx.graph.node) if reset in n.input]
    assert consumers and not any(run.run_ahead.layout.covered[k] for k in consumers)
    _, want = _run(ep, onx, args, reset_names=[reset], time_nodes=True)
    assert _fields(got) == _fields(want)
    assert any(r.reset for r in got)


def test_time_nodes_is_an_option_everywhere():
    from onnx_sbs_nb.align.engine.options import RunOptions
    from onnx_sbs_nb.cli.main import build_parser
    from onnx_sbs_nb.errors import SbsInputError
    from onnx_sbs_nb.notebook.run_args import options_from_args

    assert RunOptions(time_nodes=True).to_dict()["time_nodes"] is True
    with pytest.raises(SbsInputError, match="time_nodes"):
        RunOptions(time_nodes="yes")
    argv = ["run", "--ep", "a.pt2", "--onnx", "b.onnx", "--inputs", "c.pt", "--time-nodes"]
    args = build_parser().parse_args(argv)
    assert options_from_args(args).time_nodes is True
    assert "onnx_time_run" in RECORD_FIELDS and np is not None


def test_torch_nodes_before_a_stretch_run_as_one_function(wide):
    ep, onx, args = wide
    _run(ep, onx, args)
    run, recs = _run(ep, onx, args)
    assert run.run_ahead.fx_runs and run.run_ahead.fx_until >= 0
    assert not any(r.broken for r in run.run_ahead.fx_runs.values())
    ahead = [r for r in recs if r.ep_name and r.ep_time_run is None]
    assert ahead, "torch nodes of a compiled run are not timed one by one"
    _, want = _run(ep, onx, args, time_nodes=True)
    assert _fields(recs) == _fields(want)


def test_a_compiled_torch_run_that_fails_runs_node_by_node():
    torch.manual_seed(4)
    ids, x = torch.randint(0, 16, (2, 5)), torch.randn(2, 5, 8)
    ep, onx = export(Lookup(), (ids, x))
    _run(ep, onx, (ids, x))
    bad = ids.clone()
    bad[0, 0] = 77  # torch's embedding raises too
    run, got = _run(ep, onx, (bad, x))
    assert any(r.broken for r in run.run_ahead.fx_runs.values())
    _, want = _run(ep, onx, (bad, x), time_nodes=True)
    assert _fields(got) == _fields(want)
    assert any(r.status == "error" and r.ep_target == "aten.embedding" for r in got)


def test_compiled_torch_runs_check_output_sizes(wide, monkeypatch):
    """The size rules of fx_limits.py hold in a compiled run as one node at a time."""
    from onnx_sbs_nb.align.engine import fx_limits
    from onnx_sbs_nb.align.engine.limits import OutputTooLargeError

    ep, onx, args = wide
    _run(ep, onx, args)

    def refuse(shape, itemsize, device="cpu"):
        if int(np.prod(shape)) * itemsize >= 2 * 64 * 256 * 4:
            raise OutputTooLargeError(f"refused {list(shape)}")

    monkeypatch.setattr(fx_limits, "refuse_if_too_large", refuse)
    run, got = _run(ep, onx, args)
    assert run.status.extra.get("stretches")
    _, want = _run(ep, onx, args, time_nodes=True)
    assert _fields(got) == _fields(want)
    assert any(r.error and "refused" in r.error for r in got)


def test_a_compiled_run_never_executes_names_from_the_program():
    """Keyword and value names come from a file: they reach the generated code as string
    literals only."""
    from onnx_sbs_nb.align.engine.fx_runs import _function

    seen = {}

    def op(x, **kwargs):
        seen.update(kwargs)
        return x + 1

    g = torch.fx.Graph()
    x = g.placeholder("x")
    hostile = "y=1); raise SystemExit('ran code from the file'); (z"
    a = g.call_function(op, (x,), {hostile: 2})
    a.name = "a'); raise SystemExit('name'); ('"
    b = g.call_function(op, (a,), {})
    fn = _function([a, b])
    env = {"x": torch.zeros(2)}
    fn(env, "cpu")
    assert seen == {hostile: 2}
    assert torch.equal(env[b.name], torch.full((2,), 2.0)) and a.name in env


def test_stretch_sessions_keep_no_memory_arena(wide):
    """An arena keeps the peak of every value a session made for the session's life: with
    one session per stretch, a model's activations would stay held between runs."""
    ep, onx, args = wide
    _run(ep, onx, args, own_error=True)
    run, _ = _run(ep, onx, args, own_error=True)
    sessions = [s.session for s in run.run_ahead.layout.starting.values() if s.session is not None]
    sessions += [x for s in run.run_ahead.layout.starting.values() for x in s.own_sessions.values()]
    assert sessions
    for sess in sessions:
        options = sess.get_session_options()
        assert not options.enable_cpu_mem_arena and not options.enable_mem_pattern


def test_a_node_checked_with_exact_shapes_keeps_its_note_in_a_stretch(wide):
    """onnxruntime refused to check a node alone with symbolic shapes (simulated): it ran
    with exact ones and its records say so; a stretch declares exact shapes anyway, so
    the node joins one, and its records still say how one node at a time runs it."""
    from onnx_sbs_nb.align.engine.runners import OnnxruntimeRunner

    ep, onx, args = wide
    runner = OnnxruntimeRunner(fallback=False)  # a cache of its own: nothing else sees this
    warm = AlignedRun(ep, onx, args, runner=runner, time_nodes=True)
    list(warm)
    k, fn = next(
        (k, f) for k, f in warm.candidate._fns.items() if warm.candidate.nodes[k].op_type == "Tanh"
    )

    def forget_the_node():  # the sessions keyed without exact shapes, or with
        for key in [key for key in runner._cache if fn.static_key in key]:
            del runner._cache[key]

    forget_the_node()
    runner._cache[fn.exact_key] = True
    try:
        _run(ep, onx, args, runner=runner)  # records what it saw
        run, got = _run(ep, onx, args, runner=runner)
        assert run.run_ahead.layout.covered[k]
        _, want = _run(ep, onx, args, runner=runner, time_nodes=True)
        assert _fields(got) == _fields(want)
        noted = [r for r in got if r.onnx_id_node == k]
        assert noted and all("exact input shapes" in (r.comment or "") for r in noted)
    finally:
        forget_the_node()
