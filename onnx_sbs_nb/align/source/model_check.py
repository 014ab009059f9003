"""The ONNX model checked as a whole before a run: a model that cannot run is refused.

Node by node, the engine runs every node it can and records the others as not computed:
a graph with a cycle, a node reading a value nobody computes or an opset onnxruntime has
no kernels for would end with nothing failing, and nothing compared either.  So before
the run:

- :func:`check_nesting` bounds how deep local functions call each other and subgraphs
  nest, walking without recursion, before any library walks the model (onnxruntime
  recurses through both and a deep enough model kills the process);
- :func:`check_graph` checks that every node of the main graph reads values defined before
  it (graph inputs, initializers, outputs of earlier nodes): this is what the ONNX
  checker requires of a graph's order, and what a cycle or a value nobody computes breaks;
- :func:`check_opset` refuses an ai.onnx opset older than onnxruntime runs;
- :func:`check_onnxruntime_builds` asks onnxruntime to build a session for the model,
  weights left out (each initializer becomes an input of its type and shape): it checks
  that the graph is one it would run.  A refusal about one node (an op it does not know,
  a kernel it lacks, an attribute or types that node cannot take) is left to that node:
  the engine records its failure, or runs it with the torch evaluator and says so, and
  compares the rest.

Each refusal is an :class:`SbsInputError` naming the defect.
"""

from __future__ import annotations

import hashlib
import heapq
import threading
from collections.abc import Iterator
from typing import Any

import onnx
import onnx.helper as oh

from ...convert import raw_tensor_array
from ...errors import SbsInputError
from ...external import np_dtype, tensors_of

# onnxruntime's refusals that concern one node, not the model (an op it does not know, a
# kernel it lacks, an attribute or types that node cannot take): left to that node's record
NODE_GAPS = (
    "No Op registered for",
    "Could not find an implementation for",
    "Node (",
    "In Node,",
    "in node (",
)
# the initializers' bytes a check keeps for the run at most (a copy of the weights, alive
# for the run: a larger model's weights are read again, one at a time, where used)
READS_KEPT_BYTES = 256 << 20
# the oldest ai.onnx opset onnxruntime has kernels for
ORT_MIN_OPSET = 7

# deeper function calls or subgraph nesting are refused: exported models stay below 10,
# and protobuf's parser stops subgraphs at about 30 levels anyway
MAX_NESTING = 24


