"""A small model with a known discrepancy, built in code: what ``onnx-sbs demo`` runs.

The model (Linear -> LayerNorm -> GELU -> Linear -> Softmax) is exported with the real
exporter; then the ``epsilon`` of the ONNX ``LayerNormalization`` node is changed, the kind
of one-attribute bug a converter can make.  Every value after that node differs, and the
side-by-side run must name that node as the one whose own error fails.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass

import onnx
import torch

from ..align.source.quiet import quiet_torch_internals
from ..files import atomic_path, write_bytes_atomic

#: The epsilon written into the ONNX model instead of LayerNorm's 1e-5.
WRONG_EPSILON = 0.5


class DemoModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.norm = torch.nn.LayerNorm(32)
        self.fc2 = torch.nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.norm(self.fc1(x)))
        return torch.softmax(self.fc2(h), dim=-1)


@dataclass
class DemoCase:
    ep: torch.export.ExportedProgram
    onx: onnx.ModelProto
    args: tuple[torch.Tensor, ...]
    culprit: str  # name of the ONNX node made wrong on purpose
    culprit_output: str  # the value it produces


@dataclass
class DemoFiles:
    ep: pathlib.Path
    onnx: pathlib.Path
    inputs: pathlib.Path
    culprit: str
    culprit_output: str


def build_demo(seed: int = 0, inject: bool = True) -> DemoCase:
    """Exports :class:`DemoModel` and (unless ``inject`` is False) breaks its LayerNormalization."""
    torch.manual_seed(seed)
    model = DemoModel().eval()
    args = (torch.randn(4, 16),)
    with quiet_torch_internals():
        ep = torch.export.export(model, args)
        onx = torch.onnx.export(ep, args, dynamo=True, verbose=False).model_proto
    if not inject:
        return DemoCase(ep, onx, args, "", "")
    node = inject_attribute(onx, "LayerNormalization", "epsilon", WRONG_EPSILON)
    return DemoCase(ep, onx, args, node.name, node.output[0])


def inject_attribute(
    onx: onnx.ModelProto,
    op_type: str,
    attribute: str,
    value: float | int | str,
    index: int = 0,
) -> onnx.NodeProto:
    """Sets ``attribute`` of the ``index``-th ``op_type`` node to ``value`` (a deliberate bug)."""
    nodes = [n for n in onx.graph.node if n.op_type == op_type]
    if not -len(nodes) <= index < len(nodes):
        raise ValueError(
            f"the model has {len(nodes)} {op_type} node(s): no node #{index} to inject a "
            "discrepancy into"
        )
    node = nodes[index]
    for att in node.attribute:
        if att.name == attribute:
            node.attribute.remove(att)
            break
    node.attribute.append(onnx.helper.make_attribute(attribute, value))
    return node


def write_demo(folder: str | pathlib.Path, seed: int = 0, inject: bool = True) -> DemoFiles:
    """Saves ``model.pt2``, ``model.onnx`` and ``inputs.pt`` into ``folder``."""
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    case = build_demo(seed, inject)
    files = DemoFiles(
        folder / "model.pt2",
        folder / "model.onnx",
        folder / "inputs.pt",
        case.culprit,
        case.culprit_output,
    )
    # through the one safe writer: a link planted in the folder is replaced, not followed
    with atomic_path(files.ep) as tmp:
        torch.export.save(case.ep, str(tmp))
    write_bytes_atomic(files.onnx, case.onx.SerializeToString())
    with atomic_path(files.inputs) as tmp:
        torch.save(case.args, str(tmp))
    return files
