"""``onnx-sbs notebook report.ipynb -o report.html``: an executed notebook as an offline report.

Stock ``nbconvert --to html`` renders widgets with a widget manager loaded from a CDN, so
offline an SbsWidget output shows nothing (the static summary the widget displays next to
it is what stays readable there).  Here each SbsWidget output whose state was saved in the
notebook (``metadata.widgets``, written by JupyterLab's "Save Widget State Automatically"
or ``nbclient`` with ``store_widget_state=True``) is replaced by an offline rendering of
that state (the widget bundle's ``renderStatic``, inlined once), with the static summary
inside it for readers without scripts; every other output is what nbconvert shows.
Widget outputs without a saved state leave their static summary (which says how to keep
the state next time), and no widget-manager script from a CDN is left.

A received notebook is untrusted: the views render with the installed package's own bundle
only (a saved state's ``_esm``/``_css`` is whatever its sender wrote), and the notebook's
HTML (outputs, markdown, SVG) goes through :mod:`.html_sanitize`, as JupyterLab shows an
untrusted notebook; its javascript outputs do not run.
"""

from __future__ import annotations

import base64
import copy
import pathlib
import re
import secrets
from dataclasses import dataclass
from typing import Any

from ..files import write_text_atomic
from .html import load_bundle, loader_html, view_html
from .html_sanitize import clean_untrusted_html
from .report import ReportFormatError
from .view_state import STATE_TRAITS

#: Output metadata key marking the static summary displayed next to an SbsWidget.
FALLBACK_METADATA = "onnx_sbs"

WIDGET_STATE_MIME = "application/vnd.jupyter.widget-state+json"
WIDGET_VIEW_MIME = "application/vnd.jupyter.widget-view+json"
#: anywidget names each model after the class that made it (``_anywidget_id``).
SBS_WIDGET_ID_PREFIX = "onnx_sbs_nb."


@dataclass
class ExportResult:
    html: str
    views: int  # SbsWidget outputs rendered from their saved state
    fallbacks: int  # widget outputs shown through their static representation


def saved_widget_states(nb: Any) -> dict[str, dict[str, Any]]:
    """``{model_id: state}`` of the SbsWidget models saved in the notebook's metadata."""
    saved = nb.get("metadata", {}).get("widgets", {}).get(WIDGET_STATE_MIME, {})
    result = {}
    for model_id, model in saved.get("state", {}).items():
        state = model.get("state", {})
        if str(state.get("_anywidget_id", "")).startswith(SBS_WIDGET_ID_PREFIX):
            result[model_id] = state
    return result


def static_state(state: dict[str, Any]) -> dict[str, Any]:
    """The part of a saved widget state that ``renderStatic`` reads (the synced traits)."""
    return {k: state[k] for k in STATE_TRAITS if k in state}


def _fallback_for(out: Any) -> str | None:
    """The uid of the widget whose static summary this output is (SbsWidget displays it
    with ``metadata.onnx_sbs.fallback_for``), else None."""
    meta = out.get("metadata") or {}
    mark = meta.get(FALLBACK_METADATA) if isinstance(meta, dict) else None
    uid = mark.get("fallback_for") if isinstance(mark, dict) else None
    return uid if isinstance(uid, str) and uid else None


def _svg_as_image(data: Any) -> None:
    """An SVG output shown as an image, as an untrusted JupyterLab does: a script in an
    SVG loaded by <img> does not run, and the sanitizer keeps the picture."""
    if not isinstance(data, dict) or "image/svg+xml" not in data:
        return
    svg = _text(data.pop("image/svg+xml"))
    if "text/html" not in data:
        b64 = base64.b64encode(svg.encode("utf-8")).decode("ascii")
        data["text/html"] = f'<img src="data:image/svg+xml;base64,{b64}">'


def _text(value: Any) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def _has_math(nb: Any) -> bool:
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "markdown" and re.search(r"\$|\\\(|\\\[", _text(cell.source)):
            return True
    return False


