"""Generation parity's answer in words (:meth:`GenerationParity.why`).

The wording follows what was measured: where the decodes part (the tokens, the logits or
the cache), whether the step errs on torch's own inputs and cache, and what that step's
node-by-node run found.  A quantized model is judged by its noise floor: its answer says
what the quantization costs per step (the SQNR) and, where the tokens part, torch's margin
there.  A step whose own run passes is never said to make the error.
"""

from __future__ import annotations

from typing import Any

from ..records import Record

# the GenerationParity the functions read (generation.py imports this module: a type
# import back would be a cycle, tests/test_layering.py)
GenerationParity = Any


def cache_writer(parity: GenerationParity, records: list[Record]) -> Record | None:
    """The record of the cache output that differs at the parting step with the largest own
    error: its fx node writes the error the cache accumulates."""
    if parity.diverged_at is None:
        return None
    step = parity.steps[parity.diverged_at]
    if step.cache_worst is None or step.cache_passed is not False:
        return None
    mine = [r for r in records if r.onnx_name == step.cache_worst and r.ep_name]
    if not mine:
        return None
    return max(mine, key=lambda r: r.own_error if r.own_error is not None else -1.0)


def _snr_range(parity: GenerationParity, upto: int | None = None) -> str:
    snrs = [s.snr for s in parity.steps[:upto] if s.snr is not None]
    if not snrs or parity.bits is None:
        return ""
    lo, hi = min(snrs), max(snrs)
    span = f"{lo:.1f} dB" if abs(hi - lo) < 0.05 else f"{lo:.1f} to {hi:.1f} dB"
    return f"the logits' SQNR per step {span} (int{parity.bits} noise floor {parity.noise_floor:.0f} dB)"


def _head(parity: GenerationParity) -> str:
    s = parity.steps[parity.diverged_at]
    quant = parity.bits is not None
    if parity.diverged_by == "tokens" and s.err_abs is None:
        return f"step {s.step}: torch chose {s.torch_tokens}, the ONNX model {s.onnx_tokens}"
    if parity.diverged_by == "tokens" and quant:
        return (
            f"the int{parity.bits} decode parts at step {s.step} where torch's two best "
            f"logits were {s.margin:.3g} apart (torch chose {s.torch_tokens}, the ONNX "
            f"model {s.onnx_tokens}; logits SQNR {s.snr:.1f} dB)"
        )
    if parity.diverged_by == "tokens":
        return (
            f"step {s.step}: torch chose {s.torch_tokens}, the ONNX model {s.onnx_tokens} "
            f"(logits off by {s.err_abs:.3g}, torch's margin between its two best "
            f"{s.margin:.3g})"
        )
    if parity.diverged_by == "logits" and quant:
        return (
            f"step {s.step}: the logits' SQNR {s.snr:.1f} dB falls under the "
            f"{parity.noise_floor:.0f} dB int{parity.bits} quantization allows for "
            f"(max abs error {s.err_abs:.3g}) while both chose {s.torch_tokens}"
        )
    if parity.diverged_by == "logits":
        return (
            f"step {s.step}: the logits leave tolerance (max abs error {s.err_abs:.3g}, "
            f"atol {parity.atol:.3g}, rtol {parity.rtol:.3g}) while both chose {s.torch_tokens}"
        )
    within = (
        f"logits within the int{parity.bits} noise floor" if quant else "logits within tolerance"
    )
    off = (
        f"SQNR {s.cache_snr:.1f} dB, under {parity.noise_floor:.0f}"
        if quant
        else f"off by {s.cache_err_abs:.3g}"
    )
    return (
        f"step {s.step}: both chose {s.torch_tokens} with {within}, but the cache written "
        f"differs (ONNX output {s.cache_worst!r} {off}): later steps read it"
    )


