"""The graph onnxruntime actually runs: the model after its graph optimizations.

Every node of a side-by-side run executes in its own one-node session, so onnxruntime's
graph optimizations (fusions, QDQ rewrites, constant folding, layout changes) never
happen there.  A deployed session applies them (``ORT_ENABLE_ALL`` is the default), and a
fused kernel may compute something else than the nodes it replaced.  This module asks
onnxruntime for the optimized model at a level and on execution providers
(``SessionOptions.optimized_model_filepath``), loads it back and maps it onto the
original:

- a fused or contrib node keeps the names of the values it produces, so it pairs with
  torch values (and with the values of the unoptimized model) by name; its
  :class:`OptimizedNode` says which original nodes it stands for (``replaced``) and which
  original values it made internal (``internal``): those have no counterpart any more and
  are reported as internal to it, never as unpaired noise;
- onnxruntime writes nodes without their ``metadata_props``: each node gets those of the
  original node it comes from, so pairing by the exporter's ``pkg.torch.onnx.fx_node``
  keeps working on the optimized graph;
- the optimizers that changed the graph are read from the session itself (its log says,
  for each graph transformer, whether it modified the graph), not from a list kept here.

The optimized model is an ordinary ``ModelProto``: the engine runs it node by node
exactly as it runs the original.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import onnx

from ...errors import SbsInputError
from ...files import atomic_folder, make_parent, write_bytes_atomic
from ...option_names import OPTIMIZE_LEVELS
from ..source.fx_metadata import FX_NODE_KEY
from ..source.loading import load_onnx_model

# optimize= levels, mildest first; "layout" exists from onnxruntime 1.22 on
LEVELS = OPTIMIZE_LEVELS
_ORT_LEVEL_NAMES = {
    "disabled": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "layout": "ORT_ENABLE_LAYOUT",
    "all": "ORT_ENABLE_ALL",
}

# Values of OptimizedNode.kind
NODE_UNCHANGED = "unchanged"  # the original node, as it was
NODE_REWRITTEN = "rewritten"  # one original node, changed (inputs, op or attributes)
NODE_FUSED = "fused"  # stands for several original nodes
NODE_INSERTED = "inserted"  # new: stands for no original node (a layout Transpose, say)

# metadata this module writes on the optimized nodes (the exporter's keys are carried over)
META_KIND = "pkg.onnx_sbs_nb.optimized_kind"
META_REPLACED = "pkg.onnx_sbs_nb.replaced"
META_INTERNAL = "pkg.onnx_sbs_nb.internal_values"
META_GROUP = "pkg.onnx_sbs_nb.part_of"

_TRANSFORMER_LINE = re.compile(r"GraphTransformer (\S+) modified: (\d)")
_ORT_INFO = re.compile(r"\[[IV]:onnxruntime")
# expected whenever a level above "extended" is saved: we run it where it was made
_HARDWARE_WARNING = "may contain hardware specific optimizations"
# protobuf cannot serialise 2 GiB; beyond this much weight data the model goes through a file
_INLINE_LIMIT = 1 << 30


@dataclass
class OptimizedNode:
    """One node of the optimized graph, mapped onto the original graph."""

    name: str  # its name (or OpType_index when it has none), as the engine names it
    index: int  # position in the optimized graph
    op_type: str
    domain: str
    kind: str  # NODE_UNCHANGED, NODE_REWRITTEN, NODE_FUSED or NODE_INSERTED
    replaced: list[str] = field(default_factory=list)  # original node names
    internal: list[str] = field(default_factory=list)  # original values it made internal
    origin: str | None = None  # the original node whose metadata it carries
    group: str | None = None  # the node it is part of (its own name, or its fused node's)


@dataclass
class OptimizedModel:
    """The model onnxruntime runs at ``level`` on ``providers``, mapped onto the original."""

    model: onnx.ModelProto  # optimized, with the original nodes' metadata carried over
    original: onnx.ModelProto
    level: str
    providers: list[str]
    applied: list[str]  # optimizers that modified the graph, in the order they first did
    nodes: list[OptimizedNode]
    internal: dict[str, str]  # original value -> optimized node it is internal to
    folded: dict[str, str]  # original node -> initializer now holding its output
    removed: list[str]  # original nodes no longer computed at all (eliminated)
    # original value -> the optimized value computing it anew (float16 run as float32)
    renamed: dict[str, str] = field(default_factory=dict)
    disabled: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def node(self, name: str) -> OptimizedNode:
        """An optimized node by name or by the name of a value it produces."""
        for n in self.nodes:
            if n.name == name:
                return n
        for n, proto in zip(self.nodes, self.model.graph.node):
            if name in proto.output:
                return n
        raise KeyError(f"the optimized graph has no node named {name!r} or producing it")

    @property
    def changed(self) -> list[OptimizedNode]:
        """The nodes the optimizers made (fused, rewritten or inserted), one per group."""
        return [n for n in self.nodes if n.kind != NODE_UNCHANGED and n.group == n.name]

    def group(self, name: str) -> OptimizedNode:
        """The node a node is part of (a layout Transpose belongs to its fused kernel)."""
        return self.node(self.node(name).group or name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "providers": list(self.providers),
            "applied": list(self.applied),
            "disabled": list(self.disabled),
            "nodes": [asdict(n) for n in self.nodes],
            "internal": dict(self.internal),
            "folded": dict(self.folded),
            "removed": list(self.removed),
            "renamed": dict(self.renamed),
            "notes": list(self.notes),
        }


@dataclass
class SessionInfo:
    """A whole-model session and what onnxruntime said while building it."""

    session: Any  # onnxruntime.InferenceSession
    applied: list[str]  # optimizers that modified the graph (empty when the log is unreadable)
    log_read: bool  # False: this process's stderr could not be captured
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- temp files
_PROCESS_TMP: Path | None = None
_TMP_LOCK = threading.Lock()


def process_temp_dir() -> Path:
    """This process's own temporary folder, removed at exit."""
    global _PROCESS_TMP
    with _TMP_LOCK:
        if _PROCESS_TMP is None or not _PROCESS_TMP.is_dir():
            _PROCESS_TMP = Path(tempfile.mkdtemp(prefix=f"onnx_sbs_nb_{os.getpid()}_"))
            atexit.register(shutil.rmtree, _PROCESS_TMP, True)
        return _PROCESS_TMP


