"""What the exporter wrote on each ONNX node about the fx node it lowers.

The dynamo exporter stores the fx node's text in ``pkg.torch.onnx.fx_node`` and an
initializer's parameter name in ``pkg.torch.onnx.original_node_name``.  Reading them is
part of loading the program (the preparation check reads them before anything is
paired), so they live with the source, below the pairing that uses them most.
"""

from __future__ import annotations

import re
from typing import Any

import onnx

FX_NODE_KEY = "pkg.torch.onnx.fx_node"
ORIGINAL_NAME_KEY = "pkg.torch.onnx.original_node_name"
_FX_NAME = re.compile(r"^%([^\s:]+)\s*:")


def fx_node_text(node: onnx.NodeProto) -> str | None:
    """The fx node ``node`` says it lowers, as the exporter printed it (its metadata)."""
    for p in node.metadata_props:
        if p.key == FX_NODE_KEY:
            return p.value
    return None


def _fx_name_in(text: str | None) -> str | None:
    m = _FX_NAME.match(text) if text is not None else None
    return m.group(1) if m else None


def fx_name_from_metadata(node: onnx.NodeProto) -> str | None:
    """The name of the fx node ``node`` says it lowers."""
    return _fx_name_in(fx_node_text(node))


class FxMetadata:
    """What the ONNX nodes of one model say they lower (``pkg.torch.onnx.fx_node``), read
    at most once per run: the preparation check, pairing and the model's tables all need
    it, and every metadata entry read from Python makes an object (5 per exported node)."""

    def __init__(
        self,
        model: onnx.ModelProto,
        texts: list[str | None] | None = None,
        names: list[str | None] | None = None,
    ) -> None:
        """``texts``, ``names``: what an earlier read of a model of the same structure
        found (``engine/setup_cache.py``: the node metadata is part of the digest)."""
        self._nodes = model.graph.node
        self._texts: list[str | None] | None = texts
        self._names: list[str | None] | None = names
        # the initializers' arrays the model's check read this run (model_check.py's
        # check_tensors), until the run's tables take them (engine/setup_cache.py)
        self._reads: dict[str, Any] | None = None

    def keep_reads(self, reads: dict[str, Any]) -> None:
        """Hands this run the initializers' arrays the model's check just read."""
        self._reads = reads or None

    def take_reads(self) -> dict[str, Any] | None:
        """The arrays :meth:`keep_reads` kept, once: metadata kept for later runs (a run
        over many inputs) must not hand out values read before the model could change."""
        reads, self._reads = self._reads, None
        return reads

    @property
    def texts(self) -> list[str | None]:
        """Each node's metadata text, None where it has none."""
        if self._texts is None:
            self._texts = [fx_node_text(n) for n in self._nodes]
        return self._texts

    @property
    def names(self) -> list[str | None]:
        """The name of the fx node each node lowers, None where it names none."""
        if self._names is None:
            self._names = [_fx_name_in(text) for text in self.texts]
        return self._names


__all__ = [
    "FX_NODE_KEY",
    "ORIGINAL_NAME_KEY",
    "FxMetadata",
    "fx_name_from_metadata",
    "fx_node_text",
]
