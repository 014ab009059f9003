"""The two token streams of a generation parity run as the data a view draws
(:meth:`~onnx_sbs_nb.align.generation.GenerationParity.timeline`).

A view shows, per batch row, torch's tokens above the ONNX model's, step by step, the step
where the decodes part marked, and that step's errors and margin on hover; one click on
the parting step shows its node-by-node records, which are the run's own records
(``records_step``).  The payload is plain JSON (ids, decoded text, floats that may be
infinite: ``view_state.jsonable`` writes them for the browser) and names no run kind:
any kind with two sides that emit a sequence may answer one
(:meth:`~onnx_sbs_nb.align.contract.RunContract.timeline`; the others answer None).

Decoded tokens come from the user's ``decode(token_id) -> str`` (``tokenizer.decode``):
they are untrusted text, which the views only ever show as text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: ``decode(token_id) -> str``: a token's text (``tokenizer.decode`` takes an int too)
Decode = Callable[[int], str]

# the per-step fields a view shows on hover (GenerationStep's names)
_STEP_FIELDS = (
    "err_abs",
    "err_rel",
    "passed",
    "margin",
    "cache_err_abs",
    "cache_passed",
    "cache_worst",
)


def _texts(rows: list[list[int]], decode: Decode) -> list[list[str]]:
    """Each token's text; a bad return is shown as what it is, never trusted as markup."""
    return [[str(decode(int(t))) for t in row] for row in rows]


def generation_timeline(parity: Any, decode: Decode | None = None) -> dict[str, Any]:
    """The payload of a ``GenerationParity`` (typed loosely: that module imports this
    one): ``sides`` (``[{name, tokens: [row][step] ids, text: [row][step] or None}]``,
    torch first), ``steps`` (each step's errors, margin, whether the tokens agree
    and why it parts), ``parted_at`` / ``parted_by`` / ``margin`` / ``err_abs`` at the
    parting step (None when the decodes never part), ``why`` (the run's answer),
    ``records_step``: the step whose node-by-node comparison the run's records are (None:
    the run holds none), ``decode_error``: why ``decode`` failed (ids shown instead)."""
    steps = parity.steps
    n_rows = len(steps[0].torch_tokens) if steps else 0
    by_side = {
        "torch": [[s.torch_tokens[r] for s in steps] for r in range(n_rows)],
        "ONNX model": [[s.onnx_tokens[r] for s in steps] for r in range(n_rows)],
    }
    texts: dict[str, list[list[str]] | None] = dict.fromkeys(by_side)
    decode_error = None
    if decode is not None:
        try:
            texts = {name: _texts(rows, decode) for name, rows in by_side.items()}
        except Exception as e:  # noqa: BLE001  (the user's callable: say why, show ids)
            decode_error = f"decode failed ({type(e).__name__}: {e}): token ids shown"
    parted = steps[parity.diverged_at] if parity.diverged_at is not None else None
    return {
        "unit": "token",
        "sides": [
            {"name": name, "tokens": rows, "text": texts[name]} for name, rows in by_side.items()
        ],
        "steps": [
            {
                "step": s.step,
                "agree": s.tokens_agree,
                "parted_by": s.parted_by,
                **{k: getattr(s, k) for k in _STEP_FIELDS},
            }
            for s in steps
        ],
        "parted_at": parity.diverged_at,
        "parted_by": parity.diverged_by,
        "margin": parted.margin if parted is not None else None,
        "err_abs": parted.err_abs if parted is not None else None,
        "own_err_abs": parity.own_err_abs,
        "own_passed": parity.own_passed,
        "atol": parity.atol,
        "rtol": parity.rtol,
        "why": parity.why(),
        "records_step": parity.diverged_at if parity.records else None,
        "records": len(parity.records),
        "decode_error": decode_error,
    }


__all__ = ["Decode", "generation_timeline"]
