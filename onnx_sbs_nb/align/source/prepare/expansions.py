"""The decomposed calls' expansions, traced as the exporter's re-trace would make them.

Every distinct call (op, arguments, input shapes/strides/dtypes: :func:`signature`) is
traced once with the exporter's decomposition table, all of them in one make_fx.  A call
whose expansion reads no size (``to``, ``&``: one node, no number the sizes decide) is
traced on its example's concrete sizes and takes the call's own symbolic value; the
others with symbolic sizes of their own, each size op a question to sympy.  The walk
(:mod:`.reproduce`) splices the expansions in.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from .exporter_ops import ExporterOps
from .graphs import is_op
from .unsupported import Unsupported


@dataclass
class Expansion:
    """How one decomposed call comes out of the re-trace, relative to its inputs."""

    nodes: list[tuple[Any, Any, Any, dict[str, Any]]]  # (target, args, kwargs, meta), _Refs
    output: Any  # the call's result: _Refs and constants in its structure


def signature(node: torch.fx.Node) -> Any:
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


def trace_expansions(
    nodes: list[torch.fx.Node], ops: ExporterOps, fake_mode: Any
) -> dict[Any, Expansion]:
    """Traces every distinct decomposed call once, all in one make_fx trace."""
    unique: dict[Any, torch.fx.Node] = {}
    for n in nodes:
        unique.setdefault(signature(n), n)
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
) -> dict[Any, Expansion]:
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


def _mutates(expansion: Expansion) -> bool:
    return any(
        isinstance(t, torch._ops.OpOverload) and t._schema.is_mutable for t, *_ in expansion.nodes
    )


class _CrossRead(Unsupported):
    """A traced call read a value that belongs to another call."""


def _trace_calls(
    unique: dict[Any, torch.fx.Node],
    ops: ExporterOps,
    functional: bool = False,
    generic: Collection[Any] = frozenset(),
) -> dict[Any, Expansion]:
    """The expansions of ``unique``'s calls (signature -> call), traced in one make_fx
    (inside :func:`trace_expansions`' contexts), less those that read a value of another
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
    result: dict[Any, Expansion] = {}
    pos = 0  # position of the call's first result among the trace's outputs
    for key, (start, stop), (nodes, out) in zip(keys, spans, made):
        mine = [n for n in nodes if n in kept and n.op == "call_function"]
        local = {n: j for j, n in enumerate(mine)}
        local_in = {placeholders[k]: k - start for k in range(start, stop)}

        def ref(a: torch.fx.Node, local: dict = local, local_in: dict = local_in) -> Ref:
            if a in local:
                return Ref("node", local[a])
            if a in local_in:
                return Ref("in", local_in[a])
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
        expansion = Expansion(templ, torch.utils._pytree.tree_unflatten(refs, spec))
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


def _size_free_expansion(expansion: Expansion, node: torch.fx.Node) -> Expansion | None:
    """An expansion traced on concrete sizes, with the call's symbolic result as its
    value; None where it may depend on the sizes: more than one node, a mutation, or a
    number that is not one of the call's own arguments (a size the trace baked in)."""
    if not expansion.nodes:
        return expansion if isinstance(expansion.output, Ref) else None
    if len(expansion.nodes) != 1 or expansion.output != Ref("node", 0):
        return None
    target, args, kwargs, meta = expansion.nodes[0]
    if is_op(target) and target._schema.is_mutable:
        return None
    own = [
        a
        for a in torch.utils._pytree.tree_leaves((node.args, node.kwargs))
        if not isinstance(a, torch.fx.Node)
    ]
    for leaf in torch.utils._pytree.tree_leaves((args, kwargs)):
        if isinstance(leaf, Ref) or isinstance(leaf, _SIZE_FREE):
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
    return Expansion([(target, args, kwargs, meta)], expansion.output)


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
class Ref:
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
