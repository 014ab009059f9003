"""HTML views of a run: a static fallback (no script) and the self-contained report.

Every string that comes from a model (node names, op types, targets, errors) is untrusted:
it goes through :func:`html.escape` in the static parts, and is embedded as JSON with
``<``, ``>`` and ``&`` written as ``\\u003c``-style escapes in the scripted parts, so it can
neither close a ``<script>`` element nor become markup.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..align.blame.summary import Coverage, Summary, failing_text, summarize
from ..files import write_text_atomic
from ..records import STATUSES, Record, brief_fields, field_label
from .png import Raster
from .view_state import bundle_js, culprit_name, culprit_of, is_finite, jsonable, widget_state

#: Rows the static fallback table shows.
FALLBACK_ROWS = 20
#: Rows of the run before and after the culprit the static table shows next to it.
FALLBACK_NEIGHBOURS = 2
#: Points the static chart draws at most (the worst of each bucket is kept).
FALLBACK_POINTS = 400

# Where the interactive view is missing, the summary says why and how to get it.
SHARING_NOTE = (
    "This is the static summary of an onnx-sbs widget. The interactive view (table, chart, "
    "layers, graph) is missing here because this notebook is not trusted (JupyterLab draws "
    "no widget of a notebook it received: if it was saved with its widget state, run "
    "Trust Notebook from the command palette), because it was saved without its widget "
    "state, or because this page cannot load the widget manager (an HTML export opened "
    "offline). To keep it: in JupyterLab turn on Settings \u2192 Save Widget State "
    "Automatically, then run and save the notebook again; export the notebook with "
    "`onnx-sbs notebook this.ipynb -o report.html`; or write a report that always opens "
    "with the widget's Export report button or `w.save_html('report.html')`."
)

_ROW_BG = {True: "rgba(207,34,46,0.14)", False: "rgba(26,127,55,0.10)"}


def fallback_html(
    records: Sequence[Record],
    summary: Any = None,
    *,
    status: dict[str, Any] | None = None,
    uid: str | None = None,
    sharing: bool = False,
    stack: str | None = None,
) -> str:
    """A script-free HTML fragment: the verdict and the culprit, the summary, a small
    log-scale chart and the worst rows.

    Shown where widgets cannot render (viewers that strip scripts, a kernel-less export).
    ``uid`` marks it as the summary of that widget (its view hides it once it renders);
    ``sharing`` adds the note that says how to get the interactive view; ``stack``: the
    culprit's whole stack trace, folded under its source line.
    """
    records = list(records)
    cls = "onnx-sbs-fallback" + (f" sbs-for-{html.escape(uid)}" if uid else "")
    parts = [f'<div class="{cls}" style="font-family:sans-serif;font-size:13px;max-width:100%">']
    parts.append(f"<div><b>onnx-sbs</b>: {_counts_line(records, status, summary)}</div>")
    # the answer, then the rows around it, then the picture; the full text folded away so
    # the first screen of a shared notebook holds the verdict, the culprit and the table
    parts.append(_culprit_html(summary, stack))
    parts.append(_worst_table(records, summary))
    parts.append(error_chart_img(records))
    text = summary_text(summary)
    if text:
        parts.append(
            '<details class="onnx-sbs-summary-text"><summary>summary as text</summary>'
            '<pre class="onnx-sbs-summary" style="white-space:pre-wrap;margin:4px 0">'
            f"{html.escape(text)}</pre></details>"
        )
    if sharing:
        parts.append(
            '<p class="onnx-sbs-sharing" style="opacity:0.8;font-size:12px;margin:6px 0">'
            f"{html.escape(SHARING_NOTE)}</p>"
        )
    parts.append("</div>")
    return "\n".join(parts)


def _summary_dict(summary: Any) -> dict[str, Any] | None:
    if summary is None or isinstance(summary, str):
        return None
    d = jsonable(summary)
    return d if isinstance(d, dict) else None


def stack_of(details: dict[str, Any] | None) -> str | None:
    """The stack trace in a row's details (``{"row", "node": node_detail}``), if any."""
    node = (details or {}).get("node")
    stack = node.get("stack_trace") if isinstance(node, dict) else None
    return stack if isinstance(stack, str) and stack.strip() else None


