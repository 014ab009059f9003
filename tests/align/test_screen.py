"""The screen of a run over many inputs (``align/screen.py``): an input where every pair
passes is folded from one program run, one whole-model onnxruntime run and one
comparison per pair, and gives the aggregates the per-node engine gives; an input where
a pair fails, and runs the screen cannot reproduce, go to the engine."""

from __future__ import annotations

import onnx
import pytest
import torch

from onnx_sbs_nb import aligned_over_inputs, summarize
from onnx_sbs_nb.align import screen as screen_module
from onnx_sbs_nb.align.many_inputs import pair_key
from onnx_sbs_nb.align.run import AlignedRun
from onnx_sbs_nb.align.screen import _fields
from tests.models import export

N = 8
BAD = (3, 6)  # the inputs with negative values, where the planted Identity is no Abs


class Mlp(torch.nn.Module):
    """Linear layers, a GELU, a layer norm, a softmax: errors that differ per input."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.norm = torch.nn.LayerNorm(32)
        self.fc2 = torch.nn.Linear(32, 8)

    def forward(self, x):
        h = self.norm(torch.nn.functional.gelu(self.fc1(x)))
        return torch.softmax(self.fc2(h) * 3.0, dim=-1) + torch.abs(x).mean()


@pytest.fixture(scope="module")
def faithful():
    torch.manual_seed(0)
    ep, onx = export(Mlp(), (torch.randn(4, 16),))
    g = torch.Generator().manual_seed(1)
    # magnitudes that grow and shrink: the worst input of a pair moves between inputs
    scales = [1.0, 3.0, 0.5, 8.0, 2.0, 20.0, 1.0, 5.0]
    data = [(torch.randn(4, 16, generator=g) * s,) for s in scales]
    return ep, onx, data


@pytest.fixture(scope="module")
def planted():
    """The export with its Abs replaced by Identity: wrong only where x < 0."""
    torch.manual_seed(0)
    ep, onx = export(Mlp(), (torch.rand(4, 16),))
    onx = onnx.ModelProto.FromString(onx.SerializeToString())
    (node,) = [n for n in onx.graph.node if n.op_type == "Abs"]
    node.op_type = "Identity"
    g = torch.Generator().manual_seed(2)
    data = [(torch.rand(4, 16, generator=g) * (1 + i),) for i in range(N)]
    for i in BAD:
        data[i][0][1, 5] = -0.75 * (1 + i)
    return ep, onx, data


class _EngineRuns:
    """Counts the per-node engine's runs (iterations of an AlignedRun)."""

    def __init__(self, monkeypatch):
        self.count = 0
        original = AlignedRun.__iter__

        def counted(run):
            self.count += 1
            return original(run)

        monkeypatch.setattr(AlignedRun, "__iter__", counted)


def _both(ep, onx, data, monkeypatch, **options):
    """The records of a screened run and of an engine-only run, and both runs."""
    out = []
    for enabled in (True, False):
        monkeypatch.setattr(screen_module, "ENABLED", enabled)
        run = aligned_over_inputs(ep, onx, data, **options)
        out.append((list(run), run))
    return out


def _by_pair(records):
    return {pair_key(r): _fields(r) for r in records}


def _check_same(screened, engine):
    (recs_s, run_s), (recs_e, run_e) = screened, engine
    assert len(recs_s) == len(recs_e)
    assert _by_pair(recs_s) == _by_pair(recs_e)  # every field but the timings
    assert run_s.failing_inputs == run_e.failing_inputs
    cs, ce = summarize(recs_s).culprit, summarize(recs_e).culprit
    assert (cs is None) == (ce is None)
    if cs is not None:
        assert (cs.onnx_name, cs.input_index, cs.inputs_failing, cs.why) == (
            ce.onnx_name,
            ce.input_index,
            ce.inputs_failing,
            ce.why,
        )