def _weight_bytes(model: onnx.ModelProto) -> int:
    total = 0
    for init in model.graph.initializer:
        total += len(init.raw_data) if init.raw_data else init.ByteSize()
    return total


def save_model(model: onnx.ModelProto, path: str | os.PathLike) -> Path:
    """Saves ``model`` at ``path``; its weights go to ``<name>.data`` beside it when they
    are too large for one protobuf.  The caller's model keeps its weights."""
    path = Path(path)
    if _weight_bytes(model) < _INLINE_LIMIT:
        write_bytes_atomic(path, model.SerializeToString())
        return path
    # onnx.save moves the weights out of the proto it saves: save a copy, the caller's
    # model stays whole (the copy lives only while the file is written)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    # onnx appends to the data file it names: both are written in a fresh folder
    with atomic_folder(make_parent(path).parent) as tmp:
        onnx.save(
            copy, str(tmp / path.name), save_as_external_data=True, location=path.name + ".data"
        )
    del copy
    return path


@contextlib.contextmanager
def _session_source(model: onnx.ModelProto, folder: Path) -> Iterator[str | bytes]:
    """What to hand onnxruntime: the serialised model, or a file when it is too large."""
    if _weight_bytes(model) < _INLINE_LIMIT:
        yield model.SerializeToString()
        return
    yield str(save_model(model, folder / "input.onnx"))


# ---------------------------------------------------------------- onnxruntime
def _ort():
    import onnxruntime

    return onnxruntime


def ort_level(level: str) -> Any:
    ort = _ort()
    name = _ORT_LEVEL_NAMES.get(level)
    if name is None or not hasattr(ort.GraphOptimizationLevel, name):
        known = [lv for lv in LEVELS if hasattr(ort.GraphOptimizationLevel, _ORT_LEVEL_NAMES[lv])]
        raise SbsInputError(f"optimize={level!r} is not a level: use one of {known}")
    return getattr(ort.GraphOptimizationLevel, name)