def _culprit_html(summary: Any, stack: str | None = None) -> str:
    c = culprit_of(_summary_dict(summary))
    if c is None:
        return ""
    bits = [f"<b>culprit: {html.escape(culprit_name(c))}</b>"]
    # long source lines wrap instead of running off the page
    code = '<code style="white-space:pre-wrap;overflow-wrap:anywhere">'
    if c.get("ep_module"):
        bits.append(f"{code}{html.escape(str(c['ep_module']))}</code>")
    if c.get("ep_source"):
        bits.append(f"{code}{html.escape(str(c['ep_source']))}</code>")
    onnx = " ".join(
        str(v) for v in (c.get("onnx_node") or c.get("onnx_name"), c.get("onnx_op_type")) if v
    )
    if onnx:
        bits.append(f"ONNX {html.escape(onnx)}")
    own = c.get("own_error")
    if own is not None:
        tol = f" against atol {_fmt(c.get('atol'))}" if c.get("atol") is not None else ""
        label = "own error" if c.get("own_measured") else "error"  # own: a rerun proved it
        bits.append(f"{label} {html.escape(_fmt(own))}{html.escape(tol)}")
    if c.get("fuses"):
        bits.append(f"fusing {html.escape(str(c['fuses']))}")
    if c.get("why"):
        bits.append(f"<i>{html.escape(str(c['why']))}</i>")
    if c.get("bundle"):
        bits.append(f"replay bundle {code}{html.escape(str(c['bundle']))}</code>")
    # the source line is the innermost frame of the user's or the model library's code;
    # the whole stack is one click away
    folded = (
        '<details class="onnx-sbs-stack"><summary>whole stack</summary>'
        f'<pre style="white-space:pre-wrap;margin:2px 0">{html.escape(stack)}</pre></details>'
        if stack
        else ""
    )
    return f'<div class="onnx-sbs-culprit" style="margin:4px 0">{" · ".join(bits)}{folded}</div>'


def summary_text(summary: Any) -> str:
    """The summary's text, whatever form it was given in (Summary, dict, str or None)."""
    if summary is None:
        return ""
    if isinstance(summary, str):
        return summary
    to_text = getattr(summary, "to_text", None)
    if callable(to_text):
        return str(to_text())
    if isinstance(summary, dict):
        try:
            return Summary.from_dict(summary).to_text()
        except Exception:  # a dict of another shape: show it as it is
            return json.dumps(summary, indent=1, default=str)
    return str(summary)


def _counts_line(
    records: list[Record], status: dict[str, Any] | None = None, summary: Any = None
) -> str:
    d = _summary_dict(summary)
    failed = sum(1 for r in records if r.failed)
    inherited = sum(1 for r in records if r.inherits)
    # a weight that differs by design (folded) is no error: not the worst
    worst = max(
        (r.err_abs for r in records if is_finite(r.err_abs) and not _by_design(r)), default=None
    )
    carried = ((d or {}).get("totals") or {}).get("carried", "upstream")
    s = f"{len(records)} records, {failing_text(failed, inherited, carried)}"
    if worst is not None:
        s += f", worst err_abs {worst:.3g}"
    state = (status or {}).get("state")
    if state and state != "finished":
        s = f"{state}: {s}"
    verdict = d.get("verdict") if d else None
    shown = str(verdict).upper()
    coverage = Coverage.from_dict(d.get("coverage") or {}) if d else None
    if verdict and coverage is not None and d.get("partial"):
        # a pass over little of the model is no plain pass
        shown += f" on {coverage.onnx_covered} of {coverage.onnx_nodes} ONNX nodes"
    head = f"<b>verdict: {html.escape(shown)}</b> \u00b7 " if verdict else ""
    tail = ""
    if coverage is not None and coverage.onnx_nodes:
        tail = (
            f'<div class="onnx-sbs-coverage">{html.escape("compared: " + coverage.to_text())}</div>'
        )
    return head + html.escape(s) + tail


