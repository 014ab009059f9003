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

Where the shape agrees, the values may still not: ``AdaptiveAvgPool2d((3, 4))`` on 7x9
pools 2x2 windows, where the user's op pools windows of 2 to 3 rows and columns.  On a
run whose sizes differ from the example's, each decomposed user node reading a value of a
dynamic size is checked on its value too: the user's own op is run on the inputs the
prepared program gave its decomposition and compared with what the decomposition made
(``decomposed_values.py``).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch

from ...dtypes import dtype_name


@dataclass(frozen=True)
class UserOp:
    """A decomposed user node to rerun as the user wrote it: its op, its arguments with
    each fx node replaced by a :class:`Source` naming the prepared value it reads."""

    user_node: str
    target: Any
    args: tuple
    kwargs: dict
    sources: frozenset[str]  # the prepared values (and placeholders) it reads


@dataclass(frozen=True)
class Source:
    name: str  # a prepared program's value


@dataclass(frozen=True)
class Specialized:
    """A prepared value whose shape differs, at these input sizes, from the shape the
    user's node it decomposes has."""

    user_node: str  # the user's fx node the decomposition replaced
    user_shape_type: str  # e.g. "float32[1x4x3x4]": the user's program's value
    # the user's op's value where the shapes agree and the values do not (None: a shape)
    value: Any = None

    def note(self) -> str:
        if self.value is not None:
            return (
                f"the exporter's preparation decomposed {self.user_node} into ops whose sizes "
                f"it took from the example inputs (the exporter's decomposition fixed a size "
                f"on the example inputs): at these sizes they compute other values than "
                f"{self.user_node} itself, the value expected here, and so does the ONNX model "
                f"lowered from that preparation: it is wrong for inputs of other sizes (export "
                f"with an example of these sizes, or keep {self.user_node} from being "
                f"decomposed)"
            )
        return (
            f"the exporter's preparation decomposed {self.user_node} into ops whose sizes it "
            f"took from the example inputs, and the ONNX model, lowered from that "
            f"preparation, has the same fixed sizes: it is wrong for inputs of other sizes "
            f"(export with an example of these sizes, or keep {self.user_node} from being "
            f"decomposed)"
        )


# per prepared program: (input sizes, user program, findings, value checks), for a run
# repeated with the same sizes (a notebook's reruns) to skip the walk over the graph
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
    return fixed_on_example(program, user_program, provenance, values, user_inputs)[0]


def fixed_on_example(
    program: torch.export.ExportedProgram,
    user_program: torch.export.ExportedProgram,
    provenance: dict[str, Any],
    values: dict[str, Any],
    user_inputs: list[str],
) -> tuple[dict[str, Specialized], dict[str, UserOp]]:
    """The shape findings (:func:`specialized_values`) and {prepared fx node name: the
    user's op its value is checked against}: the decomposed user nodes reading a value of
    a dynamic size, on a run whose sizes differ from the example's (none otherwise: at
    the example's sizes a decomposition is what the exporter traced)."""
    if program is user_program:
        return {}, {}
    sizes = _input_sizes(program, values, user_inputs)
    if sizes is None:
        return {}, {}
    kept = _KEPT.get(program)
    if kept is not None and kept[0] == sizes and kept[1]() is user_program:
        return kept[2], kept[3]
    differs = _differs_from_example(program, values, user_inputs)
    found, checks = _find(program, user_program, provenance, values, user_inputs, differs)
    try:
        _KEPT[program] = (sizes, weakref.ref(user_program), found, checks)
    except TypeError:  # pragma: no cover - a program that cannot be weakly referenced
        pass
    return found, checks


def decomposed_at_other_sizes(
    program: torch.export.ExportedProgram,
    user_program: torch.export.ExportedProgram,
    values: dict[str, Any],
    user_inputs: list[str],
) -> bool:
    """Whether the run's sizes differ from the example's and the prepared program
    decomposed some user node: then its outputs are checked against the user's program's
    (``engine/user_outputs.py``)."""
    if program is user_program or not _differs_from_example(program, values, user_inputs):
        return False
    names = {n.name for n in program.graph.nodes}
    return any(n.op == "call_function" and n.name not in names for n in user_program.graph.nodes)


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


def _differs_from_example(
    program: torch.export.ExportedProgram, values: dict[str, Any], user_inputs: list[str]
) -> bool:
    """Whether some dynamic size of the run's inputs is not the example's (the size the
    program was traced with; unknown counts as different)."""
    for node in _placeholders(program.graph):
        val, value = node.meta.get("val"), values.get(node.name)
        if node.name not in user_inputs or not isinstance(val, torch.Tensor):
            continue
        if not isinstance(value, torch.Tensor) or val.dim() != value.dim():
            continue
        for dim, size in zip(val.shape, value.shape):
            if isinstance(dim, torch.SymInt) and getattr(dim.node, "hint", None) != int(size):
                return True
    return False


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
    differs: bool,
) -> tuple[dict[str, Specialized], dict[str, UserOp]]:
    prepared_names = {n.name for n in program.graph.nodes}
    user_nodes = {
        n.name: n
        for n in user_program.graph.nodes
        if n.op == "call_function" and n.name not in prepared_names
    }
    if not user_nodes:
        return {}, {}
    # the prepared nodes each decomposed user node became
    groups: dict[str, list[torch.fx.Node]] = {}
    for node in program.graph.nodes:
        prov = provenance.get(node.name)
        user = getattr(prov, "user_name", None)
        if node.op == "call_function" and user in user_nodes:
            groups.setdefault(user, []).append(node)
    if not groups:
        return {}, {}
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
    # a decomposed user node's value, read by another, is its group's output
    handed_on = {user: out for out, user in out_of.items()}
    found: dict[str, Specialized] = {}
    checks: dict[str, UserOp] = {}
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
            op = _user_op(user_nodes[user], prepared_names, handed_on) if differs else None
            if op is not None:
                checks[node.name] = op
            continue
        if len(want_shape) != len(got_shape):
            continue  # not the same value (a group handing on a mask, say)
        shape_type = f"{dtype_name(want.dtype)}[{'x'.join(map(str, want_shape))}]"
        found[node.name] = Specialized(user, shape_type)
        tainted.add(node.name)
    return found, checks


def _user_op(
    node: torch.fx.Node, prepared_names: set[str], handed_on: dict[str, str]
) -> UserOp | None:
    """The user's node as an op to rerun on prepared values; None when one of its inputs
    has no prepared value, or when none has a dynamic size (a decomposition reads a size
    only off a value that has one: a node reading only static sizes is not checked)."""
    if not isinstance(node.target, torch._ops.OpOverload) or node.target._schema.is_mutable:
        return None  # an op writing into its inputs would change the run's values
    dynamic = False
    sources: set[str] = set()

    def source(arg: torch.fx.Node) -> Any:
        nonlocal dynamic
        name = handed_on.get(arg.name, arg.name if arg.name in prepared_names else None)
        if name is None:
            raise LookupError(arg.name)
        val = arg.meta.get("val")
        if isinstance(val, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in val.shape):
            dynamic = True
        sources.add(name)
        return Source(name)

    try:
        args = torch.fx.node.map_arg(node.args, source)
        kwargs = torch.fx.node.map_arg(node.kwargs, source)
    except LookupError:
        return None
    if not dynamic:
        return None
    return UserOp(node.name, node.target, tuple(args), dict(kwargs), frozenset(sources))


__all__ = [
    "Source",
    "Specialized",
    "UserOp",
    "decomposed_at_other_sizes",
    "fixed_on_example",
    "specialized_values",
]
