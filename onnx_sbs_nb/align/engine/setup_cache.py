"""What a second run of the same program and model reuses: its pairing, provenance,
the two sides' tables and the plan.

A notebook runs the same program and model again and again (a changed input, the
widget's rerun, a loop over inputs).  Pairing costs 10 to 20 ms on a small Llama and
provenance 4 to 6 ms: a sixth of such a run.  These, the tables each side derives from
its graph (``sides.py``), each node's session key and the plan (``plan.py``) are pure
functions of the prepared program (itself kept per ExportedProgram, ``program.py``) and
of the model's structure, so they are kept per prepared program; they are keyed by a
digest of everything they read from the model, so an edited model (a node renamed, a
value retyped, a weight reshaped, another opset) is read again.  Nothing kept holds a
protobuf object: a kept model would keep its weights alive with the program.
"""

from __future__ import annotations

import hashlib
import weakref
from typing import Any

import onnx
import torch

from ..pairing.float_views import with_float_views
from ..pairing.lowered_by import returned_outputs
from ..pairing.names import pair_values
from ..pairing.pairs import Pairing
from ..source.fx_metadata import FxMetadata
from ..source.model_check import check_model, check_tensors
from ..source.prepare.check import structure_digest
from ..source.provenance import Provenance, program_provenance
from .runners import ModelContext
from .sides import FxTables, OnnxTables

_PROVENANCE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_PAIRINGS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_KEYS_PER_PROGRAM = 8
_FX_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_ONNX_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# models that passed check_model as they are and need no float views: check key -> the
# fx node names their metadata gives (strings, no protobuf object; the longer texts are
# read again where a step needs them, a warm run's does not)
_CHECKED: dict[str, list[str | None]] = {}
_CHECKED_KEPT = 8


def cached_provenance(
    program: torch.export.ExportedProgram,
    user_program: torch.export.ExportedProgram,
    weights: dict[str, str],
) -> dict[str, Provenance]:
    """:func:`.provenance.program_provenance`, computed once per program pair."""
    key = tuple(weights.items())
    entry = _PROVENANCE.get(program)
    if entry is not None and entry[0]() is user_program and entry[1] == key:
        return entry[2]
    result = program_provenance(program.graph, user_program.graph, weights)
    try:
        _PROVENANCE[program] = (weakref.ref(user_program), key, result)
    except TypeError:  # pragma: no cover - a program that cannot be weakly referenced
        pass
    return result


def cached_pairing(
    program: torch.export.ExportedProgram,
    model: onnx.ModelProto,
    weights: dict[str, str],
    user_inputs: list[str],
    trusted: set[str] | None,
    digest: str | None = None,
    metadata: FxMetadata | None = None,
) -> Pairing:
    """:func:`.names.pair_values`, computed once per program and model structure; each
    caller gets its own tables (the pairs themselves are not changed after pairing).
    ``digest``: the model's :func:`.prepare.check.structure_digest`, when already known;
    ``metadata``: its :class:`.names.FxMetadata`, when the caller reads it too."""
    key: Any = (
        digest or structure_digest(model),
        tuple(weights.items()),
        tuple(user_inputs),
        None if trusted is None else frozenset(trusted),
    )
    pairing = _kept(
        _PAIRINGS,
        program,
        key,
        lambda: pair_values(
            program.graph,
            model,
            weights,
            user_inputs,
            trusted,
            metadata,
            returned_outputs(program),
        ),
    )
    return Pairing(dict(pairing.by_onnx), dict(pairing.by_fx), cache_key=key)


def _kept(store: weakref.WeakKeyDictionary, program: Any, key: Any, make: Any) -> Any:
    """``store[program][key]``, made by ``make()`` at first use; a program keeps its
    latest few keys (a model edited again and again is not kept in every version)."""
    per_program = store.get(program)
    value = per_program.get(key) if per_program is not None else None
    if value is None:
        value = make()
        if per_program is None:
            per_program = {}
            try:
                store[program] = per_program
            except TypeError:  # pragma: no cover - a program that cannot be weakly referenced
                pass
        if len(per_program) >= _KEYS_PER_PROGRAM:
            per_program.pop(next(iter(per_program)))
        per_program[key] = value
    return value