def _grows(parity: GenerationParity) -> str:
    r: Record | None = parity.grows_in
    if r is None:
        return ""
    s = parity.steps[parity.diverged_at]
    where = f" in {r.ep_module}" if r.ep_module else ""
    source = f" ({r.ep_source})" if r.ep_source else ""
    own = f"{r.own_error:.3g}" if r.own_error is not None else "not measured"
    # the tolerance a value is judged by is atol + rtol*|torch's value|: quoting atol alone
    # reads as a contradiction when the own error passes atol
    tol = ""
    if r.atol is not None and r.rtol:
        tol = f" (atol {r.atol:.3g} + rtol {r.rtol:.3g}*|torch's value|)"
    elif r.atol is not None:
        tol = f" (atol {r.atol:.3g})"
    node = f", ONNX node {r.onnx_node_name!r}" if r.onnx_node_name else ""
    return (
        f"; the error grows in cache output {s.cache_worst!r}, written by {r.ep_name}"
        f"{where}{source}{node}: its own error per step is {own}, under tolerance{tol}, and the "
        "cache accumulates it"
    )


def _fault(parity: GenerationParity) -> str:
    """The culprit the step's node-by-node run names: the step's fault."""
    c = parity.culprit
    r = c.record
    where = f" in {r.ep_module}" if r.ep_module else ""
    source = f" ({r.ep_source})" if r.ep_source else ""
    onnx_node = c.onnx_node or r.onnx_node_name
    node = f", ONNX node {onnx_node!r}" if onnx_node else ""
    return f"compared node by node it fails at {r.ep_name}{where}{source}{node}: a fault there"


def _own(parity: GenerationParity) -> str:
    quant = parity.bits is not None
    measure = (
        f"SQNR {parity.own_snr:.1f} dB"
        if quant and parity.own_snr is not None
        else f"error {parity.own_err_abs:.3g}"
    )
    if parity.own_passed and parity.step_run_verdict == "fail" and parity.culprit is not None:
        # the node-by-node run is the finer judge: a fault the step's logits SQNR hides
        # (a wrong weight scale costing a few dB over the floor) fails it
        within = "the noise floor" if quant else "tolerance"
        return f"; on torch's cache the same step is within {within} ({measure}), but " + _fault(
            parity
        )
    if parity.own_passed:
        if quant and parity.diverged_by == "tokens":
            if parity.step_run_verdict is None:  # not compared node by node: no claim
                return (
                    f"; on torch's cache the same step is within the noise floor ({measure}) "
                    f"({parity.step_hint})"
                )
            return (
                f"; on torch's cache the same step is within the noise floor ({measure}) and "
                "passes node by node: quantization noise, no fault"
            )
        return (
            f"; on torch's cache the same step is within "
            f"{'the noise floor' if quant else 'tolerance'} ({measure}): the error came in "
            "with the cache written by earlier steps" + _grows(parity)
        )
    if parity.step_run_verdict == "pass":
        noise = "quantization noise" if quant else "within tolerance"
        return (
            f"; on torch's own inputs and cache the step still differs ({measure}), yet "
            f"compared node by node every node's own error is {noise}: no node of the step "
            "makes it alone" + _grows(parity)
        )
    named = f"; {_fault(parity)}" if parity.culprit is not None else ""
    return (
        f"; on torch's own inputs and cache the step still errs ({measure}): the step "
        f"itself makes it ({parity.step_hint}){named}"
    )


def explain(parity: GenerationParity) -> str:
    n = len(parity.steps)
    if parity.diverged_at is None:
        cost = _snr_range(parity)
        return f"the two decodes agree on all {n} steps" + (f"; {cost}" if cost else "")
    head = _head(parity)
    if parity.bits is not None and parity.diverged_at > 0:
        cost = _snr_range(parity, parity.diverged_at)
        head += f"; before it, {cost}" if cost else ""
    if parity.own_passed is None:
        return head
    return head + _own(parity)


__all__: list[Any] = ["cache_writer", "explain"]
