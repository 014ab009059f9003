"""Runs of torch nodes as one generated function, on a second run.

With stretches (``stretches.py``), the plan puts the torch nodes a stretch of ONNX nodes
waits for right before it: runs of tens of fx nodes with no ONNX node between.  One at a
time, each pays the loop's step (its argument list, the grad mode, its size rule, a
timing).  A run compiled into one function of straight-line code calls the same ops on
the same values, as the program's own forward does, with the same size checks
(``fx_limits.py``): the values, and every comparison, are those of one node at a time.
What a run does not give is each node's own time (``ep_time_run`` is None).

A run holds only ``call_function`` nodes whose arguments are values, constants, and lists
or tuples of them; a run that raises is run node by node (each failure its own record),
and never compiled again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .fx_limits import check_fx_output_size, fx_size_rule
from .plan import REF, Plan

MIN_NODES = 2


class FxRun:
    """Plan steps ``first`` to ``last`` (reference nodes all), as one function."""

    __slots__ = ("first", "last", "fn", "broken")

    def __init__(self, first: int, last: int, fn: Any) -> None:
        self.first = first
        self.last = last
        self.fn = fn
        self.broken = False


class _NotCompilable(Exception):
    pass


def compile_runs(
    plan: Plan,
    nodes: Sequence[torch.fx.Node],
    device_map: dict[torch.device, torch.device] | None = None,
) -> dict[int, FxRun]:
    """The runs of ``plan`` (by first step) over the reference's fx ``nodes``;
    ``device_map``: devices the program names, replaced (``sides.traced_device_map``)."""
    steps = plan.steps
    runs: dict[int, FxRun] = {}
    s = 0
    while s < len(steps):
        e = s
        while e < len(steps) and steps[e][0] == REF and nodes[steps[e][1]].op == "call_function":
            e += 1
        if e - s >= MIN_NODES:
            try:
                fn = _function([nodes[steps[k][1]] for k in range(s, e)], device_map)
            except _NotCompilable:
                fn = None
            if fn is not None:
                runs[s] = FxRun(s, e - 1, fn)
        s = e + 1 if e == s else e
    return runs


def _function(
    run: Sequence[torch.fx.Node], device_map: dict[torch.device, torch.device] | None = None
) -> Any:
    """``f(env, device)``: the nodes' values into ``env``, computed in order; devices
    the nodes name are replaced by ``device_map``."""
    device_map = device_map or {}
    scope: dict[str, Any] = {
        "_grad": torch.is_grad_enabled,
        "_set_grad": torch._C._set_grad_enabled,
        "_check": check_fx_output_size,
    }
    local: dict[str, str] = {}
    body: list[str] = []

    def constant(v: Any) -> str:
        name = f"c{len(scope)}"
        scope[name] = v
        return name

    def value(a: Any) -> str:
        if isinstance(a, torch.fx.Node):
            var = local.get(a.name)
            if var is None:
                var = local[a.name] = f"v{len(local)}"
                body.append(f"        {var} = env[{a.name!r}]")
            return var
        if isinstance(a, list | tuple):
            if not any(isinstance(x, torch.fx.Node | list | tuple | dict) for x in a):
                return constant(a)
            items = ", ".join(value(x) for x in a)
            return f"[{items}]" if isinstance(a, list) else f"({items}{',' if len(a) == 1 else ''})"
        if isinstance(a, dict | slice) and _holds_nodes(a):
            raise _NotCompilable
        if isinstance(a, torch.device):
            return constant(device_map.get(a, a))
        return constant(a)

    for node in run:
        args = [value(a) for a in node.args]
        kwargs = [(k, value(a)) for k, a in node.kwargs.items()]
        target = constant(node.target)
        rule = fx_size_rule(node.target)
        if rule is not None:
            kw = "{" + ", ".join(f"{k!r}: {v}" for k, v in kwargs) + "}"
            packed = f"({', '.join(args)},)" if args else "()"
            body.append(f"        _check({constant(rule)}, {packed}, {kw}, device)")
        # keyword names come from the program (a file): string literals, never code
        kw = ", ".join(f"{k!r}: {v}" for k, v in kwargs)
        call = ", ".join([*args, f"**{{{kw}}}"] if kwargs else args)
        var = local[node.name] = f"v{len(local)}"
        body.append(f"        {var} = {target}({call})")
        body.append(f"        env[{node.name!r}] = {var}")
    source = "\n".join(
        [
            "def run(env, device):",
            "    grad = _grad()",
            "    _set_grad(False)",
            "    try:",
            *body,
            "    finally:",
            "        _set_grad(grad)",
        ]
    )
    exec(compile(source, "<sbs fx run>", "exec"), scope)  # our own source: names are repr'd
    return scope["run"]


def _holds_nodes(a: Any) -> bool:
    found: list[bool] = []
    torch.fx.node.map_arg(a, lambda n: found.append(True) or n)
    return bool(found)


__all__ = ["FxRun", "compile_runs"]
