"""Warm runs through the screen: a run of a program and model run before, on an input of
the same shapes, made of the screen's three passes instead of the per-node engine.

A notebook runs the same program and model again (a rerun, a changed input of the same
shapes).  The per-node engine costs such a run some 6x the bare work on a 4-layer Llama
(its Python loop over ~400 records); the screen (``screen.py``) makes the records of an
input where every pair passes from one program run, one whole-model onnxruntime run and
one comparison per pair, each record being the template run's with its comparison filled
in as the engine fills it.  A run is screened here only where a run over many inputs
would screen it: the options and the run allow it (``_options_allow``, ``_run_allows``),
an earlier run of the same program, model structure, options and input shapes finished
with every pair passing (the template, ``_template_allows``), and the screen reproduced
that run's records field by field (``Screen.of_first``); then the new run is screened
first, and if any pair fails there, or anything is unusual, the engine runs it as
before.  The screen is built at the end of the second such run (as the stretches are,
``run_ahead.py``): a program and model run once pay nothing for it.

What a screen holds is kept per prepared program (weakly, a few keys each, as
``engine/setup_cache.py`` keeps its tables): the template records, the screen's session
and graph module, no protobuf object.  The weights are baked in the screen's session,
so the ONNX model's initializers' bytes are kept beside it and compared on each warm run
(a weight changed in place sends the run to the engine and drops the screen), and the
program's weights' versions (a torch weight changed in place does the same); a model
whose weights are larger than ``MAX_WEIGHT_BYTES`` is not screened.
"""

from __future__ import annotations

import hashlib
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import torch

from ..compare.value_facts import _same_bits
from ..records import Record
from .screen import Screen, _fields, _leaf_key, _options_allow, _run_allows, _template_allows

# the ONNX weights a screen may keep a copy of (to see a weight changed in place)
MAX_WEIGHT_BYTES = 256 << 20
_KEYS_PER_PROGRAM = 2
# prepared program -> [Warm]: the latest few (key, options) of that program
_WARM: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass
class Warm:
    """What one (program, model structure, options, input shapes) keeps between runs."""

    key: tuple[Any, ...]
    options: Any
    screen: Screen | None = None  # None: run once, the next finished run builds it
    onnx_weights: tuple[bytes, ...] = ()
    torch_weights: tuple[Any, ...] = ()

    def weights_unchanged(self, run: Any) -> bool:
        """Whether the weights are those the screen was built with (its session holds
        the ONNX ones, its template records compare them to the program's)."""
        return _torch_weights(run) == self.torch_weights and _onnx_unchanged(
            run.candidate, self.onnx_weights
        )


def warm_key(run: Any) -> tuple[Any, ...] | None:
    """What a warm run must share with the run that made its screen: the model's
    structure (the pairing's key: its digest, the weights' and inputs' names), what the
    session reads beyond it (opsets, IR version, local functions), the input's
    structure and leaves' shapes, dtypes and devices; None where no screen may serve."""
    if run.pairing.cache_key is None or not _options_allow(run.options) or not _run_allows(run):
        return None
    model = run.candidate.model
    if model.graph.sparse_initializer:
        return None
    functions = hashlib.blake2b(digest_size=16)
    for f in model.functions:
        functions.update(f.SerializeToString())
    leaves, spec = torch.utils._pytree.tree_flatten((run.args, run.kwargs))
    try:
        inputs = (spec, _leaf_key(leaves))
        hash(inputs)
    except TypeError:  # a leaf that cannot be a key: no screen
        return None
    return (
        run.pairing.cache_key,
        tuple((o.domain, o.version) for o in model.opset_import),
        model.ir_version,
        functions.hexdigest(),
        inputs,
    )


def lookup(run: Any) -> Warm | None:
    """The kept screen that may serve ``run`` (an AlignedRun made, not iterated)."""
    kept = _WARM.get(run.program)
    if not kept:
        return None
    key = warm_key(run)
    if key is None:
        return None
    warm = _find(kept, key, run.options)
    if warm is None or warm.screen is None:
        return None
    if not warm.weights_unchanged(run):
        kept.remove(warm)  # a weight changed in place: the screen is stale
        return None
    return warm


