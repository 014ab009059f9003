"""Decompositions that fixed a size on the example inputs.

The exporter lowers a prepared program: the user's program after its decompositions.  A
decomposition may read a size off the example inputs instead of keeping it symbolic:
``adaptive_avg_pool2d`` to ``(3, 4)`` becomes an ``avg_pool2d`` whose kernel and stride
are the example's height and width divided by 3 and 4.  For another size the prepared
program, and the ONNX model lowered from it, then compute another shape than the user's
program, and both sides of the run agree with each other: nothing would be found.  The
user's node says what shape its value has (``meta["val"]``, symbolic in the program's
input sizes); evaluated at the run's input sizes, it is compared with the shape of the
value its decomposition makes.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch

from ...dtypes import dtype_name


@dataclass(frozen=True)
class Specialized:
    """A prepared value whose shape differs, at these input sizes, from the shape the
    user's node it decomposes has."""

    user_node: str  # the user's fx node the decomposition replaced
    user_shape_type: str  # e.g. "float32[1x4x3x4]": the user's program's value

    def note(self) -> str:
        return (
            f"the exporter's preparation decomposed {self.user_node} into ops whose sizes it "
            f"took from the example inputs, and the ONNX model, lowered from that "
            f"preparation, has the same fixed sizes: it is wrong for inputs of other sizes "
            f"(export with an example of these sizes, or keep {self.user_node} from being "
            f"decomposed)"
        )


# per prepared program: (input sizes, user program, findings), for a run repeated with
# the same sizes (a notebook's reruns) to skip the walk over the graph
_KEPT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def specialized_values(
    program: torch.export.ExportedProgram,
    user_program: torch.export.ExportedProgram,
    provenance: dict[str, Any],
    values: dict[str, Any],
    user_inputs: list[str],
) -> dict[str, Specialized]:
    """{prepared fx node name: finding} for the run's input values (``values``: the
    placeholders' values); empty when the program's inputs have no symbolic size, or
    when the program is the user's own."""
    if program is user_program:
        return {}
    sizes = _input_sizes(program, values, user_inputs)
    if sizes is None:
        return {}
    kept = _KEPT.get(program)
    if kept is not None and kept[0] == sizes and kept[1]() is user_program:
        return kept[2]
    found = _find(program, user_program, provenance, values, user_inputs)
    try:
        _KEPT[program] = (sizes, weakref.ref(user_program), found)
    except TypeError:  # pragma: no cover - a program that cannot be weakly referenced
        pass
    return found


def _input_sizes(
    program: torch.export.ExportedProgram, values: dict[str, Any], user_inputs: list[str]
) -> tuple | None:
    """The user inputs' sizes when some placeholder has a symbolic size, else None."""
    placeholders = {n.name: n for n in _placeholders(program.graph)}
    symbolic = False
    sizes = []
    for name in user_inputs:
        val = placeholders[name].meta.get("val") if name in placeholders else None
        value = values.get(name)
        if isinstance(val, torch.Tensor) and isinstance(value, torch.Tensor):
            symbolic = symbolic or any(isinstance(d, torch.SymInt) for d in val.shape)
            sizes.append(tuple(int(d) for d in value.shape))
        else:
            sizes.append(None)
    return tuple(sizes) if symbolic else None


def _placeholders(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    """The graph's placeholders: they come first, so the walk stops at the first op."""
    found = []
    for node in graph.nodes:
        if node.op != "placeholder":
            break
        found.append(node)
    return found


def _bindings(graph: torch.fx.Graph, values: dict[str, Any], user_inputs: list[str]) -> dict:
    """Each input size's symbol -> the run's size (a sympy integer, ready to substitute)."""
    import sympy

    bound: dict = {}
    for node in _placeholders(graph):
        if node.name not in user_inputs:
            continue
        val, value = node.meta.get("val"), values.get(node.name)
        if not isinstance(val, torch.Tensor) or not isinstance(value, torch.Tensor):
            continue
        if val.dim() != value.dim():
            continue
        for dim, size in zip(val.shape, value.shape):
            if isinstance(dim, torch.SymInt) and dim.node.expr.is_Symbol:
                bound[dim.node.expr] = sympy.Integer(int(size))
    return bound


def _shape_at(val: Any, bound: dict) -> tuple[int, ...] | None:
    """A value's shape at the bound sizes; None when a size does not evaluate."""
    if not isinstance(val, torch.Tensor):
        return None
    shape = []
    for dim in val.shape:
        if isinstance(dim, int):
            shape.append(dim)
            continue
        try:
            expr = dim.node.expr.xreplace(bound)
        except (AttributeError, TypeError):
            return None
        if not expr.is_Integer:
            return None
        shape.append(int(expr))
    return tuple(shape)


def _find(
    program: torch.export.ExportedProgram,
    user_program: torch.export.ExportedProgram,
    provenance: dict[str, Any],
    values: dict[str, Any],
    user_inputs: list[str],
) -> dict[str, Specialized]:
    prepared_names = {n.name for n in program.graph.nodes}
    user_nodes = {
        n.name: n
        for n in user_program.graph.nodes
        if n.op == "call_function" and n.name not in prepared_names
    }
    if not user_nodes:
        return {}
    # the prepared nodes each decomposed user node became
    groups: dict[str, list[torch.fx.Node]] = {}
    for node in program.graph.nodes:
        prov = provenance.get(node.name)
        user = getattr(prov, "user_name", None)
        if node.op == "call_function" and user in user_nodes:
            groups.setdefault(user, []).append(node)
    if not groups:
        return {}
    user_bound = _bindings(user_program.graph, values, user_inputs)
    bound = _bindings(program.graph, values, user_inputs)
    # the value each group hands on (read outside it, or returned): that of its user node
    out_of: dict[str, str] = {}
    members_of: dict[str, set[str]] = {}
    for user, nodes in groups.items():
        members = {n.name for n in nodes}
        outs = [n for n in nodes if any(u.name not in members for u in n.users)]
        if len(outs) == 1:
            out_of[outs[0].name] = user
            members_of[user] = members
    found: dict[str, Specialized] = {}
    # values downstream of a finding: a shape they get wrong may be inherited from it
    tainted: set[str] = set()
    for node in program.graph.nodes:
        if any(a.name in tainted for a in node.all_input_nodes):
            tainted.add(node.name)
        user = out_of.get(node.name)
        if user is None:
            continue
        members = members_of[user]
        inputs = {a.name for m in groups[user] for a in m.all_input_nodes} - members
        if inputs & tainted:
            continue
        want = user_nodes[user].meta.get("val")
        want_shape = _shape_at(want, user_bound)
        got_shape = _shape_at(node.meta.get("val"), bound)
        if want_shape is None or got_shape is None or want_shape == got_shape:
            continue
        if len(want_shape) != len(got_shape):
            continue  # not the same value (a group handing on a mask, say)
        shape_type = f"{dtype_name(want.dtype)}[{'x'.join(map(str, want_shape))}]"
        found[node.name] = Specialized(user, shape_type)
        tainted.add(node.name)
    return found


__all__ = ["Specialized", "specialized_values"]
