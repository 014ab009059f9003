"""Input shapes checked against what the program was exported for, before anything runs.

A program exported with static dimensions only computes those; one exported with dynamic
dimensions holds their ranges (``ep.range_constraints``) and which dimensions must be
equal (the same symbol).  Inputs outside that are refused early, naming the input, the
dimension and what the program expects, instead of failing somewhere mid-run.
"""

from __future__ import annotations

from typing import Any

import torch

from ...errors import SbsInputError


def _bound(value: Any) -> int | None:
    try:
        v = int(value)
    # an infinite bound; int() of torch's int_oo raises AttributeError inside sympy
    except (TypeError, ValueError, OverflowError, AttributeError):
        return None
    return v


def check_input_shapes(
    program: torch.export.ExportedProgram, values: dict[str, Any], user_inputs: list[str]
) -> None:
    """Raises SbsInputError when a user input's shape does not fit the program."""
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    ranges = {str(k): v for k, v in (program.range_constraints or {}).items()}
    seen: dict[str, tuple[str, int, int]] = {}  # symbol -> (input, dim, size)
    for name in user_inputs:
        node = placeholders.get(name)
        value = values.get(name)
        expected = node.meta.get("val") if node is not None else None
        if not isinstance(expected, torch.Tensor) or not isinstance(value, torch.Tensor):
            continue
        if expected.dim() != value.dim():
            continue  # the rank check names this one
        for d, (want, got) in enumerate(zip(expected.shape, value.shape)):
            got = int(got)
            if isinstance(want, int):
                if want != got:
                    raise SbsInputError(
                        f"input {name!r} has size {got} in dimension {d} but the program was "
                        f"exported for {want} there (shape {tuple(expected.shape)}): pass "
                        "inputs of the exported shape, or export with dynamic_shapes="
                    )
                continue
            symbol = str(want)
            vr = ranges.get(symbol)
            if vr is not None:
                low, high = _bound(vr.lower), _bound(vr.upper)
                if (low is not None and got < low) or (high is not None and got > high):
                    raise SbsInputError(
                        f"input {name!r} has size {got} in dimension {d}, outside the range "
                        f"the program was exported for ({symbol} in [{vr.lower}, {vr.upper}])"
                    )
            if symbol in seen and seen[symbol][2] != got:
                other, od, osize = seen[symbol]
                raise SbsInputError(
                    f"input {name!r} has size {got} in dimension {d} but {other!r} has "
                    f"{osize} in dimension {od}: the program requires them equal ({symbol})"
                )
            seen.setdefault(symbol, (name, d, got))


__all__ = ["check_input_shapes"]