def check_providers(providers: Sequence[Any] | None) -> list[Any]:
    """The providers to use (CPU by default); an unavailable one is an input error."""
    if providers is None:
        return ["CPUExecutionProvider"]
    if isinstance(providers, str):
        providers = [providers]
    available = _ort().get_available_providers()
    out = []
    for p in providers:
        name = p[0] if isinstance(p, tuple | list) else p
        if name not in available:
            raise SbsInputError(
                f"execution provider {name!r} is not available in this onnxruntime build "
                f"(available: {available}): install the onnxruntime package that has it "
                "(onnxruntime-gpu for CUDAExecutionProvider) or pick one of those"
            )
        out.append(tuple(p) if isinstance(p, list) else p)
    return out


_STDERR_LOCK = threading.Lock()


@contextlib.contextmanager
def _captured_stderr() -> Iterator[list[str]]:
    """Captures what native code writes to file descriptor 2 (onnxruntime's log).

    Yields a list that holds the captured text once the block ends; stays empty when the
    descriptor cannot be redirected.  Lines that are not onnxruntime's info log are
    written back, so nothing another thread printed meanwhile is lost.
    """
    out: list[str] = []
    with _STDERR_LOCK:
        try:
            sys.stderr.flush()
            saved = os.dup(2)
        except (OSError, ValueError):
            yield out
            return
        with tempfile.TemporaryFile(dir=process_temp_dir()) as f:
            os.dup2(f.fileno(), 2)
            try:
                yield out
            finally:
                os.dup2(saved, 2)
                os.close(saved)
                f.seek(0)
                out.append(f.read().decode("utf-8", "replace"))


def _parse_log(text: str) -> tuple[list[str], list[str], list[str]]:
    """(optimizers that modified the graph, notes, lines to give back to stderr)."""
    applied: list[str] = []
    notes: list[str] = []
    others: list[str] = []
    for line in text.splitlines():
        m = _TRANSFORMER_LINE.search(line)
        if m:
            if m.group(2) == "1" and m.group(1) not in applied:
                applied.append(m.group(1))
            continue
        if _ORT_INFO.search(line):
            continue
        if _HARDWARE_WARNING in line:
            notes.append(
                "onnxruntime: the optimized model may hold hardware-specific kernels "
                "(NCHWc layout); it is run here, on the machine that made it"
            )
            continue
        if line.strip():
            others.append(line)
    return applied, notes, others


def ort_session(
    model: onnx.ModelProto,
    level: str,
    providers: Sequence[Any] | None = None,
    *,
    disabled_optimizers: Sequence[str] = (),
    optimized_model_path: str | Path | None = None,
    session_config: dict[str, str] | None = None,
) -> SessionInfo:
    """A whole-model session at ``level`` ("disabled" too), reading what it applied."""
    ort = _ort()
    so = ort.SessionOptions()
    so.graph_optimization_level = ort_level(level)
    # INFO is where each graph transformer says whether it modified the graph
    so.log_severity_level = 1
    for k, v in (session_config or {}).items():
        so.add_session_config_entry(k, v)
    if optimized_model_path is not None:
        path = Path(optimized_model_path)
        so.optimized_model_filepath = str(path)
        # weights go to a side file: an optimized model can exceed protobuf's 2 GiB
        so.add_session_config_entry(
            "session.optimized_model_external_initializers_file_name", path.name + ".data"
        )
        so.add_session_config_entry(
            "session.optimized_model_external_initializers_min_size_in_bytes", "1024"
        )
    providers = check_providers(providers)
    kwargs: dict[str, Any] = {}
    if disabled_optimizers:
        kwargs["disabled_optimizers"] = list(disabled_optimizers)
    with tempfile.TemporaryDirectory(dir=process_temp_dir()) as folder:
        with _session_source(model, Path(folder)) as source, _captured_stderr() as log:
            try:
                session = ort.InferenceSession(source, so, providers=providers, **kwargs)
                error = None
            except Exception as e:
                session, error = None, e
    text = log[0] if log else ""
    applied, notes, others = _parse_log(text)
    if others:
        sys.stderr.write("\n".join(others) + "\n")
    if error is not None:
        raise SbsInputError(
            f"onnxruntime could not build a session at level {level!r} on {providers} "
            f"({type(error).__name__}: {str(error).strip()[:500]})"
        ) from error
    log_read = (bool(log) and "GraphTransformer" in text) or level == "disabled"
    return SessionInfo(session, applied, log_read, notes)


