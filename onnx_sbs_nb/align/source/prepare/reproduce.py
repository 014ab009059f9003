"""The exporter's preparation of a program, reproduced by walking the user's graph once.

``torch.onnx.export`` re-traces the whole program with fake tensors before lowering it
(``run_decompositions`` with its table, then explicit type promotions, then no
assertions): seconds on a small Llama, and a cost that grows faster than the graph.
Almost every node comes out of that re-trace unchanged; only the nodes whose op the
exporter decomposes change, and the re-trace renames everything after them.  This module
builds the same graph by walking the user's graph once:

* a node whose op is kept is copied, under the name the re-trace gives it (the same fx
  namespace rules, applied in the same order);
* the nodes whose op is decomposed are traced together, once per distinct signature
  (:mod:`.expansions`), and their expansion is spliced in;
* an in-place call on a value the program made becomes its functional op, and a view of
  the written value is made again where it is read (functionalization's rules:
  :mod:`.aliasing`, :mod:`.written_views`; writes into inputs: :mod:`.input_writes`);
* dead code goes, sizes are recomputed from the inputs' and assertions go
  (:mod:`.passes`), type promotions are inserted by the exporter's own rules
  (:mod:`.promotions`).

It is a reproduction, so it is checked against the ONNX model before it is used
(:func:`.check.disagreement`), and the exporter's preparation runs whenever the check
fails or the program is declined (:mod:`.supported`).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

from .aliasing import FUNCTIONAL_FORM, NO_OPS, aliases_op, functional_form, pure_view, writes
from .expansions import Expansion, Ref, signature, trace_expansions
from .exporter_ops import ExporterOps
from .graphs import graph_module, is_op, with_graph
from .input_writes import mutation_outputs, written_input
from .passes import ASSERTION_TARGETS, reify_sizes, remove_assertions
from .promotions import RecordedValues, insert_type_promotions, promoted, promotion_context
from .supported import check_supported, fake_mode_of
from .unsupported import Unsupported
from .written_views import reserve_dropped_names, written_views

# the pass a spliced node records in its provenance (kept as first published)
PASS_NAME = "onnx_sbs_nb.light_prep"


def _candidate_name(graph: torch.fx.Graph, target: Any) -> str:
    """The name the re-trace proposes for a call (proxy_call's rule)."""
    if is_op(target):
        return graph._target_to_str(target.overloadpacket.__name__)
    return graph._target_to_str(target)


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
    check_supported(ep)
    fake_mode = fake_mode_of(ep)
    mutations: list[Any] = []
    if _kept_as_is(ep, ops, fake_mode):
        # nothing to decompose, promote, rename or remove: the user's graph is the one the
        # exporter lowers, and runs as it is (a copy is most of a long graph's set-up)
        return with_graph(ep, ep.graph_module)
    decomposed = [n for n in ep.graph.nodes if n.op == "call_function" and ops.decomposes(n.target)]
    expansions = trace_expansions(decomposed, ops, fake_mode)
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, Any] = {}  # user node -> its value in the new graph
    views = written_views(
        ep.graph,
        pure_view,
        lambda n: writes(n) and n.target not in NO_OPS,
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
            if p.name != node.name:
                # fx names no new value after a builtin (``input``, nn.Sequential's
                # argument: it makes ``input_1``); torch.export does, and the program's
                # signature and the ONNX model's input keep that name
                p.name = node.name
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
        elif node.target in NO_OPS:
            env[node] = value(node.args[0])
        elif node.target is operator.getitem:
            src, idx = node.args
            env[node] = env[src][idx]
        elif ops.decomposes(node.target):
            expansion = expansions[signature(node)]
            if node in views.spliced and any(aliases_op(t) for t, *_ in expansion.nodes):
                raise Unsupported(f"node {node.name!r} views a value written in place")
            env[node] = _splice(graph, node, expansion, value)
        else:
            args = torch.fx.node.map_arg(node.args, new_arg)
            kwargs = torch.fx.node.map_arg(node.kwargs, new_arg)
            target = node.target
            target = FUNCTIONAL_FORM.get(target, target)
            in_place = is_op(target) and target._schema.is_mutable
            if in_place:
                target = functional_form(node)
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
        if node.op == "call_function" and node.target not in NO_OPS and writes(node):
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
                if not (writes(target) and target.target not in NO_OPS):
                    break
                target = target.args[0]
    if any(not n.users and n.op == "call_function" for n in graph.nodes):
        # the pass lints the graph and asks every node whether it is impure; exported
        # programs almost never hold a dead node, and without one it removes nothing
        graph.eliminate_dead_code()
    gm = graph_module(graph)
    reify_sizes(gm, fake_mode)
    insert_type_promotions(gm, fake_mode)
    remove_assertions(gm)
    return with_graph(ep, gm, mutations)


def _meta_from(user_node: torch.fx.Node, meta: dict[str, Any]) -> dict[str, Any]:
    from torch.fx.traceback import NodeSource, NodeSourceAction

    meta = dict(meta)
    for key in ("stack_trace", "nn_module_stack", "source_fn_stack", "torch_fn"):
        if key in user_node.meta:
            meta[key] = user_node.meta[key]
    meta["from_node"] = [NodeSource(user_node, PASS_NAME, NodeSourceAction.CREATE)]
    return meta


def _splice(graph: torch.fx.Graph, node: torch.fx.Node, exp: Expansion, value: Any) -> Any:
    inputs: list[Any] = []
    torch.fx.node.map_arg((node.args, node.kwargs), lambda a: inputs.append(value(a)))
    made: list[torch.fx.Node] = []

    def resolve(x: Any) -> Any:
        if isinstance(x, Ref):
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
                    t in NO_OPS
                    or (is_op(t) and t._schema.is_mutable)
                    or t in FUNCTIONAL_FORM
                    or t is operator.getitem
                    or ops.decomposes(t)
                    or str(t) in ASSERTION_TARGETS
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
    with promotion_context(fake_mode):
        return next(promoted(list(ep.graph.nodes), RecordedValues()), None) is None
