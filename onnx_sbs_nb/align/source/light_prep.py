"""The exporter's preparation of a program, reproduced without re-tracing the program.

``torch.onnx.export`` re-traces the whole program with fake tensors before lowering it
(``run_decompositions`` with its table, then explicit type promotions, then no
assertions): seconds on a small Llama, and a cost that grows faster than the graph.
Almost every node comes out of that re-trace unchanged; only the nodes whose op the
exporter decomposes change, and the re-trace renames everything after them.  This module
builds the same graph by walking the user's graph once:

* a node whose op is kept is copied, under the name the re-trace gives it (the same fx
  namespace rules, applied in the same order);
* the nodes whose op is decomposed are traced together, once per distinct signature
  (op, arguments, input shapes/strides/dtypes), with the exporter's decomposition
  table, and their expansion is spliced in;
* an in-place call on a value the program made becomes its functional op, and a view of
  the written value is made again where it is read (functionalization's rules);
* dead code goes, sizes are recomputed from the inputs' (the re-trace's own pass), type
  promotions are inserted by the exporter's own rules (reading the recorded dtypes,
  running only the nodes they change), assertions go.

It is a reproduction, so it is checked against the ONNX model before it is used
(:func:`.prep_check.disagreement`), and the exporter's preparation runs whenever the
check fails or this module declines the program (:class:`Unsupported`: sizes the data
decides, subgraphs, writes through views, into parameters, or into an input read after
the write, custom ops).  A write into a user input or a buffer is functionalized as the
re-trace does (:mod:`.input_writes`), and a view of a written value is made as
functionalization makes it (:mod:`.written_views`).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import operator
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from .exporter_ops import ExporterOps
from .input_writes import check_writable, mutation_outputs, read_only_before, written_input
from .unsupported import Unsupported
from .written_views import reserve_dropped_names, written_views

PASS_NAME = "onnx_sbs_nb.light_prep"

# the exporter's remove_assertion_nodes
_ASSERTION_TARGETS = (
    "aten.sym_constrain_range_for_size.default",
    "aten._assert_async.default",
    "aten._assert_async.msg",
    "aten._assert_scalar.default",
    "aten._assert_tensor_metadata.default",
)


# in-place ops that only change autograd metadata: functionalization drops them
_NO_OPS = (torch.ops.aten.detach_.default,)


# what functionalization records for an op, where it is not the op itself
_FUNCTIONAL_FORM = {torch.ops.aten.lift_fresh_copy.default: torch.ops.aten.clone.default}


@dataclass
class _Expansion:
    """How one decomposed call comes out of the re-trace, relative to its inputs."""

    nodes: list[tuple[Any, Any, Any, dict[str, Any]]]  # (target, args, kwargs, meta), _Refs
    output: Any  # the call's result: _Refs and constants in its structure


def _is_op(target: Any) -> bool:
    return isinstance(target, torch._ops.OpOverload)


def _candidate_name(graph: torch.fx.Graph, target: Any) -> str:
    """The name the re-trace proposes for a call (proxy_call's rule)."""
    if _is_op(target):
        return graph._target_to_str(target.overloadpacket.__name__)
    return graph._target_to_str(target)


def _check_supported(ep: torch.export.ExportedProgram) -> None:
    from torch.export.graph_signature import OutputKind

    gm = ep.graph_module
    for name, _ in gm.named_children():
        raise Unsupported(f"the program holds submodules (subgraphs: {name!r})")
    for spec in ep.graph_signature.output_specs:
        if spec.kind not in (OutputKind.USER_OUTPUT,):
            raise Unsupported(f"the program has {spec.kind.name} outputs (mutations)")
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    check_writable(ep, lambda n: _writes(n) and n.target not in _NO_OPS)
    for node in ep.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if free_unbacked_symbols(node.meta.get("val")):
            # sizes only the data decides (nonzero, item): tracing a call alone would
            # ask for them again
            raise Unsupported(f"node {node.name!r} has a data-dependent size")
        if node.op != "call_function":
            raise Unsupported(f"node {node.name!r} is a {node.op}")
        t = node.target
        if _is_op(t):
            if t._schema.is_mutable and t not in _NO_OPS and _functional_form(node) is None:
                raise Unsupported(f"node {node.name!r} mutates ({t})")
            if t.namespace not in ("aten", "prims"):
                raise Unsupported(f"node {node.name!r} calls a custom op ({t})")
        elif t is not operator.getitem and not _is_symbolic_arithmetic(t):
            raise Unsupported(f"node {node.name!r} calls {t!r}")


def _functional_form(node: torch.fx.Node) -> Any:
    """The op functionalization records for ``node``, an in-place call (``add_``) on a
    value the program made (``add``: the exported graph reads the call's result from then
    on, and a view of the value made before is made again where it is read); None for any
    other mutation (through a view, into an input)."""
    t = node.target
    args = t._schema.arguments
    written = [a for a in args if a.alias_info is not None and a.alias_info.is_write]
    name = t.overloadpacket.__name__
    if written != args[:1] or not name.endswith("_") or not node.args:
        return None
    packet = getattr(getattr(torch.ops, t.namespace), name[:-1], None)
    functional = getattr(packet, t._overloadname, None) if packet is not None else None
    if not _is_op(functional) or functional._schema.is_mutable:
        return None
    target = node.args[0]
    if not isinstance(target, torch.fx.Node):
        return None
    if not _fresh_value(target):
        # an input written in place: the re-trace returns the value it ends with
        if written_input(target) is None or not read_only_before(node, target):
            return None  # a write through a view
    readers = [(u, target) for u in target.users] + [(u, node) for u in node.users]
    if any(
        _views(user, value) and not _replayable(user) for user, value in readers if user is not node
    ):
        return None  # a view written through, or one the walk does not replay
    return functional


def _writes(node: torch.fx.Node) -> bool:
    return _is_op(node.target) and node.target._schema.is_mutable


def _pure_view(node: torch.fx.Node) -> bool:
    """A call returning one view of its first argument (``view``, ``unsqueeze``...)."""
    t = node.target
    if not _is_op(t) or t._schema.is_mutable or len(t._schema.returns) != 1:
        return False
    alias = t._schema.returns[0].alias_info
    return alias is not None and not alias.is_write and bool(node.args)


def _replayable(view: torch.fx.Node) -> bool:
    """A view of a written value that functionalization replays where it is read: a chain
    of pure views nothing writes through."""
    if not _pure_view(view):
        return False
    for user in view.users:
        if _writes(user) and user.args[0] is view:
            return False
        if _aliases(user) and not _replayable(user):
            return False
    return True


def _fresh_value(node: torch.fx.Node) -> bool:
    """``node``'s value is memory of its own: made by an op that returns no alias (or by
    an in-place call on such a value, itself functionalized)."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        source = node.args[0]
        return isinstance(source, torch.fx.Node) and _is_op(source.target) and not _aliases(source)
    if not _is_op(node.target):
        return False
    if _writes(node):
        return _functional_form(node) is not None
    return not _aliases(node)


def _views(user: torch.fx.Node, value: torch.fx.Node) -> bool:
    """``user`` makes an alias of ``value`` other than writing to it in place (another
    in-place call on it is functionalized in its turn)."""
    writes = _writes(user) and user.args[0] is value
    return _aliases(user) and not writes


def _aliases(node: torch.fx.Node) -> bool:
    """A call whose result may share memory with an input (a view, an in-place call)."""
    t = node.target
    if not _is_op(t):
        return t is operator.getitem and _aliases(node.args[0])
    return any(r.alias_info is not None for r in t._schema.returns)


def _aliases_op(target: Any) -> bool:
    return _is_op(target) and any(r.alias_info is not None for r in target._schema.returns)


def _is_symbolic_arithmetic(target: Any) -> bool:
    """Python arithmetic on sizes (``operator.mul``, ``torch.sym_max``...): the re-trace
    keeps these calls as they are."""
    module = getattr(target, "__module__", None)
    return module in ("_operator", "operator", "math") or (
        module == "torch" and getattr(target, "__name__", "").startswith("sym_")
    )


def _fake_mode(ep: torch.export.ExportedProgram) -> Any:
    from torch._guards import detect_fake_mode

    vals = [n.meta.get("val") for n in ep.graph.nodes if n.op == "placeholder"]
    mode = detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])
    if mode is None:
        raise Unsupported("the program's placeholders carry no fake tensors")
    return mode


def _signature(node: torch.fx.Node) -> Any:
    """What decides a decomposition's result: the op, constants, input metadata."""

    def meta(a: torch.fx.Node) -> Any:
        v = a.meta.get("val")
        if isinstance(v, torch.Tensor):
            return ("T", v.dtype, _sizes(v.shape), _sizes(v.stride()), str(v.device))
        if isinstance(v, torch.SymInt | torch.SymFloat | torch.SymBool):
            return ("S", type(v).__name__, v.node.expr)
        return ("V", repr(v))

    flat, spec = torch.utils._pytree.tree_flatten((node.args, node.kwargs))
    items = tuple(
        meta(a) if isinstance(a, torch.fx.Node) else ("C", type(a).__name__, repr(a)) for a in flat
    )
    return (str(node.target), str(spec), items)


def _sizes(sizes: Any) -> tuple[Any, ...]:
    """Sizes as a key: symbolic ones by their expression (printing them costs more than
    tracing some calls)."""
    return tuple(d.node.expr if isinstance(d, torch.SymInt) else d for d in sizes)


def _trace_expansions(
    nodes: list[torch.fx.Node], ops: ExporterOps, fake_mode: Any
) -> dict[Any, _Expansion]:
    """Traces every distinct decomposed call once, all in one make_fx trace."""
    unique: dict[Any, torch.fx.Node] = {}
    for n in nodes:
        unique.setdefault(_signature(n), n)
    if not unique:
        return {}
    from torch.export.exported_program import (
        _override_composite_implicit_decomp,
        _special_op_to_preserve_cia,
    )

    # ops with an ONNX function stay whole, inside a decomposition too, and the ops the
    # exporter decomposes with a Python function use it there too (as in the re-trace)
    keep = {op: _special_op_to_preserve_cia for op in ops.preserved_ops()}
    keep.update(ops.cia_overrides())
    # entered once: overriding the decompositions walks every op's kernels
    with (
        _trace_context(fake_mode),
        _override_composite_implicit_decomp(keep),
        torch._dispatch.python.enable_python_dispatcher(),
    ):
        result = _traced(unique, ops)
        # functionalization costs every op a detour: only for the calls that need it
        mutating = {k: unique[k] for k, e in result.items() if _mutates(e)}
        if mutating:
            result.update(_traced(mutating, ops, functional=True))
        return result


def _traced(
    unique: dict[Any, torch.fx.Node], ops: ExporterOps, functional: bool = False
) -> dict[Any, _Expansion]:
    # a call whose result does not depend on its symbolic sizes is traced on sizes of its
    # own (cheap), the rest with symbolic sizes (each size op a sympy question)
    generic = set() if functional else {k for k, n in unique.items() if _size_free_call(n)}
    result = _trace_calls(unique, ops, functional, generic)
    rest = {k: unique[k] for k in unique.keys() - result.keys() if k in generic}
    if rest:
        # its expansion read a size after all: traced again, symbolically
        result.update(_trace_calls(rest, ops, functional))
    for key in unique.keys() - result.keys():
        # it read a size the tracer knew from another call: traced alone, it reads its
        # sizes from its own inputs (at a trace's cost)
        alone = _trace_calls({key: unique[key]}, ops, functional)
        if key not in alone:
            raise Unsupported(f"a decomposition of {unique[key].name!r} reads another value")
        result.update(alone)
    return result


def _mutates(expansion: _Expansion) -> bool:
    return any(
        isinstance(t, torch._ops.OpOverload) and t._schema.is_mutable for t, *_ in expansion.nodes
    )


class _CrossRead(Unsupported):
    """A traced call read a value that belongs to another call."""


def _trace_calls(
    unique: dict[Any, torch.fx.Node],
    ops: ExporterOps,
    functional: bool = False,
    generic: set[Any] = frozenset(),
) -> dict[Any, _Expansion]:
    """The expansions of ``unique``'s calls (signature -> call), traced in one make_fx
    (inside :func:`_trace_expansions`' contexts), less those that read a value of another
    call; ``functional``: through functionalization, as the re-trace does; ``generic``:
    the calls traced on concrete sizes (:func:`_size_free_call`), less those whose
    expansion then reads a size (:func:`_size_free_expansion`)."""
    from torch.fx.experimental.proxy_tensor import get_proxy_mode, make_fx

    keys = list(unique)
    inputs: list[torch.fx.Node] = []
    spans: list[tuple[int, int]] = []
    values: list[Any] = []
    for key in keys:
        start = len(inputs)
        torch.fx.node.map_arg((unique[key].args, unique[key].kwargs), inputs.append)
        spans.append((start, len(inputs)))
        make = _concrete if key in generic else _fresh
        values += [make(a.meta["val"]) for a in inputs[start:]]
    made: list[tuple[list[torch.fx.Node], Any]] = []  # per call: the nodes it made, its result

    def fn(*flat: Any) -> list[Any]:
        graph = get_proxy_mode().tracer.graph
        outs = []
        for key, (start, stop) in zip(keys, spans):
            node = unique[key]
            args, kwargs = _bind(node, flat[start:stop])
            last = graph._root.prev  # the graph's last node before the call
            out = node.target(*args, **kwargs)
            mine = []
            while (last := last.next) is not graph._root:
                mine.append(last)
            made.append((mine, out))
            outs.append(out)
        return torch.utils._pytree.tree_leaves(outs)

    gm = make_fx(
        _functionalized(fn) if functional else fn,
        decomposition_table=ops.python_table(),
        tracing_mode="real",
        pre_dispatch=False,
        record_module_stack=True,
    )(*values)
    traced = list(gm.graph.nodes)
    kept = set(traced)  # the tracer drops the size reads nothing used
    placeholders = [n for n in traced if n.op == "placeholder"]
    flat_outs = list(traced[-1].args[0])
    result: dict[Any, _Expansion] = {}
    pos = 0  # position of the call's first result among the trace's outputs
    for key, (start, stop), (nodes, out) in zip(keys, spans, made):
        mine = [n for n in nodes if n in kept and n.op == "call_function"]
        local = {n: j for j, n in enumerate(mine)}
        local_in = {placeholders[k]: k - start for k in range(start, stop)}

        def ref(a: torch.fx.Node, local: dict = local, local_in: dict = local_in) -> _Ref:
            if a in local:
                return _Ref("node", local[a])
            if a in local_in:
                return _Ref("in", local_in[a])
            raise _CrossRead(f"a decomposition reads another call's value ({a.name})")

        leaves, spec = torch.utils._pytree.tree_flatten(out)
        outs = flat_outs[pos : pos + len(leaves)]
        pos += len(leaves)
        try:
            templ = [
                (n.target, *torch.fx.node.map_arg((n.args, n.kwargs), ref), n.meta) for n in mine
            ]
            refs = [
                ref(traced) if isinstance(traced, torch.fx.Node) else leaf
                for traced, leaf in zip(outs, leaves)
            ]
        except _CrossRead:
            continue  # left out: the caller traces it alone
        expansion = _Expansion(templ, torch.utils._pytree.tree_unflatten(refs, spec))
        if key in generic:
            expansion = _size_free_expansion(expansion, unique[key])
            if expansion is None:
                continue  # left out: the caller traces it with symbolic sizes
        result[key] = expansion
    return result


def _size_free_call(node: torch.fx.Node) -> bool:
    """A call that may be traced on concrete sizes: it reads only tensors, some with
    symbolic sizes, each of which (by its example's size) is at least 2, as size-oblivious
    tracing takes every symbolic size to be; and it makes one tensor."""
    if not isinstance(node.meta.get("val"), torch.Tensor):
        return False
    symbolic = False
    for a in node.all_input_nodes:
        val = a.meta.get("val")
        if not isinstance(val, torch.Tensor):
            return False
        for d in (*val.shape, *val.stride()):
            if isinstance(d, torch.SymInt):
                hint = d.node.hint
                if hint is None or (hint < 2 and d in val.shape):
                    return False
                symbolic = True
    return symbolic


_SIZE_FREE = (bool, type(None), str, torch.dtype, torch.device, torch.layout, torch.memory_format)


def _size_free_expansion(expansion: _Expansion, node: torch.fx.Node) -> _Expansion | None:
    """An expansion traced on concrete sizes, with the call's symbolic result as its
    value; None where it may depend on the sizes: more than one node, a mutation, or a
    number that is not one of the call's own arguments (a size the trace baked in)."""
    if not expansion.nodes:
        return expansion if isinstance(expansion.output, _Ref) else None
    if len(expansion.nodes) != 1 or expansion.output != _Ref("node", 0):
        return None
    target, args, kwargs, meta = expansion.nodes[0]
    if _is_op(target) and target._schema.is_mutable:
        return None
    own = [
        a
        for a in torch.utils._pytree.tree_leaves((node.args, node.kwargs))
        if not isinstance(a, torch.fx.Node)
    ]
    for leaf in torch.utils._pytree.tree_leaves((args, kwargs)):
        if isinstance(leaf, _Ref) or isinstance(leaf, _SIZE_FREE):
            continue
        if not (
            isinstance(leaf, int | float) and any(leaf == o and type(leaf) is type(o) for o in own)
        ):
            return None
    val, traced = node.meta["val"], meta.get("val")
    if not isinstance(traced, torch.Tensor) or (traced.dtype, traced.dim()) != (
        val.dtype,
        val.dim(),
    ):
        return None
    meta = {**meta, "val": val}
    if "tensor_meta" in node.meta:
        meta["tensor_meta"] = node.meta["tensor_meta"]
    else:
        meta.pop("tensor_meta", None)
    return _Expansion([(target, args, kwargs, meta)], expansion.output)


def _functionalized(fn: Any) -> Any:
    """``fn`` under the functionalization the re-trace runs: a kernel's in-place step
    (``cosine_similarity``'s ``clamp_min_``) is recorded as its functional op."""
    from torch._functorch._aot_autograd.functional_utils import from_fun, to_fun
    from torch._subclasses.functional_tensor import FunctionalTensorMode

    def functional(*flat: Any) -> Any:
        with FunctionalTensorMode(pre_dispatch=False, export=True):
            outs = fn(*[to_fun(a) for a in flat])
        return [from_fun(o) for o in outs]

    return functional


def _bind(node: torch.fx.Node, values: Any) -> tuple[Any, Any]:
    """``node``'s args and kwargs with its input nodes replaced by ``values``, in order."""
    it = iter(values)
    return torch.fx.node.map_arg((node.args, node.kwargs), lambda _: next(it))


def _fresh(val: Any) -> Any:
    """A new fake tensor (or size) like ``val``: the tracer knows a value by its object,
    and a size by its symbol node, so each input of each call needs its own, with sizes
    of its own, or a call would read its sizes from the first call that carries them."""
    if isinstance(val, torch.Tensor):
        shape = [_fresh_size(d) for d in val.shape]
        stride = [_fresh_size(d) for d in val.stride()]
        return torch.empty_strided(shape, stride, dtype=val.dtype, device=val.device)
    return _fresh_size(val)


def _concrete(val: torch.Tensor) -> torch.Tensor:
    """A fake tensor like ``val`` with its example's sizes and strides, no symbols."""
    hint = _hint
    return torch.empty_strided(
        [hint(d) for d in val.shape],
        [hint(d) for d in val.stride()],
        dtype=val.dtype,
        device=val.device,
    )


def _hint(d: Any) -> int:
    return d.node.hint if isinstance(d, torch.SymInt) else d


def _fresh_size(val: Any) -> Any:
    if isinstance(val, torch.SymInt | torch.SymFloat | torch.SymBool) and val.node.is_symbolic():
        from torch.fx.experimental.sym_node import SymNode

        node = val.node
        return type(val)(SymNode(node.expr, node.shape_env, node.pytype, node._hint))
    return val


@dataclass(frozen=True)
class _Ref:
    """A value inside an expansion: the call's k-th input or the expansion's j-th node."""

    kind: str
    index: int


@contextlib.contextmanager
def _trace_context(fake_mode: Any) -> Iterator[None]:
    from torch._subclasses.fake_tensor import disable_fake_tensor_cache

    with (
        torch.fx.experimental._config.patch(backed_size_oblivious=True),
        torch.no_grad(),
        fake_mode,
        # each traced call is distinct, so the cache would only pay to fill itself
        disable_fake_tensor_cache(fake_mode),
    ):
        yield


def _output_arity(node: torch.fx.Node) -> int | None:
    """Number of outputs of a call the tracer unpacks (None: a single value)."""
    val = node.meta.get("val")
    if isinstance(val, list | tuple):
        return len(val)
    return None


def prepare_light(
    ep: torch.export.ExportedProgram, ops: ExporterOps
) -> torch.export.ExportedProgram:
    """The program the exporter would lower, built by walking ``ep`` once."""
    _check_supported(ep)
    fake_mode = _fake_mode(ep)
    mutations: list[Any] = []
    if _kept_as_is(ep, ops, fake_mode):
        # nothing to decompose, promote, rename or remove: the user's graph is the one the
        # exporter lowers, and runs as it is (a copy is most of a long graph's set-up)
        return with_graph(ep, ep.graph_module)
    decomposed = [n for n in ep.graph.nodes if n.op == "call_function" and ops.decomposes(n.target)]
    expansions = _trace_expansions(decomposed, ops, fake_mode)
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, Any] = {}  # user node -> its value in the new graph
    views = written_views(
        ep.graph,
        _pure_view,
        lambda n: _writes(n) and n.target not in _NO_OPS,
        lambda n: ops.decomposes(n.target),
    )
    replayed = views.replayed
    for view in replayed:
        if ops.decomposes(view.target):
            # the re-trace replays its expansion, and numbers what it drops: not reproduced
            raise Unsupported(f"node {view.name!r} views a value written in place")
    replays: dict[tuple[torch.fx.Node, torch.fx.Node], torch.fx.Node] = {}
    reading: list[torch.fx.Node] = []  # the node the walk is at: a replay is made for it
    written: dict[torch.fx.Node, Any] = {}  # user node -> its value as last written in place

    def value(a: torch.fx.Node) -> Any:
        if a not in replayed:
            return env[a]
        # functionalization makes a view of a written value again where it is read, from
        # the value as written so far
        base = a.args[0]
        source = written[base] if base in written else value(base)
        key = (a, source)
        if key not in replays:
            rest = torch.fx.node.map_arg((a.args[1:], a.kwargs), new_arg)
            made = graph.create_node(
                "call_function",
                a.target,
                (source, *rest[0]),
                rest[1],
                name=_candidate_name(graph, a.target),
            )
            # the re-trace records it while running the node that reads it
            made.meta = _meta_from(reading[0] if reading else a, a.meta)
            replays[key] = made
        return replays[key]

    def new_arg(a: torch.fx.Node) -> Any:
        v = value(a)
        if not isinstance(v, torch.fx.Node):
            raise Unsupported(f"{a.name!r} is not a single value")
        return v

    for node in ep.graph.nodes:
        reading[:] = [node]
        if node.op == "placeholder":
            p = graph.placeholder(node.name)
            p.target = node.target
            p.meta = dict(node.meta)
            env[node] = p
        elif node.op == "output":
            # the inputs written in place end as outputs, first (as the re-trace returns)
            final = {p.name: v for p, v in written.items() if p.op == "placeholder"}
            values, mutations = mutation_outputs(ep, final)
            user_outputs = torch.fx.node.map_arg(node.args[0], new_arg)
            out = graph.output((*values, *user_outputs) if values else user_outputs)
            out.meta = dict(node.meta)
        elif node in replayed:
            if node in views.chains:
                reserve_dropped_names(graph, views.chains[node], _candidate_name)
            continue  # made where it is read
        elif node.target in _NO_OPS:
            env[node] = value(node.args[0])
        elif node.target is operator.getitem:
            src, idx = node.args
            env[node] = env[src][idx]
        elif ops.decomposes(node.target):
            expansion = expansions[_signature(node)]
            if node in views.spliced and any(_aliases_op(t) for t, *_ in expansion.nodes):
                raise Unsupported(f"node {node.name!r} views a value written in place")
            env[node] = _splice(graph, node, expansion, value)
        else:
            args = torch.fx.node.map_arg(node.args, new_arg)
            kwargs = torch.fx.node.map_arg(node.kwargs, new_arg)
            target = node.target
            target = _FUNCTIONAL_FORM.get(target, target)
            in_place = _is_op(target) and target._schema.is_mutable
            if in_place:
                target = _functional_form(node)
            new = graph.create_node(
                "call_function", target, args, kwargs, name=_candidate_name(graph, target)
            )
            if new.name == node.name and "from_node" not in node.meta:
                # the user's node itself, under its own name: the name is its provenance
                # (provenance.user_node_name), and a record per node would be 7 objects
                # more for the cyclic collector on every node of a long graph
                new.meta = dict(node.meta)
            else:
                new.meta = _meta_from(node, node.meta)
            arity = _output_arity(node)
            if arity is None:
                env[node] = new
            else:
                # the tracer unpacks every output at once, in order
                items = []
                for i in range(arity):
                    g = graph.create_node(
                        "call_function", operator.getitem, (new, i), {}, name="getitem"
                    )
                    g.meta = _meta_from(node, {**node.meta, "val": node.meta["val"][i]})
                    items.append(g)
                env[node] = items
        if node.op == "call_function" and node.target not in _NO_OPS and _writes(node):
            # the value and every earlier write's result name the same memory
            target = node.args[0]
            while True:
                written[target] = env[node]
                source = written_input(target)
                if source is not None and source is not target:
                    if env[target] is not env[source]:
                        # the .to() the write goes through made a value of its own
                        raise Unsupported(f"node {node.name!r} writes through {target.name!r}")
                    target = source
                    continue
                if not (_writes(target) and target.target not in _NO_OPS):
                    break
                target = target.args[0]
    if any(not n.users and n.op == "call_function" for n in graph.nodes):
        # the pass lints the graph and asks every node whether it is impure; exported
        # programs almost never hold a dead node, and without one it removes nothing
        graph.eliminate_dead_code()
    gm = _graph_module(graph)
    _reify_sizes(gm, fake_mode)
    _insert_type_promotions(gm, fake_mode)
    _remove_assertions(gm)
    return with_graph(ep, gm, mutations)


