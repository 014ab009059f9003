"""The words every view shares for a record or a count (the terminal, the widget, the
reports): how a number prints, how a record is named, what drift means.  Plain functions
over records and numbers, so the culprit's why (``why.py``) and the summary
(``summary.py``) say things the same way."""

from __future__ import annotations

import math
from typing import Any

from ...records import (
    KIND_OUTPUT,
    ONNXRUNTIME_RUNS_IT,
    WEIGHT_COMPENSATED_NOTE,
    WEIGHT_UNEXPLAINED_NOTE,
    WEIGHT_UNTRIED_NOTE,
    Record,
)


def fmt(value: float | None) -> str:
    """A number in three significant digits ("-" when there is none)."""
    if value is None:
        return "-"
    return f"{value:.3g}"


def percent(ratio: float | None) -> str:
    if ratio is None:
        return "?"
    return f"{ratio * 100:.2g}%" if ratio >= 1e-3 else f"{ratio:.2g}"


def json_float(value: float | None) -> float | str | None:
    """A float JSON can hold: NaN and infinities as their str."""
    if value is None or math.isfinite(value):
        return value
    return str(value)


def float_or_none(value: float | str | None) -> float | None:
    return None if value is None else float(value)


def printable(text: str) -> str:
    """Model-supplied names with control characters escaped, safe to print in a terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def label(rec: Record) -> str:
    """A record's value as the counts name it: its ONNX value, else its fx node."""
    return rec.onnx_name or rec.ep_name or f"step {rec.step}"


def dtype_of(rec: Record) -> str:
    """The element type of the record's ONNX value ("float16" of "float16[2x3]")."""
    return (rec.onnx_shape_type or "").split("[", 1)[0]


def fused_list(fuses: str, most: int = 8) -> str:
    """A fused node's fx nodes, the first ``most`` of them."""
    names = [n.strip() for n in fuses.split(",") if n.strip()]
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


def on_input_text(rec: Record) -> str:
    """Where a record of a run over many inputs comes from ("on input 7 (b.pt), 1 of
    32 inputs failing here"); "" for a run over one input."""
    if rec.input_index is None:
        return ""
    name = f" ({rec.input_name})" if rec.input_name else ""
    text = f"on input {rec.input_index}{name}"
    if rec.inputs_total is not None and rec.inputs_failing is not None:
        text += f", {rec.inputs_failing} of {rec.inputs_total} inputs failing here"
    return text


def suspect_name(rec: Record) -> str:
    """A suspect as the widget names it: the user's fx node name (not the prepared
    program's ``getitem_9``), the module it lives in, and its ONNX value when named
    otherwise."""
    name = rec.ep_user_name or rec.ep_name or rec.onnx_name or f"step {rec.step}"
    where = f" in {rec.ep_module}" if rec.ep_module else ""
    value = f" (value {rec.onnx_name})" if rec.onnx_name and rec.onnx_name != name else ""
    return f"{name}{where}{value}"


def failing_text(failed: int, inherited: int, carried: str = "upstream") -> str:
    """How many values fail, and how many of them only inherit their error
    (:attr:`Record.inherits`, graph outputs included): the one wording of the terminal, the
    widget and the reports, so a red count never reads as that many culprits.
    ``carried``: what they carry (``decisions.carried_from``): an error "upstream", a
    flipped "decision", or "none" when no value before them fails (nothing to inherit)."""
    if not inherited:
        return f"{failed} failing"
    if carried == "decision":
        return f"{failed} failing, of which {inherited} only carry a flipped decision"
    if carried == "none":
        return (
            f"{failed} failing, of which {inherited} agree with torch when rerun on its "
            "inputs (no value before them fails)"
        )
    return f"{failed} failing, of which {inherited} only inherit their error"


def drift_text(
    drifted: int,
    verdict: str,
    outputs: int = 0,
    onnx_reference: bool = False,
    carried: str = "upstream",
    origin: str | None = None,
) -> str:
    """What drifted values mean for the verdict, in a sentence (``outputs``: the graph
    outputs that carry an error too, counted among those that only inherit it;
    ``onnx_reference``: the reference is an ONNX model, not torch; ``carried`` as
    :func:`failing_text`'s, ``origin``: the flipped decision's name)."""
    values = "1 value is" if drifted == 1 else f"{drifted} values are"
    ref = "the reference model" if onnx_reference else "torch"
    ref_values = "the reference model's values" if onnx_reference else "the torch values"
    if carried == "decision":
        source = f"the difference comes from the decision flipped at {origin or 'a tie'}"
    elif carried == "none":
        # nothing before them fails: no error to inherit, only differences within
        # tolerance (rounding) that these nodes let grow beyond it
        source = (
            "no value before them fails, so the difference is made of differences within "
            "tolerance that grow beyond it on the way"
        )
    else:
        source = "the difference is carried from upstream"
    why = (
        f"{values} beyond tolerance while each node, rerun on {ref_values} of its "
        f"inputs, agrees with {ref}: {source}"
    )
    if outputs:
        why += f", and on to {'1 graph output' if outputs == 1 else f'{outputs} graph outputs'}"
    if verdict == "pass" and carried != "decision":
        return f"{why} (rounding the graph amplifies), and the outputs agree"
    return why


