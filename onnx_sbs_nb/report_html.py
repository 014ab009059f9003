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

from .files import write_text_atomic
from .records import Record
from .summary import Summary, summarize
from .view_state import bundle_js, culprit_name, culprit_of, is_finite, jsonable, widget_state

#: Rows the static fallback table shows.
FALLBACK_ROWS = 20
#: Points the static chart draws at most (the worst of each bucket is kept).
FALLBACK_POINTS = 400

_FALLBACK_COLUMNS = (
    ("step", "#"),
    ("ep_user_name", "fx node"),
    ("ep_module", "module"),
    ("onnx_name", "ONNX value"),
    ("onnx_op_type", "op"),
    ("onnx_shape_type", "shape"),
    ("err_abs", "err_abs"),
    ("err_abs2", "own err"),
    ("status", "status"),
)

# Where the interactive view is missing, the summary says why and how to get it.
SHARING_NOTE = (
    "This is the static summary of an onnx-sbs widget. The interactive view (table, chart, "
    "layers, graph) is missing here because the notebook was saved without its widget "
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
) -> str:
    """A script-free HTML fragment: the verdict and the culprit, the summary, a small
    log-scale chart and the worst rows.

    Shown where widgets cannot render (viewers that strip scripts, a kernel-less export).
    ``uid`` marks it as the summary of that widget (its view hides it once it renders);
    ``sharing`` adds the note that says how to get the interactive view.
    """
    records = list(records)
    cls = "onnx-sbs-fallback" + (f" sbs-for-{html.escape(uid)}" if uid else "")
    parts = [f'<div class="{cls}" style="font-family:sans-serif;font-size:13px;max-width:100%">']
    parts.append(f"<div><b>onnx-sbs</b>: {_counts_line(records, status)}</div>")
    parts.append(_culprit_html(summary))
    text = summary_text(summary)
    if text:
        parts.append(
            '<pre class="onnx-sbs-summary" style="white-space:pre-wrap;margin:4px 0">'
            f"{html.escape(text)}</pre>"
        )
    parts.append(error_chart_svg(records))
    parts.append(_worst_table(records))
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


def _culprit_html(summary: Any) -> str:
    c = culprit_of(_summary_dict(summary))
    if c is None:
        return ""
    bits = [f"<b>culprit: {html.escape(culprit_name(c))}</b>"]
    if c.get("ep_module"):
        bits.append(f"<code>{html.escape(str(c['ep_module']))}</code>")
    if c.get("ep_source"):
        bits.append(f"<code>{html.escape(str(c['ep_source']))}</code>")
    onnx = " ".join(
        str(v) for v in (c.get("onnx_node") or c.get("onnx_name"), c.get("onnx_op_type")) if v
    )
    if onnx:
        bits.append(f"ONNX {html.escape(onnx)}")
    own = c.get("own_error")
    if own is not None:
        tol = f" against atol {_fmt(c.get('atol'))}" if c.get("atol") is not None else ""
        bits.append(f"own error {html.escape(_fmt(own))}{html.escape(tol)}")
    if c.get("why"):
        bits.append(f"<i>{html.escape(str(c['why']))}</i>")
    return f'<div class="onnx-sbs-culprit" style="margin:4px 0">{" · ".join(bits)}</div>'


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


def _counts_line(records: list[Record], status: dict[str, Any] | None = None) -> str:
    failed = sum(1 for r in records if r.failed)
    worst = max((r.err_abs for r in records if is_finite(r.err_abs)), default=None)
    s = f"{len(records)} records, {failed} failing"
    if worst is not None:
        s += f", worst err_abs {worst:.3g}"
    state = (status or {}).get("state")
    if state and state != "finished":
        s = f"{state}: {s}"
    return html.escape(s)


def _worst(records: list[Record], n: int) -> list[Record]:
    def key(r: Record) -> tuple[int, float]:
        e = r.err_abs
        err = e if is_finite(e) else (math.inf if isinstance(e, float) else -1.0)
        return (1 if r.failed else 0, err)

    return sorted(records, key=key, reverse=True)[:n]


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


def _worst_table(records: list[Record]) -> str:
    rows = _worst(records, FALLBACK_ROWS)
    if not rows:
        return "<div>no records</div>"
    columns = [
        (name, label)
        for name, label in _FALLBACK_COLUMNS
        if name != "ep_module" or any(getattr(r, name, None) for r in rows)
    ]
    head = "".join(f"<th>{html.escape(label)}</th>" for _, label in columns)
    body = []
    for r in rows:
        color = _ROW_BG.get(True if r.failed else (False if r.passed else None), "transparent")
        cells = "".join(f"<td>{html.escape(_fmt(_cell(r, name)))}</td>" for name, _ in columns)
        body.append(f'<tr style="background:{color}">{cells}</tr>')
    return (
        '<table class="onnx-sbs-worst" border="1" style="border-collapse:collapse">'
        f"<caption>worst {len(rows)} of {len(records)} rows</caption>"
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    )