def _meta_from(user_node: torch.fx.Node, meta: dict[str, Any]) -> dict[str, Any]:
    from torch.fx.traceback import NodeSource, NodeSourceAction

    meta = dict(meta)
    for key in ("stack_trace", "nn_module_stack", "source_fn_stack", "torch_fn"):
        if key in user_node.meta:
            meta[key] = user_node.meta[key]
    meta["from_node"] = [NodeSource(user_node, PASS_NAME, NodeSourceAction.CREATE)]
    return meta


def _splice(graph: torch.fx.Graph, node: torch.fx.Node, exp: _Expansion, value: Any) -> Any:
    inputs: list[Any] = []
    torch.fx.node.map_arg((node.args, node.kwargs), lambda a: inputs.append(value(a)))
    made: list[torch.fx.Node] = []

    def resolve(x: Any) -> Any:
        if isinstance(x, _Ref):
            return inputs[x.index] if x.kind == "in" else made[x.index]
        if isinstance(x, list | tuple):
            return type(x)(resolve(v) for v in x)
        if isinstance(x, dict):
            return {k: resolve(v) for k, v in x.items()}
        return x

    for target, args, kwargs, meta in exp.nodes:
        new = graph.create_node(
            "call_function",
            target,
            resolve(args),
            resolve(kwargs),
            name=_candidate_name(graph, target),
        )
        new.meta = _meta_from(node, meta)
        made.append(new)
    return resolve(exp.output)


