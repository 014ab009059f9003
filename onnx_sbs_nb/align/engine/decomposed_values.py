"""A decomposition's value checked against the user's own op, during the run.

``source/specialized.py`` names the decomposed user nodes to check on a run whose sizes
differ from the example's (:class:`~..source.specialized.UserOp`).  As the reference side
computes the values they read, these are kept (the run's plan frees a value after its
last prepared consumer, which may come before the decomposition's output); when the
decomposition's output is computed, the user's op runs on them and is compared with it.
Where they differ, the output's finding joins the run's ``specialized`` values, which the
verdict rule ``fixed_on_example_inputs`` reads when the pair is judged (after both of its
values exist, so after this check).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

from ...compare.diff import compare
from ...compare.value_facts import shape_type
from ..judge.judging import comparable
from ..source.specialized import Source, Specialized, UserOp


class DecomposedValues:
    """Checks ``checks`` ({prepared output: user op}) as the reference side runs; each
    finding goes into ``found`` (the run's own copy of the shape findings)."""

    def __init__(
        self,
        checks: dict[str, UserOp],
        found: dict[str, Any],
        leaf: Callable[[str], Any],
        atol: float | None,
        rtol: float | None,
    ) -> None:
        self.checks, self.found, self.leaf = checks, found, leaf
        self.atol, self.rtol = atol, rtol
        # how many checks still read each value, and the values kept for them
        self._reads = Counter(s for op in checks.values() for s in op.sources)
        self._kept: dict[str, Any] = {}

    def observe(self, outputs: tuple[str, ...], env: dict[str, Any]) -> None:
        """The reference side computed ``outputs`` (their values in ``env``)."""
        for o in outputs:
            if o in self._reads and o in env:
                self._kept[o] = env[o]
            op = self.checks.get(o)
            if op is not None:
                self._check(o, op, env.get(o))

    def _value(self, name: str) -> Any:
        if name in self._kept:
            return self._kept[name]
        return self.leaf(name)  # a placeholder: an input or a weight

    def _check(self, name: str, op: UserOp, prepared: Any) -> None:
        def resolve(a: Any) -> Any:
            if isinstance(a, Source):
                return self._value(a.name)
            if isinstance(a, tuple | list):
                return type(a)(resolve(x) for x in a)
            return a

        try:
            args = resolve(op.args)
            kwargs = {k: resolve(v) for k, v in op.kwargs.items()}
            with torch.no_grad():
                value = op.target(*args, **kwargs)
        except Exception:
            value = None  # the user's op does not run here: nothing to say
        for s in op.sources:
            self._reads[s] -= 1
            if self._reads[s] <= 0:
                self._kept.pop(s, None)
        if not isinstance(value, torch.Tensor) or not isinstance(prepared, torch.Tensor):
            return
        if value.shape != prepared.shape or value.dtype != prepared.dtype:
            return  # a shape the shape check did not explain: not this check's to judge
        expected, got = comparable(value, prepared)
        if expected is None:
            return
        if compare(expected, got, self.atol, self.rtol).passed is False:
            self.found[name] = Specialized(op.user_node, shape_type(value), value)


__all__ = ["DecomposedValues"]