def inner_failures_text(outputs: int, reran: bool = False) -> str:
    """A failing run whose every graph output agrees (``reran``: with own errors)."""
    every = "the graph output agrees" if outputs == 1 else f"all {outputs} graph outputs agree"
    if reran:
        return (
            f"{every} with torch: the errors made inside the graph cancel out or are masked "
            "on these inputs (a model reparametrized, weights rescaled across layers, or "
            "an error other inputs would show)"
        )
    return (
        f"{every} with torch; the values beyond tolerance are inside the graph: rounding "
        "that long sums amplify, or an error masked further on; own_error=True tells which"
    )


def outputs_text(t: dict[str, Any]) -> str:
    """What the graph outputs say of a failing run none of whose outputs fails: they
    agree, unless a node failed to run (the run went on from torch's values: the ONNX
    model itself produced nothing) or they are off by the quantization's noise."""
    outs = t["by_kind"][KIND_OUTPUT]
    if t.get("errors"):
        nodes = "1 node" if t["errors"] == 1 else f"{t['errors']} nodes"
        return (
            f"{nodes} failed to run, and the run went on from torch's values there: the graph "
            "outputs here are not what the ONNX model computes, and their agreement says "
            "nothing of it"
        )
    noisy = t.get("noisy_outputs", 0)
    if noisy:
        which = "the graph output is" if outs == 1 else f"{noisy} of {outs} graph outputs are"
        they, their = ("it does", "its") if noisy == 1 else ("they do", "their")
        return (
            f"{which} beyond tolerance, within what the model's quantization allows for "
            f"(see quantization noise): {they} not agree with torch, and an error made "
            f"upstream may be part of {their} difference"
        )
    return inner_failures_text(outs, bool(t.get("reran")))


def count_differing_weight(t: dict[str, Any], rec: Record) -> None:
    """Files weight ``rec`` (status weight_differs) in the summary's totals ``t`` for its
    ``weights:`` line: one whose consumer agrees with nothing run to say why
    (``weights_unexplained``), or one whose consumer was shown to make up for it
    (``weights_compensated``: a rescaled weight and a Gemm's alpha, say, which no
    structure names as a BatchNorm fold is named).  A fold the graph's structure shows
    (a BatchNorm into its Conv) is the exporter's everyday work: not named."""
    comment = rec.comment or ""
    if any(n in comment for n in (WEIGHT_UNEXPLAINED_NOTE, WEIGHT_UNTRIED_NOTE)):
        t.setdefault("weights_unexplained", {})[label(rec)] = rec.err_abs
    elif WEIGHT_COMPENSATED_NOTE in comment:
        t.setdefault("weights_compensated", {})[label(rec)] = rec.err_abs


def weights_text(t: dict[str, Any]) -> str:
    """The summary's ``weights:`` line: the weights that differ from their torch
    parameters while their consumers agree (``count_differing_weight``)."""
    parts = []
    if t.get("weights_compensated"):
        parts.append(compensated_weights_text(t))
    if t.get("weights_unexplained"):
        parts.append(unexplained_weights_text(t))
    return "; ".join(parts)


def _named(found: dict[str, Any], most: int) -> tuple[str, str]:
    """Up to ``most`` weights with their differences ("fc1.weight (0.75)"), and the verb."""
    named = ", ".join(f"{k} ({fmt(v)})" for k, v in list(found.items())[:most])
    more = f" and {len(found) - most} more" if len(found) > most else ""
    return named + more, "differs" if len(found) == 1 else "differ"


def compensated_weights_text(t: dict[str, Any], most: int = 3) -> str:
    """The weights that differ from their torch parameters while their consumers agree,
    and disagree given the torch parameters: a change the consumer makes up for."""
    named, differ = _named(t["weights_compensated"], most)
    return (
        f"{named} {differ} from the torch parameter, and the consumer makes up for it: it "
        "agrees with torch given the ONNX weight, not given the torch parameter (a fold, "
        "a rescaling the consumer undoes)"
    )


def unexplained_weights_text(t: dict[str, Any], most: int = 3) -> str:
    """The weights that differ from their torch parameters while their consumers agree,
    with nothing run to say why (no own errors)."""
    named, differ = _named(t["weights_unexplained"], most)
    return (
        f"{named} {differ} from the torch parameter while the consumer agrees on "
        "these inputs: a fold the consumer makes up for, or rows these inputs do not read "
        "(a fault other inputs meet)"
        + (
            ": its consumer's rerun with the torch parameter, which tells which, could not be made"
            if t.get("reran")
            else "; own_error=True tells which"
        )
    )


def runner_failed_text(t: dict[str, Any]) -> str:
    """The nodes the runner failed on while onnxruntime runs them (not computed)."""
    n = t["runner_failed"]
    first = str(t.get("runner_failed_first", "")).replace(ONNXRUNTIME_RUNS_IT, "")
    more = f" (and {n - 1} more nodes)" if n > 1 else ""
    return (
        f"{first}{more}; onnxruntime runs it on the same inputs: the runner's failure, "
        "not the model's (not computed)"
    )


__all__ = [
    "compensated_weights_text",
    "count_differing_weight",
    "runner_failed_text",
    "inner_failures_text",
    "outputs_text",
    "weights_text",
    "unexplained_weights_text",
    "drift_text",
    "dtype_of",
    "failing_text",
    "float_or_none",
    "fmt",
    "fused_list",
    "json_float",
    "label",
    "on_input_text",
    "percent",
    "printable",
    "suspect_name",
]