def _reify_sizes(gm: torch.fx.GraphModule, fake_mode: Any) -> None:
    """The re-trace's last step, run on the reproduction: every symbolic size a node
    computes is recomputed from the inputs' sizes (``sym_size(cat, 1) - 1`` becomes the
    input's ``s50``, read once), as ``run_decompositions`` does with the same pass."""
    shape_env = getattr(fake_mode, "shape_env", None)
    if shape_env is None or not any(
        isinstance(n.meta.get("val"), torch.SymInt | torch.SymFloat | torch.SymBool)
        for n in gm.graph.nodes
    ):
        return
    from torch._export.passes._node_metadata_hook import (
        _node_metadata_hook,
        _set_node_metadata_hook,
    )
    from torch.export.exported_program import first_call_function_nn_module_stack
    from torch.fx.passes.runtime_assert import insert_deferred_runtime_asserts

    stack_trace = (
        'File "torch/fx/passes/runtime_assert.py", line 24, in insert_deferred_runtime_asserts'
    )
    hook = functools.partial(_node_metadata_hook, metadata={"stack_trace": stack_trace})
    with _set_node_metadata_hook(gm, hook):
        insert_deferred_runtime_asserts(
            gm,
            shape_env,
            f"exported program: {first_call_function_nn_module_stack(gm.graph)}",
            export=True,
        )