def optimize_model(
    onx: Any,
    level: str = "all",
    providers: Sequence[Any] | None = None,
    *,
    disabled_optimizers: Sequence[str] = (),
    session_config: dict[str, str] | None = None,
) -> OptimizedModel:
    """The model onnxruntime runs at ``level`` on ``providers``, mapped onto ``onx``.

    ``disabled_optimizers``: optimizer names to leave out (``InferenceSession``'s
    ``disabled_optimizers``); ``session_config``: extra session config entries (e.g.
    ``{"session.x64quantprecision": "1"}``).  The optimized file is written in a folder
    inside this process's temporary folder, loaded back (external data included) and
    removed.
    """
    original = load_onnx_model(onx)
    if level not in LEVELS:
        raise SbsInputError(f"optimize={level!r} is not a level: use one of {list(LEVELS)}")
    providers = check_providers(providers)
    with tempfile.TemporaryDirectory(dir=process_temp_dir()) as folder:
        path = Path(folder) / "optimized.onnx"
        info = ort_session(
            original,
            level,
            providers,
            disabled_optimizers=disabled_optimizers,
            optimized_model_path=path,
            session_config=session_config,
        )
        del info.session
        optimized = onnx.load(str(path), load_external_data=True)
    mapped = map_onto_original(original, optimized)
    carry_metadata(original, optimized, mapped.nodes)
    _drop_stale_value_info(optimized)
    _declare_types(optimized, providers)
    notes = list(info.notes)
    if not info.log_read:
        notes.append(
            "the optimizers applied are unknown: onnxruntime's log could not be read "
            "(stderr is not a file descriptor in this process)"
        )
    return OptimizedModel(
        model=optimized,
        original=original,
        level=level,
        providers=[p if isinstance(p, str) else p[0] for p in providers],
        applied=info.applied,
        nodes=mapped.nodes,
        internal=mapped.internal,
        folded=mapped.folded,
        removed=mapped.removed,
        renamed=mapped.renamed,
        disabled=list(disabled_optimizers),
        notes=notes,
    )


# ---------------------------------------------------------------- mapping
def node_name(node: onnx.NodeProto, k: int) -> str:
    """A node's name as the engine names it."""
    return node.name or f"{node.op_type}_{k}"


def _opset(model: onnx.ModelProto, domain: str) -> int | None:
    for o in model.opset_import:
        if o.domain == domain or (domain in ("", "ai.onnx") and o.domain in ("", "ai.onnx")):
            return o.version
    return None


def _attributes(node: onnx.NodeProto, opset: int | None) -> dict[str, bytes]:
    """Attributes with the schema's defaults filled in (onnxruntime writes them out)."""
    attrs = {}
    for a in node.attribute:
        b = onnx.AttributeProto()
        b.CopyFrom(a)
        b.ClearField("doc_string")
        attrs[a.name] = b.SerializeToString()
    if opset is not None:
        try:
            schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
        except Exception:
            return attrs
        for name, spec in schema.attributes.items():
            if name not in attrs and spec.default_value.type:
                d = onnx.AttributeProto()
                d.CopyFrom(spec.default_value)
                d.name = name
                attrs[name] = d.SerializeToString()
    return attrs


def _same_node(a: onnx.NodeProto, ma: onnx.ModelProto, b: onnx.NodeProto, mb) -> bool:
    if (a.op_type, a.domain, list(a.input), list(a.output)) != (
        b.op_type,
        b.domain,
        list(b.input),
        list(b.output),
    ):
        return False
    return _attributes(a, _opset(ma, a.domain)) == _attributes(b, _opset(mb, b.domain))


@dataclass
class GraphMap:
    """How an optimized graph relates to its original (see :func:`map_onto_original`)."""

    nodes: list[OptimizedNode]
    internal: dict[str, str]  # original value -> optimized node it is internal to
    folded: dict[str, str]  # original node -> initializer now holding its output
    removed: list[str]  # original nodes no longer computed
    renamed: dict[str, str]  # original value -> optimized value computing it anew


