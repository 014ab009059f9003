"""The torch side: the program the exporter actually lowered, and how to feed it.

``torch.onnx.export`` does not lower the user's program as given: it first decomposes it
with its own registry, inserts type promotions and removes assertions, and the ONNX
value names are the fx names of *that* program.  Running the user's program would pair
values that merely share a name (``add_1`` can be two different computations), so we
run the prepared program.

Two ways to get it.  Given the ONNX model, :mod:`.light_prep` builds it by walking the
user's graph once (tens of milliseconds), and it is used when the ONNX model's node
metadata agrees with it node for node (:mod:`.prep_check`).  Otherwise, or for programs
the reproduction declines (symbolic shapes, subgraphs, mutations), the exporter's own
preparation runs: a full re-trace, seconds on a small Llama.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import onnx
import torch

from ...errors import SbsInputError
from .quiet import quiet_torch_internals

if TYPE_CHECKING:
    from .fx_metadata import FxMetadata

# Values of PreparedProgram.source
PREPARED_BY_EXPORTER = "exporter"  # the exporter's preparation, re-traced here
PREPARED_REPRODUCED = "reproduced"  # light_prep, checked against the ONNX model's metadata
PREPARED_FROM_ONNX_PROGRAM = "onnx_program"  # the ONNXProgram carried its prepared program
PREPARED_FALLBACK = "fallback"  # private API unavailable: plain run_decompositions()


@dataclass
class PreparedProgram:
    program: torch.export.ExportedProgram
    source: str
    note: str = ""  # a limit of the run the user should know about
    # why the fast reproduction was not used (empty when it was, or was not tried)
    detail: str = ""


@dataclass
class _Preparations:
    """What was prepared for one ExportedProgram (both ways are tried at most once)."""

    reproduced: PreparedProgram | None = None
    declined: str | None = None  # why light_prep declined or failed
    exporter: PreparedProgram | None = None
    # model digest -> the reproduction that model vouches for, or why it vouches for none
    checked: dict[str, tuple[PreparedProgram | None, str | None]] = field(default_factory=dict)


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def prepare_program(
    ep: torch.export.ExportedProgram,
    model: onnx.ModelProto | None = None,
    *,
    reproduce: bool = True,
    digest: str | None = None,
    metadata: FxMetadata | None = None,
) -> PreparedProgram:
    """The program the exporter lowers, cached per ExportedProgram.

    With ``model`` (the ONNX model exported from ``ep``) and ``reproduce``, the fast
    reproduction is tried first and used when the model's metadata vouches for it.
    ``digest``: the model's :func:`.prep_check.structure_digest`, when already known;
    ``metadata``: its :class:`.names.FxMetadata`, when the caller reads it too.
    """
    state = _CACHE.get(ep)
    if state is None:
        state = _Preparations()
        with contextlib.suppress(TypeError):
            _CACHE[ep] = state
    detail = ""
    if model is not None and reproduce:
        reproduced = _reproduce(ep, state)
        if reproduced is not None:
            from .prep_check import structure_digest

            key = digest or structure_digest(model)
            if key not in state.checked:
                state.checked[key] = _vouched(reproduced, model, metadata)
            vouched, why = state.checked[key]
            if vouched is not None:
                return vouched
            detail = f"the reproduced preparation differs from the ONNX model ({why})"
        else:
            detail = f"the preparation was not reproduced: {state.declined}"
    if state.exporter is None:
        state.exporter = _exporter_preparation(ep)
    prepared = state.exporter
    if not detail:
        return prepared
    return PreparedProgram(prepared.program, prepared.source, prepared.note, detail)


def _reproduce(ep: torch.export.ExportedProgram, state: _Preparations) -> PreparedProgram | None:
    if state.reproduced is None and state.declined is None:
        from .exporter_ops import exporter_ops
        from .light_prep import Unsupported, prepare_light

        try:
            with quiet_torch_internals():
                program = prepare_light(ep, exporter_ops())
            state.reproduced = PreparedProgram(program, PREPARED_REPRODUCED)
        except Unsupported as e:
            state.declined = str(e)
        except Exception as e:  # a reproduction that breaks is only a slower run
            state.declined = f"{type(e).__name__}: {e}"
    return state.reproduced


def _vouched(
    reproduced: PreparedProgram, model: onnx.ModelProto, metadata: FxMetadata | None
) -> tuple[PreparedProgram | None, str | None]:
    """The reproduction as the model describes it: as built, or under the model's names
    (symbolic sizes number the re-trace's nodes otherwise: :mod:`.model_names`)."""
    from .fx_metadata import FxMetadata
    from .model_names import adopt_model_names, unnamed_values
    from .prep_check import disagreement

    metadata = metadata or FxMetadata(model)
    why = disagreement(reproduced.program, model, metadata)
    if why is None:
        return reproduced, None
    renamed = adopt_model_names(reproduced.program, metadata)
    if renamed is None or disagreement(renamed, model, metadata) is not None:
        return None, why
    g = model.graph
    values = {i.name for i in g.initializer} | {o for n in g.node for o in n.output}
    missing = unnamed_values(renamed, values)
    if missing:
        return None, f"no node of the reproduction is named {', '.join(missing[:3])}"
    return PreparedProgram(renamed, PREPARED_REPRODUCED), None


def _exporter_preparation(ep: torch.export.ExportedProgram) -> PreparedProgram:
    try:
        # Private in torch 2.13; guarded, and tested against the installed version.
        # Exports run without autograd: some decompositions only trace that way (a
        # float SDPA mask gathered from a Parameter changes strides when it needs grad).
        try:
            with torch.no_grad():
                prepared = _exporter_prepare(ep)
        except Exception:
            prepared = _exporter_prepare(ep)
        return PreparedProgram(prepared, PREPARED_BY_EXPORTER)
    except Exception as e:  # pragma: no cover - depends on torch internals
        try:
            prepared = ep.run_decompositions()
        except Exception:
            prepared = ep
        return PreparedProgram(
            prepared,
            PREPARED_FALLBACK,
            f"could not reproduce the exporter's preparation ({type(e).__name__}: {e}); "
            "pairing relies on ONNX node metadata",
        )


@functools.lru_cache(maxsize=2)
def _decomposition_table(names: frozenset[str]) -> dict[Any, Any]:
    """The exporter's create_onnx_friendly_decomposition_table, from the op names."""
    table: dict[Any, Any] = {}
    for op, fn in itertools.chain(
        torch.export.default_decompositions().items(),
        torch._decomp.decomposition_table.items(),
    ):
        if str(op) in names and op not in table:
            table[op] = fn
    return table


def _exporter_prepare(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``_core._prepare_exported_program_for_export(ep, registry=...)``, with the
    decomposition table built from the cached op names instead of torchlib's registry
    (which costs seconds to build): the same table, the same passes."""
    from torch.onnx._internal.exporter import _fx_passes

    from .exporter_ops import exporter_ops

    table = dict(_decomposition_table(exporter_ops().table_names()))
    with quiet_torch_internals(), torch.fx.experimental._config.patch(backed_size_oblivious=True):
        prepared = ep.run_decompositions(table)
        graph_module = prepared.graph_module
        _fx_passes.insert_type_promotion_nodes(graph_module)
        graph_module = _fx_passes.remove_assertion_nodes(graph_module)
        prepared._graph_module = graph_module
    return prepared


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