def _insert_type_promotions(gm: torch.fx.GraphModule, fake_mode: Any) -> None:
    """The exporter's InsertTypePromotion, running only the nodes it changes.

    The exporter's pass runs every node on fake tensors to learn the dtypes its rules
    read; they are already recorded in ``meta["val"]``, so a node is only run (and its
    meta recorded) when a rule changes one of its arguments, through the pass's own code.
    """
    from torch.onnx._internal.fx.passes import type_promotion as tp

    interp = tp._TypePromotionInterpreter(gm, _type_promotion_table())
    interp.env = _RecordedValues()
    with _promotion_context(fake_mode):
        for node, rule in _promoted(list(gm.graph.nodes), interp.env):
            with interp._set_current_node(node):
                interp._maybe_promote_node(node, rule)


@contextlib.contextmanager
def _promotion_context(fake_mode: Any) -> Iterator[None]:
    from torch.fx import traceback as fx_traceback

    with (
        fake_mode,
        torch._dispatch.python.enable_python_dispatcher(),
        fx_traceback.preserve_node_meta(),
    ):
        yield


def _promoted(nodes: list[torch.fx.Node], env: dict) -> Iterator[tuple[torch.fx.Node, Any]]:
    """The calls whose arguments the exporter's type promotion rules change, and the rule."""
    from torch.onnx._internal.fx.passes import type_promotion as tp

    table = _type_promotion_table()
    rules: dict[Any, Any] = {}
    for node in nodes:
        if node.op != "call_function":
            continue
        if node.target not in rules:
            rules[node.target] = tp.get_type_promotion_rule(node, table)
        rule = rules[node.target]
        if rule is not None and _promotes(env, node, rule):
            yield node, rule


