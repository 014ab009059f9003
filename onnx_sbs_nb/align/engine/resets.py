"""Where the candidate continues from the torch value instead of its own: values the user
names (``reset_names``), every node (``reset="all"``), random draws, and the outputs of a
node that failed.  After a reset, the nodes downstream are judged on torch inputs, so an
error upstream does not hide a second one."""

from __future__ import annotations

from collections.abc import Container
from typing import Any

import onnx

from ...records import STATUS_NOT_COMPARED, Record
from ..judge.judging import as_candidate
from ..pairing.pairs import Pair, Pairing
from .options import RESET_ALL, RunOptions
from .sides import OnnxSide

CONTINUED_NOTE = "the nodes after it continue from the torch value"


class Resets:
    """The run's resets (``options.reset``, ``options.reset_names``)."""

    def __init__(
        self,
        options: RunOptions,
        candidate: OnnxSide,
        pairing: Pairing,
        undefined: Container[str],
        random: Container[str],
        unproven: Container[str],
    ) -> None:
        self.candidate, self.pairing = candidate, pairing
        self.all = options.reset == RESET_ALL
        self.names = set(options.reset_names)
        self.undefined, self.random, self.unproven = undefined, random, unproven
        self.unordered: Container[str] = frozenset()
        self.reordered: Container[str] = frozenset()

    def order_free(self, unordered: Container[str], reordered: Container[str]) -> None:
        """Values whose order is free (``judge/unordered.py``), and those of them the
        comparison as sets found the same: they continue from their torch values."""
        self.unordered, self.reordered = unordered, reordered

    def after(self, name: str, pair: Pair, rec: Record, ref_env: dict[str, Any]) -> bool:
        """Whether the candidate continues from the torch value after pair ``name``'s
        record ``rec`` (a weight is the model's own constant: only replaced when named)."""
        names = self.names
        return pair.fx_name in ref_env and (
            (self.all and name not in self.candidate.initializers and name not in self.undefined)
            or name in names
            or pair.fx_name in names
            or (name in self.random and rec.status == STATUS_NOT_COMPARED)
            or (name in self.reordered and rec.passed)
        )

    def feed(self, name: str, pair: Pair, cand_env: dict[str, Any], ref_env: dict[str, Any]):
        """The candidate's value ``name`` replaced by its torch partner's."""
        cand = self.candidate
        cand_env[name] = cand.as_runner_value(as_candidate(pair, ref_env[pair.fx_name]))

    def fed_names(self) -> set[str]:
        """Candidate values the run replaces by their torch values, whatever they are."""
        fed = set(self.random)
        fed.update(self.unordered)  # fed when found the same as sets: decided as it runs
        names = self.names
        if names:
            fed.update(
                name
                for name, pair in self.pairing.by_onnx.items()
                if name in names or pair.fx_name in names
            )
        return fed

    def after_failure(
        self, node: onnx.NodeProto, ref_env: dict[str, Any], cand_env: dict[str, Any]
    ) -> None:
        """After a node failed, its outputs take their torch values, so the nodes after it
        still run and are judged (a second, independent bug is not hidden)."""
        cand, by_onnx = self.candidate, self.pairing.by_onnx
        for o in node.output:
            pair = by_onnx.get(o)
            if o and pair is not None and pair.fx_name in ref_env and o not in self.unproven:
                cand_env[o] = cand.as_runner_value(as_candidate(pair, ref_env[pair.fx_name]))
                cand.notes[o] = CONTINUED_NOTE


__all__ = ["CONTINUED_NOTE", "Resets"]
