"""Converting a float32 model to float16 or bfloat16 with a block list: onnxconverter-common's
converter for float16, then the same model retyped for bfloat16 (the converter has no
bfloat16), keeping the output types and the blocked nodes' weights as the float32 model has them."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from ..dtypes import ONNX_FLOAT_TYPES
from ..errors import SbsInputError
from .precision_casts import repair_round_trips

LOW_DTYPES = {"float16": onnx.TensorProto.FLOAT16, "bfloat16": onnx.TensorProto.BFLOAT16}
_FLOAT_TYPES = ONNX_FLOAT_TYPES
INSTALL_HINT = "pip install 'onnx_sbs_nb[precision]'"


# ---------------------------------------------------------------- conversion


def _float16_module() -> Any:
    try:
        from onnxconverter_common import float16
    except ImportError:
        raise SbsInputError(
            "converting a model to float16 needs onnxconverter-common: " + INSTALL_HINT
        ) from None
    return float16


def convert_model(
    model: onnx.ModelProto,
    dtype: str = "float16",
    node_block_list: list[str] | tuple[str, ...] = (),
    keep_io_types: bool = True,
) -> onnx.ModelProto:
    """``model`` (float32) converted to ``dtype`` except the nodes of ``node_block_list``.

    float16: onnxconverter-common's ``convert_float_to_float16``.  bfloat16: the same
    conversion (its large-value clamp lifted), every float16 type, Cast and value then
    turned to bfloat16, values taken from ``model`` where it holds them in float32.
    """
    float16 = _float16_module()
    if dtype not in LOW_DTYPES:
        raise SbsInputError(f"dtype must be one of {sorted(LOW_DTYPES)}, not {dtype!r}")
    import warnings

    bf16 = dtype == "bfloat16"
    kw = {"max_finite_val": 3.0e38, "min_positive_val": 1e-38} if bf16 else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "the float32 number ... will be truncated"
        out = float16.convert_float_to_float16(
            model, keep_io_types=keep_io_types, node_block_list=list(node_block_list), **kw
        )
    if bf16:
        out = _float16_to_bfloat16(out, model)
    if node_block_list:
        _keep_blocked_weights(out, model)
        repair_round_trips(out)  # float32 between two blocked nodes, not float16
    if keep_io_types:
        _keep_output_types(out, model)
    return out


def _keep_output_types(model: onnx.ModelProto, original: onnx.ModelProto) -> None:
    """Graph outputs in their original float type (``keep_io_types``).

    onnxconverter-common drops the Casts around a blocked node that computes a graph
    output as unnecessary, leaving the Cast down to float16 in their place: the output
    is float16, and values a float32 node computed overflow there.  That Cast is turned
    back to the output's type (or one is added).
    """
    g = model.graph
    want = {o.name: o.type.tensor_type.elem_type for o in original.graph.output}
    producers = {o: n for n in g.node for o in n.output if o}
    for out in g.output:
        elem = want.get(out.name)
        if elem is None or elem not in _FLOAT_TYPES or out.type.tensor_type.elem_type == elem:
            continue
        node = producers.get(out.name)
        if node is None:
            continue
        to = [a for a in node.attribute if a.name == "to"]
        if node.op_type == "Cast" and node.domain in ("", "ai.onnx") and to:
            to[0].i = elem
        else:
            low = f"{out.name}_before_cast"
            node.output[list(node.output).index(out.name)] = low
            g.node.append(onnx.helper.make_node("Cast", [low], [out.name], to=elem))
        out.type.tensor_type.elem_type = elem


def _keep_blocked_weights(model: onnx.ModelProto, original: onnx.ModelProto) -> None:
    """The weights of the nodes kept in float32 in float32 again.

    onnxconverter-common casts a blocked node's inputs before it converts the weights, so
    it no longer sees them as the blocked node's: every float weight is converted (and
    clamped to +-max_finite_val, 1e4), then cast back up.  Each such Cast is given the
    original float32 weight instead (a Cast to float of a float is the value itself).
    """
    g = model.graph
    low = {onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
    inits = {i.name: i for i in g.initializer}
    originals = {i.name: i for i in original.graph.initializer}
    added: dict[str, str] = {}
    for node in g.node:
        if node.op_type != "Cast" or node.domain not in ("", "ai.onnx"):
            continue
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        name = node.input[0] if node.input else ""
        init, orig = inits.get(name), originals.get(name)
        if to != onnx.TensorProto.FLOAT or init is None or init.data_type not in low:
            continue
        if orig is None or orig.data_type != onnx.TensorProto.FLOAT:
            continue
        if name not in added:
            copy = onnx.TensorProto()
            copy.CopyFrom(orig)
            copy.name = added[name] = f"{name}_float32"
            g.initializer.append(copy)
        node.input[0] = added[name]
    if added:
        used = {i for n in g.node for i in n.input} | {o.name for o in g.output}
        keep = [i for i in g.initializer if i.name in used]
        if len(keep) != len(g.initializer):
            del g.initializer[:]
            g.initializer.extend(keep)


def _to_bf16_tensor(t: onnx.TensorProto, original: onnx.TensorProto | None) -> None:
    import ml_dtypes

    src = original if original is not None else t
    values = onnx.numpy_helper.to_array(src).astype(np.float32).astype(ml_dtypes.bfloat16)
    new = onnx.numpy_helper.from_array(values, t.name)
    meta = list(t.metadata_props)
    t.CopyFrom(new)
    t.metadata_props.extend(meta)


def _float16_to_bfloat16(model: onnx.ModelProto, original: onnx.ModelProto) -> onnx.ModelProto:
    f16, bf16 = onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16
    inits = {i.name: i for i in original.graph.initializer}
    nodes = {n.name: n for n in original.graph.node if n.name}

    def retype(t: onnx.TypeProto) -> None:
        if t.HasField("tensor_type") and t.tensor_type.elem_type == f16:
            t.tensor_type.elem_type = bf16

    def graph(g: onnx.GraphProto) -> None:
        for i in g.initializer:
            if i.data_type == f16:
                _to_bf16_tensor(i, inits.get(i.name))
        for vi in [*g.input, *g.output, *g.value_info]:
            retype(vi.type)
        for n in g.node:
            orig = nodes.get(n.name)
            for a in n.attribute:
                if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == f16:
                    o = None
                    if orig is not None:
                        o = next((x.t for x in orig.attribute if x.name == a.name), None)
                    _to_bf16_tensor(
                        a.t, o if o is not None and o.data_type in _FLOAT_TYPES else None
                    )
                elif a.type == onnx.AttributeProto.INT and a.name in ("to", "dtype") and a.i == f16:
                    a.i = bf16
                elif a.type == onnx.AttributeProto.GRAPH:
                    graph(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for sub in a.graphs:
                        graph(sub)

    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph(out.graph)
    return out


# ---------------------------------------------------------------- reading models


def low_precision_of(model: onnx.ModelProto) -> str | None:
    """'float16' or 'bfloat16' when most float weights and values of ``model`` are."""
    counts: dict[int, int] = {}
    for i in model.graph.initializer:
        if i.data_type in _FLOAT_TYPES:
            counts[i.data_type] = counts.get(i.data_type, 0) + 1
    for vi in [*model.graph.value_info, *model.graph.output]:
        t = vi.type.tensor_type.elem_type
        if t in _FLOAT_TYPES:
            counts[t] = counts.get(t, 0) + 1
    if not counts:
        return None
    best = max(counts, key=counts.__getitem__)
    return next((k for k, v in LOW_DTYPES.items() if v == best), None)
