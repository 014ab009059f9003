"""Which nodes a run writes replay bundles for: :class:`ReplayConfig`, an option of a run.

It is read with the run's options, long before any bundle is written (``replay.py``
writes them after the run), so it lives with the options.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...files import write_text_atomic
from ...records import KIND_INPUT, KIND_WEIGHT, Record


@dataclass
class ReplayConfig:
    """Which nodes get a replay bundle.

    A record is selected when it comes from an ONNX node and

    - it matches ``names`` or ``op_types`` (either; when both are empty every node
      matches), and
    - when ``threshold`` is set, its own error (``err_abs2``, else ``err_abs``) is above
      it (NaN counts as above).

    A config with no names, no op types and no threshold selects nothing.  At most
    ``max_nodes`` nodes are selected; ``prefix_model`` also writes the model from the
    original inputs to each selected node.
    """

    names: list[str] = field(default_factory=list)  # ONNX node or value names, or fx names
    op_types: list[str] = field(default_factory=list)
    threshold: float | None = None
    prefix_model: bool = False
    max_nodes: int = 50

    def __post_init__(self) -> None:
        for attr in ("names", "op_types"):
            value = getattr(self, attr)
            if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
                raise TypeError(f"ReplayConfig.{attr} must be a list of str, not {value!r}")
            setattr(self, attr, list(value))
        if self.threshold is not None:
            if isinstance(self.threshold, bool) or not isinstance(self.threshold, (int, float)):
                raise TypeError(
                    f"ReplayConfig.threshold must be a float or None, not {self.threshold!r}"
                )
            self.threshold = float(self.threshold)
        if (
            isinstance(self.max_nodes, bool)
            or not isinstance(self.max_nodes, int)
            or self.max_nodes < 0
        ):
            raise ValueError(f"ReplayConfig.max_nodes must be an int >= 0, not {self.max_nodes!r}")
        if not isinstance(self.prefix_model, bool):
            raise TypeError(f"ReplayConfig.prefix_model must be a bool, not {self.prefix_model!r}")

    @property
    def empty(self) -> bool:
        return not self.names and not self.op_types and self.threshold is None

    def selects(self, record: Record, node_name: str | None = None) -> bool:
        """Whether ``record`` (whose ONNX node is ``node_name`` when known) is selected."""
        if self.empty or record.kind in (KIND_INPUT, KIND_WEIGHT):
            return False
        if record.onnx_op_type is None or record.onnx_name is None:
            return False  # only ONNX nodes can be replayed
        if self.names or self.op_types:
            names = set(self.names)
            # any name the record goes by: ONNX value or node, prepared or user fx node
            known = {record.onnx_name, record.ep_name, record.ep_user_name, node_name}
            by_name = bool(names & (known - {None}))
            if not by_name and record.onnx_op_type not in self.op_types:
                return False
        if self.threshold is not None:
            err = record.err_abs2 if record.err_abs2 is not None else record.err_abs
            if err is None:
                return False
            if not (math.isnan(err) or err > self.threshold):
                return False
        return True

    def select(self, records: Iterable[Record]) -> list[Record]:
        """Selected records, one per ONNX node (its first output), at most ``max_nodes``."""
        out: list[Record] = []
        seen: set[Any] = set()
        for rec in records:
            if len(out) >= self.max_nodes:
                break
            key = rec.onnx_id_node if rec.onnx_id_node is not None else rec.onnx_name
            if key in seen or not self.selects(rec):
                continue
            seen.add(key)
            out.append(rec)
        return out

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ReplayConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(
                f"unknown ReplayConfig keys {unknown}; expected some of {sorted(known)}"
            )
        return cls(**d)

    @classmethod
    def from_json(cls, text: str) -> ReplayConfig:
        d = json.loads(text)
        if not isinstance(d, dict):
            raise ValueError(f"a ReplayConfig JSON must be an object, not {type(d).__name__}")
        return cls.from_dict(d)

    def save(self, path: str | os.PathLike[str]) -> pathlib.Path:
        """Writes the JSON whole (a new file moved into place: a link there is replaced,
        never followed)."""
        return write_text_atomic(path, self.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ReplayConfig:
        return cls.from_json(pathlib.Path(path).read_text(encoding="utf-8"))


__all__ = ["ReplayConfig"]