def test_faithful_model_screened_as_the_engine_folds_it(faithful, monkeypatch):
    ep, onx, data = faithful
    screened, engine = _both(ep, onx, data, monkeypatch)
    _check_same(screened, engine)
    assert screened[1].full_runs == [True] + [False] * (N - 1)
    assert engine[1].full_runs == [True] * N
    records = screened[0]
    # the screen's errors are in the aggregates: the worst input moves between inputs
    assert {r.input_index for r in records if r.err_abs} - {0}
    assert all(r.inputs_total == N for r in records)


def test_planted_fault_on_some_inputs_is_found_as_without_screen(planted, monkeypatch):
    ep, onx, data = planted
    screened, engine = _both(ep, onx, data, monkeypatch)
    _check_same(screened, engine)
    assert screened[1].failing_inputs == list(BAD)
    # the inputs where a pair fails go to the engine: its verdict rules, its culprit
    assert screened[1].full_runs == [i == 0 or i in BAD for i in range(N)]
    culprit = summarize(screened[0]).culprit
    assert culprit.onnx_op_type == "Identity" and culprit.input_index in BAD
    assert culprit.inputs_failing == len(BAD)


def test_engine_runs_counted_per_input(faithful, planted, monkeypatch):
    monkeypatch.setattr(screen_module, "ENABLED", True)
    runs = _EngineRuns(monkeypatch)
    ep, onx, data = faithful
    list(aligned_over_inputs(ep, onx, data))
    assert runs.count == 1  # the first input only: it decides and checks the screen
    runs.count = 0
    ep, onx, data = planted
    list(aligned_over_inputs(ep, onx, data))
    assert runs.count == 1 + len(BAD)


@pytest.mark.parametrize(
    "options",
    [{"keep_records": True}, {"own_error": True}, {"reset": "all"}, {"atol": 1e-9, "rtol": 0}],
    ids=["keep_records", "own_error", "reset", "first_input_fails"],
)
def test_runs_the_screen_cannot_reproduce_go_to_the_engine(faithful, monkeypatch, options):
    monkeypatch.setattr(screen_module, "ENABLED", True)
    runs = _EngineRuns(monkeypatch)
    ep, onx, data = faithful
    run = aligned_over_inputs(ep, onx, data, **options)
    list(run)
    assert runs.count == N and run.full_runs == [True] * N


def test_screen_switched_off_per_run(faithful, monkeypatch):
    monkeypatch.setattr(screen_module, "ENABLED", True)
    ep, onx, data = faithful
    run = aligned_over_inputs(ep, onx, data)
    run.screen = False
    list(run)
    assert run.full_runs == [True] * N


def test_an_input_holding_nan_goes_to_the_engine(faithful, monkeypatch):
    """Both sides agree on NaN, yet the engine notes the input's non-finite values on its
    record: the screen leaves that input to the engine."""
    ep, onx, data = faithful
    data = [(x.clone(),) for (x,) in data]
    data[4][0][0, 0] = float("nan")
    screened, engine = _both(ep, onx, data, monkeypatch)
    _check_same(screened, engine)
    assert screened[1].full_runs == [i in (0, 4) for i in range(N)]


class _RunsMade:
    """Counts the AlignedRuns made (each costs its binding and checks)."""

    def __init__(self, monkeypatch):
        self.count = 0
        original = AlignedRun.__init__

        def counted(run, *args, **kwargs):
            self.count += 1
            original(run, *args, **kwargs)

        monkeypatch.setattr(AlignedRun, "__init__", counted)


def test_screened_inputs_make_no_run(faithful, planted, monkeypatch):
    """The screen binds an input itself: a run is made for the first input and for the
    inputs where a pair fails only (the engine runs those)."""
    monkeypatch.setattr(screen_module, "ENABLED", True)
    made = _RunsMade(monkeypatch)
    ep, onx, data = faithful
    list(aligned_over_inputs(ep, onx, data))
    assert made.count == 1
    made.count = 0
    ep, onx, data = planted
    run = aligned_over_inputs(ep, onx, data)
    list(run)
    assert made.count == 1 + len(BAD) and run.failing_inputs == list(BAD)


