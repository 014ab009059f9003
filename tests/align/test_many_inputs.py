"""Runs over many inputs (issue 38): a bug that shows on some inputs only is found over a
loader and named with the input that shows it; aggregates per pair; inputs checked early;
the CLI over several files and a folder."""

from __future__ import annotations

import math

import onnx
import pytest
import torch

from onnx_sbs_nb import AlignedRun, aligned_over_inputs, run_aligned, summarize
from onnx_sbs_nb.align.many_inputs import ManyInputsRun, pair_key
from onnx_sbs_nb.cli.main import main
from onnx_sbs_nb.errors import SbsInputError
from tests.models import export

N = 32
BAD_LOG1P = 19  # the one input with a value where Log(1 + x) loses log1p(x)
BAD_ABS = 13  # the one input with negative values, where Identity is not Abs


class Log1pRatio(torch.nn.Module):
    """log1p(x) / x: about 1 near 0, where the exporter's Log(Add(x, 1)) gives 0."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(torch.log1p(x) / x)


class AbsThenLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(torch.abs(x) * 2.0 + 1.0)


@pytest.fixture(scope="module")
def log1p_case():
    torch.manual_seed(0)
    ep, onx = export(Log1pRatio(), (torch.rand(4, 8) + 0.1,))
    g = torch.Generator().manual_seed(1)
    data = [torch.rand(4, 8, generator=g) * 0.9 + 0.1 for _ in range(N)]
    data[BAD_LOG1P][2, 3] = 1e-9
    return ep, onx, data


@pytest.fixture(scope="module")
def abs_case():
    """The export with its Abs replaced by Identity: wrong only where x < 0."""
    torch.manual_seed(0)
    ep, onx = export(AbsThenLinear(), (torch.rand(3, 8),))
    onx = onnx.ModelProto.FromString(onx.SerializeToString())
    (node,) = [n for n in onx.graph.node if n.op_type == "Abs"]
    node.op_type = "Identity"
    g = torch.Generator().manual_seed(2)
    data = [(torch.rand(3, 8, generator=g),) for _ in range(N)]
    data[BAD_ABS][0][1, 5] = -0.75
    return ep, onx, data


def _loader(data):
    dataset = torch.utils.data.TensorDataset(torch.stack(data))
    return torch.utils.data.DataLoader(dataset, batch_size=None)  # yields [x] per input


def test_exporter_bug_on_one_input_is_named_with_that_input(log1p_case):
    ep, onx, data = log1p_case
    run = aligned_over_inputs(ep, onx, _loader(data))
    records = list(run)
    assert run.failing_inputs == [BAD_LOG1P]
    summary = summarize(records)
    assert summary.verdict == "fail"
    c = summary.culprit
    assert c is not None and c.onnx_op_type == "Div"
    assert (c.input_index, c.inputs_failing, c.inputs_total) == (BAD_LOG1P, 1, N)
    text = summary.to_text()
    assert f"on input {BAD_LOG1P}, 1 of {N} inputs failing here" in text
    assert f"worst of {N} inputs" in text
    # one record per pair, in execution order
    assert [r.step for r in records] == list(range(len(records)))
    assert len({pair_key(r) for r in records}) == len(records)
    # with own errors, the Div only inherits: the log1p that made it is named, on its input
    run = aligned_over_inputs(ep, onx, _loader(data), own_error=True)
    c = summarize(list(run), node_inputs=onx).culprit
    assert c is not None and c.ep_name == "log1p" and c.rule == "amplified", c
    assert c.input_index == BAD_LOG1P and f"on input {BAD_LOG1P}" in c.why


class RowMax(torch.nn.Module):
    def forward(self, x):
        return x.amax(-1) * 2.0


class SignOf(torch.nn.Module):
    def forward(self, x):
        return torch.signbit(x).float() + x


@pytest.mark.parametrize(
    "model, bad, op",
    [
        # torch's amax propagates a NaN, onnxruntime's ReduceMax skips it
        (RowMax(), math.nan, "ReduceMax"),
        # signbit(-0.0) is True, the exporter's Less(x, 0) says False
        (SignOf(), -0.0, "Less"),
    ],
    ids=["nan_in_one_element", "negative_zero"],
)
def test_real_bug_on_one_input_of_a_loader(model, bad, op):
    ep, onx = export(model, (torch.rand(3, 4) + 0.1,))
    g = torch.Generator().manual_seed(3)
    xs = torch.rand(N, 3, 4, generator=g) + 0.1
    k = 23
    xs[k, 1, 2] = bad
    run = aligned_over_inputs(ep, onx, _loader(list(xs)))
    summary = summarize(run)
    assert run.failing_inputs == [k]
    c = summary.culprit
    assert c is not None and c.onnx_op_type == op, summary.to_text()
    assert (c.input_index, c.inputs_failing, c.inputs_total) == (k, 1, N)


def test_one_input_alone_passes_where_the_loader_fails(log1p_case):
    """The bug needs the one input: every other input alone passes."""
    ep, onx, data = log1p_case
    assert summarize(run_aligned(ep, onx, (data[0],))).verdict == "pass"
    assert summarize(run_aligned(ep, onx, (data[BAD_LOG1P],))).verdict == "fail"


@pytest.mark.parametrize("own_error", [False, True])
def test_planted_fault_culprit_names_the_input(abs_case, own_error):
    ep, onx, data = abs_case
    summary = summarize(run_aligned(ep, onx, inputs=data, own_error=own_error))
    c = summary.culprit
    assert c is not None and c.onnx_op_type == "Identity"
    assert c.input_index == BAD_ABS and c.inputs_failing == 1
    if own_error:
        assert c.rule == "rerun"
    assert summary.culprit.why.startswith(f"on input {BAD_ABS}")


def test_aggregates_match_the_runs_of_each_input(abs_case):
    ep, onx, data = abs_case
    data = [(-x,) if i in (3, 7) else (x,) for i, (x,) in enumerate(data[:10])]
    run = aligned_over_inputs(ep, onx, data, keep_records=True)
    records = list(run)
    assert run.failing_inputs == [3, 7]
    assert len(run.records_by_input) == 10
    by_key = {pair_key(r): r for r in records}
    for key, agg in by_key.items():
        per_input = [next(r for r in recs if pair_key(r) == key) for recs in run.records_by_input]
        assert agg.inputs_total == 10
        assert agg.inputs_failing == sum(r.failed for r in per_input)
        errors = [r.err_abs for r in per_input if r.err_abs is not None]
        if errors:
            assert agg.err_abs_mean == pytest.approx(sum(errors) / len(errors))
            assert agg.err_abs == max(errors)
            assert per_input[agg.input_index].err_abs == agg.err_abs
    identity = next(r for r in records if r.onnx_op_type == "Identity")
    assert identity.inputs_failing == 2 and identity.input_index in (3, 7)


def test_one_inputs_records_on_demand(abs_case):
    ep, onx, data = abs_case
    for keep in (False, True):
        run = aligned_over_inputs(ep, onx, data[:16], keep_records=keep)
        list(run)
        again = run.input_records(BAD_ABS)
        alone = list(run_aligned(ep, onx, data[BAD_ABS]))
        assert {r.input_index for r in again} == {BAD_ABS}
        assert [(r.onnx_name, r.status, r.err_abs) for r in again] == [
            (r.onnx_name, r.status, r.err_abs) for r in alone
        ]
    # a DataLoader is read again up to the input
    loader_run = aligned_over_inputs(ep, onx, _loader([x for (x,) in data[:16]]))
    list(loader_run)
    statuses = {r.status for r in loader_run.input_records(BAD_ABS)}
    assert "fail" in statuses
    # a shuffling DataLoader cannot be read again to the same input: say so
    dataset = torch.utils.data.TensorDataset(torch.stack([x for (x,) in data[:4]]))
    shuffled = torch.utils.data.DataLoader(dataset, batch_size=None, shuffle=True)
    shuffled_run = aligned_over_inputs(ep, onx, shuffled)
    list(shuffled_run)
    with pytest.raises(SbsInputError, match="shuffles"):
        shuffled_run.input_records(1)
    # an iterator can be read once: say so
    once = aligned_over_inputs(ep, onx, iter(data[:4]))
    list(once)
    with pytest.raises(SbsInputError, match="read once"):
        once.input_records(2)


def test_bad_inputs_are_refused_early(abs_case):
    ep, onx, data = abs_case
    x = data[0][0]
    with pytest.raises(SbsInputError, match="a Tensor is one"):
        aligned_over_inputs(ep, onx, x)
    with pytest.raises(SbsInputError, match="input 2 is a int"):
        aligned_over_inputs(ep, onx, [(x,), (x,), 3])
    with pytest.raises(SbsInputError, match="empty"):
        aligned_over_inputs(ep, onx, [])
    with pytest.raises(SbsInputError, match="not both"):
        run_aligned(ep, onx, (x,), inputs=[(x,)])
    with pytest.raises(SbsInputError, match="iterable"):
        aligned_over_inputs(ep, onx, 3.5)
    # the first input runs through every check at once
    with pytest.raises(SbsInputError, match="input 0"):
        aligned_over_inputs(ep, onx, [(x[0],), (x,)])


def test_exc_names_the_input_of_the_first_failing_pair(abs_case):
    from onnx_sbs_nb.align.judge.judging import SbsMismatchError

    ep, onx, data = abs_case
    with pytest.raises(SbsMismatchError, match=f"^input {BAD_ABS}: ") as caught:
        list(run_aligned(ep, onx, inputs=data, exc=True))
    assert caught.value.record.input_index == BAD_ABS


def test_a_later_bad_input_is_named_when_reached(abs_case):
    ep, onx, data = abs_case
    x = data[0][0]
    inputs = (item for item in [(x,), (x,), (x[0],)])  # a generator: read as it goes
    run = aligned_over_inputs(ep, onx, inputs)
    with pytest.raises(SbsInputError, match="input 2"):
        list(run)


def test_stop_keeps_the_inputs_run_so_far(abs_case):
    ep, onx, data = abs_case
    seen = []

    def on_input(index, status):
        seen.append(index)
        if index == 2:
            run.stop()

    run = ManyInputsRun(lambda a, k: AlignedRun(ep, onx, a, k), data, on_input=on_input)
    records = list(run)
    assert seen == [0, 1, 2] and run.status.stopped
    assert records and all(r.inputs_total == 3 for r in records)


def test_non_finite_error_on_one_input(abs_case):
    ep, onx, data = abs_case
    x = data[0][0]
    inputs = [(x,), (torch.full_like(x, -math.inf),)]  # -inf through Identity: inf vs -inf
    records = list(run_aligned(ep, onx, inputs=inputs))
    identity = next(r for r in records if r.onnx_op_type == "Identity")
    assert identity.input_index == 1 and identity.inputs_failing == 1
    assert not math.isfinite(identity.err_abs) and not math.isfinite(identity.err_abs_mean)


def _save_inputs(folder, data):
    folder.mkdir()
    paths = []
    for i, item in enumerate(data):
        path = folder / f"input_{i:03d}.pt"
        torch.save(item, path)
        paths.append(path)
    return paths


def test_folder_of_files_names_the_file(abs_case, tmp_path):
    ep, onx, data = abs_case
    _save_inputs(tmp_path / "inputs", data)
    summary = summarize(run_aligned(ep, onx, inputs=tmp_path / "inputs"))
    c = summary.culprit
    assert c.input_index == BAD_ABS and c.input_name == f"input_{BAD_ABS:03d}.pt"
    assert f"on input {BAD_ABS} (input_{BAD_ABS:03d}.pt)" in summary.to_text()
    with pytest.raises(SbsInputError, match="no .pt file"):
        aligned_over_inputs(ep, onx, tmp_path)  # the folder holds a folder, no file


@pytest.fixture(scope="module")
def abs_files(abs_case, tmp_path_factory):
    ep, onx, data = abs_case
    root = tmp_path_factory.mktemp("many")
    torch.export.save(ep, root / "model.pt2")
    onnx.save(onx, root / "model.onnx")
    paths = _save_inputs(root / "inputs", data[:16])
    return root, paths


def test_cli_inputs_files_and_folder(abs_files, tmp_path, capsys):
    root, paths = abs_files
    model = [str(root / "model.pt2"), str(root / "model.onnx")]
    out = tmp_path / "many.jsonl"
    code = main(["run", *model, "--inputs", *map(str, paths), "-o", str(out), "--no-progress"])
    text = capsys.readouterr().out
    assert code == 1
    assert f"on input {BAD_ABS} (input_{BAD_ABS:03d}.pt), 1 of 16 inputs failing here" in text
    from onnx_sbs_nb.reports.report import read_jsonl

    records = read_jsonl(out)
    assert {r.inputs_total for r in records} == {16}
    culprit = next(r for r in records if r.onnx_op_type == "Identity")
    assert (culprit.input_index, culprit.inputs_failing) == (BAD_ABS, 1)
    # the spreadsheet formats carry the same columns
    from onnx_sbs_nb.reports.report import read_csv, write_report

    write_report(records, tmp_path / "many.csv")
    back = next(r for r in read_csv(tmp_path / "many.csv") if r.onnx_op_type == "Identity")
    assert (back.input_index, back.input_name, back.inputs_total) == (
        BAD_ABS,
        f"input_{BAD_ABS:03d}.pt",
        16,
    )
    assert back.err_abs_mean == pytest.approx(culprit.err_abs_mean)
    # a folder as the third file: the same run
    out2 = tmp_path / "folder.html"
    code = main(["run", *model, str(root / "inputs"), "-o", str(out2), "--no-progress"])
    assert code == 1
    assert f"on input {BAD_ABS} (input_{BAD_ABS:03d}.pt)" in capsys.readouterr().out
    assert out2.exists() and f"input_{BAD_ABS:03d}.pt" in out2.read_text()
    # the inputs without the bad one pass
    good = [str(p) for i, p in enumerate(paths) if i != BAD_ABS]
    code = main(
        ["run", *model, "--inputs", *good, "-o", str(tmp_path / "g.jsonl"), "--no-progress"]
    )
    assert code == 0
    # --bisect takes one input
    code = main(["run", *model, "--inputs", *good[:2], "--bisect", "--no-progress"])
    assert code == 2


def test_widget_over_a_loader_shows_the_worst_and_picks_one_input(abs_case):
    from onnx_sbs_nb import SbsWidget
    from onnx_sbs_nb.reports.view_state import decode_rows

    ep, onx, data = abs_case
    w = SbsWidget(ep, onx, inputs=_loader([x for (x,) in data[:16]]))
    w.wait()
    assert w.summary.culprit.input_index == BAD_ABS
    assert w.inputs == {
        "total": 16,  # a DataLoader over a TensorDataset has a len()
        "done": 16,
        "failing": [BAD_ABS],
        "names": [None] * 16,
        "shown": None,
    }
    aggregate_rows = w.rows["n"]
    culprit_row = next(i for i, r in enumerate(w.records) if r.onnx_op_type == "Identity")
    w.selected = culprit_row  # the node detail comes from a run over that row's input
    assert w.details.get("node") and not w.details.get("node_error")
    # the picker: one input's own records, as the browser sets it
    w.inputs = {**w.inputs, "shown": 0}
    assert w.inputs["shown"] == 0 and w.summary.verdict == "pass"
    rows = decode_rows(w.rows)
    assert len(rows) == w.rows["n"] == aggregate_rows
    w.show_input(BAD_ABS)
    assert w.summary.verdict == "fail" and w.summary.culprit.input_index == BAD_ABS
    answer = w.act("rerun", row=culprit_row)
    assert answer["state"] == "done", answer
    w.show_input(None)
    assert w.inputs["shown"] is None and w.summary.culprit.inputs_failing == 1


def test_session_tells_its_views_after_each_input(abs_case):
    from onnx_sbs_nb import SbsSession

    ep, onx, data = abs_case
    session = SbsSession(ep, onx, iter(data[:5]))  # a generator is many inputs too
    done = []
    session.add_listener(
        lambda event, payload: (
            event == "status" and done.append(payload["status"]["extra"].get("inputs_done"))
        )
    )
    session.wait()
    assert [d for d in done if d][:5] == [1, 2, 3, 4, 5]
    assert session.summary.culprit is None  # input 13 is not among the first five
    assert session.inputs["failing"] == [] and session.inputs["done"] == 5


def test_onnx_file_with_external_data_is_read_once(abs_case, tmp_path):
    ep, onx, data = abs_case
    path = tmp_path / "model.onnx"
    onnx.save(
        onnx.ModelProto.FromString(onx.SerializeToString()),
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="model.onnx.data",
        size_threshold=0,
    )
    run = aligned_over_inputs(ep, path, data[10:16])
    from_file = [(r.onnx_name, r.status, r.err_abs, r.input_index) for r in run]
    in_memory = [
        (r.onnx_name, r.status, r.err_abs, r.input_index)
        for r in aligned_over_inputs(ep, onx, data[10:16])
    ]
    assert from_file == in_memory
    assert run.failing_inputs == [BAD_ABS - 10]


def test_later_inputs_reuse_what_depends_on_the_model_only(abs_case):
    """Inputs after the first pay their execution only (issue 50): the model is checked
    and read once, and no onnxruntime session is built after the second input (the
    first run builds the nodes' sessions, unless an earlier run of the process did, the
    second its stretches').  Counted, not timed."""
    ep, onx, data = abs_case
    run = aligned_over_inputs(ep, onx, data[:6])
    records = list(run)
    assert run.reuse is not None and run.reuse.checks == 1
    assert len(run.sessions_by_input) == 6
    assert run.sessions_by_input[2:] == [0, 0, 0, 0], run.sessions_by_input
    # the same records as runs that check the model afresh for each input
    alone = [list(AlignedRun(ep, onx, x)) for x in data[:6]]
    by_key = {pair_key(r): r for r in records}
    for key, agg in by_key.items():
        errors = [e for recs in alone for r in recs if pair_key(r) == key if (e := r.err_abs)]
        if errors:
            assert agg.err_abs == max(errors)