def screened_records(warm: Warm, run: Any) -> list[Record] | None:
    """``run``'s records made by the screen, or None where the engine must run it (a pair
    fails, another shape, a value the screen cannot compare)."""
    screen = warm.screen
    if screen is None:
        return None
    try:
        return screen.every_record(run)
    except Exception:  # anything the screen cannot run: the engine runs it and says why
        return None


def remember(run: Any) -> None:
    """After a finished engine run: the first of its kind is noted, the second builds
    the screen from its records (when they and the run allow one)."""
    key = warm_key(run)
    if key is None or not _template_allows(run.records):
        return
    kept = _WARM.get(run.program)
    if kept is None:
        kept = []
        try:
            _WARM[run.program] = kept
        except TypeError:  # pragma: no cover - a program that cannot be weakly referenced
            return
    warm = _find(kept, key, run.options)
    if warm is None:
        if len(kept) >= _KEYS_PER_PROGRAM:
            kept.pop(0)  # the oldest
        kept.append(Warm(key, run.options))
        return
    if warm.screen is not None:
        return  # the engine ran an input the screen refused: the template still holds
    model = run.candidate.model
    if sum(_size(t) for t in model.graph.initializer) > MAX_WEIGHT_BYTES:
        kept.remove(warm)
        return
    onnx_weights = _onnx_weights(model)  # before the session reads them
    torch_weights = _torch_weights(run)
    records = list(run.records)
    screen = Screen.of_first(run, records)
    # the records a warm run is given, made on this run's own input, are this run's
    mine = None if screen is None else screened_records(Warm(key, run.options, screen), run)
    if mine is None or [_fields(r) for r in mine] != [_fields(r) for r in records]:
        kept.remove(warm)
        return
    # a warm run binds its input itself, and the session holds the weights it needs: the
    # screen keeps no reference to the program (the key of its own cache) nor its weights
    screen.program = screen.binding = None
    warm.screen, warm.onnx_weights, warm.torch_weights = screen, onnx_weights, torch_weights


def _find(kept: list[Warm], key: tuple[Any, ...], options: Any) -> Warm | None:
    for warm in kept:
        if warm.key == key and warm.options == options:
            return warm
    return None


def _size(t: onnx.TensorProto) -> int:
    return len(t.raw_data) if t.raw_data else t.ByteSize()


def _onnx_weights(model: onnx.ModelProto) -> tuple[bytes, ...]:
    """Each initializer's bytes (:func:`_bytes_of`)."""
    return tuple(_bytes_of(t) for t in model.graph.initializer)


def _bytes_of(t: onnx.TensorProto) -> bytes:
    """An initializer's bytes: its raw data, else the whole message (typed fields)."""
    return t.raw_data or t.SerializeToString()


def _onnx_unchanged(side: Any, kept: tuple[bytes, ...]) -> bool:
    """Whether the model's initializers hold the bytes ``kept`` (``_onnx_weights``); a
    weight the model's check read this run is compared as it read it (each read of a
    protobuf's bytes copies them: reading them again cost a warm run a tenth of its time)."""
    inits = side.model.graph.initializer
    if len(inits) != len(kept):
        return False
    names = [t.name for t in inits]
    unique = len(set(names)) == len(names)  # the check keeps one read per name
    for t, was in zip(inits, kept, strict=True):
        read = side.checked_read(t.name) if unique else None
        if isinstance(read, np.ndarray) and read.flags.c_contiguous and read.nbytes == len(was):
            if not _same_bits(read.reshape(-1).view(np.uint8), np.frombuffer(was, np.uint8)):
                return False
        elif _bytes_of(t) != was:
            return False
    return True


def _torch_weights(run: Any) -> tuple[Any, ...]:
    """The program's weights, constants and buffers as the run binds them: their
    storage and version (an in-place change bumps it)."""
    user = set(run.bound.user_inputs)
    return tuple(
        (name, v.data_ptr(), tuple(v.shape), v.dtype, v._version)
        if isinstance(v, torch.Tensor)
        else (name, type(v), repr(v))
        for name, v in run.bound.values.items()
        if name not in user
    )


__all__ = ["MAX_WEIGHT_BYTES", "Warm", "lookup", "remember", "screened_records", "warm_key"]