def test_an_input_given_otherwise_goes_to_the_engine(faithful, monkeypatch):
    """An input given by keyword where the first was positional binds through the run
    (the screen binds inputs of the first's structure only), with the same records."""
    ep, onx, data = faithful
    data = list(data)
    data[5] = {"x": data[5][0]}
    screened, engine = _both(ep, onx, data, monkeypatch)
    _check_same(screened, engine)
    assert screened[1].full_runs == [i in (0, 5) for i in range(N)]


class Strided(torch.nn.Module):
    """An Abs of a transposed view: torch keeps the view's strides (a value the screen
    puts in order before the C module compares it), ONNX computes it in order."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 5)

    def forward(self, x):
        return self.fc(torch.abs(x.transpose(0, 1) * 2.0))


def test_a_failing_strided_value_is_not_screened_away(monkeypatch):
    """A planted fault (Abs exported as Identity) on a value whose torch side is strided,
    failing on some later inputs only: each of them goes to the engine and fails there,
    as without the screen (a screen that passed them would miss the fault)."""
    x = torch.rand(4, 6)
    assert not torch.abs(x.transpose(0, 1) * 2.0).is_contiguous()  # what is tested
    torch.manual_seed(0)
    ep, onx = export(Strided(), (x,))
    onx = onnx.ModelProto.FromString(onx.SerializeToString())
    (node,) = [n for n in onx.graph.node if n.op_type == "Abs"]
    node.op_type = "Identity"
    g = torch.Generator().manual_seed(3)
    data = [(torch.rand(4, 6, generator=g) * (1 + i),) for i in range(N)]
    for i in BAD:
        data[i][0][2, 3] = -0.5 * (1 + i)
    screened, engine = _both(ep, onx, data, monkeypatch)
    _check_same(screened, engine)
    assert engine[1].failing_inputs == list(BAD)
    assert screened[1].full_runs == [i == 0 or i in BAD for i in range(N)]
    culprit = summarize(screened[0]).culprit
    assert culprit.onnx_op_type == "Identity" and culprit.inputs_failing == len(BAD)


def test_copy_record_is_dataclasses_replace():
    """The aggregates' and the screen's record copy: every field copied, the changes
    set (a field it dropped would differ here)."""
    import dataclasses

    from onnx_sbs_nb.records import Record, copy_record

    fields = dataclasses.fields(Record)
    rec = Record(**{f.name: f"v{k}" for k, f in enumerate(fields) if f.init})
    copied = copy_record(rec, step=7, input_index=3)
    assert copied is not rec
    assert copied == dataclasses.replace(rec, step=7, input_index=3)
    assert copy_record(rec) == rec


class TwoInputs(torch.nn.Module):
    def forward(self, x, y):
        return torch.tanh(x) * 2.0 - torch.sigmoid(y)


@pytest.mark.parametrize("given", ["reversed_keywords", "one_tensor_twice"])
def test_inputs_bound_by_the_screen_as_the_run_binds_them(given, monkeypatch):
    """Keyword inputs in another order than the program's, or one tensor given for both
    inputs on the first input: the screen's own binding must not swap them (it leaves
    the binding to the run where it cannot tell), and the records are the engine's."""
    torch.manual_seed(0)
    ep, onx = export(TwoInputs(), (torch.randn(3, 4), torch.randn(3, 4)))
    g = torch.Generator().manual_seed(5)
    pairs = [(torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g) * 9) for _ in range(N)]
    if given == "reversed_keywords":
        data = [{"y": y, "x": x} for x, y in pairs]
    else:
        data = [(pairs[0][0], pairs[0][0]), *pairs[1:]]
    screened, engine = _both(ep, onx, data, monkeypatch)
    _check_same(screened, engine)
    assert screened[1].full_runs == [True] + [False] * (N - 1)