def map_onto_original(original: onnx.ModelProto, optimized: onnx.ModelProto) -> GraphMap:
    """For each optimized node, the original nodes it stands for.

    An optimized node stands for the original nodes that computed its outputs from its
    inputs: walking the original graph back from the producers of its outputs, through
    values that no longer exist in the optimized graph, until its own inputs (or any
    value still computed, stored or fed).  A node that keeps an original node's name and
    op but writes new values (a float16 node onnxruntime runs in float32 between Casts)
    is that node, its values renamed.  New nodes wired to a mapped node through new
    values (the Transposes around an NHWC kernel, a bias DequantizeLinear, precision
    Casts) form one group with it, named after the member onnxruntime named after a
    replaced node.
    """
    og, ng = original.graph, optimized.graph
    orig_names = [node_name(n, k) for k, n in enumerate(og.node)]
    names = [node_name(n, j) for j, n in enumerate(ng.node)]
    orig_producer = {o: k for k, n in enumerate(og.node) for o in n.output if o}
    orig_values = set(orig_producer) | {i.name for i in og.input} | {i.name for i in og.initializer}
    new_inits = {i.name for i in ng.initializer}
    new_produced = {o: j for j, n in enumerate(ng.node) for o in n.output if o}
    available = new_inits | {i.name for i in ng.input} | set(new_produced)

    twins, renamed = _twins(og, ng, orig_names, names, orig_values, available)
    back = {new: old for old, new in renamed.items()}
    computed = available | set(renamed)  # original values still computed, maybe renamed
    covering: list[list[int]] = []
    touched: dict[int, int] = {}  # adapter node -> the twin whose original value it writes
    for j, node in enumerate(ng.node):
        if j in twins:
            covering.append([twins[j]])
            continue
        outs = [back.get(o, o) for o in node.output if o]
        ins = {back.get(i, i) for i in node.input if i}
        stop = (computed - set(outs)) | ins
        ks, twin = _covered(og, orig_producer, stop, outs, set(twins.values()))
        covering.append(ks)
        if not ks and twin is not None:
            touched[j] = next(t for t, k in twins.items() if k == twin)
    covered = {k for ks in covering for k in ks}

    # groups: a mapped node plus the new nodes wired to it through new values
    group_of: dict[int, int] = {}
    members: dict[int, list[int]] = {}

    def new_inputs(p: int) -> list[str]:
        return [i for i in ng.node[p].input if i and i not in orig_values and i in new_produced]

    for j in range(len(ng.node)):
        if not covering[j] or j in group_of:
            continue
        group = [j]
        stack = new_inputs(j)
        while stack:
            p = new_produced[stack.pop()]
            if covering[p] or p in group_of or p in group:
                continue
            group.append(p)
            stack.extend(new_inputs(p))
        group += [a for a, t in touched.items() if t == j and a not in group_of]
        for p in group:
            group_of[p] = j
        members[j] = group

    nodes = [
        OptimizedNode(names[j], j, node.op_type, node.domain, NODE_INSERTED)
        for j, node in enumerate(ng.node)
    ]
    internal: dict[str, str] = {}
    for j, group in members.items():
        ks = sorted({k for p in group for k in covering[p]})
        replaced = [orig_names[k] for k in ks]
        main = _main_member(group, names, replaced)
        firsts = [orig_producer.get(back.get(o, o)) for o in ng.node[j].output if o]
        origin = orig_names[firsts[0]] if firsts and firsts[0] in ks else replaced[-1]
        hidden = [
            o
            for k in ks
            for o in og.node[k].output
            if o and o not in computed and o not in internal
        ]
        for o in hidden:
            internal[o] = names[main]
        if len(ks) > 1:
            kind = NODE_FUSED
        elif (
            len(group) == 1
            and replaced[0] == names[j]
            and _same_node(og.node[ks[0]], original, ng.node[j], optimized)
        ):
            kind = NODE_UNCHANGED
        else:
            kind = NODE_REWRITTEN
        for p in group:
            nodes[p].group, nodes[p].origin = names[main], origin
        m = nodes[main]
        m.kind, m.replaced, m.internal = kind, replaced, hidden
    for n in nodes:
        if n.group is None:
            n.group = n.name
    _inserted_origins(optimized, nodes)
    folded: dict[str, str] = {}
    removed: list[str] = []
    for k, n in enumerate(og.node):
        if k in covered:
            continue
        stored = [o for o in n.output if o and o in new_inits]
        if stored:
            folded[orig_names[k]] = stored[0]
        else:
            removed.append(orig_names[k])
    return GraphMap(nodes, internal, folded, removed, renamed)


