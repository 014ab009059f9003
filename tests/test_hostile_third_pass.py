"""Issue 47: hostile files and broken runs, third pass (input folders, compare functions,
verdict policies, bundles, the notebook export, the diff).  Each test is one row of the
issue: the attack, and what must hold."""

from __future__ import annotations

import html.parser
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from onnx_sbs_nb import run_aligned

ROOT = Path(__file__).resolve().parents[1]


class Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


@pytest.fixture(scope="module")
def small():
    """A faithful export: its run passes."""
    torch.manual_seed(0)
    x = torch.randn(3, 8)
    ep = torch.export.export(Small(), (x,))
    onx = torch.onnx.export(ep, (x,), dynamo=True, verbose=False).model_proto
    return ep, onx, (x,)


def _cli(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "onnx_sbs_nb", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
    )


# --------------------------------------------------------------- rows 1-2: notebook export
class _Active(html.parser.HTMLParser):
    """What in a page can run: inline scripts' text and event-handler / javascript: attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[str] = []
        self.handlers: list[tuple[str, str, str]] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            v = "".join((value or "").split()).lower()
            if name.startswith("on") or v.startswith("javascript:"):
                self.handlers.append((tag, name, value or ""))
        self._in_script = tag == "script"

    def handle_endtag(self, tag):
        self._in_script = False

    def handle_data(self, data):
        if self._in_script:
            self.scripts.append(data)


def _hostile_notebook(small):
    import nbformat
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

    from onnx_sbs_nb.reports.html import report_state
    from onnx_sbs_nb.reports.notebook import WIDGET_STATE_MIME, WIDGET_VIEW_MIME

    ep, onx, x = small
    state = report_state(list(run_aligned(ep, onx, x)))
    state["_anywidget_id"] = "onnx_sbs_nb.notebook.widget.SbsWidget"
    # a sender's own front end, named so the old export took it for the package's bundle
    state["_esm"] = "export function renderStatic(el){ window.SENDER_ESM_RAN = 1 }"
    state["_css"] = "</style><script>window.SENDER_CSS_RAN=1</script>"
    view = new_output(
        "display_data",
        data={WIDGET_VIEW_MIME: {"model_id": "m1", "version_major": 2, "version_minor": 1}},
    )
    evil = new_output(
        "display_data",
        data={
            "text/html": '<img src="x" onerror="window.SENDER_HTML_RAN=1"><b>kept</b>'
            '<a href="javascript:window.SENDER_LINK=1">l</a><script>window.SENDER_S=1</script>',
            "text/plain": "x",
        },
    )
    js = new_output("display_data", data={"application/javascript": "window.SENDER_JS=1"})
    svg = new_output(
        "display_data",
        data={"image/svg+xml": '<svg xmlns="http://www.w3.org/2000/svg" onload="window.SENDER_SVG=1">'
              '<circle r="4"/></svg>'},
    )  # fmt: skip
    nb = new_notebook(
        cells=[
            new_markdown_cell('# t\n<img src=y onerror="window.SENDER_MD=1">'),
            new_code_cell("w", outputs=[view]),
            new_code_cell("h", outputs=[evil, js, svg]),
        ]
    )
    nb.metadata["widgets"] = {
        WIDGET_STATE_MIME: {
            "version_major": 2,
            "version_minor": 0,
            "state": {"m1": {"state": state}},
        }
    }
    return nbformat.from_dict(nb)


def test_row1_row2_notebook_export_runs_none_of_the_senders_code(small):
    pytest.importorskip("nbconvert")
    from onnx_sbs_nb.reports.notebook import notebook_html
    from onnx_sbs_nb.reports.view_state import bundle_js

    result = notebook_html(_hostile_notebook(small))
    assert result.views == 1
    page = _Active()
    page.feed(result.html)
    active = "\n".join(page.scripts)
    # row 1: the installed bundle renders the view, never the state's _esm/_css
    assert "SENDER_ESM_RAN" not in result.html and "SENDER_CSS_RAN" not in result.html
    assert bundle_js()[:200] in result.html or "renderStatic" in active
    # row 2: the sender's HTML outputs and markdown are shown as an untrusted notebook is
    assert page.handlers == []
    for marker in ("SENDER_HTML_RAN", "SENDER_LINK", "SENDER_S", "SENDER_JS", "SENDER_MD"):
        assert marker not in active, marker
    assert "<b>kept</b>" in result.html  # formatting stays
    assert 'src="data:image/svg+xml;base64,' in result.html  # the SVG, as a picture


# ---------------------------------------------------- rows 4, 23: runs over many inputs
def _inputs_then(exc: BaseException, at: int, n: int = 12):
    """A generator of inputs (a DataLoader's loop) that raises ``exc`` when asked for
    input ``at``: a Ctrl-C arriving, or a dataset item that cannot be read."""
    torch.manual_seed(1)
    for i in range(n):
        if i == at:
            raise exc
        yield (torch.randn(3, 8),)


def test_row4_interrupt_keeps_the_inputs_done(small):
    from onnx_sbs_nb.notebook.session import SbsSession

    ep, onx, _ = small
    s = SbsSession(ep, onx, inputs=_inputs_then(KeyboardInterrupt(), at=5))
    s.start()
    assert s.status["state"] == "stopped"
    assert len(s.records) > 0 and all(r.inputs_total == 5 for r in s.records)
    reason = s.completion.reason
    assert reason == "stopped after 5 inputs", reason  # a generator: no total known
    assert "stopped after 5 inputs" in s.summary.to_text()


def test_row4_interrupt_keeps_the_inputs_done_engine_and_total(small):
    """The engine yields the inputs done before passing the interrupt on (the CLI's loop
    writes each record it is given, then sees the Ctrl-C)."""
    from onnx_sbs_nb.align.run import aligned_over_inputs
    from onnx_sbs_nb.completion import Completion

    ep, onx, _ = small
    torch.manual_seed(2)
    xs = [(torch.randn(3, 8),) for _ in range(6)]

    class Interrupting:
        """Inputs of a known length whose reading is interrupted at input 4."""

        def __len__(self):
            return len(xs)

        def __iter__(self):
            for i, x in enumerate(xs):
                if i == 4:
                    raise KeyboardInterrupt
                yield x

    run = aligned_over_inputs(ep, onx, Interrupting())
    got = []
    with pytest.raises(KeyboardInterrupt):
        for rec in run:
            got.append(rec)
    assert got and all(r.inputs_total == 4 for r in got)
    c = Completion.of_run(run.status, ended=True, stopped=True)
    assert c.state == "stopped" and c.reason == "stopped after 4 of 6 inputs"


def test_row23_a_dataloader_raising_on_item_7_keeps_inputs_0_to_6(small):
    from onnx_sbs_nb.notebook.session import SbsSession

    ep, onx, _ = small

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 10

        def __getitem__(self, i):
            if i == 7:
                raise OSError("corrupt shard")
            return torch.randn(3, 8)

    loader = torch.utils.data.DataLoader(Data(), batch_size=None)
    s = SbsSession(ep, onx, inputs=loader)
    s.start()
    assert s.status["state"] == "error"
    assert len(s.records) > 0 and all(r.inputs_total == 7 for r in s.records)
    reason = s.completion.reason
    assert "input 7 could not be read (OSError: corrupt shard)" in reason, reason
    assert "after 7 of 10 inputs" in reason


# ------------------------------------------------------- rows 5-9: the compare function
class _Deeper(torch.nn.Module):
    """Values that feed later nodes (and own-error reruns): a write into one is seen."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8)
        self.c = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.c(torch.tanh(self.b(torch.relu(self.a(x)))))


@pytest.fixture(scope="module")
def deeper():
    torch.manual_seed(3)
    x = torch.randn(4, 8)
    ep = torch.export.export(_Deeper(), (x,))
    onx = torch.onnx.export(ep, (x,), dynamo=True, verbose=False).model_proto
    return ep, onx, (x,)


def _verdict(ep, onx, x, **kw):
    from onnx_sbs_nb.align.blame.summary import summarize

    records = list(run_aligned(ep, onx, x, **kw))
    return records, summarize(records)


def test_row5_a_compare_function_writing_into_its_arguments_changes_nothing(deeper):
    ep, onx, x = deeper

    def vandal(expected, got):
        expected.add_(1000)
        got.mul_(0)
        return {}

    records, summary = _verdict(ep, onx, x, compare=vandal, own_error=True)
    base, base_summary = _verdict(ep, onx, x, own_error=True)
    assert summary.verdict == base_summary.verdict == "pass"
    assert [r.err_abs for r in records] == [r.err_abs for r in base]
    assert [r.err_abs2 for r in records] == [r.err_abs2 for r in base]


class _Unprintable:
    def __str__(self):
        raise RuntimeError("no str")

    __repr__ = __str__


class _BadItems(dict):
    def items(self):
        raise RuntimeError("items broken")


@pytest.mark.parametrize(
    "answer",
    [
        {"passed": True, "v": _Unprintable()},
        {_Unprintable(): 1},
        _BadItems(passed=True),
        {"passed": _Unprintable()},
    ],
    ids=["value-str-raises", "key-str-raises", "items-raises", "passed-repr-raises"],
)
def test_row6_an_unreadable_answer_is_that_pairs_error_and_the_run_goes_on(small, answer):
    from onnx_sbs_nb.records import STATUS_CHECK_ERROR

    ep, onx, x = small
    records, summary = _verdict(ep, onx, x, compare=lambda e, g: answer)
    assert records and all(r.status == STATUS_CHECK_ERROR for r in records)
    assert all("compare function" in r.error for r in records)
    assert summary.completion is None or summary.completion.finished


def test_row9_a_compare_function_returning_none_blames_itself_never_the_model(small):
    ep, onx, x = small
    records, summary = _verdict(ep, onx, x, compare=lambda e, g: None)
    assert summary.culprit is None  # not "culprit: x [input], the node failed to run"
    assert summary.verdict == "incomplete"
    text = summary.to_text()
    assert "compare function broken on 8 pairs" in text and "returned a NoneType" in text
    assert "failed to run" not in text and "not computed" not in text
    assert summary.totals["errors"] == 0
    # measured, not judged: one count everywhere (the verdict line and the coverage line)
    cov = summary.coverage
    assert cov.onnx_compared == 0 and cov.not_compared.get("your compare function failed"), (
        cov.to_text()
    )


_COMPARE_FUNCS = """
def inf(e, g):
    return {"passed": True, "snr_db": float("inf"), "low": float("-inf"), "n": float("nan")}

def huge(e, g):
    return {"passed": True, "snr_db": 10**400}

def many(e, g):
    return {"passed": True, **{f"k{i}": i for i in range(20000)}}

def bigstr(e, g):
    return {"passed": True, "s": "x" * 20_000_000}
"""


@pytest.fixture(scope="module")
def small_files(small, tmp_path_factory):
    import onnx

    ep, onx, x = small
    d = tmp_path_factory.mktemp("small")
    torch.export.save(ep, d / "m.pt2")
    onnx.save(onx, d / "m.onnx")
    torch.save(x, d / "x.pt")
    (d / "cmp.py").write_text(_COMPARE_FUNCS)
    return d


@pytest.mark.parametrize("fn", ["inf", "huge", "many", "bigstr"])
def test_row7_row8_every_report_is_written_whatever_the_extras(
    small_files, tmp_path, fn, monkeypatch, capsys
):
    """Non-finite and huge numbers shown as such; 20,000 keys and a 20 MB string cut with a
    note; HTML, xlsx and CSV written, and `onnx-sbs report` reads the JSONL back."""
    from onnx_sbs_nb.cli.main import main
    from onnx_sbs_nb.compare.user_compare import MAX_EXTRA_KEYS, MAX_EXTRA_TEXT, NOTE_KEY
    from onnx_sbs_nb.reports.report import read_jsonl

    d = small_files
    monkeypatch.chdir(tmp_path)
    out = [tmp_path / n for n in ("r.html", "r.xlsx", "r.csv")]
    code = main([
        "run", "--ep", str(d / "m.pt2"), "--onnx", str(d / "m.onnx"), "--inputs", str(d / "x.pt"),
        "--compare-func", f"{d / 'cmp.py'}:{fn}", "--no-progress", "-o", *map(str, out),
    ])  # fmt: skip
    assert code == 0, capsys.readouterr().err[-2000:]
    assert all(f.is_file() and f.stat().st_size > 0 for f in out)
    jsonl = tmp_path / "r.jsonl"
    assert jsonl.stat().st_size < 200_000  # was 140 MB for the 20 MB string
    extra = read_jsonl(jsonl)[0].extra
    if fn == "inf":
        assert extra["snr_db"] == float("inf") and extra["low"] == float("-inf")
    if fn == "huge":
        assert extra["snr_db"] == "1.000e+400"
    if fn == "many":
        assert len(extra) == MAX_EXTRA_KEYS + 1 and "19968 more entries" in extra[NOTE_KEY]
    if fn == "bigstr":
        assert len(extra["s"]) == MAX_EXTRA_TEXT + 1
    again = [tmp_path / "again.html", tmp_path / "again.xlsx", tmp_path / "again.csv"]
    code = main(["report", str(jsonl), "-o", *map(str, again)])
    assert code == 0, capsys.readouterr().err[-2000:]
    assert all(f.is_file() for f in again)


# ------------------------------------------- row 10: compressed .pt declaring huge sizes
def _pt_bomb(path: Path, value, mb: int = 64) -> Path:
    """``torch.save(value)`` with a zeros tensor of ``mb`` MB, its members deflated: a file of
    a few hundred KB that inflates to ``mb`` MB (torch.save stores members uncompressed)."""
    import zipfile

    plain = path.with_suffix(".plain")
    torch.save(value(torch.zeros(mb << 18)), plain)
    with zipfile.ZipFile(plain) as src, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    plain.unlink()
    assert path.stat().st_size < (mb << 20) // 100
    return path


def test_row10_a_compressed_inputs_file_is_refused_before_inflating(small, tmp_path):
    from onnx_sbs_nb.errors import SbsInputError

    ep, onx, _ = small
    bomb = _pt_bomb(tmp_path / "x.pt", lambda t: (t.reshape(-1, 8),))
    with pytest.raises(SbsInputError, match=r"x\.pt.*inflates to 67108864 bytes"):
        list(run_aligned(ep, onx, str(bomb)))
    folder = tmp_path / "inputs"
    folder.mkdir()
    torch.save((torch.randn(3, 8),), folder / "a.pt")
    bomb.rename(folder / "b.pt")
    with pytest.raises(SbsInputError, match=r"input 1 \(b\.pt\).*inflates to"):
        list(run_aligned(ep, onx, inputs=str(folder)))


def test_row10_a_bundles_compressed_expected_pt_is_refused(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    from onnx_sbs_nb.align.post.replay import write_replay_bundle
    from onnx_sbs_nb.align.post.replay_load import load_replay
    from onnx_sbs_nb.errors import SbsInputError

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="r")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    x = torch.randn(3)
    folder = write_replay_bundle(
        tmp_path, model=model, node_name="r", torch_inputs={"x": x}, onnx_inputs={"x": x},
        expected={"y": x.relu()}, mapping={"x": "x", "y": "relu"},
    )  # fmt: skip
    assert isinstance(onnx.load(folder / "model.onnx"), onnx.ModelProto)
    load_replay(folder)  # the bundle as written replays
    (folder / "expected.pt").unlink()
    _pt_bomb(folder / "expected.pt", lambda t: {"y": t})
    with pytest.raises(SbsInputError, match=r"expected\.pt.*inflates to"):
        load_replay(folder)


# ------------------------------------------ row 11: an inputs folder's non-file entries
@pytest.mark.parametrize("entry", ["dangling", "fifo", "folder", "dev-zero"])
def test_row11_inputs_folder_entries_that_are_no_files_are_named(small, tmp_path, entry):
    import os

    from onnx_sbs_nb.errors import SbsInputError

    ep, onx, _ = small
    folder = tmp_path / "inputs"
    folder.mkdir()
    torch.save((torch.randn(3, 8),), folder / "a.pt")
    bad = folder / "b.pt"
    if entry == "dangling":  # an unfetched DVC / git-annex dataset
        bad.symlink_to(tmp_path / "cache" / "0a1b2c")
    elif entry == "fifo":
        os.mkfifo(bad)
    elif entry == "folder":
        bad.mkdir()
    else:
        bad.symlink_to("/dev/zero")
    why = {"dangling": "link to nothing", "fifo": "FIFO", "folder": "folder", "dev-zero": "device"}
    with pytest.raises(SbsInputError, match=rf"'b\.pt': a {why[entry]}"):
        list(run_aligned(ep, onx, inputs=str(folder)))


# ------------------------------------------------------- row 12: replay's memory guard
def test_row12_a_replayed_model_asking_for_too_much_memory_is_not_run(tmp_path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from onnx_sbs_nb.align.engine.limits import free_memory
    from onnx_sbs_nb.align.post.replay import write_replay_bundle
    from onnx_sbs_nb.align.post.replay_load import load_replay

    # x + ConstantOfShape([n]): n float32 more than the memory free, from a few bytes
    n = max(free_memory("cpu") // 2, 1 << 40)  # and at least 4 TB: no machine allocates it
    shape = numpy_helper.from_array(__import__("numpy").array([n], "int64"), "shape")
    graph = helper.make_graph(
        [
            helper.make_node("ConstantOfShape", ["shape"], ["big"], name="fill"),
            helper.make_node("Add", ["x", "big"], ["y"], name="add"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [shape],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    x = torch.randn(1)
    folder = write_replay_bundle(
        tmp_path, model=model, node_name="add", torch_inputs={"x": x}, onnx_inputs={"x": x},
        expected={"y": x}, mapping={"x": "x", "y": "add"},
    )  # fmt: skip
    assert isinstance(onnx.load(folder / "model.onnx"), onnx.ModelProto)
    replay = load_replay(folder)
    for label in ("torch_inputs", "onnx_inputs"):
        err = replay.errors[label]
        assert err.startswith("OutputTooLargeError: node 'fill' (ConstantOfShape)"), err
        assert "more than the" in err and "free on cpu: not run" in err


# ------------------------------------------------ row 13: diff checks both models as run
@pytest.mark.parametrize("defect", ["defines-twice", "opset-6", "opset-30"])
@pytest.mark.parametrize("which", ["a", "b"])
def test_row13_diff_refuses_a_model_run_would_refuse(small, defect, which):
    import onnx
    from onnx import helper

    from onnx_sbs_nb.align.two_models import run_aligned_onnx
    from onnx_sbs_nb.errors import SbsInputError

    _, onx, x = small
    bad = onnx.ModelProto.FromString(onx.SerializeToString())
    if defect == "defines-twice":
        first = bad.graph.node[0].output[0]
        bad.graph.node.insert(1, helper.make_node("Identity", [first], [first], name="dup"))
    else:
        for o in bad.opset_import:
            if o.domain in ("", "ai.onnx"):
                o.version = 6 if defect == "opset-6" else 30
    a, b = (bad, onx) if which == "a" else (onx, bad)
    why = {"defines-twice": "Duplicate definition", "opset-6": "opset 6", "opset-30": "opset"}
    with pytest.raises(SbsInputError, match=rf"model {which} .*{why[defect]}"):
        list(run_aligned_onnx(a, b, x))


# --------------------------------------- row 14: precision with an op onnxruntime lacks
def test_row14_precision_on_a_model_onnxruntime_cannot_run_is_bad_input(small, tmp_path, capsys):
    import onnx
    from onnx import helper

    from onnx_sbs_nb.cli.main import EXIT_BAD_INPUT, main

    ep, onx, x = small
    m = onnx.ModelProto.FromString(onx.SerializeToString())
    out = m.graph.output[0].name
    last = next(n for n in m.graph.node if out in n.output)
    last.output[0] = "pre"
    m.graph.node.append(helper.make_node("Frobnicate", ["pre"], [out], domain="example.ops"))
    m.opset_import.append(helper.make_opsetid("example.ops", 1))
    onnx.save(m, tmp_path / "m.onnx")
    torch.save(x, tmp_path / "x.pt")
    torch.export.save(ep, tmp_path / "m.pt2")
    capsys.readouterr()
    code = main([
        "precision", "--onnx", str(tmp_path / "m.onnx"), "--inputs", str(tmp_path / "x.pt"),
        "--ep", str(tmp_path / "m.pt2"), "--no-progress",
    ])  # fmt: skip
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "onnxruntime cannot run the ONNX model" in lines[0], err
    assert "Frobnicate" in lines[0]


# ------------------------------------------- row 15: a culprit bundle of an unnamed node
def test_row15_the_culprit_bundle_of_a_node_without_a_name(tmp_path):
    import onnx

    from onnx_sbs_nb.notebook.session import SbsSession
    from tests.notebook.test_session import _broken_mlp

    ep, onx, x = _broken_mlp()
    onx = onnx.ModelProto.FromString(onx.SerializeToString())
    for node in onx.graph.node:  # names are optional; graph tools drop them
        node.name = ""
    s = SbsSession(ep, onx, x, own_error=True)
    s.start()
    assert s.summary.culprit is not None and s.summary.culprit.onnx_op_type == "Gemm"
    bundle = s.save_culprit_bundle(tmp_path)
    assert bundle is not None and bundle.reproduced, bundle
    assert (bundle.folder / "model.onnx").is_file()


# ------------------------------------------ row 16: a link planted at sbs_replays itself
def test_row16_a_link_planted_at_sbs_replays_is_refused(tmp_path, capsys):
    import onnx

    from onnx_sbs_nb.cli.main import EXIT_BAD_INPUT, main
    from tests.notebook.test_session import _broken_mlp

    ep, onx, x = _broken_mlp()  # a culprit, so a bundle to write
    d = tmp_path / "files"
    d.mkdir()
    torch.export.save(ep, d / "m.pt2")
    onnx.save(onx, d / "m.onnx")
    torch.save(x, d / "x.pt")
    out = tmp_path / "out"
    out.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / "sbs_replays").symlink_to(elsewhere)
    capsys.readouterr()
    code = main([
        "run", str(d / "m.pt2"), str(d / "m.onnx"), str(d / "x.pt"), "--no-progress",
        "-o", str(out / "r.jsonl"), "--replay-culprit",
    ])  # fmt: skip
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT and "sbs_replays' is a link" in err, err
    assert list(elsewhere.iterdir()) == []


# --------------------------------------------------- rows 17-19: verdict policies
class _IntsAndBools(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        return y.argmax(-1), y > 0, y


def test_row17_a_measure_that_does_not_apply_to_a_dtype_does_not_fail_it():
    from onnx_sbs_nb.align.blame.summary import summarize

    torch.manual_seed(4)
    x = torch.randn(3, 8)
    ep = torch.export.export(_IntsAndBools(), (x,))
    onx = torch.onnx.export(ep, (x,), dynamo=True, verbose=False).model_proto
    for verdict in ("ulp<=64", "snr>=60", ["cos>=0.9999", "ulp<=64"]):
        records = list(run_aligned(ep, onx, (x,), verdict=verdict))
        ints = [
            r for r in records if r.ep_shape_type and r.ep_shape_type.startswith(("int64", "bool"))
        ]
        assert ints and all(r.passed for r in ints), [(r.ep_name, r.comment) for r in ints]
        assert summarize(records).verdict == "pass", verdict


@pytest.mark.parametrize(
    "verdict, words",
    [
        ({"flaot32": "abs<=100"}, "dtype 'flaot32'.*did you mean 'float32'"),
        ("cos>=1.5", "'cos>=1.5' can never hold: err_cos is between -1 and 1"),
        (["abs<=1", "abs>1"], "'abs<=1' and 'abs>1' can never hold"),
        ("abs<0", "'abs<0' can never hold"),
        ("abs<=" + "9" * 16000, "16005 characters long"),  # row 19: at once, not after seconds
    ],
)
def test_row18_row19_a_verdict_that_cannot_mean_anything_is_refused(verdict, words):
    from onnx_sbs_nb.compare.verdict_policy import VerdictPolicy
    from onnx_sbs_nb.errors import SbsInputError

    with pytest.raises(SbsInputError, match=words):
        VerdictPolicy(verdict)


def test_row18_the_culprits_reason_is_in_the_policys_words():
    from tests.notebook.test_session import _broken_mlp

    ep, onx, x = _broken_mlp()
    _, summary = _verdict(ep, onx, x, verdict="abs<=1e-5", own_error=True)
    why = summary.culprit.why
    assert "the verdict abs<=1e-5 (abs " in why and "atol" not in why, why


# --------------------------------------------- row 21: the bundle's own replay.py, hostile
def _bundle(tmp_path, node_name: str = "r") -> Path:
    from onnx import TensorProto, helper

    from onnx_sbs_nb.align.post.replay import write_replay_bundle

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name=node_name)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    x = torch.randn(3)
    return write_replay_bundle(
        tmp_path, model=model, node_name=node_name, torch_inputs={"x": x}, onnx_inputs={"x": x},
        expected={"y": x.relu()}, mapping={"x": "x", "y": "relu"},
    )  # fmt: skip


class _NotATensor:
    pass


def _replay_py(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "replay.py"], cwd=folder, capture_output=True, text=True, timeout=120
    )


def test_row21_replay_py_on_pickled_tensors_says_one_line(tmp_path):
    folder = _bundle(tmp_path)
    torch.save({"x": _NotATensor()}, folder / "torch_inputs.pt")  # a pickle, not tensors
    p = _replay_py(folder)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "this bundle cannot be replayed: UnpicklingError" in p.stderr


def test_row21_replay_py_shows_escapes_escaped(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    evil = "\x1b[31mevil\x1b]0;title\x07"
    folder = _bundle(tmp_path, evil)
    # the model swapped for one whose weight lives "../" outside the bundle
    w = helper.make_tensor("w", TensorProto.FLOAT, [3], [0.0] * 3)
    w.ClearField("float_data")
    w.data_location = TensorProto.EXTERNAL
    w.external_data.add(key="location", value="../\x1b[2Jw.bin")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"], name=evil)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.save(model, folder / "model.onnx")
    p = _replay_py(folder)
    out = p.stdout + p.stderr
    assert "\x1b" not in out and "\x07" not in out, out
    assert "Traceback" not in out, out
    assert "\\x1b[31mevil" in out or "\\x1b" in out, out


# ------------------------------------------------- row 20: chart strings all escaped
def test_row20_a_schema_label_holding_plotly_markup_is_drawn_as_text(small, tmp_path):
    pytest.importorskip("playwright")
    from playwright.sync_api import sync_playwright

    from onnx_sbs_nb.reports.html import load_bundle, page_html, report_state, view_html

    from .browser import CHROMIUM, launch

    if not Path(CHROMIUM).exists():
        pytest.skip(f"no chromium at {CHROMIUM}")
    ep, onx, x = small
    state = report_state(list(run_aligned(ep, onx, x)))
    link = '<a href="https://evil.example/">click me</a>'
    for field in state["schema"]["fields"]:
        if field["name"] == "err_abs":  # a crafted state: the measure's label, drawn as the y title
            field["label"] = link
    path = tmp_path / "crafted.html"
    path.write_text(page_html("t", view_html(state, "s0"), load_bundle()), encoding="utf-8")
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = browser.new_page()
            page.route(
                "**/*",
                lambda r: (
                    r.continue_()
                    if r.request.url.startswith(("file:", "data:", "blob:"))
                    else r.abort()
                ),
            )
            page.goto(path.as_uri())
            page.wait_for_selector(".sbs-chart .main-svg", timeout=30000)
            chart = page.locator(".sbs-chart")
            assert chart.locator("a").count() == 0  # no link made of the label
            assert link in chart.locator(".g-ytitle").text_content()  # shown as the text it is
        finally:
            browser.close()


# ------------------------------------------- row 22: a model unrelated to the program
def test_row22_an_empty_graph_passing_its_input_through_is_bad_input(small):
    from onnx import TensorProto, helper

    from onnx_sbs_nb.errors import SbsInputError

    ep, _, x = small
    # named like the program's input, so only that name pairs: nothing computed does
    value = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 8])
    graph = helper.make_graph([], "g", [value], [value])
    empty = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(SbsInputError, match="shares no computed value"):
        list(run_aligned(ep, empty, x))


@pytest.mark.slow  # a real process and a folder of 1,000 inputs
def test_row4_ctrl_c_in_the_cli_keeps_the_inputs_done(small_files, tmp_path):
    """A real SIGINT to `onnx-sbs run` over a folder of inputs, sent once the progress bar
    shows a few inputs done: exit 130, the records of the inputs done written."""
    import os
    import re
    import signal

    from onnx_sbs_nb.reports.report import read_jsonl

    d = small_files
    folder = tmp_path / "inputs"
    folder.mkdir()
    torch.manual_seed(5)
    n = 1000
    for i in range(n):
        torch.save((torch.randn(3, 8),), folder / f"x{i:05d}.pt")
    proc = subprocess.Popen(
        [sys.executable, "-m", "onnx_sbs_nb", "run", str(d / "m.pt2"), str(d / "m.onnx"),
         "--inputs", str(folder), "-o", str(tmp_path / "r.jsonl")],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    seen = b""
    while proc.poll() is None:  # wait for the bar to show 3 inputs done
        seen += os.read(proc.stderr.fileno(), 4096)
        done = [int(k) for k in re.findall(rb"(\d+)/1000", seen)]
        if done and max(done) >= 3:
            proc.send_signal(signal.SIGINT)
            break
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, (out + err)[-3000:]
    text = out.decode()
    m = re.search(r"stopped after ([\d,]+) of 1,000 inputs", text)
    assert m, text
    kept = int(m.group(1).replace(",", ""))
    assert 3 <= kept < n
    records = read_jsonl(tmp_path / "r.jsonl")
    assert records and all(r.inputs_total >= kept for r in records)


@pytest.mark.parametrize(
    "passed,expected",
    [
        (torch.tensor(True), True),
        (torch.tensor(False), False),
        (torch.ones(1, dtype=torch.bool), True),
        (np.bool_(True), True),
    ],
)
def test_passed_may_be_a_one_element_torch_bool(passed, expected):
    # the function is given torch tensors: (e - g).abs().le(1e-3).all() is its natural
    # answer, and refusing it made every pair a check_error (a new user's first try)
    from onnx_sbs_nb.compare.user_compare import call_compare

    found = call_compare(lambda e, g: {"passed": passed}, "fn", torch.zeros(2), torch.zeros(2))
    assert found.passed is expected


@pytest.mark.parametrize("passed", [torch.tensor([True, False]), torch.tensor(1.0), "yes"])
def test_passed_that_is_no_single_bool_is_the_pairs_error(passed):
    from onnx_sbs_nb.compare.user_compare import CompareFunctionError, call_compare

    with pytest.raises(CompareFunctionError, match="not a bool"):
        call_compare(lambda e, g: {"passed": passed}, "fn", torch.zeros(2), torch.zeros(2))
