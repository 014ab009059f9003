"""The exporter's type promotions (InsertTypePromotion), running only the nodes it changes.

The exporter's pass runs every node on fake tensors to learn the dtypes its rules read;
they are already recorded in ``meta["val"]``, so a node is only run (and its meta
recorded) when a rule changes one of its arguments, through the pass's own code.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx


def insert_type_promotions(gm: torch.fx.GraphModule, fake_mode: Any) -> None:
    """The exporter's InsertTypePromotion, running only the nodes it changes.

    The exporter's pass runs every node on fake tensors to learn the dtypes its rules
    read; they are already recorded in ``meta["val"]``, so a node is only run (and its
    meta recorded) when a rule changes one of its arguments, through the pass's own code.
    """
    from torch.onnx._internal.fx.passes import type_promotion as tp

    interp = tp._TypePromotionInterpreter(gm, _type_promotion_table())
    interp.env = RecordedValues()
    with promotion_context(fake_mode):
        for node, rule in promoted(list(gm.graph.nodes), interp.env):
            with interp._set_current_node(node):
                interp._maybe_promote_node(node, rule)


@contextlib.contextmanager
def promotion_context(fake_mode: Any) -> Iterator[None]:
    from torch.fx import traceback as fx_traceback

    with (
        fake_mode,
        torch._dispatch.python.enable_python_dispatcher(),
        fx_traceback.preserve_node_meta(),
    ):
        yield


def promoted(nodes: list[torch.fx.Node], env: dict) -> Iterator[tuple[torch.fx.Node, Any]]:
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


class RecordedValues(dict):
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


_TABLE: Any = None


def _type_promotion_table() -> Any:
    global _TABLE
    if _TABLE is None:
        from torch.onnx._internal.fx.passes import type_promotion as tp

        _TABLE = tp.TypePromotionTable()
    return _TABLE
