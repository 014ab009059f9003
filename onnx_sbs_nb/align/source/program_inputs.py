"""How to feed the prepared program: its placeholders bound to the user's inputs, the
parameters, buffers and constants (the program itself: :mod:`.prepare.program`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ...errors import SbsInputError


@dataclass
class ProgramInputs:
    """Maps every placeholder of the program to its value."""

    values: dict[str, Any]  # placeholder name -> tensor / python value
    user_inputs: list[str]  # placeholder names of the user inputs, in order
    weights: dict[str, str]  # placeholder name -> state-dict / constant name


def _several_inputs_hint(args: Any) -> str:
    """Positional inputs that are each a whole input (``((x1,), (x2,))``) were meant as
    several inputs: say how those are passed."""
    if (
        isinstance(args, tuple | list)
        and len(args) > 1
        and all(isinstance(a, tuple | list | dict) for a in args)
    ):
        return (
            "; to compare several inputs, pass them as a list, one run per input: "
            "inputs=[(x1,), (x2,)] (run_aligned, SbsSession, SbsWidget, %sbs)"
        )
    return ""


def bind_inputs(
    ep: torch.export.ExportedProgram, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> ProgramInputs:
    """Binds parameters, buffers, constants and user inputs to the placeholders.

    Checks count, dtype and rank of the user inputs against the program and raises a
    SbsInputError naming the first mismatch.
    """
    from torch.export.graph_signature import InputKind

    args, kwargs = _positional_by_name(ep, args, kwargs)
    kwargs = _order_kwargs(ep, kwargs)
    flat, _ = torch.utils._pytree.tree_flatten((args, kwargs))
    sig = ep.graph_signature
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    user_specs = [s for s in sig.input_specs if s.kind == InputKind.USER_INPUT]
    # Constant (non-tensor) user inputs are baked into the graph but still flattened.
    if len(flat) != len(user_specs):
        expected = ", ".join(s.arg.name for s in user_specs)
        raise SbsInputError(
            f"the program takes {len(user_specs)} input(s) ({expected}) but {len(flat)} "
            "were given: pass the same args/kwargs as used for torch.export.export"
            + _several_inputs_hint(args)
        )
    values: dict[str, Any] = {}
    weights: dict[str, str] = {}
    user_names: list[str] = []
    for spec, value in zip(user_specs, flat):
        name = spec.arg.name
        ph = placeholders.get(name)
        expected_val = ph.meta.get("val") if ph is not None else None
        if isinstance(value, torch.Tensor) and value.device.type == "meta":
            raise SbsInputError(
                f"input {name!r} is on the meta device: it has a shape but no values to "
                "compare; pass a tensor with values (on the CPU or a GPU)"
            )
        if isinstance(expected_val, torch.Tensor):
            if not isinstance(value, torch.Tensor):
                raise SbsInputError(
                    f"input {name!r} must be a tensor ({_describe(expected_val)}), "
                    f"got {type(value).__name__}"
                )
            if value.dtype != expected_val.dtype:
                raise SbsInputError(
                    f"input {name!r} has dtype {value.dtype} but the program expects "
                    f"{expected_val.dtype}: convert it with .to({expected_val.dtype})"
                )
            if value.dim() != expected_val.dim():
                raise SbsInputError(
                    f"input {name!r} has rank {value.dim()} (shape {tuple(value.shape)}) but "
                    f"the program expects rank {expected_val.dim()} "
                    f"({_describe(expected_val)})"
                )
        values[name] = _detach(value)
        user_names.append(name)
    state = ep.state_dict
    constants = ep.constants
    for spec in sig.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            continue
        name = getattr(spec.arg, "name", None)
        if name is None:
            continue
        target = spec.target
        # detached once (same storage): no op of the run records autograd history
        if target in state:
            values[name] = _detach(state[target])
        elif target in constants:
            values[name] = _detach(constants[target])
        elif spec.kind == InputKind.TOKEN:
            values[name] = torch.tensor([])
        else:
            raise SbsInputError(f"the program has no value for {spec.kind.name} {target!r}")
        if target is not None:
            weights[name] = target
    return ProgramInputs(values, user_names, weights)


def _positional_by_name(
    ep: torch.export.ExportedProgram, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Inputs given by name (a dict, a batch of a DataLoader) to a program that takes them
    positionally, moved to their places, as Python binds ``forward(**batch)``: where every
    positional input after those given is named, and each is one tensor."""
    if not kwargs:
        return args, kwargs
    spec = _in_spec(ep)
    try:
        positional = spec.child(0)
        expected = set(spec.child(1).context)
        count = positional.num_children
        single = positional.num_leaves == count
    except Exception:
        return args, kwargs
    names = _positional_names(ep, spec)
    wanted = names[len(args) : count]
    if (
        not single
        or len(names) != count
        or not wanted
        or any(n not in kwargs or n in expected for n in wanted)
    ):
        return args, kwargs
    rest = {k: v for k, v in kwargs.items() if k not in wanted}
    return (*args, *(kwargs[n] for n in wanted)), rest


def _order_kwargs(ep: torch.export.ExportedProgram, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Keyword inputs in the order the program flattens them (its signature's order)."""
    spec = _in_spec(ep)
    try:
        expected = list(spec.child(1).context)
    except Exception:
        return kwargs
    missing = [k for k in expected if k not in kwargs]
    extra = [k for k in kwargs if k not in expected]
    if extra:
        positional = _positional_names(ep, spec)
        named = [k for k in extra if k in positional]
        unknown = [k for k in extra if k not in positional]
        if named and not unknown:
            raise SbsInputError(
                f"keyword input(s) {named} are inputs the program takes positionally "
                f"(positional inputs: {positional}; keyword inputs: {expected}): pass them "
                f"as positional args, in that order, as they were given to torch.export.export"
            )
        raise SbsInputError(
            f"keyword input(s) {unknown} are not inputs of the program (it takes {expected} by "
            f"keyword and {positional} positionally)"
        )
    if missing:
        raise SbsInputError(
            f"keyword input(s) {missing} are missing: the program was exported with {expected}"
        )
    return {k: kwargs[k] for k in expected}


def _positional_names(ep: torch.export.ExportedProgram, spec: Any) -> list[str]:
    """The names of the program's positional user inputs (its placeholders' names, which
    torch.export takes from the forward's parameters)."""
    from torch.export.graph_signature import InputKind

    try:
        count = spec.child(0).num_leaves
    except Exception:
        return []
    users = [s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    return users[:count]


def _in_spec(ep: torch.export.ExportedProgram) -> Any:
    """The program's input tree spec, read where ``ep.call_spec`` reads it: that property
    defines a new NamedTuple class on every access, garbage only the cyclic collector frees."""
    calls = getattr(ep, "module_call_graph", None) or ()
    if not calls or calls[0].fqn != "" or calls[0].signature is None:
        return None
    return calls[0].signature.in_spec


def _detach(v: Any) -> Any:
    return v.detach() if isinstance(v, torch.Tensor) else v


def _describe(t: torch.Tensor) -> str:
    shape = "x".join(str(d) for d in t.shape)
    return f"{str(t.dtype).replace('torch.', '')}[{shape}]"
