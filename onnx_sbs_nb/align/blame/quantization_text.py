"""The summary's words for a quantized model's values that are off by its quantization's
noise only (``judge/quantization_noise.py``), and the totals they are counted in."""

from __future__ import annotations

from typing import Any

from ...records import KIND_OUTPUT, QUANTIZATION_AMPLIFIED, Record
from .text import label


def count_quantization_noise(t: dict[str, Any], rec: Record) -> None:
    """Counts a value within quantization noise, keeping the lowest SQNR and where."""
    t["quantization_noise"] = t.get("quantization_noise", 0) + 1
    if QUANTIZATION_AMPLIFIED in (rec.comment or ""):
        t["quantization_amplified"] = t.get("quantization_amplified", 0) + 1
        if rec.kind == KIND_OUTPUT and rec.err_snr is not None:
            # an output under the floor: the model is faithful but loses accuracy, which a
            # plain "no fault" would hide
            lossy = t.setdefault("quantization_lossy_outputs", {})
            lossy[label(rec)] = rec.err_snr
    snr = rec.err_snr
    if snr is not None and ("quantization_min_snr" not in t or snr < t["quantization_min_snr"]):
        t["quantization_min_snr"], t["quantization_min_at"] = snr, label(rec)


def quantization_noise_text(t: dict[str, Any], onnx_reference: bool = False) -> str:
    """The values of a quantized model off by quantization noise only, in a sentence
    (``onnx_reference``: the reference is an ONNX model, not torch)."""
    inputs = "the reference model's inputs" if onnx_reference else "torch's inputs"
    n = t["quantization_noise"]
    values = "1 value is" if n == 1 else f"{n} values are"
    lowest = t.get("quantization_min_snr")
    at = f" (lowest SQNR {lowest:.1f} dB, at {t.get('quantization_min_at')})" if lowest else ""
    amplified = t.get("quantization_amplified", 0)
    if not amplified:
        return (
            f"{values} beyond tolerance only by the model's quantization{at}: each SQNR, and "
            f"its own rerun's on {inputs}, is above what the bit width allows for; no fault"
        )
    fall = "1 of them falls" if amplified == 1 else f"{amplified} of them fall"
    return (
        f"{values} beyond tolerance only by the model's quantization{at}: each own rerun's "
        f"SQNR on {inputs} is above what the bit width allows for; {fall} "
        "under it in total SQNR, amplifying the quantization noise of their inputs (a loss "
        "of accuracy of the quantized model); no fault"
    )


def lossy_outputs_text(t: dict[str, Any]) -> str:
    """The graph outputs a faithful quantization leaves under its bit width's floor."""
    outs = ", ".join(f"{k} at {v:.1f} dB" for k, v in t["quantization_lossy_outputs"].items())
    return (
        f"the quantization costs the outputs accuracy ({outs}, under what the bit width "
        "allows for): faithful to the float program node by node, but lossy on these inputs; "
        "advise_quantization ranks the nodes to keep in float"
    )