def _worst(records: list[Record], n: int) -> list[Record]:
    def key(r: Record) -> tuple[int, float]:
        e = r.err_abs
        err = e if is_finite(e) else (math.inf if isinstance(e, float) else -1.0)
        return (1 if r.failed else -1 if _by_design(r) else 0, err)

    return sorted(records, key=key, reverse=True)[:n]


def _by_design(r: Record) -> bool:
    """A weight that differs from its torch parameter by design (a BatchNorm folded into
    it) while its consumers agree: listed after every value's error."""
    spec = STATUSES.get(r.status)
    return spec is not None and spec.by_design


def _rows(records: list[Record], summary: Any, n: int) -> tuple[list[Record], int, int]:
    """(rows, index of the culprit's row or -1, rows before the worst ones).

    The culprit first, then its neighbours in the run (what feeds it and what it feeds
    come next to it), then the worst: sorted by error alone, errors it propagated fill the
    table and the culprit, whose own error is often small, is not among them.
    """
    c = culprit_of(_summary_dict(summary))
    at = -1
    if c is not None and c.get("step") is not None:
        at = next((i for i, r in enumerate(records) if r.step == c["step"]), -1)
    if at < 0:
        return _worst(records, n), -1, 0
    # its compared neighbours: a value only one side has says nothing about the error
    before = [r for r in reversed(records[:at]) if is_finite(r.err_abs)][:FALLBACK_NEIGHBOURS]
    after = [r for r in records[at + 1 :] if is_finite(r.err_abs)][:FALLBACK_NEIGHBOURS]
    first = [records[at], *reversed(before), *after]
    seen = {id(r) for r in first}
    rest = [r for r in _worst(records, n + len(first)) if id(r) not in seen]
    return (first + rest)[:n], 0, len(first)


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def _cell(r: Record, name: str) -> Any:
    if name == "ep_user_name":  # the user's own name, else the prepared program's
        return getattr(r, name, None) or r.ep_name
    return getattr(r, name, None)


_LEADING = ("step", "ep_user_name", "err_abs", "status")


def _worst_table(records: list[Record], summary: Any = None) -> str:
    rows, culprit_at, leading = _rows(records, summary, FALLBACK_ROWS)
    if not rows:
        return "<div>no records</div>"
    # the schema's brief columns; a module column only where some row has a module
    columns = [
        (name, field_label(name))
        for name in brief_fields()
        if name != "ep_module" or any(getattr(r, name, None) for r in rows)
    ]
    # the answer's columns next to the name: a narrow output (800 px with a side panel)
    # shows them without scrolling sideways; the others follow in the schema's order
    lead = [c for k in _LEADING for c in columns if c[0] == k]
    columns = lead + [c for c in columns if c not in lead]
    # a long fx node name breaks (from 8em on), so a narrow output (800 px, a side panel
    # open) still shows the error and verdict columns beside it (word-break and
    # min-width: JupyterLab's sanitizer keeps them, and drops overflow-wrap:anywhere)
    name_td = '<td style="word-break:break-all;min-width:8em">'
    td = {n: name_td if n == "ep_user_name" else "<td>" for n, _ in columns}
    head = "".join(f"<th>{html.escape(label)}</th>" for _, label in columns)
    body = []
    for k, r in enumerate(rows):
        color = _ROW_BG.get(True if r.failed else (False if r.passed else None), "transparent")
        cells = "".join(
            f"{td[name]}{html.escape(_fmt(_cell(r, name)))}</td>" for name, _ in columns
        )
        if k == culprit_at:
            body.append(
                f'<tr class="onnx-sbs-culprit-row" style="background:{color};'
                f'font-weight:bold" title="culprit">{cells}</tr>'
            )
        else:
            body.append(f'<tr style="background:{color}">{cells}</tr>')
    if culprit_at >= 0:
        caption = (
            f"the culprit and {leading - 1} rows around it, then the worst "
            f"{len(rows) - leading} of {len(records)} rows"
        )
    else:
        caption = f"worst {len(rows)} of {len(records)} rows"
    return (
        '<table class="onnx-sbs-worst" border="1" style="border-collapse:collapse;max-width:100%">'
        f"<caption>{html.escape(caption)}</caption>"
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    )