def _twins(og, ng, orig_names, names, orig_values, available):
    """Optimized nodes that keep an original node's name and op but write new values.

    Returns ({optimized index: original index}, {original value: new value}); the
    renames come from the twins' outputs, and from their inputs where an original value
    that no longer exists is fed under a new name.
    """
    by_name = {name: k for k, name in enumerate(orig_names)}
    twins: dict[int, int] = {}
    renamed: dict[str, str] = {}
    for j, node in enumerate(ng.node):
        k = by_name.get(names[j])
        if k is None:
            continue
        orig = og.node[k]
        if (orig.op_type, orig.domain, len(orig.output)) != (
            node.op_type,
            node.domain,
            len(node.output),
        ):
            continue
        if any(o in orig_values for o in node.output if o):
            continue  # it keeps its names: an ordinary node
        twins[j] = k
        for a, b in zip(orig.output, node.output):
            if a and b and a not in available:
                renamed[a] = b
    for j, k in twins.items():
        for a, b in zip(og.node[k].input, ng.node[j].input):
            if a and b and a != b and a not in available and b not in orig_values:
                renamed.setdefault(a, b)
    return twins, renamed


def _covered(og, orig_producer, stop, outputs, twin_owned) -> tuple[list[int], int | None]:
    """Original nodes between a node's inputs (``stop``) and its ``outputs``.

    Also returns an original node the walk reached that a twin already stands for.
    """
    stack = [orig_producer[o] for o in outputs if o in orig_producer]
    seen: set[int] = set()
    twin = None
    while stack:
        k = stack.pop()
        if k in seen:
            continue
        if k in twin_owned:
            twin = k
            continue
        seen.add(k)
        for v in og.node[k].input:
            if v and v not in stop and v in orig_producer:
                stack.append(orig_producer[v])
    return sorted(seen), twin


def _main_member(group: list[int], names: list[str], replaced: list[str]) -> int:
    """The member onnxruntime named after a replaced node (it names new nodes so)."""
    best, best_len = group[0], -1
    for p in group:
        for r in replaced:
            if r in names[p] and len(r) > best_len:
                best, best_len = p, len(r)
    return best


def _inserted_origins(optimized: onnx.ModelProto, nodes: list[OptimizedNode]) -> None:
    """A new node in no group takes the origin of the nearest mapped node it feeds
    (else of the nearest one feeding it), so it carries an fx node too."""
    g = optimized.graph
    consumers: dict[str, list[int]] = {}
    producer: dict[str, int] = {}
    for j, n in enumerate(g.node):
        for i in n.input:
            consumers.setdefault(i, []).append(j)
        for o in n.output:
            if o:
                producer[o] = j

    def search(start: int, step) -> str | None:
        frontier, seen = [start], {start}
        while frontier:
            nxt = []
            for j in frontier:
                for k in step(j):
                    if k in seen:
                        continue
                    seen.add(k)
                    if nodes[k].origin is not None:
                        return nodes[k].origin
                    nxt.append(k)
            frontier = nxt
        return None

    def downstream(j: int) -> list[int]:
        return [k for o in g.node[j].output for k in consumers.get(o, ())]

    def upstream(j: int) -> list[int]:
        return [producer[i] for i in g.node[j].input if i in producer]

    for j, n in enumerate(nodes):
        if n.origin is None:
            n.origin = search(j, downstream) or search(j, upstream)