def _kept_as_is(ep: torch.export.ExportedProgram, ops: ExporterOps, fake_mode: Any) -> bool:
    """Whether the re-trace gives back ``ep``'s graph node for node: no op decomposed,
    unpacked, promoted or removed, no dead code, and every node named as the re-trace's
    namespace would name it.  ``prepare_light``'s walk, asked without building a graph."""
    scratch = torch.fx.Graph()  # its namespace proposes the names, as the walk's does
    names = scratch._graph_namespace
    proposals: dict[Any, str | None] = {}  # target -> its name, None: the walk changes it
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            proposed = scratch._target_to_str(node.name)
        elif node.op == "output":
            proposed = "output"
        else:
            t = node.target
            if t in proposals:
                proposed = proposals[t]
            else:
                changed = (
                    t in _NO_OPS
                    or (_is_op(t) and t._schema.is_mutable)
                    or t in _FUNCTIONAL_FORM
                    or t is operator.getitem
                    or ops.decomposes(t)
                    or str(t) in _ASSERTION_TARGETS
                )
                proposed = proposals[t] = None if changed else _candidate_name(scratch, t)
            if (
                proposed is None
                or not node.users
                or "from_node" in node.meta  # the copy would record another provenance
                or _output_arity(node) is not None
            ):
                return False
        if names.create_name(proposed, None) != node.name:
            return False
    with _promotion_context(fake_mode):
        return next(_promoted(list(ep.graph.nodes), _RecordedValues()), None) is None


