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
from typing import Any

from .records import Record
from .summary import summarize
from .view_state import bundle_js, is_finite, widget_state

#: Rows the static fallback table shows.
FALLBACK_ROWS = 20
#: Points the static chart draws at most (the worst of each bucket is kept).
FALLBACK_POINTS = 400

_FALLBACK_COLUMNS = (
    ("step", "#"),
    ("ep_name", "fx node"),
    ("onnx_name", "ONNX value"),
    ("onnx_op_type", "op"),
    ("onnx_shape_type", "shape"),
    ("err_abs", "err_abs"),
    ("err_rel", "err_rel"),
    ("err_abs2", "own err"),
    ("status", "status"),
)


def fallback_html(records: Sequence[Record], summary: Any = None) -> str:
    """A script-free HTML fragment: summary, worst rows as a table, a small log-scale chart.

    Shown where widgets cannot render (viewers that strip scripts, a kernel-less export).
    """
    records = list(records)
    parts = ['<div class="onnx-sbs-fallback" style="font-family:sans-serif;font-size:13px">']
    parts.append(f"<div><b>onnx-sbs</b>: {_counts_line(records)}</div>")
    text = summary_text(summary)
    if text:
        parts.append(
            '<pre class="onnx-sbs-summary" style="white-space:pre-wrap;margin:4px 0">'
            f"{html.escape(text)}</pre>"
        )
    parts.append(error_chart_svg(records))
    parts.append(_worst_table(records))
    parts.append("</div>")
    return "\n".join(parts)


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
        return json.dumps(summary, indent=1, default=str)
    return str(summary)


def _counts_line(records: list[Record]) -> str:
    failed = sum(1 for r in records if r.failed)
    worst = max((r.err_abs for r in records if is_finite(r.err_abs)), default=None)
    s = f"{len(records)} records, {failed} failing"
    if worst is not None:
        s += f", worst err_abs {worst:.3g}"
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


def _worst_table(records: list[Record]) -> str:
    rows = _worst(records, FALLBACK_ROWS)
    if not rows:
        return "<div>no records</div>"
    head = "".join(f"<th>{html.escape(label)}</th>" for _, label in _FALLBACK_COLUMNS)
    body = []
    for r in rows:
        color = "#fdd" if r.failed else ("#dfd" if r.passed else "#fff")
        cells = "".join(
            f"<td>{html.escape(_fmt(getattr(r, name)))}</td>" for name, _ in _FALLBACK_COLUMNS
        )
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
    """Inline SVG: err_abs per record along the stream (log scale), failing points in red."""
    pts = [(i, r) for i, r in enumerate(records) if is_finite(r.err_abs)]
    if not pts:
        return '<svg class="onnx-sbs-chart" width="0" height="0"></svg>'
    if len(pts) > max_points:  # keep the worst point of each bucket so spikes stay visible
        size = math.ceil(len(pts) / max_points)
        pts = [max(pts[k : k + size], key=lambda p: p[1].err_abs) for k in range(0, len(pts), size)]
    floor = 1e-12
    logs = [math.log10(max(r.err_abs, floor)) for _, r in pts]
    tols = [r.atol for _, r in pts if is_finite(r.atol) and r.atol > 0]
    tol_log = math.log10(min(tols)) if tols else None
    lo = min(logs + ([tol_log] if tol_log is not None else []))
    hi = max(logs + ([tol_log] if tol_log is not None else []))
    lo, hi = math.floor(lo), math.ceil(hi)
    if hi == lo:
        hi = lo + 1
    n = max(len(records) - 1, 1)
    m = 30  # left margin for the axis labels

    def xy(i: int, lg: float) -> tuple[float, float]:
        return (m + (width - m - 5) * i / n, 5 + (height - 20) * (hi - lg) / (hi - lo))

    out = [
        f'<svg class="onnx-sbs-chart" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" style="background:#fafafa">',
        f"<title>{html.escape('err_abs per node (log10)')}</title>",
    ]
    for e in range(lo, hi + 1):
        _, y = xy(0, e)
        out.append(
            f'<line x1="{m}" x2="{width}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
            f'<text x="2" y="{y + 4:.1f}" font-size="9">1e{e}</text>'
        )
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(i, lg) for (i, _), lg in zip(pts, logs)))
    out.append(f'<polyline fill="none" stroke="#4a7" stroke-width="1" points="{line}"/>')
    if tol_log is not None:
        _, y = xy(0, tol_log)
        out.append(
            f'<line x1="{m}" x2="{width}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e90" '
            'stroke-dasharray="4 2"/>'
        )
    for (i, r), lg in zip(pts, logs):
        x, y = xy(i, lg)
        color = "#d22" if r.failed else "#4a7"
        label = html.escape(f"{r.onnx_name or r.ep_name} ({r.onnx_op_type}) {r.err_abs:.3g}")
        out.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2" fill="{color}"><title>{label}</title></circle>'
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
COMPRESS_ABOVE = 1_000_000


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


def page_html(title: str, body: str, bundle: str) -> str:
    return (
        '<!DOCTYPE html>\n<html>\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n"
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
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


def report_state(records: Sequence[Record], summary: Any = None) -> dict[str, Any]:
    """The widget state (same keys as SbsWidget's synced traits) of a finished run."""
    if summary is None:
        summary = summarize(records)
    # Summary.to_dict carries the verdict (a property a plain dataclass copy would drop)
    if hasattr(summary, "to_dict"):
        summary = summary.to_dict()
    return widget_state(records, summary=summary)


def report_html(
    records: Sequence[Record], summary: Any = None, *, title: str = "", bundle: str | None = None
) -> str:
    """One HTML file that opens offline: summary, linked table and chart, filters.

    The static fallback sits inside the view, so a viewer that runs no script still shows
    the summary and the worst rows.
    """
    records = list(records)
    if summary is None:
        summary = summarize(records)
    bundle = bundle if bundle is not None else load_bundle()
    title = title or "onnx-sbs report"
    body = f'<h2 style="font-family:sans-serif">{html.escape(title)}</h2>\n' + view_html(
        report_state(records, summary), "onnx-sbs-state-0", fallback_html(records, summary)
    )
    return page_html(title, body, bundle)
