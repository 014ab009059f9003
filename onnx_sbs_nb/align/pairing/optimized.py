"""The graph onnxruntime actually runs: the model after its graph optimizations.

Every node of a side-by-side run executes in its own one-node session, so onnxruntime's
graph optimizations (fusions, QDQ rewrites, constant folding, layout changes) never
happen there.  A deployed session applies them (``ORT_ENABLE_ALL`` is the default), and a
fused kernel may compute something else than the nodes it replaced.  This module asks
onnxruntime for the optimized model at a level and on execution providers
(``SessionOptions.optimized_model_filepath``, through :mod:`.onnxruntime_session`), loads
it back and maps it onto the original (:mod:`.graph_map`):

- a fused or contrib node keeps the names of the values it produces, so it pairs with
  torch values (and with the values of the unoptimized model) by name; its
  :class:`OptimizedNode` says which original nodes it stands for (``replaced``) and which
  original values it made internal (``internal``): those have no counterpart any more and
  are reported as internal to it, never as unpaired noise;
- onnxruntime writes nodes without their ``metadata_props``: each node gets those of the
  original node it comes from, so pairing by the exporter's ``pkg.torch.onnx.fx_node``
  keeps working on the optimized graph;
- the optimizers that changed the graph are read from the session itself (its log says,
  for each graph transformer, whether it modified the graph), not from a list kept here.

The optimized model is an ordinary ``ModelProto``: the engine runs it node by node
exactly as it runs the original.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import onnx

from ...errors import SbsInputError
from ..source.loading import load_onnx_model
from .graph_map import (
    NODE_UNCHANGED,
    OptimizedNode,
    carry_metadata,
    drop_stale_value_info,
    map_onto_original,
)
from .onnxruntime_session import (
    LEVELS,
    check_providers,
    declare_types,
    ort_session,
    process_temp_dir,
)


@dataclass
class OptimizedModel:
    """The model onnxruntime runs at ``level`` on ``providers``, mapped onto the original."""

    model: onnx.ModelProto  # optimized, with the original nodes' metadata carried over
    original: onnx.ModelProto
    level: str
    providers: list[str]
    applied: list[str]  # optimizers that modified the graph, in the order they first did
    nodes: list[OptimizedNode]
    internal: dict[str, str]  # original value -> optimized node it is internal to
    folded: dict[str, str]  # original node -> initializer now holding its output
    removed: list[str]  # original nodes no longer computed at all (eliminated)
    # original value -> the optimized value computing it anew (float16 run as float32)
    renamed: dict[str, str] = field(default_factory=dict)
    disabled: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def node(self, name: str) -> OptimizedNode:
        """An optimized node by name or by the name of a value it produces."""
        for n in self.nodes:
            if n.name == name:
                return n
        for n, proto in zip(self.nodes, self.model.graph.node):
            if name in proto.output:
                return n
        raise KeyError(f"the optimized graph has no node named {name!r} or producing it")

    @property
    def changed(self) -> list[OptimizedNode]:
        """The nodes the optimizers made (fused, rewritten or inserted), one per group."""
        return [n for n in self.nodes if n.kind != NODE_UNCHANGED and n.group == n.name]

    def group(self, name: str) -> OptimizedNode:
        """The node a node is part of (a layout Transpose belongs to its fused kernel)."""
        return self.node(self.node(name).group or name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "providers": list(self.providers),
            "applied": list(self.applied),
            "disabled": list(self.disabled),
            "nodes": [asdict(n) for n in self.nodes],
            "internal": dict(self.internal),
            "folded": dict(self.folded),
            "removed": list(self.removed),
            "renamed": dict(self.renamed),
            "notes": list(self.notes),
        }


def optimize_model(
    onx: Any,
    level: str = "all",
    providers: Sequence[Any] | None = None,
    *,
    disabled_optimizers: Sequence[str] = (),
    session_config: dict[str, str] | None = None,
) -> OptimizedModel:
    """The model onnxruntime runs at ``level`` on ``providers``, mapped onto ``onx``.

    ``disabled_optimizers``: optimizer names to leave out (``InferenceSession``'s
    ``disabled_optimizers``); ``session_config``: extra session config entries (e.g.
    ``{"session.x64quantprecision": "1"}``).  The optimized file is written in a folder
    inside this process's temporary folder, loaded back (external data included) and
    removed.
    """
    original = load_onnx_model(onx)
    if level not in LEVELS:
        raise SbsInputError(f"optimize={level!r} is not a level: use one of {list(LEVELS)}")
    providers = check_providers(providers)
    with tempfile.TemporaryDirectory(dir=process_temp_dir()) as folder:
        path = Path(folder) / "optimized.onnx"
        info = ort_session(
            original,
            level,
            providers,
            disabled_optimizers=disabled_optimizers,
            optimized_model_path=path,
            session_config=session_config,
        )
        del info.session
        optimized = onnx.load(str(path), load_external_data=True)
    mapped = map_onto_original(original, optimized)
    carry_metadata(original, optimized, mapped.nodes)
    drop_stale_value_info(optimized)
    declare_types(optimized, providers)
    notes = list(info.notes)
    if not info.log_read:
        notes.append(
            "the optimizers applied are unknown: onnxruntime's log could not be read "
            "(stderr is not a file descriptor in this process)"
        )
    return OptimizedModel(
        model=optimized,
        original=original,
        level=level,
        providers=[p if isinstance(p, str) else p[0] for p in providers],
        applied=info.applied,
        nodes=mapped.nodes,
        internal=mapped.internal,
        folded=mapped.folded,
        removed=mapped.removed,
        renamed=mapped.renamed,
        disabled=list(disabled_optimizers),
        notes=notes,
    )


__all__ = ["OptimizedModel", "optimize_model"]