class _RecordedValues(dict):
    """The pass's environment: a node's value is the one its meta records."""

    def __missing__(self, node: torch.fx.Node) -> Any:
        return node.meta.get("val")

    def __contains__(self, node: object) -> bool:
        return isinstance(node, torch.fx.Node)


def _promotes(env: dict, node: torch.fx.Node, rule: Any) -> bool:
    """Whether the exporter's rule changes an argument of ``node`` (its _maybe_promote_arg).

    The answer reads only what the signature holds (the rule, each tensor's dtype, each
    constant's type), so it is kept per signature: a model asks the same few questions
    thousands of times."""
    signature = _args_signature(env, node.args)
    if signature is not None and node.kwargs:
        kwargs = _dtype_signature(env, node.kwargs)
        signature = None if kwargs is None else (*signature, ("kwargs", kwargs))
    key = (id(rule), signature)
    verdict = _VERDICTS.get(key) if signature is not None else None
    if verdict is None:
        args = torch.fx.node.map_arg(node.args, env.__getitem__)
        kwargs = torch.fx.node.map_arg(node.kwargs, env.__getitem__)
        info = rule.preview_type_promotion(args, kwargs)
        wanted = [(a, info.args_dtypes.get(i)) for i, a in enumerate(node.args)]
        wanted += [(a, info.kwargs_dtypes.get(k)) for k, a in node.kwargs.items()]
        verdict = any(_changes(env, a, d) for a, d in wanted)
        if signature is not None and len(_VERDICTS) < 100_000:
            _VERDICTS[key] = verdict
    return verdict


