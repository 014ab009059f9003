"""Stretches: consecutive ONNX nodes run as one onnxruntime session, on a second run.

One session per node pays onnxruntime's call overhead, and ours, at every node: on a
small Llama that is two thirds of the ONNX side's time.  A run of a model records, node by
node, what it saw (a :class:`StretchMemo`): which nodes ran plainly (an onnxruntime
session, numpy values in and out, no fallback), the shape and type of every value, and
how many bytes each node made.  The next run of the same model (its kept tables,
``setup_cache.py``) on inputs of the same shapes runs *stretches* of such nodes as one
session that returns every value the nodes make.  The session does no graph
optimization: the same kernels run on the same inputs as one node at a time, so every
value, and every comparison, is what the node-by-node run gives.  What a stretch does not
give is each node's own time: its records have ``onnx_time_run=None`` (``time_nodes=True``
keeps one timed session per node).

Safety, as for one node at a time:
- a node whose output size is set by input *values* (``Expand``, ``ConstantOfShape``,
  ``Range``...: the size checks of ``limits.py``) or whose output shape depends on values
  (``NonZero``...) runs alone, checked before it allocates;
- a stretch runs only when its inputs have the shapes and types they had when it was
  recorded, so every value inside has the size recorded then;
- a stretch is at most :data:`MAX_NODES` nodes and :data:`MAX_BYTES` of values (made and
  read from weights): the values it makes live a little longer than one node at a time;
- a stretch that fails is run node by node (each node's failure becomes its record), and
  never tried again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import onnx.helper as oh

from ...dtypes import np_to_onnx_dtype
from .randomness import RANDOM_OPS
from .runners import LARGE_NODE_ELEMENTS, OnnxruntimeRunner, _CachedRunner

MAX_NODES = 256
MAX_BYTES = 64 << 20
# a stretch of one node is one node's session
MIN_NODES = 2
# memos kept per model structure: one per shape of the inputs
MAX_MEMOS = 4

# Ops that run alone: their output size is set by input values (limits.py checks those
# per node, before they allocate), their output shape by values, or they draw at random.
ALONE_OPS = frozenset(
    {
        "ConstantOfShape",
        "Expand",
        "Tile",
        "Range",
        "Resize",
        "Upsample",
        "Pad",
        "OneHot",
        "MaxUnpool",
        "CenterCropPad",
        "NonZero",
        "Unique",
        "Compress",
        "NonMaxSuppression",
        "StringSplit",
        "Dropout",
        # sizes read from an input's values: frames, windows, images, grids
        "STFT",
        "DFT",
        "MelWeightMatrix",
        "HannWindow",
        "HammingWindow",
        "BlackmanWindow",
        "Col2Im",
        "AffineGrid",
    }
    | RANDOM_OPS
)

# a value's record: (numpy dtype char, shape)
Signature = tuple[str, tuple[int, ...]]


def _signature(v: Any) -> Signature | None:
    """(dtype char, shape) of a plain numpy value, None for anything else (a sequence, a
    bfloat16 array from ml_dtypes, a torch tensor)."""
    if type(v) is np.ndarray and v.dtype.kind in "biufc":
        return (v.dtype.char, v.shape)
    return None


def runs_stretches(runner: Any) -> bool:
    """Whether this runner's nodes may run in stretches: onnxruntime on the CPU, as this
    package runs it."""
    kind = type(runner)
    return (
        isinstance(runner, OnnxruntimeRunner)
        # a subclass that runs or builds nodes its own way (a user's, a test's) decides
        # per node
        and getattr(kind, "prepare", None) is _CachedRunner.prepare
        and kind._run is OnnxruntimeRunner._run
        and kind._build is OnnxruntimeRunner._build
        and runner.providers == ["CPUExecutionProvider"]
    )


def memo_key(runner: Any, env: dict[str, Any]) -> tuple | None:
    """What a memo is kept under: the runner's configuration and the graph inputs'
    types and shapes (None: an input that is not a plain array)."""
    sigs = []
    for name in sorted(env):
        sig = _signature(env[name])
        if sig is None:
            return None
        sigs.append((name, sig))
    return (runner._config(runner.fallback), tuple(sigs))


class StretchMemo:
    """What one run saw, node by node (see the module's docstring)."""

    __slots__ = ("plain", "large", "made", "seen", "notes", "complete", "layouts")

    def __init__(self, n_nodes: int) -> None:
        self.plain = bytearray(n_nodes)  # 1: the node ran plainly
        # 1: the node ran in a multi-threaded session (runners._is_large), whose kernels
        # may round otherwise than a single-threaded one's: a stretch keeps the node's
        self.large = bytearray(n_nodes)
        self.made = [0] * n_nodes  # bytes of the node's outputs
        self.seen: dict[str, Signature] = {}  # every value's signature
        self.notes: dict[int, str] = {}  # how a node had to be run, when its records say
        self.complete = False  # every node was run
        self.layouts: dict[Any, Layout] = {}  # by what the run resets

    def observe(
        self,
        idx: int,
        names_in: Sequence[str],
        inputs: Sequence[Any],
        names_out: Sequence[str],
        outputs: Sequence[Any],
        plain: bool,
        note: str | None = None,
    ) -> None:
        plain_in, largest, _ = self._see(names_in, inputs)
        plain_out, _, made = self._see(names_out, outputs)
        self.plain[idx] = plain and plain_in and plain_out
        self.large[idx] = largest >= LARGE_NODE_ELEMENTS
        self.made[idx] = made
        if note:
            self.notes[idx] = note

    def _see(self, names: Sequence[str], values: Sequence[Any]) -> tuple[bool, int, int]:
        """Records the values' signatures: (all plain arrays, most elements, bytes)."""
        plain, largest, nbytes = True, 0, 0
        for name, v in zip(names, values):
            if name:
                sig = _signature(v)
                if sig is None:
                    plain = False
                else:
                    self.seen[name] = sig
                    largest = max(largest, v.size)
                    nbytes += v.nbytes
        return plain, largest, nbytes


class Stretch:
    """Nodes ``first`` to ``last`` run as one session (built at first use)."""

    __slots__ = (
        "first",
        "last",
        "inputs",
        "signatures",
        "outputs",
        "large",
        "session",
        "broken",
        "own_sessions",
    )

    def __init__(
        self,
        first: int,
        last: int,
        inputs: tuple[str, ...],
        signatures: tuple[Signature, ...],
        outputs: tuple[str, ...],
        large: bool,
    ) -> None:
        self.first = first
        self.last = last
        self.inputs = inputs
        self.signatures = signatures
        self.outputs = outputs
        self.large = large
        self.session: Any = None
        self.broken = False
        # own-error batches by their wiring and feeds (see OwnBatch)
        self.own_sessions: dict[Any, Any] = {}

    def feeds(self, env: dict[str, Any], candidate: Any) -> dict[str, Any] | None:
        """The session's feeds from ``env`` (and the weights), or None when an input is
        missing or not what it was when the stretch was recorded."""
        feeds = {}
        initializers = candidate.initializers
        for name, (char, shape) in zip(self.inputs, self.signatures):
            v = env.get(name)
            if v is None:
                if name not in initializers:
                    return None
                v = candidate.initializer(name)
            if type(v) is not np.ndarray or v.shape != shape or v.dtype.char != char:
                return None
            feeds[name] = v
        return feeds

    def run(self, feeds: dict[str, Any], candidate: Any) -> list[Any]:
        if self.session is None:
            runner = candidate.runner
            self.session = runner.build_stretch(self.model(candidate), self.large)
            runner.stretch_sessions_built = getattr(runner, "stretch_sessions_built", 0) + 1
        # the session was built with exactly these feeds: the wrapper's checks are skipped
        return self.session._sess.run(list(self.outputs), feeds, None)

    def model(self, candidate: Any) -> onnx.ModelProto:
        """The nodes as one model: every output of every node is an output of the graph,
        inputs declared with the exact types and shapes they were recorded with."""
        nodes = [_bare(candidate.nodes[k]) for k in range(self.first, self.last + 1)]
        return _model(candidate, nodes, zip(self.inputs, self.signatures), self.outputs)


def _bare(node: onnx.NodeProto) -> onnx.NodeProto:
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    copy.ClearField("metadata_props")
    return copy


def _model(
    candidate: Any, nodes: list[onnx.NodeProto], inputs: Any, outputs: Sequence[str]
) -> onnx.ModelProto:
    ctx = candidate.ctx
    declared = [
        oh.make_tensor_value_info(name, np_to_onnx_dtype(np.dtype(char)), list(shape))
        for name, (char, shape) in inputs
    ]
    return oh.make_model(
        oh.make_graph(
            nodes, "stretch", declared, [oh.make_value_info(o, onnx.TypeProto()) for o in outputs]
        ),
        opset_imports=[oh.make_opsetid(d, v) for d, v in ctx.opsets.items()],
        ir_version=ctx.ir_version,
        functions=list(ctx.functions.values()),
    )


class OwnBatch:
    """The own-error runs of a stretch's nodes as one session: each node fed the torch
    values of its inputs (or, for an input without a torch partner, the value computed
    from torch values upstream: inside the batch, the output of the node before).

    ``add`` takes a node's own-error inputs (``own_error.own_error_inputs``, with the values
    the batch computes as ``Pending`` markers); ``run`` returns each node's outputs.
    """

    __slots__ = ("stretch", "nodes", "wiring", "feeds", "signatures")

    def __init__(self, stretch: Stretch) -> None:
        self.stretch = stretch
        self.nodes: list[int] = []
        self.wiring: list[tuple] = []
        self.feeds: list[Any] = []
        self.signatures: list[Signature] = []

    def add(self, idx: int, inputs: Sequence[Any], pending_type: type) -> bool:
        """False when an input cannot be fed to a session (not a plain array)."""
        wires = []
        for v in inputs:
            if v is None:
                wires.append(None)
            elif type(v) is pending_type:
                wires.append(v.name)
            else:
                sig = _signature(v)
                if sig is None:
                    return False
                wires.append(len(self.feeds))
                self.feeds.append(v)
                self.signatures.append(sig)
        self.nodes.append(idx)
        self.wiring.append(tuple(wires))
        return True

    def run(self, candidate: Any) -> list[list[Any]]:
        stretch = self.stretch
        key = (tuple(zip(self.nodes, self.wiring)), tuple(self.signatures))
        session = stretch.own_sessions.get(key)
        outputs = [f"own/{o}" for k in self.nodes for o in candidate.graph.outputs[k] if o]
        if session is None:
            session = stretch.own_sessions[key] = candidate.runner.build_stretch(
                self._model(candidate, outputs), stretch.large
            )
        feeds = {f"feed/{i}": v for i, v in enumerate(self.feeds)}
        values = iter(session._sess.run(outputs, feeds, None))
        return [
            [next(values) if o else None for o in candidate.graph.outputs[k]] for k in self.nodes
        ]

    def _model(self, candidate: Any, outputs: list[str]) -> onnx.ModelProto:
        nodes = []
        for k, wires in zip(self.nodes, self.wiring):
            node = _bare(candidate.nodes[k])
            del node.input[:]
            node.input.extend(
                "" if w is None else f"feed/{w}" if isinstance(w, int) else f"own/{w}"
                for w in wires
            )
            renamed = [f"own/{o}" if o else "" for o in node.output]
            del node.output[:]
            node.output.extend(renamed)
            nodes.append(node)
        inputs = ((f"feed/{i}", sig) for i, sig in enumerate(self.signatures))
        return _model(candidate, nodes, inputs, outputs)


class Layout:
    """The stretches of one run: by first node, and which nodes they cover."""

    __slots__ = ("starting", "covered", "plans")

    def __init__(self, stretches: Sequence[Stretch], n_nodes: int) -> None:
        self.starting = {s.first: s for s in stretches}
        # plans whose stretches run as units (plan.schedule's units), by plan key
        self.plans: dict[Any, Any] = {}
        self.covered = bytearray(n_nodes)
        for s in stretches:
            self.covered[s.first : s.last + 1] = b"\x01" * (s.last - s.first + 1)

    def __len__(self) -> int:
        return len(self.starting)


def _alone(node: onnx.NodeProto) -> bool:
    """Whether a node always runs on its own (see :data:`ALONE_OPS`; subgraphs too)."""
    if node.domain in ("", "ai.onnx") and node.op_type in ALONE_OPS:
        return True
    return any(
        a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute
    )


def layout(memo: StretchMemo, candidate: Any, fed_from_reference: frozenset[str]) -> Layout:
    """The stretches of a run over ``candidate`` (an OnnxSide) recorded in ``memo``;
    ``fed_from_reference``: values the run replaces by their torch value (resets, random
    draws), whose consumers run alone, after the replacement.  Kept in the memo."""
    found = memo.layouts.get(fed_from_reference)
    if found is not None:
        return found
    tables = candidate.tables
    node_inputs, node_outputs = tables.graph.inputs, tables.graph.outputs
    ties = tables.tie_axes
    initializers = candidate.initializers
    seen, plain, large, made = memo.seen, memo.plain, memo.large, memo.made
    stretches: list[Stretch] = []
    run: list[int] = []
    size = 0
    weights: set[str] = set()

    def close() -> None:
        if len(run) >= MIN_NODES:
            stretch = _stretch(run, node_inputs, node_outputs, seen, bool(large[run[0]]))
            if stretch is not None:
                stretches.append(stretch)
        run.clear()
        weights.clear()

    for k, node in enumerate(candidate.nodes):
        ok = bool(plain[k]) and k not in ties and not _alone(node)
        if ok and fed_from_reference:
            ok = not any(i in fed_from_reference for i in node_inputs[k])
        if not ok:
            close()
            size = 0
            continue
        cost = made[k]
        fresh = [i for i in node_inputs[k] if i in initializers and i not in weights]
        for i in fresh:
            sig = seen.get(i)
            if sig is not None:
                cost += int(np.prod(sig[1], dtype=np.int64)) * np.dtype(sig[0]).itemsize
        if run and (len(run) >= MAX_NODES or size + cost > MAX_BYTES or large[k] != large[run[0]]):
            close()
            size = 0
        run.append(k)
        weights.update(fresh)
        size += cost
    close()
    found = memo.layouts[fed_from_reference] = Layout(stretches, len(plain))
    return found


def _stretch(
    run: Sequence[int],
    node_inputs: Sequence[tuple[str, ...]],
    node_outputs: Sequence[tuple[str, ...]],
    seen: dict[str, Signature],
    large: bool,
) -> Stretch | None:
    made: set[str] = set()
    inputs: dict[str, None] = {}
    outputs: list[str] = []
    for k in run:
        for i in node_inputs[k]:
            if i and i not in made:
                inputs.setdefault(i)
        for o in node_outputs[k]:
            if o:
                made.add(o)
                outputs.append(o)
    if any(name not in seen for name in (*inputs, *outputs)):
        return None  # a value the recording run did not see
    signatures = tuple(seen[name] for name in inputs)
    return Stretch(run[0], run[-1], tuple(inputs), signatures, tuple(outputs), large)


def kept_memo(candidate: Any, key: tuple) -> StretchMemo:
    """The memo kept with the candidate's tables under ``key``, made when missing (a model
    run on inputs of many shapes keeps the latest few)."""
    memos = candidate.tables.stretch_memos
    memo = memos.get(key)
    if memo is None:
        if len(memos) >= MAX_MEMOS:
            memos.pop(next(iter(memos)))
        memo = memos[key] = StretchMemo(len(candidate.nodes))
    return memo


__all__ = [
    "ALONE_OPS",
    "MAX_BYTES",
    "MAX_NODES",
    "Layout",
    "OwnBatch",
    "Stretch",
    "StretchMemo",
    "kept_memo",
    "layout",
    "memo_key",
    "runs_stretches",
]
