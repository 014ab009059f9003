"""What the loop asks of its reference side: the torch program (``sides.FxSide``) or an
ONNX model (``sides.OnnxSide``: two runtimes, two models) answer the same questions, so
the loop never asks which one it holds."""

from __future__ import annotations

from collections.abc import Container, Mapping
from typing import Any, Protocol

from .plan import Plan, SideGraph


class ReferenceSide(Protocol):
    graph: SideGraph
    device: str
    # the looser float dtype a value inherits from low-precision values it is computed from
    inherited: Mapping[str, str]
    undefined: Container[str]  # values of uninitialised memory (torch.empty...)
    # the devices its values move to, by node (the compiled runs hold them)
    device_map: Mapping[Any, Any]

    def initial_env(self) -> dict[str, Any]:
        """The values the side holds before any node runs (an ONNX model's inputs)."""

    def run(self, idx: int, env: dict[str, Any]) -> list[Any]:
        """Node ``idx`` run on ``env``: its outputs."""

    def forget(self, name: str) -> None:
        """A value freed by the loop: any copy the side keeps of it goes too."""

    def compiled_runs(self, plan: Plan) -> dict[int, Any]:
        """Runs of several nodes as one function, by first plan step (``fx_runs.py``)."""

    def leaf_value(self, name: str) -> Any: ...

    def is_weight(self, name: str) -> bool: ...

    def kind_of(self, name: str) -> str: ...

    def describe(self, name: str) -> dict[str, Any]: ...

    def reports_unpaired(self, idx: int, value: Any, failed: bool) -> bool: ...


__all__ = ["ReferenceSide"]