def _changes(env: dict, arg: Any, dtype: Any) -> bool:
    """Whether promoting ``arg`` to ``dtype`` changes it.  A module-level function: a
    recursive closure per node would be a reference cycle per node for the collector."""
    from torch.onnx._internal.fx import type_utils

    if dtype is None:
        return False
    if isinstance(arg, torch.fx.Node):
        val = env[arg]
        if isinstance(val, torch.Tensor):
            return val.dtype != dtype
        if type_utils.is_torch_symbolic_type(val):
            return type_utils.from_scalar_type_to_torch_dtype(type(val)) != dtype
        return False
    if isinstance(arg, list | tuple):
        return any(_changes(env, a, dtype) for a in arg)
    scalar = type_utils.from_scalar_type_to_torch_dtype(type(arg))
    return scalar is not None and scalar != dtype


# verdicts by (rule, what it reads)
_VERDICTS: dict[Any, bool] = {}
_SCALARS = (bool, int, float, complex, type(None))
_NAMED = (str, torch.dtype, torch.device, torch.memory_format, torch.layout)


def _args_signature(env: dict, args: tuple) -> tuple | None:
    """``_dtype_signature`` of a node's positional arguments, the common kinds inline."""
    out = []
    for a in args:
        if isinstance(a, torch.fx.Node):
            v = env[a]
            if not isinstance(v, torch.Tensor):
                return None
            out.append((v.dtype, v.dim() == 0))
        elif isinstance(a, _SCALARS):
            out.append(type(a))
        else:
            item = _dtype_signature(env, a)
            if item is None:
                return None
            out.append(item)
    return tuple(out)