def carry_metadata(
    original: onnx.ModelProto, optimized: onnx.ModelProto, nodes: list[OptimizedNode]
) -> None:
    """Gives each optimized node the metadata of its origin, plus what it replaced."""
    og, ng = original.graph, optimized.graph
    by_name = {node_name(n, k): n for k, n in enumerate(og.node)}
    for mapped, node in zip(nodes, ng.node):
        if not node.metadata_props and mapped.origin in by_name:
            for p in by_name[mapped.origin].metadata_props:
                node.metadata_props.add(key=p.key, value=p.value)
        if mapped.kind != NODE_UNCHANGED:
            _set_meta(node, META_KIND, mapped.kind)
            if mapped.replaced:
                _set_meta(node, META_REPLACED, json.dumps(mapped.replaced))
            if mapped.internal:
                _set_meta(node, META_INTERNAL, json.dumps(mapped.internal))
            if mapped.group != mapped.name:
                _set_meta(node, META_GROUP, mapped.group)
    inits = {i.name: i for i in og.initializer}
    producer = {o: n for n in og.node for o in n.output if o}
    for init in ng.initializer:
        if init.metadata_props:
            continue
        src = inits.get(init.name)
        if src is not None:
            for p in src.metadata_props:
                init.metadata_props.add(key=p.key, value=p.value)
        elif init.name in producer:
            # a folded constant: the fx node it was computed for
            for p in producer[init.name].metadata_props:
                if p.key == FX_NODE_KEY:
                    init.metadata_props.add(key=p.key, value=p.value)
    if not optimized.metadata_props:
        for p in original.metadata_props:
            optimized.metadata_props.add(key=p.key, value=p.value)


def _set_meta(node: onnx.NodeProto, key: str, value: str) -> None:
    for p in node.metadata_props:
        if p.key == key:
            p.value = value
            return
    node.metadata_props.add(key=key, value=value)


def _declare_types(model: onnx.ModelProto, providers: Sequence[Any]) -> None:
    """Declares the type of every value onnxruntime created (it writes none).

    A value of unknown type pairs with anything of the same name or metadata; a float32
    value computing a float16 one would then be compared as if it were that value.  The
    types come from onnxruntime itself (it knows its contrib ops), from a session of the
    graph without its weights: the initializers become typed inputs, nothing is folded.
    """
    g = model.graph
    known = {vi.name for vi in [*g.value_info, *g.input, *g.output]}
    known |= {i.name for i in g.initializer}
    missing = [o for n in g.node for o in n.output if o and o not in known]
    if not missing:
        return
    ort = _ort()
    light = onnx.ModelProto()  # no weight is copied
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    lg = light.graph
    lg.node.extend(g.node)
    lg.input.extend(g.input)
    lg.input.extend(
        onnx.helper.make_tensor_value_info(i.name, i.data_type, list(i.dims)) for i in g.initializer
    )
    lg.output.extend(g.output)
    lg.output.extend(onnx.ValueInfoProto(name=o) for o in missing)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    try:
        sess = ort.InferenceSession(light.SerializeToString(), so, providers=list(providers))
    except Exception:  # a kernel that insists on constant weights: types stay unknown
        return
    wanted = set(missing)
    for out in sess.get_outputs():
        if out.name not in wanted or not out.type.startswith("tensor("):
            continue
        elem = getattr(onnx.TensorProto, out.type[7:-1].upper(), None)
        if elem is None:
            continue
        dims = [d if isinstance(d, int) else None for d in (out.shape or [])]
        g.value_info.append(onnx.helper.make_tensor_value_info(out.name, elem, dims))


def _drop_stale_value_info(model: onnx.ModelProto) -> None:
    """onnxruntime keeps the value_info of values it removed; they describe nothing."""
    g = model.graph
    live = {i.name for i in g.input} | {i.name for i in g.initializer}
    for n in g.node:
        live.update(n.input)
        live.update(n.output)
    kept = [vi for vi in g.value_info if vi.name in live]
    del g.value_info[:]
    g.value_info.extend(kept)


__all__ = [
    "LEVELS",
    "NODE_FUSED",
    "NODE_INSERTED",
    "NODE_REWRITTEN",
    "NODE_UNCHANGED",
    "OptimizedModel",
    "OptimizedNode",
    "GraphMap",
    "SessionInfo",
    "check_providers",
    "map_onto_original",
    "optimize_model",
    "ort_session",
    "process_temp_dir",
    "save_model",
]