def error_chart_svg(
    records: Sequence[Record],
    width: int = 640,
    height: int = 180,
    max_points: int = FALLBACK_POINTS,
) -> str:
    """Inline SVG: err_abs per record along the stream (log scale), failing points in red.

    Exact zeros sit on a baseline labelled 0 under the log axis, not at a made-up floor;
    the line breaks there.  Colours read on a light and a dark page alike.
    """
    pts = [(i, r) for i, r in enumerate(records) if is_finite(r.err_abs)]
    if not pts:
        return '<svg class="onnx-sbs-chart" width="0" height="0"></svg>'
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
    m = 34  # left margin for the axis labels
    zero_y = height - 8  # the baseline of exact zeros, under the log axis
    top, bottom = 5, height - 24

    def x_of(i: int) -> float:
        return m + (width - m - 5) * i / n

    def y_of(v: float) -> float:
        if v <= 0:
            return zero_y
        return top + (bottom - top) * (hi - math.log10(v)) / (hi - lo)

    out = [
        f'<svg class="onnx-sbs-chart" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" style="max-width:100%;color:inherit">',
        f"<title>{html.escape('err_abs per node (log10); exact zeros on the 0 line')}</title>",
    ]
    for e in range(lo, hi + 1):
        y = top + (bottom - top) * (hi - e) / (hi - lo)
        out.append(
            f'<line x1="{m}" x2="{width}" y1="{y:.1f}" y2="{y:.1f}" stroke="currentColor" '
            'stroke-opacity="0.12"/>'
            f'<text x="2" y="{y + 4:.1f}" font-size="9" fill="currentColor">1e{e}</text>'
        )
    out.append(
        f'<line x1="{m}" x2="{width}" y1="{zero_y}" y2="{zero_y}" stroke="currentColor" '
        f'stroke-opacity="0.35"/><text x="2" y="{zero_y + 3}" font-size="9" '
        'fill="currentColor">0</text>'
    )
    segments, current = [], []
    for i, r in pts:
        if r.err_abs > 0:
            current.append(f"{x_of(i):.1f},{y_of(r.err_abs):.1f}")
        elif current:
            segments.append(current)
            current = []
    if current:
        segments.append(current)
    for seg in segments:
        out.append(
            f'<polyline fill="none" stroke="#2f81f7" stroke-width="1" points="{" ".join(seg)}"/>'
        )
    if tol_log is not None:
        y = y_of(10**tol_log)
        out.append(
            f'<line x1="{m}" x2="{width}" y1="{y:.1f}" y2="{y:.1f}" stroke="#d29922" '
            'stroke-dasharray="4 2"/>'
        )
    for i, r in pts:
        color = "#e5534b" if r.failed else "#2f81f7"
        label = html.escape(f"{r.onnx_name or r.ep_name} ({r.onnx_op_type}) {r.err_abs:.3g}")
        out.append(
            f'<circle cx="{x_of(i):.1f}" cy="{y_of(r.err_abs):.1f}" r="2" fill="{color}">'
            f"<title>{label}</title></circle>"
        )
    out.append("</svg>")
    return "".join(out)


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
) -> dict[str, Any]:
    """The widget state (same keys as SbsWidget's synced traits) of a run: finished
    unless ``status`` says otherwise; ``model`` (the ONNX model) adds its graph."""
    if summary is None:
        summary = summarize(records)
    state = widget_state(records, summary=summary, status=status, model=model)
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
) -> str:
    """One HTML file that opens offline: the culprit, linked table and chart, layers,
    filters, and (given the ONNX ``model``) the graph around each node.

    The static fallback sits inside the view, so a viewer that runs no script still shows
    the summary and the worst rows.  ``status`` is the run's when it did not finish.
    """
    records = list(records)
    if summary is None:
        summary = summarize(records)
    running = (status or {}).get("state") == "running"
    bundle = bundle if bundle is not None else load_bundle()
    title = title or "onnx-sbs report"
    body = f"<h2>{html.escape(title)}</h2>\n" + view_html(
        report_state(records, summary, status=status, model=model),
        "onnx-sbs-state-0",
        fallback_html(records, None if running else summary, status=status),
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
) -> Path:
    """:func:`report_html` written to ``path`` (its folder is created); returns the path."""
    path = Path(path)
    text = report_html(records, summary, title=title, status=status, model=model)
    write_text_atomic(path, text)
    return path