def _dtype_signature(env: dict, tree: Any) -> Any:
    """What a type promotion preview reads from the arguments; None: more than that."""
    if isinstance(tree, torch.fx.Node):
        v = env[tree]
        if isinstance(v, torch.Tensor):
            return (v.dtype, v.dim() == 0)
        return None
    if isinstance(tree, _SCALARS):
        return type(tree)
    if isinstance(tree, _NAMED):
        return (type(tree), str(tree))
    if isinstance(tree, list | tuple):
        items = tuple([_dtype_signature(env, v) for v in tree])
        return None if None in items else (type(tree), items)
    if isinstance(tree, dict):
        items = tuple([(k, _dtype_signature(env, v)) for k, v in tree.items()])
        return None if any(v is None for _, v in items) else ("dict", items)
    return None


def copy_graph_module(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A GraphModule on a copy of ``gm``'s graph (nodes and their meta dicts copied, the
    values in them shared), for a pass that must leave ``gm`` as it is."""
    graph = torch.fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    return _graph_module(graph)


def _graph_module(graph: torch.fx.Graph) -> torch.fx.GraphModule:
    """A GraphModule whose Python code is generated on first use, not now: the engine
    runs the graph node by node, so most runs never need it."""
    try:
        from torch.fx._lazy_graph_module import _LazyGraphModule

        return _LazyGraphModule(torch.nn.Module(), graph)
    except ImportError:  # pragma: no cover - older torch
        return torch.fx.GraphModule(torch.nn.Module(), graph)


_TABLE: Any = None


def _type_promotion_table() -> Any:
    global _TABLE
    if _TABLE is None:
        from torch.onnx._internal.fx.passes import type_promotion as tp

        _TABLE = tp.TypePromotionTable()
    return _TABLE


def _remove_assertions(gm: torch.fx.GraphModule) -> None:
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and str(node.target) in _ASSERTION_TARGETS:
            gm.graph.erase_node(node)


def with_graph(
    ep: torch.export.ExportedProgram, gm: torch.fx.GraphModule, mutations: list[Any] = ()
) -> torch.export.ExportedProgram:
    """A copy of ``ep`` running ``gm``, its signature's output names updated;
    ``mutations``: the specs of the outputs ``gm`` returns first, before ``ep``'s (the
    values written inputs end with)."""
    from torch.export.graph_signature import ExportGraphSignature, OutputSpec, TensorArgument

    out_node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    new_outputs = list(out_node.args[0])
    specs = []
    for spec, value in zip([*mutations, *ep.graph_signature.output_specs], new_outputs):
        arg = spec.arg
        if isinstance(arg, TensorArgument) and isinstance(value, torch.fx.Node):
            arg = TensorArgument(name=value.name)
        specs.append(OutputSpec(spec.kind, arg, spec.target))
    prepared = copy.copy(ep)
    prepared._graph_module = gm
    prepared._graph_signature = ExportGraphSignature(list(ep.graph_signature.input_specs), specs)
    return prepared
