"""Building programs: a graph module on a graph, a copy of one, a program running one.

A step of the walk :mod:`.program` runs that reads nothing of the others: the steps
after it build their graphs and programs with these.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.fx


def is_op(target: Any) -> bool:
    """An aten/prims/custom op overload (not Python arithmetic on sizes, not getitem)."""
    return isinstance(target, torch._ops.OpOverload)


def copy_graph_module(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A GraphModule on a copy of ``gm``'s graph (nodes and their meta dicts copied, the
    values in them shared), for a pass that must leave ``gm`` as it is."""
    graph = torch.fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    return graph_module(graph)


def graph_module(graph: torch.fx.Graph) -> torch.fx.GraphModule:
    """A GraphModule whose Python code is generated on first use, not now: the engine
    runs the graph node by node, so most runs never need it."""
    try:
        from torch.fx._lazy_graph_module import _LazyGraphModule

        return _LazyGraphModule(torch.nn.Module(), graph)
    except ImportError:  # pragma: no cover - older torch
        return torch.fx.GraphModule(torch.nn.Module(), graph)


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
