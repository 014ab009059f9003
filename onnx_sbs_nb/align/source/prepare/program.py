"""The program the exporter actually lowered: the steps of the preparation, in order.

``torch.onnx.export`` does not lower the user's program as given: it first decomposes it
with its own registry, inserts type promotions and removes assertions, and the ONNX
value names are the fx names of *that* program.  Running the user's program would pair
values that merely share a name (``add_1`` can be two different computations), so we
run the prepared program.

The walk, each module importing only those before it (tests/test_layering.py):
``unsupported``, ``exporter_ops`` (which ops the exporter decomposes), ``graphs``,
``input_writes``, ``aliasing``, ``written_views`` (functionalization's rules),
``supported`` (what the reproduction declines), ``expansions`` (the decomposed calls,
traced), ``promotions``, ``passes`` (the re-trace's closing passes), ``reproduce`` (the
walk over the user's graph), ``check`` (does the ONNX model vouch for it),
``model_names`` (the model's names for it), ``prepared`` (the result), ``exporter``
(the exporter's own re-trace), and this module, which runs them: given the ONNX model,
the reproduction is built by walking the user's graph once (tens of milliseconds), and
used when the model's node metadata agrees with it node for node, as built or under the
model's names.  Otherwise, or for programs the reproduction declines, the exporter's own
preparation runs: a full re-trace, seconds on a small Llama.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import onnx
import torch

from ..quiet import quiet_torch_internals
from .prepared import PREPARED_REPRODUCED, PreparedProgram

if TYPE_CHECKING:
    from ..fx_metadata import FxMetadata


@dataclass
class _Preparations:
    """What was prepared for one ExportedProgram (both ways are tried at most once)."""

    reproduced: PreparedProgram | None = None
    declined: str | None = None  # why the reproduction declined or failed
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
    ``digest``: the model's :func:`.check.structure_digest`, when already known;
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
            from .check import structure_digest

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
        from .exporter import exporter_preparation

        state.exporter = exporter_preparation(ep)
    prepared = state.exporter
    if not detail:
        return prepared
    return PreparedProgram(prepared.program, prepared.source, prepared.note, detail)


def _reproduce(ep: torch.export.ExportedProgram, state: _Preparations) -> PreparedProgram | None:
    if state.reproduced is None and state.declined is None:
        from .exporter_ops import exporter_ops
        from .reproduce import prepare_light
        from .unsupported import Unsupported

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
    from ..fx_metadata import FxMetadata
    from .check import disagreement
    from .model_names import adopt_model_names, unnamed_values

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
