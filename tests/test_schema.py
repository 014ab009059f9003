"""The record schema is declared once (records.py FIELDS and STATUSES) and every view
derives from it: the front end gets it with the state, and no other file names statuses
or labels fields on its own (they drifted: the widget's "failing" filter once left out a
status the summary counted)."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import pytest

from onnx_sbs_nb import records as records_mod
from onnx_sbs_nb.records import FAILING_STATUSES, FIELDS, STATUSES, Record, schema_dict

REPO = Path(__file__).resolve().parents[1]
JS_SRC = REPO / "js" / "src"
PACKAGE = REPO / "onnx_sbs_nb"
# the views (and the summary they read): the engine (align/, evaluator/) sets statuses
VIEWS = [p for p in PACKAGE.glob("*.py") if p.name != "records.py"]

# statuses whose name is also an ordinary word of the views (a summary verdict "fail",
# a run state "error", a button's "ok") cannot be searched for as literals
_WORDS = {"ok", "fail", "error"}


def _js_sources() -> list[Path]:
    return sorted([*JS_SRC.glob("*.js"), *JS_SRC.glob("*.css")])


def test_every_record_field_and_status_is_declared_once_in_the_table():
    assert list(FIELDS) != [] and set(FIELDS) == {f.name for f in dataclasses.fields(Record)}
    constants = {v for k, v in vars(records_mod).items() if k.startswith("STATUS_")}
    assert set(STATUSES) == constants
    assert FAILING_STATUSES == {k for k, v in STATUSES.items() if v.failing}
    # the drift this table ended: an output only one side has is failing everywhere
    assert records_mod.STATUS_UNPAIRED_OUTPUT in FAILING_STATUSES
    for spec in STATUSES.values():
        assert spec.tone in ("good", "bad", "warn", "muted"), spec


def test_the_front_end_names_no_status_and_labels_no_field():
    sources = _js_sources()
    assert any(p.name == "schema.js" for p in sources)
    hits = []
    for path in sources:
        text = path.read_text(encoding="utf-8")
        for name in set(STATUSES) - _WORDS:
            for literal in (f'"{name}"', f"'{name}'", f"`{name}`", f"sbs-v-{name}"):
                if literal in text:
                    hits.append(f"{path.name}: status {literal}")
        for field, label in _label_pairs(text):
            hits.append(f"{path.name}: label {label!r} of {field}")
        # a set of statuses of its own (the old util.js FAILING)
        if re.search(r"new Set\(\[\s*\"(?:" + "|".join(STATUSES) + r")\"", text):
            hits.append(f"{path.name}: a literal set of statuses")
    assert hits == []


# a set or frozenset literal holding two statuses, by constant or by name (dict keys that
# count statuses, the summary's totals, are its output, not a declaration)
_NAME = r"(?:STATUS_\w+|\"(?:" + "|".join(STATUSES) + r")\"(?!\s*:))"
_STATUS_SET = re.compile(r"(?:frozenset\(|set\(|\{)[^{}()]*?" + _NAME + r"[^{}()]*?" + _NAME, re.S)


def _label_pairs(text: str) -> list[tuple[str, str]]:
    """(field, label) pairs written side by side: ``["label", "field"]``,
    ``("field", "label")``, ``key: "field", label: "label"``."""
    pairs = [(f, lab) for lab, f in re.findall(r"\[\s*\"([^\"]+)\"\s*,\s*\"(\w+)\"", text)]
    pairs += re.findall(r"\(\s*\"(\w+)\"\s*,\s*\"([^\"]+)\"", text)
    pairs += re.findall(r"key:\s*\"(\w+)\",\s*label:\s*\"([^\"]+)\"", text)
    # a label reads like one (words with spaces or signs), not like another key
    return [(f, lab) for f, lab in pairs if f in FIELDS and not re.fullmatch(r"\w+", lab)]


def test_the_python_views_declare_no_status_set_or_field_label():
    hits = []
    for path in VIEWS:
        text = path.read_text(encoding="utf-8")
        for m in _STATUS_SET.finditer(text):
            hits.append(f"{path.name}: {m.group(0)[:80]!r}")
        for field, label in _label_pairs(text):
            hits.append(f"{path.name}: label {label!r} of {field}")
    assert hits == []


def test_the_widget_and_every_saved_state_carry_the_schema():
    from onnx_sbs_nb.notebook.widget import SbsWidget
    from onnx_sbs_nb.reports.view_state import STATE_TRAITS, widget_state

    recs = [Record(step=0, onnx_name="a", status=records_mod.STATUS_UNPAIRED_OUTPUT)]
    w = SbsWidget(records=recs)
    w.wait(5)
    assert "schema" in STATE_TRAITS and w.trait_metadata("schema", "sync")
    assert w.schema == schema_dict() == w.state()["schema"]
    assert widget_state(recs)["schema"] == schema_dict()
    names = [f["name"] for f in w.schema["fields"]]
    assert names == list(FIELDS)
    failing = {s["name"] for s in w.schema["statuses"] if s["failing"]}
    assert failing == FAILING_STATUSES


@pytest.mark.skipif(not os.path.exists("/usr/bin/chromium"), reason="needs /usr/bin/chromium")
def test_the_front_end_derives_columns_filters_and_colours_from_the_schema(tmp_path):
    """A column and a status the front end has never heard of, added to the schema only,
    show in the table header, the detail, the verdict filter and the failing filter."""
    from playwright.sync_api import sync_playwright

    from onnx_sbs_nb.reports.html import fallback_html, load_bundle, page_html, view_html
    from onnx_sbs_nb.reports.view_state import widget_state

    from .browser import launch

    recs = [
        Record(step=0, onnx_name="v0", onnx_op_type="Relu", status="ok", err_abs=0.0),
        Record(step=1, onnx_name="v1", onnx_op_type="Relu", status="ok", err_abs=0.5),
        Record(step=2, onnx_name="v2", onnx_op_type="Relu", status="ok", err_abs=0.0),
    ]
    state = widget_state(recs)
    # a new field (its values in a new column) and a new failing status, declared only here
    state["schema"]["fields"].insert(
        1,
        {
            "name": "zz_new",
            "label": "brand new",
            "short": "new col",
            "fmt": "num",
            "priority": 0,
            "width": 80,
        },
    )
    state["schema"]["statuses"].append(
        {
            "name": "zz_bad",
            "label": "zz bad label",
            "failing": True,
            "tone": "bad",
            "compared": True,
            "own": False,
            "judged_elsewhere": False,
            "group": None,
            "doc": "",
        }
    )
    state["columns"].append("zz_new")
    state["rows"]["data"].append([1.5, 2.5, 3.5])
    status_col = state["columns"].index("status")
    state["rows"]["data"][status_col] = ["ok", "zz_bad", "ok"]
    body = view_html(state, "onnx-sbs-state-0", fallback_html(recs))
    path = tmp_path / "schema.html"
    path.write_text(page_html("schema", body, load_bundle()), encoding="utf-8")
    with sync_playwright() as pw:
        b = launch(pw)
        try:
            page = b.new_page(viewport={"width": 1500, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(path.as_uri())
            root = page.locator(".sbs-root")
            root.locator(".sbs-tr").first.wait_for(timeout=20000)
            heads = root.locator(".sbs-th").all_inner_texts()
            assert "new col" in heads, heads
            options = root.locator(".sbs-f-verdict option").all_inner_texts()
            assert "zz bad label" in options, options
            root.locator(".sbs-f-verdict").select_option("failing")
            page.wait_for_function(
                "() => document.querySelectorAll('.sbs-root .sbs-tr[data-row]:not([style*=\"none\"])').length === 1"
            )
            row = root.locator(".sbs-tr[data-row='1']:visible")
            assert "zz bad label" in row.inner_text() and "2.5" in row.inner_text()
            assert "sbs-fail" in row.get_attribute("class")
            assert "sbs-tone-bad" in row.locator(".sbs-v").get_attribute("class")
            row.click()
            detail = root.locator(".sbs-detail .sbs-record")
            detail.locator("summary").click()
            assert "brand new" in detail.locator(".sbs-dt").all_inner_texts()
            assert errors == []
        finally:
            b.close()