def error_chart_img(
    records: Sequence[Record],
    width: int = 640,
    height: int = 180,
    max_points: int = FALLBACK_POINTS,
) -> str:
    """The error chart as a PNG ``<img>``: err_abs per record along the stream (log scale),
    failing points in red, the tolerance dashed, exact zeros on a baseline labelled 0.

    An image and not inline SVG: an untrusted notebook's sanitizer strips SVG elements but
    keeps their text, so every point's tooltip used to spill into the page as a wall of
    text. The image carries no model string; its alt text is one line.  Colours read on a
    light and a dark page alike (the background is transparent).
    """
    pts = [(i, r) for i, r in enumerate(records) if is_finite(r.err_abs)]
    if not pts:
        return ""
    if len(pts) > max_points:  # keep the worst point of each bucket so spikes stay visible
        size = math.ceil(len(pts) / max_points)
        pts = [max(pts[k : k + size], key=lambda p: p[1].err_abs) for k in range(0, len(pts), size)]
    nonzero = [math.log10(r.err_abs) for _, r in pts if r.err_abs > 0]
    tols = [r.atol for _, r in pts if is_finite(r.atol) and r.atol > 0]
    tol_log = math.log10(min(tols)) if tols else None
    scale = nonzero + ([tol_log] if tol_log is not None else []) or [0.0]
    lo, hi = math.floor(min(scale)), math.ceil(max(scale))
    if hi == lo:
        hi = lo + 1
    n = max(len(records) - 1, 1)
    m = 44  # left margin for the axis labels
    zero_y = height - 8  # the baseline of exact zeros, under the log axis
    top, bottom = 6, height - 24

    def x_of(i: int) -> float:
        return m + (width - m - 5) * i / n

    def y_of(v: float) -> float:
        if v <= 0:
            return zero_y
        return top + (bottom - top) * (hi - math.log10(v)) / (hi - lo)

    img = Raster(width, height)
    grey, grid = (128, 128, 128, 255), (128, 128, 128, 40)
    step = max(1, math.ceil((hi - lo) / 6))  # at most about 7 labelled decades
    for e in range(lo, hi + 1):
        y = round(top + (bottom - top) * (hi - e) / (hi - lo))
        img.hline(m, width, y, grid)
        if (hi - e) % step == 0:
            img.text(2, y - 4, f"1e{e}", grey)
    img.hline(m, width, zero_y, (128, 128, 128, 90))
    img.text(2, zero_y - 4, "0", grey)
    if tol_log is not None:
        img.hline(m, width, round(y_of(10**tol_log)), (210, 153, 34, 255), dash=4)
    blue, red = (47, 129, 247, 255), (229, 83, 75, 255)
    prev: tuple[float, float] | None = None
    for i, r in pts:
        if r.err_abs > 0:
            xy = (x_of(i), y_of(r.err_abs))
            if prev is not None:
                img.line(*prev, *xy, (47, 129, 247, 160))
            prev = xy
        else:
            prev = None  # the line breaks at exact zeros
    for i, r in pts:
        if not r.failed:
            img.dot(x_of(i), y_of(r.err_abs), blue)
    for i, r in pts:  # failing points last, on top
        if r.failed:
            img.dot(x_of(i), y_of(r.err_abs), red, radius=2)
    alt = "err_abs per node (log scale), failing nodes in red"
    return (
        f'<figure class="onnx-sbs-chart" style="margin:4px 0">'
        f'<img src="{img.data_uri()}" width="{width}" height="{height}" alt="{alt}" '
        f'style="max-width:100%;height:auto"/>'
        '<figcaption style="font-size:11px;opacity:0.75">err_abs per node along the run '
        "(log scale; exact zeros on the 0 line), failing in red, tolerance dashed"
        "</figcaption></figure>"
    )


# ---- the self-contained report -----------------------------------------------------------

#: Class of the elements the loader script renders a state into.
VIEW_CLASS = "onnx-sbs-view"
BUNDLE_ID = "onnx-sbs-bundle"