def cached_fx_tables(program: torch.export.ExportedProgram) -> FxTables:
    """:meth:`.sides.FxTables.of`, computed once per program."""
    tables = _FX_TABLES.get(program)
    if tables is None:
        tables = FxTables.of(program)
        try:
            _FX_TABLES[program] = tables
        except TypeError:  # pragma: no cover
            pass
    return tables


def cached_onnx_tables(
    program: torch.export.ExportedProgram,
    model: onnx.ModelProto,
    digest: str,
    metadata: FxMetadata | None = None,
) -> OnnxTables:
    """:meth:`.sides.OnnxTables.of` for ``model``, computed once per program and model
    structure (``digest``: its :func:`.prepare.check.structure_digest`, ``metadata``: its
    :class:`.names.FxMetadata` when the caller reads it too); the opsets and local
    functions the session keys read are part of the key."""
    functions = hashlib.blake2b(digest_size=16)
    for f in model.functions:
        functions.update(f.SerializeToString())
    key = (
        digest,
        tuple((o.domain, o.version) for o in model.opset_import),
        model.ir_version,
        functions.hexdigest(),
    )
    tables = _kept(
        _ONNX_TABLES,
        program,
        key,
        lambda: OnnxTables.of(model, ModelContext.from_model(model), metadata=metadata),
    )
    reads = metadata.take_reads() if metadata is not None else None
    if reads:
        # the initializers checked_model read this run: the side made next takes them
        tables.hand_reads(model, reads)
    return tables


def checked_model(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str, FxMetadata]:
    """The model a run works on (:func:`.model_check.check_model`, then the quantized
    models' float views), its :func:`.prepare.check.structure_digest` and its
    :class:`.FxMetadata`.  A model of a structure that passed before as it was (no node
    reordered, no view added) skips what depends on its structure alone: the nesting, the
    graph's order, its constants' data and the node metadata.  Its initializers' data is
    checked again on every run: the digest leaves their values out, and an initializer's
    bytes can be replaced in place (a weight truncated, a value changed).  The bytes that
    check reads are the run's weights: the metadata hands them to the run's tables
    (:func:`cached_onnx_tables`), the side made with them takes them; nothing read is
    kept for another run."""
    try:
        digest = structure_digest(model)
    except Exception:  # noqa: BLE001 - one the checks name better (they run first then)
        digest = None
    key = None if digest is None else _check_key(model, digest)
    kept = _CHECKED.get(key) if key is not None else None
    # the bytes the check reads are the run's weights (a read copies them: one is enough)
    reads: dict[str, Any] = {}
    if kept is not None:
        check_tensors(model, initializers_only=True, reads=reads)
        metadata = FxMetadata(model, names=kept)
        metadata.keep_reads(reads)
        return model, digest, metadata  # type: ignore[return-value]
    checked = with_float_views(check_model(model, reads=reads))
    if checked is not model or digest is None or key is None:
        return checked, structure_digest(checked), FxMetadata(checked)
    metadata = FxMetadata(model)
    metadata.keep_reads(reads)
    if len(_CHECKED) >= _CHECKED_KEPT:
        _CHECKED.pop(next(iter(_CHECKED), None), None)  # the oldest
    _CHECKED[key] = metadata.names
    return model, digest, metadata


def _check_key(model: onnx.ModelProto, digest: str) -> str:
    """What :func:`checked_model` reads beyond the structure digest: the local functions
    (their nesting), the sparse initializers' names (values defined before any node)."""
    h = hashlib.blake2b(digest.encode(), digest_size=20)
    for f in model.functions:
        h.update(b"\0f")
        h.update(f.SerializeToString())
    for t in model.graph.sparse_initializer:
        h.update(b"\0s")
        h.update((t.values.name or "").encode())
    return h.hexdigest()
