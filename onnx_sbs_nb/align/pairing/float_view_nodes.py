"""The nodes of the float views (``float_views.py``, ``qoperator_views.py``): what a view
node is (its metadata, its name), and the model read once with the views made for it."""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx
import onnx.helper as oh

#: metadata key on a view node: ``weight``, ``activation``, ``output`` or ``helper``
FLOAT_VIEW = "onnx_sbs_nb.float_view"
VIEW_WEIGHT = "weight"
VIEW_ACTIVATION = "activation"
VIEW_OUTPUT = "output"  # a QOperator node's integer output (qoperator_views.py)
VIEW_HELPER = "helper"  # a node a view reads (the identity of a MatMulNBits view)
#: metadata on a weight view the product multiplies by as it is (``x @ view``: a MatMul's
#: ``[K, N]``), so a linear's square weight pairs through its transposition even after
#: onnxruntime's optimizer rewrote the product (MatMulIntegerToFloat)
AS_STORED = "onnx_sbs_nb.float_view_multiplied_as_stored"
_SUFFIX = "_float_view"


def view_name(value: str) -> str:
    return f"{value}{_SUFFIX}"


def multiplied_as_stored(node: onnx.NodeProto) -> bool:
    """Whether a weight view is multiplied by as it is (:data:`AS_STORED`)."""
    return any(p.key == AS_STORED for p in node.metadata_props)


def view_kind(node: onnx.NodeProto) -> str | None:
    """``weight``, ``activation``, ``output``, ``helper`` or None (not a view)."""
    for p in node.metadata_props:
        if p.key == FLOAT_VIEW:
            return p.value
    return None


@dataclass
class Views:
    """The model read once, and the views made for it: nodes to add before or after a
    node (by its index), their value infos and the initializers they read."""

    graph: onnx.GraphProto
    opset: int
    inits: dict[str, onnx.TensorProto]
    consumers: dict[str, list[onnx.NodeProto]] = field(default_factory=dict)
    producer: dict[str, onnx.NodeProto] = field(default_factory=dict)
    taken: set[str] = field(default_factory=set)
    before: dict[int, list[onnx.NodeProto]] = field(default_factory=dict)
    after: dict[int, list[onnx.NodeProto]] = field(default_factory=dict)
    infos: list[onnx.ValueInfoProto] = field(default_factory=list)
    extra_inits: list[onnx.TensorProto] = field(default_factory=list)

    @classmethod
    def of(cls, model: onnx.ModelProto) -> Views:
        g = model.graph
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
        views = cls(g, opset, {i.name: i for i in g.initializer})
        for node in g.node:
            for i in node.input:
                if i:
                    views.consumers.setdefault(i, []).append(node)
            for o in node.output:
                if o:
                    views.producer[o] = node
        views.taken = set(views.producer) | set(views.inits)
        return views

    def add(self, k: int, nodes: list, info: onnx.ValueInfoProto, after: bool = False) -> None:
        (self.after if after else self.before).setdefault(k, []).extend(nodes)
        self.infos.append(info)

    def model(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """A copy of ``model`` with the views; ``model`` itself when there are none."""
        if not self.before and not self.after:
            return model
        out = onnx.ModelProto()
        out.CopyFrom(model)
        nodes = []
        for k, node in enumerate(self.graph.node):
            nodes.extend(self.before.get(k, ()))
            nodes.append(node)
            nodes.extend(self.after.get(k, ()))
        del out.graph.node[:]
        out.graph.node.extend(nodes)
        out.graph.value_info.extend(self.infos)
        out.graph.initializer.extend(self.extra_inits)
        return out


def fresh(name: str, taken: set[str]) -> str:
    out, k = name, 0
    while out in taken:
        k += 1
        out = f"{name}_{k}"
    taken.add(out)
    return out


def view_node(
    op: str,
    inputs: list[str],
    output: str,
    kind: str,
    of: onnx.NodeProto,
    label: str | None = None,
    as_stored: bool = False,
    **attrs,
) -> onnx.NodeProto:
    """A view node, named after the node whose value it views (a culprit names it):
    ``<node>/<label or kind>_float_view``, a helper ``<node>/<op>_for_float_view``."""
    domain = attrs.pop("domain", "")
    what = f"{op}_for_float_view" if kind == VIEW_HELPER else f"{label or kind}_float_view"
    name = f"{of.name or output}/{what}"
    node = oh.make_node(op, inputs, [output], name=name, domain=domain, **attrs)
    p = node.metadata_props.add()
    p.key, p.value = FLOAT_VIEW, kind
    if as_stored:
        p = node.metadata_props.add()
        p.key, p.value = AS_STORED, "1"
    return node


def dequantized_weight(
    node: onnx.NodeProto,
    weight: str,
    scale: str,
    zp: str,
    axis: int,
    views: Views,
    label: str | None = None,
    as_stored: bool = False,
) -> tuple[onnx.NodeProto, onnx.ValueInfoProto] | None:
    """``DequantizeLinear(weight, scale, zp)`` of ``node``'s weight initializer, per tensor
    or per channel along ``axis`` (negative: from the end), as a weight view."""
    inits = views.inits
    if weight not in inits or scale not in inits or zp and zp not in inits:
        return None
    s_dims = list(inits[scale].dims)
    zp_dims = list(inits[zp].dims) if zp else s_dims
    if zp_dims != s_dims or len(s_dims) > 1:
        return None  # DequantizeLinear wants a scale and zero point of one shape
    dims = list(inits[weight].dims)
    attrs = {}
    if s_dims and s_dims[0] != 1:
        # per channel; an axis needs opset 13
        axis = axis % len(dims) if dims else 0
        if views.opset < 13 or not dims or dims[axis] != s_dims[0]:
            return None
        attrs["axis"] = axis
    out = fresh(view_name(weight), views.taken)
    view = view_node(
        "DequantizeLinear",
        [weight, scale] + ([zp] if zp else []),
        out,
        VIEW_WEIGHT,
        node,
        label,
        as_stored,
        **attrs,
    )
    return view, oh.make_tensor_value_info(out, inits[scale].data_type, dims)


__all__ = [
    "AS_STORED",
    "FLOAT_VIEW",
    "VIEW_ACTIVATION",
    "VIEW_HELPER",
    "VIEW_OUTPUT",
    "VIEW_WEIGHT",
    "Views",
    "dequantized_weight",
    "fresh",
    "multiplied_as_stored",
    "view_kind",
    "view_name",
    "view_node",
]