# The bundle is an ES module: it is kept as inert text and imported through a Blob URL,
# which works from file:// and needs no network, so one copy serves every view on the page.
_LOADER = """
async function readState(node) {
  const text = node.textContent;
  if (node.dataset.encoding !== "gzip+base64") return JSON.parse(text);
  const bytes = Uint8Array.from(atob(JSON.parse(text)), (c) => c.charCodeAt(0));
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  return JSON.parse(await new Response(stream).text());
}
const views = document.querySelectorAll(".__VIEW__");
try {
  const src = document.getElementById("__BUNDLE__").textContent;
  const url = URL.createObjectURL(new Blob([src], {type: "text/javascript"}));
  const mod = await import(url);
  for (const el of views) {
    const state = await readState(document.getElementById(el.dataset.stateId));
    const fallback = el.querySelector(".onnx-sbs-fallback");
    try {
      const target = document.createElement("div");
      target.className = "onnx-sbs-static";
      el.appendChild(target);
      await mod.renderStatic(target, state);
      if (fallback) fallback.remove();
    } catch (e) {
      const msg = document.createElement("pre");
      msg.className = "onnx-sbs-render-error";
      msg.textContent = "onnx-sbs: the interactive view failed: " + e;
      el.prepend(msg);
    }
  }
} catch (e) {
  for (const el of views) {
    const msg = document.createElement("pre");
    msg.className = "onnx-sbs-render-error";
    msg.textContent = "onnx-sbs: cannot load the viewer: " + e;
    el.prepend(msg);
  }
}
""".replace("__VIEW__", VIEW_CLASS).replace("__BUNDLE__", BUNDLE_ID)


