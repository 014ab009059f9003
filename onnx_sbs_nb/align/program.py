"""The torch side: the program the exporter actually lowered, and how to feed it.

``torch.onnx.export`` does not lower the user's program as given: it first decomposes it
with its own registry, inserts type promotions and removes assertions, and the ONNX
value names are the fx names of *that* program.  Running the user's program would pair
values that merely share a name (``add_1`` can be two different computations), so we
reproduce the exporter's preparation and run the prepared program.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import SbsInputError

# Values of PreparedProgram.source
PREPARED_BY_EXPORTER = "exporter"  # reproduced the exporter's preparation
PREPARED_FROM_ONNX_PROGRAM = "onnx_program"  # the ONNXProgram carried its prepared program
PREPARED_FALLBACK = "fallback"  # private API unavailable: plain run_decompositions()


@dataclass
class PreparedProgram:
    program: torch.export.ExportedProgram
    source: str
    note: str = ""


@contextlib.contextmanager
def quiet_torch_internals() -> Iterator[None]:
    """Silences what torch's exporter machinery prints about itself (missing torchvision
    ops, deprecations inside torch): it says nothing about the user's model."""
    logger = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning, module="copyreg")
            warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\..*")
            yield
    finally:
        logger.setLevel(level)


@functools.lru_cache(maxsize=1)
def _torchlib_registry() -> Any:
    from torch.onnx._internal.exporter import _registration

    with quiet_torch_internals():
        return _registration.ONNXRegistry.from_torchlib()


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def prepare_program(ep: torch.export.ExportedProgram) -> PreparedProgram:
    """The program the exporter lowers, cached per ExportedProgram (preparation re-traces)."""
    cached = _CACHE.get(ep)
    if cached is not None:
        return cached
    try:
        # Private in torch 2.13; guarded, and tested against the installed version.
        from torch.onnx._internal.exporter import _core

        registry = _torchlib_registry()
        with quiet_torch_internals():
            prepared = _core._prepare_exported_program_for_export(ep, registry=registry)
        result = PreparedProgram(prepared, PREPARED_BY_EXPORTER)
    except Exception as e:  # pragma: no cover - depends on torch internals
        try:
            prepared = ep.run_decompositions()
        except Exception:
            prepared = ep
        result = PreparedProgram(
            prepared,
            PREPARED_FALLBACK,
            f"could not reproduce the exporter's preparation ({type(e).__name__}: {e}); "
            "pairing relies on ONNX node metadata",
        )
    try:
        _CACHE[ep] = result
    except TypeError:  # pragma: no cover
        pass
    return result


@dataclass
class ProgramInputs:
    """Maps every placeholder of the program to its value."""

    values: dict[str, Any]  # placeholder name -> tensor / python value
    user_inputs: list[str]  # placeholder names of the user inputs, in order
    weights: dict[str, str]  # placeholder name -> state-dict / constant name


def bind_inputs(
    ep: torch.export.ExportedProgram, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> ProgramInputs:
    """Binds parameters, buffers, constants and user inputs to the placeholders.

    Checks count, dtype and rank of the user inputs against the program and raises a
    SbsInputError naming the first mismatch.
    """
    from torch.export.graph_signature import InputKind

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
        )
    values: dict[str, Any] = {}
    weights: dict[str, str] = {}
    user_names: list[str] = []
    for spec, value in zip(user_specs, flat):
        name = spec.arg.name
        ph = placeholders.get(name)
        expected_val = ph.meta.get("val") if ph is not None else None
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


def _order_kwargs(ep: torch.export.ExportedProgram, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Keyword inputs in the order the program flattens them (its signature's order)."""
    spec = getattr(getattr(ep, "call_spec", None), "in_spec", None)
    try:
        expected = list(spec.child(1).context)
    except Exception:
        return kwargs
    missing = [k for k in expected if k not in kwargs]
    extra = [k for k in kwargs if k not in expected]
    if extra:
        raise SbsInputError(
            f"keyword input(s) {extra} are not inputs of the program (it takes {expected})"
        )
    if missing:
        raise SbsInputError(
            f"keyword input(s) {missing} are missing: the program was exported with {expected}"
        )
    return {k: kwargs[k] for k in expected}


def _detach(v: Any) -> Any:
    return v.detach() if isinstance(v, torch.Tensor) else v


def _describe(t: torch.Tensor) -> str:
    shape = "x".join(str(d) for d in t.shape)
    return f"{str(t.dtype).replace('torch.', '')}[{shape}]"
