"""The precision advice in the reports: a script-free HTML section above the run of the
float32 model against its conversion, and the advice itself as JSON.

``.json``: the advice (``node_block_list``, ``op_block_list``, the ranked nodes, the
outputs before and after); ``.html``: the report of the first round's run (the float32
model against the conversion as given) with the advice on top; ``.xlsx``, ``.csv``,
``.jsonl``: that run's records.
"""

from __future__ import annotations

import html
import math
import pathlib
from collections.abc import Sequence

from ..align.precision_advice import OutputError, PrecisionAdvice, write_advice

ADVICE_SUFFIX = ".json"


def _num(v: float | None) -> str:
    if v is None:
        return ""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return f"{v:.3g}"


def _outputs(label: str, o: OutputError) -> str:
    colour = "#1a7f37" if o.passed else "#cf222e"
    word = "agree" if o.passed else "DISAGREE"
    if o.error:
        return (
            f"<div>{html.escape(label)}: <b style='color:{colour}'>FAILED to run</b> "
            f"({html.escape(o.error)})</div>"
        )
    return (
        f"<div>{html.escape(label)}: <b style='color:{colour}'>{word}</b> "
        f"(max abs error {_num(o.err_abs)}, rel {_num(o.err_rel)})</div>"
    )


def advice_html(advice: PrecisionAdvice, limit: int = 50) -> str:
    """The advice as a script-free HTML section: verdict, outputs before and after, the
    ranked nodes and the converter call that applies the block list."""
    colour = "#1a7f37" if advice.agrees else "#cf222e"
    parts = [
        '<section class="onnx-sbs-precision" '
        'style="font-family:sans-serif;font-size:13px;margin:0 0 14px">',
        f"<div><b>precision advice ({html.escape(advice.dtype)}): "
        f"<span style='color:{colour}'>{advice.verdict.upper()}</span></b> - "
        f"{len(advice.node_block_list)} node(s) to keep in float32 of {advice.compared} "
        f"measured (atol {advice.atol:g}, rtol {advice.rtol:g})</div>",
        _outputs(
            "outputs as converted" + ("" if advice.converted_here else " (given)"), advice.before
        ),
    ]
    if advice.after is not None:
        parts.append(_outputs("outputs with the block list", advice.after))
    if advice.nodes:
        head = ("#", "ONNX node", "op", "fx node", "module", "own error", "relative", "why")
        rows = [
            "<tr>" + "".join(f"<th style='text-align:left;padding:2px 6px'>{h}</th>" for h in head)
        ]
        for k, n in enumerate(advice.nodes[:limit], 1):
            cells = (
                str(k),
                n.node,
                n.op_type,
                n.fx_node or "",
                n.module or "",
                _num(n.own_error),
                "overflow" if n.overflow else _num(n.relative_error),
                n.why,
            )
            rows.append(
                "<tr>"
                + "".join(f"<td style='padding:2px 6px'>{html.escape(c)}</td>" for c in cells)
                + "</tr>"
            )
        parts.append(
            "<table class='onnx-sbs-precision-nodes' style='border-collapse:collapse;"
            f"margin:6px 0'>{''.join(rows)}</table>"
        )
        if len(advice.nodes) > limit:
            parts.append(f"<div>... and {len(advice.nodes) - limit} more</div>")
        call = (
            "float16.convert_float_to_float16(model, "
            f"keep_io_types={advice.keep_io_types}, node_block_list={advice.node_block_list!r})"
        )
        parts.append(f"<pre style='white-space:pre-wrap;margin:4px 0'>{html.escape(call)}</pre>")
        parts.append(f"<div>op types: {html.escape(', '.join(advice.op_block_list))}</div>")
        parts.append(
            "<div>the advised model (--save-model) is that conversion repaired: the weights "
            "of the kept nodes and the graph outputs stay float32, and a value goes from one "
            "kept node to the next in float32, not through a Cast to the low type</div>"
        )
    else:
        parts.append(
            f"<div>no node's own error in {html.escape(advice.dtype)} exceeds the tolerance</div>"
        )
    if advice.unresolved:
        parts.append(f"<div><b>why it still disagrees:</b> {html.escape(advice.unresolved)}</div>")
    parts.append("</section>")
    return "\n".join(parts)


def write_precision_outputs(
    advice: PrecisionAdvice, paths: Sequence[str | pathlib.Path], *, title: str = ""
) -> list[pathlib.Path]:
    """Each path by its suffix (see the module's doc); every file whole or not at all."""
    from ..align.blame.summary import summarize
    from .report import write_report

    written = []
    summary = None
    for p in paths:
        p = pathlib.Path(p)
        if p.suffix.lower() == ADVICE_SUFFIX:
            write_advice(advice, p)
        else:
            if summary is None:
                summary = summarize(advice.records)
            write_report(
                advice.records,
                p,
                summary,
                title=title or f"onnx-sbs precision ({advice.dtype})",
                preface=advice_html(advice),
            )
        written.append(p)
    return written


__all__ = ["ADVICE_SUFFIX", "advice_html", "write_precision_outputs"]