def script_json(value: Any) -> str:
    """JSON safe to inline in a ``<script>``: no ``<``, ``>``, ``&`` characters left."""
    text = json.dumps(value, allow_nan=False, separators=(",", ":"), default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def script_js(source: str) -> str:
    """JavaScript safe to inline in a ``<script>`` element.

    Only ``</script`` and ``<!--`` can end or confuse the element; in valid JS both can only
    occur inside strings, templates, regexes or comments, where ``\\x3C`` means ``<`` too.
    """
    import re

    source = re.sub(r"<(?=/script)", r"\\x3C", source, flags=re.IGNORECASE)
    return source.replace("<!--", "\\x3C!--")


#: States larger than this (bytes of JSON) are gzipped: 20,000 rows shrink about tenfold.
COMPRESS_ABOVE = 256_000


def view_html(
    state: dict[str, Any], view_id: str, fallback: str = "", compress_above: int = COMPRESS_ABOVE
) -> str:
    """A placeholder the loader renders ``state`` into, and the state as inert JSON.

    ``fallback`` (script-free HTML) stays visible until the view renders, or for good where
    scripts do not run.  A large state is stored gzipped (base64 in a JSON string) and
    inflated by the browser's DecompressionStream.
    """
    data = script_json(state)
    encoding = ""
    if len(data) > compress_above:
        import base64
        import gzip

        raw = json.dumps(state, allow_nan=False, separators=(",", ":"), default=str)
        packed = base64.b64encode(gzip.compress(raw.encode("utf-8"), mtime=0)).decode("ascii")
        data, encoding = json.dumps(packed), ' data-encoding="gzip+base64"'
    vid = html.escape(view_id)
    return (
        f'<div class="{VIEW_CLASS}" data-state-id="{vid}">{fallback}</div>\n'
        f'<script type="application/json" id="{vid}"{encoding}>{data}</script>'
    )


def loader_html(bundle: str) -> str:
    """The bundle (once per page) and the script that renders every view."""
    return (
        f'<script type="text/plain" id="{BUNDLE_ID}">{script_js(bundle)}</script>\n'
        f'<script type="module">{_LOADER}</script>'
    )


# The page follows the reader's light or dark preference (the view inside does too).
_PAGE_STYLE = (
    ":root{color-scheme:light dark}"
    "body{margin:16px 20px;font-family:system-ui,-apple-system,'Segoe UI',sans-serif;"
    "background:#ffffff;color:#1f2328}"
    "@media (prefers-color-scheme: dark){body{background:#0d1117;color:#e6edf3}}"
    "h2{font-weight:600;margin:0 0 12px}"
)


def page_html(title: str, body: str, bundle: str) -> str:
    return (
        '<!DOCTYPE html>\n<html>\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n"
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        '<meta name="color-scheme" content="light dark">\n'
        f"<style>{_PAGE_STYLE}</style>\n"
        "</head>\n<body>\n"
        f"{body}\n{loader_html(bundle)}\n</body>\n</html>\n"
    )


class BundleMissingError(RuntimeError):
    """The widget bundle (onnx_sbs_nb/static/widget.js) is not built."""


def load_bundle() -> str:
    try:
        return bundle_js()
    except OSError as e:
        raise BundleMissingError(
            "the HTML report needs the front-end bundle onnx_sbs_nb/static/widget.js "
            f"({type(e).__name__}: {e}); build it with `cd js && npm ci && npm run build`, "
            "or write a .xlsx/.csv/.jsonl report instead"
        ) from e


def report_state(
    records: Sequence[Record],
    summary: Any = None,
    *,
    status: dict[str, Any] | None = None,
    model: Any = None,
    details: dict[str, Any] | None = None,
    timeline: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The widget state (same keys as SbsWidget's synced traits) of a run: finished
    unless ``status`` says otherwise; ``model`` (the ONNX model) adds its graph;
    ``timeline`` (``Run.timeline()``) the two token streams of a generation parity."""
    if summary is None:
        summary = summarize(records)
    state = widget_state(records, summary=summary, status=status, model=model, timeline=timeline)
    if details and isinstance(details.get("row"), int):
        # the culprit's node detail (its whole stack): selected, as the live view does
        state.update(selected=details["row"], details=jsonable(details))
    completion = (state.get("summary") or {}).get("completion")
    if status is None and isinstance(completion, dict) and completion.get("state") != "finished":
        # the run ended without comparing everything: the report never says "finished"
        state["status"].update(
            state=completion["state"],
            stopped=completion["state"] == "stopped",
            done_onnx_nodes=completion.get("nodes_done"),
            total_onnx_nodes=completion.get("nodes_total"),
        )
    return state


def report_html(
    records: Sequence[Record],
    summary: Any = None,
    *,
    title: str = "",
    bundle: str | None = None,
    status: dict[str, Any] | None = None,
    model: Any = None,
    details: dict[str, Any] | None = None,
    preface: str = "",
    timeline: dict[str, Any] | None = None,
) -> str:
    """One HTML file that opens offline: the culprit, linked table and chart, layers,
    filters, and (given the ONNX ``model``) the graph around each node.

    The static fallback sits inside the view, so a viewer that runs no script still shows
    the summary and the worst rows.  ``status`` is the run's when it did not finish.
    ``preface``: script-free HTML shown above the view (the precision advice's section).
    ``details``: ``{"row", "node": node_detail}`` of the culprit (its whole stack shows
    on the answer card, and in the fallback under its source line).
    """
    records = list(records)
    if summary is None:
        summary = summarize(records)
    running = (status or {}).get("state") == "running"
    bundle = bundle if bundle is not None else load_bundle()
    title = title or "onnx-sbs report"
    body = f"<h2>{html.escape(title)}</h2>\n{preface}" + view_html(
        report_state(
            records, summary, status=status, model=model, details=details, timeline=timeline
        ),
        "onnx-sbs-state-0",
        fallback_html(
            records, None if running else summary, status=status, stack=stack_of(details)
        ),
    )
    return page_html(title, body, bundle)


def write_report_html(
    records: Sequence[Record],
    path: str | Path,
    *,
    summary: Any = None,
    status: dict[str, Any] | None = None,
    model: Any = None,
    title: str = "",
    details: dict[str, Any] | None = None,
    timeline: dict[str, Any] | None = None,
) -> Path:
    """:func:`report_html` written to ``path`` (its folder is created); returns the path."""
    path = Path(path)
    text = report_html(
        records,
        summary,
        title=title,
        status=status,
        model=model,
        details=details,
        timeline=timeline,
    )
    write_text_atomic(path, text)
    return path