def notebook_html(nb: Any, *, template: str = "lab") -> ExportResult:
    """Renders a notebook node (nbformat v4) to one offline HTML document."""
    import nbconvert

    nb = copy.deepcopy(nb)
    states = saved_widget_states(nb)
    views = fallbacks = 0
    # Each rendered view goes in after nbconvert sanitized the sender's HTML, at a slot
    # no notebook can guess.
    slot = f"onnx-sbs-view-{secrets.token_hex(8)}-"
    rendered: dict[str, str] = {}
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        outputs = cell.get("outputs", [])
        # the static summaries displayed next to widgets, by widget uid
        summaries = {u: out for out in outputs if (u := _fallback_for(out)) is not None}
        inside: set[int] = set()  # summaries shown inside a rendered view
        kept = []
        for out in outputs:
            data = out.get("data")
            _svg_as_image(data)
            view = data.pop(WIDGET_VIEW_MIME, None) if data else None
            if view is None:
                kept.append(out)
                continue
            model_id = view.get("model_id") if isinstance(view, dict) else None
            state = states.get(model_id)
            if state is None:
                fallbacks += 1
                if summaries:
                    continue  # its static summary is another output: show that, once
                if not data.get("text/html") and "text/plain" not in data:
                    data["text/plain"] = "(a widget whose state was not saved in the notebook)"
                kept.append(out)
                continue
            summary = summaries.get(str(state.get("uid", "")))
            if summary is not None:
                inside.add(id(summary))
            fallback = _text((summary or out).get("data", {}).get("text/html", ""))
            fallback = clean_untrusted_html(fallback)
            rendered[f"{slot}{views}"] = view_html(
                static_state(state), f"onnx-sbs-state-{views}", fallback
            )
            data["text/html"] = f"{slot}{views}"
            data.pop("text/plain", None)
            views += 1
            kept.append(out)
        cell["outputs"] = [o for o in kept if id(o) not in inside]
    # Without widget metadata nbconvert adds no widget manager from a CDN.
    nb.get("metadata", {}).pop("widgets", None)
    # The notebook is untrusted: its HTML (outputs, markdown, SVG) reaches the page only as
    # JupyterLab would show it untrusted, and its javascript outputs do not run.
    exporter = nbconvert.HTMLExporter(
        template_name=template,
        sanitize_html=True,
        filters={"clean_html": clean_untrusted_html},
    )
    body, _ = exporter.from_notebook_node(nb)
    for key, view in rendered.items():
        body = body.replace(key, view, 1)
    # Remote scripts nothing here needs: require.js serves application/javascript outputs
    # only (not run here), MathJax math in markdown only; offline they would just fail.
    body = re.sub(r'<script src="[^"]*require(\.min)?\.js"></script>\s*', "", body)
    if not _has_math(nb):
        body = re.sub(r'<script src="[^"]*mathjax[^"]*">\s*</script>\s*', "", body, flags=re.I)
    if views:
        # Only the installed package's bundle: a saved state's _esm/_css is the sender's code.
        extra = loader_html(load_bundle())
        i = body.lower().rfind("</body>")
        body = body[:i] + extra + "\n" + body[i:] if i >= 0 else body + extra
    return ExportResult(body, views, fallbacks)


def export_notebook(src: str | pathlib.Path, out: str | pathlib.Path) -> ExportResult:
    """Reads ``src`` (.ipynb), writes the offline HTML report to ``out``."""
    import nbformat

    src, out = pathlib.Path(src), pathlib.Path(out)
    try:
        nb = nbformat.read(src, as_version=4)
    except Exception as e:
        raise ReportFormatError(
            f"{str(src)!r} is not a readable notebook ({type(e).__name__}: {e})"
        ) from e
    result = notebook_html(nb)
    write_text_atomic(out, result.html)
    return result