def _graphs_of(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    for att in node.attribute:
        if att.type == onnx.AttributeProto.GRAPH:
            yield att.g
        elif att.type == onnx.AttributeProto.GRAPHS:
            yield from att.graphs


def check_nesting(model: onnx.ModelProto, limit: int = MAX_NESTING) -> None:
    """Refuses a model whose local functions call each other (or whose subgraphs nest)
    more than ``limit`` deep, or whose functions call themselves."""
    functions = {(f.domain, f.name): f for f in model.functions}
    # subgraph nesting, and the functions each body calls, on an explicit stack
    calls: dict[tuple[str, str] | None, set[tuple[str, str]]] = {}
    bodies: list[tuple[tuple[str, str] | None, list[onnx.NodeProto]]] = [(None, model.graph.node)]
    bodies += [(key, f.node) for key, f in functions.items()]
    for owner, nodes in bodies:
        called = calls.setdefault(owner, set())
        stack = [(n, 1) for n in nodes]
        while stack:
            node, depth = stack.pop()
            if (node.domain, node.op_type) in functions:
                called.add((node.domain, node.op_type))
            for g in _graphs_of(node):
                if depth >= limit:
                    raise SbsInputError(
                        f"node {node.name or node.op_type!r} nests subgraphs more than {limit} "
                        "deep: the model is refused before anything walks it (no exporter "
                        "writes such a model; check where it comes from)"
                    )
                stack.extend((n, depth + 1) for n in g.node)
    # the longest chain of calls, from each function, by iterative depth-first search
    depth: dict[tuple[str, str], int] = {}
    for start in functions:
        if start in depth:
            continue
        on_path: set[tuple[str, str]] = {start}
        stack: list[tuple[tuple[str, str], Iterator[tuple[str, str]]]] = [
            (start, iter(sorted(calls.get(start, ()))))
        ]
        while stack:
            key, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                on_path.discard(key)
                depth[key] = 1 + max((depth[c] for c in calls.get(key, ())), default=0)
                if depth[key] > limit:
                    raise SbsInputError(
                        f"local function {key[0]}.{key[1]} calls functions more than {limit} "
                        "deep: the model is refused before anything walks it (no exporter "
                        "writes such a model; check where it comes from)"
                    )
                continue
            if child in on_path:
                raise SbsInputError(
                    f"local function {child[0]}.{child[1]} calls itself (through "
                    f"{key[0]}.{key[1]}): ONNX functions may not recurse, the model cannot run"
                )
            if child not in depth:
                if len(stack) >= limit:  # the path alone is already too deep
                    raise SbsInputError(
                        f"local function {start[0]}.{start[1]} calls functions more than "
                        f"{limit} deep: the model is refused before anything walks it (no "
                        "exporter writes such a model; check where it comes from)"
                    )
                on_path.add(child)
                stack.append((child, iter(sorted(calls.get(child, ())))))


def check_graph(model: onnx.ModelProto) -> None:
    """Refuses a main graph whose nodes read a value not defined before them."""
    g = model.graph
    defined = {i.name for i in g.input} | {t.name for t in g.initializer}
    defined |= {t.name for t in g.sparse_initializer}
    defined.add("")  # an omitted optional input
    produced_later: dict[str, int] = {}
    for k, node in enumerate(g.node):
        for o in node.output:
            produced_later.setdefault(o, k)
    for k, node in enumerate(g.node):
        for name in node.input:
            if name in defined:
                continue
            label = node.name or f"#{k} ({node.op_type})"
            if name in produced_later:
                where = g.node[produced_later[name]]
                raise SbsInputError(
                    f"ONNX node {label!r} reads {name!r} before node "
                    f"{where.name or where.op_type!r} computes it: the graph has a cycle or is "
                    "not in topological order (the ONNX checker refuses it), the model cannot run"
                )
            raise SbsInputError(
                f"ONNX node {label!r} reads {name!r}, which no node computes and which is no "
                "graph input or initializer: the model cannot run"
            )
        defined.update(node.output)
    missing = [o.name for o in g.output if o.name not in defined]
    if missing:
        raise SbsInputError(
            f"the ONNX model's outputs {missing} are computed by no node: the model cannot run"
        )


def _reads(node: onnx.NodeProto) -> Iterator[str]:
    """The names a node reads: its inputs and, through its subgraphs (If, Loop, Scan),
    the outer values those read."""
    yield from node.input
    for sub in _graphs_of(node):
        for inner in sub.node:
            yield from _reads(inner)


def in_run_order(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its main graph's nodes in an order that computes each value before a
    node reads it: the model itself when they already are; else a copy with the nodes
    sorted, each as early as its inputs allow and otherwise in the file's order (a graph
    tool's output: onnxruntime's float16 converter appends the Casts of the graph inputs
    last, and onnxruntime sorts the nodes itself). A cycle or a value nothing computes is
    left as it is, for :func:`check_graph` to name."""
    g = model.graph
    producer: dict[str, int] = {}
    for k, node in enumerate(g.node):
        for o in node.output:
            if o:
                producer.setdefault(o, k)
    needs = [
        {producer[n] for n in _reads(node) if n in producer} - {k} for k, node in enumerate(g.node)
    ]
    if all(all(d < k for d in deps) for k, deps in enumerate(needs)):
        return model
    waiting = [len(deps) for deps in needs]
    readers: dict[int, list[int]] = {}
    for k, deps in enumerate(needs):
        for d in deps:
            readers.setdefault(d, []).append(k)
    ready = [k for k, n in enumerate(waiting) if n == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        k = heapq.heappop(ready)
        order.append(k)
        for r in readers.get(k, ()):
            waiting[r] -= 1
            if waiting[r] == 0:
                heapq.heappush(ready, r)
    if len(order) != len(g.node):
        return model  # a cycle: check_graph names it
    sorted_model = onnx.ModelProto()
    sorted_model.CopyFrom(model)
    del sorted_model.graph.node[:]
    sorted_model.graph.node.extend(g.node[k] for k in order)
    return sorted_model


def check_opset(model: onnx.ModelProto) -> None:
    """Refuses an ai.onnx opset older than onnxruntime runs at all (no kernel for any
    node: each one would fall back or fail alone)."""
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx") and o.version < ORT_MIN_OPSET:
            raise SbsInputError(
                f"the ONNX model imports ai.onnx opset {o.version}: onnxruntime runs opset "
                f"{ORT_MIN_OPSET} and above, the model cannot run; convert it "
                "(onnx.version_converter.convert_version) or export it again"
            )


_T = onnx.TensorProto
# the repeated field a tensor keeps its values in when it has no raw_data, and how many
# entries one element takes there
_TYPED_FIELDS: dict[int, tuple[str, int]] = {
    _T.FLOAT: ("float_data", 1),
    _T.COMPLEX64: ("float_data", 2),
    _T.DOUBLE: ("double_data", 1),
    _T.COMPLEX128: ("double_data", 2),
    _T.INT64: ("int64_data", 1),
    _T.UINT32: ("uint64_data", 1),
    _T.UINT64: ("uint64_data", 1),
    _T.STRING: ("string_data", 1),
    **{
        t: ("int32_data", 1)
        for t in (
            _T.INT32,
            _T.INT16,
            _T.INT8,
            _T.UINT16,
            _T.UINT8,
            _T.BOOL,
            _T.FLOAT16,
            _T.BFLOAT16,
        )
    },
}


def _tensor_defect(t: onnx.TensorProto, reads: dict[str, Any] | None = None) -> str | None:
    """Why the data of ``t`` does not match its dims and type (None when it does).
    ``reads``: where a sound tensor whose raw bytes are its array is kept, by name, as
    :func:`.convert.tensor_array` reads it (the check reads the bytes anyway)."""
    if any(d < 0 for d in t.dims):
        return f"has a negative dimension in {list(t.dims)}"
    n = 1
    for d in t.dims:
        n *= d
    if t.data_location == _T.EXTERNAL:
        return None  # checked against its file by external.py
    dtype = np_dtype(t.data_type)
    if t.HasField("raw_data"):
        if dtype is None:
            return None  # packed and other types: sized by onnx itself
        raw = t.raw_data  # a copy: the length alone cannot be had for less
        size = len(raw)
        if size != n * dtype.itemsize:
            return (
                f"declares {n} elements of {dtype.name} ({list(t.dims)}, {n * dtype.itemsize} "
                f"bytes) but holds {size} bytes"
            )
        if reads is not None:
            array = raw_tensor_array(t, raw)
            if array is not None:
                reads[t.name] = array
        return None
    field = _TYPED_FIELDS.get(t.data_type)
    if field is None:
        return None
    count = len(getattr(t, field[0]))
    if count != n * field[1]:
        return f"declares {n} elements ({list(t.dims)}) but holds {count // field[1]}"
    return None


def check_tensors(
    model: onnx.ModelProto,
    initializers_only: bool = False,
    reads: dict[str, Any] | None = None,
) -> None:
    """Refuses an initializer or constant whose data does not match its dims and type
    (declared 1e12 elements with 512 bytes, raw_data shorter than its shape says).
    ``initializers_only``: the main graph's initializers alone (a model whose nodes, their
    constants included, passed before: ``engine/setup_cache.py``).  ``reads``: filled
    with the main graph's initializers as arrays, the bytes this check read (about
    :data:`READS_KEPT_BYTES` of them): a run takes its weights from there instead of
    reading (copying) each one again (``engine/sides.py``)."""
    tensors = ((t, True) for t in model.graph.initializer) if initializers_only else None
    kept = 0
    for t, top in tensors or tensors_of(model.graph, True):
        keep = None
        if top and reads is not None:
            reads.pop(t.name, None)  # a name given twice: the run takes the last one
            keep = reads if kept < READS_KEPT_BYTES else None
        why = _tensor_defect(t, keep)
        if keep is not None and t.name in keep:
            kept += keep[t.name].nbytes
        if why is not None:
            raise SbsInputError(
                f"tensor {t.name or '<constant>'!r} of the ONNX model {why}: the model is "
                "corrupt (truncated or edited), export it again"
            )


def check_model(model: onnx.ModelProto, reads: dict[str, Any] | None = None) -> onnx.ModelProto:
    """The checks that need no runtime: nesting, graph order, tensors' data; returns the
    model to run (:func:`in_run_order`); ``reads``: see :func:`check_tensors` (the arrays
    are those of the model returned)."""
    check_nesting(model)
    model = in_run_order(model)
    check_graph(model)
    check_tensors(model, reads=reads)
    return model


def _without_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model's structure, each initializer an input of its type and shape (no data
    read, none copied: a deferred external weight stays in its file)."""
    g = model.graph
    shell = onnx.ModelProto(ir_version=model.ir_version)
    shell.opset_import.extend(model.opset_import)
    shell.functions.extend(model.functions)
    sg = shell.graph
    sg.name = g.name
    sg.node.extend(g.node)
    sg.input.extend(g.input)
    sg.output.extend(g.output)
    inputs = {i.name for i in g.input}
    for t in g.initializer:
        if t.name not in inputs:
            sg.input.append(oh.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    # value_info is left out: onnxruntime infers the types, a stale annotation is no defect
    return shell


def _shell_bytes(model: onnx.ModelProto) -> bytes | None:
    try:
        return _without_weights(model).SerializeToString()
    except ValueError:
        return None  # beyond protobuf's limit even without weights: the runs will say


def check_onnxruntime_builds(model: onnx.ModelProto | bytes | None) -> None:
    """Refuses a model onnxruntime would not build a session for (weights left out)."""
    import onnxruntime as ort

    data = _shell_bytes(model) if isinstance(model, onnx.ModelProto) else model
    if data is None:
        return
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4
    try:
        ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    except Exception as e:
        text = " ".join(str(e).split())
        if any(gap in text for gap in NODE_GAPS):
            # one node's defect: that node's record says so (or the torch evaluator runs
            # it, with a note), the rest of the model is still compared
            return
        for prefix in ("[ONNXRuntimeError] :",):
            if prefix in text:
                text = text.split(prefix, 1)[1].strip()
        if len(text) > 400:
            text = text[:397] + "..."
        raise SbsInputError(
            f"onnxruntime cannot build a session for the ONNX model: {text}. The model "
            "cannot run as it is: export it again, or pick another runner (runner='torch' "
            "or 'reference')"
        ) from None


class OnnxruntimeCheck:
    """:func:`check_onnxruntime_builds` in a thread: onnxruntime builds the session while
    the program is prepared (it releases the GIL), and :meth:`result` raises its refusal."""

    def __init__(self, model: onnx.ModelProto, key: str | None = None) -> None:
        self._error: SbsInputError | None = None
        self._key = key
        # the thread gets bytes, not the model the run goes on reading
        self._thread = threading.Thread(
            target=self._run, args=(_shell_bytes(model),), name="onnx-sbs-model-check", daemon=True
        )
        self._thread.start()

    def _run(self, model: bytes | None) -> None:
        try:
            check_onnxruntime_builds(model)
        except SbsInputError as e:
            self._error = e
        except Exception:  # noqa: BLE001 - a check that cannot run refuses nothing
            pass

    def result(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error
        if self._key is not None:
            if len(_BUILT) >= _BUILT_KEPT:
                _BUILT.pop(next(iter(_BUILT)))
            _BUILT[self._key] = None


# structures onnxruntime built a session for: a second run of the same model checks nothing
_BUILT: dict[str, None] = {}
_BUILT_KEPT = 64


class _Done:
    def result(self) -> None:
        return None


def start_onnxruntime_check(model: onnx.ModelProto, digest: str) -> OnnxruntimeCheck | _Done:
    """The onnxruntime check of ``model`` started (done at once when a model of the same
    structure, opsets and functions was built before); ``.result()`` raises a refusal."""
    h = hashlib.sha256(digest.encode())
    h.update(str(model.ir_version).encode())
    for o in model.opset_import:
        h.update(f"\0{o.domain}\1{o.version}".encode())
    for f in model.functions:
        h.update(f.SerializeToString())
    key = h.hexdigest()
    if key in _BUILT:
        return _Done()
    return OnnxruntimeCheck(model, key)


__all__ = [
    "MAX_NESTING",
    "OnnxruntimeCheck",
    "check_graph",
    "in_run_order",
    "check_model",
    "check_nesting",
    "check_opset",
    "check_tensors",
    "check_onnxruntime_builds",
    "start_onnxruntime_check",
]
