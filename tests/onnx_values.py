"""Every value an ONNX model computes, from one whole-model onnxruntime session."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort


def onnx_values(
    model: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    *,
    optimize: bool = True,
    initializers: bool = False,
) -> dict[str, np.ndarray]:
    """The feeds plus every node output (intermediate ones exposed as outputs).

    ``optimize=False``: onnxruntime leaves the graph as it is (a graph that is already
    the optimized one, with contrib ops, is then run as written); ``initializers``:
    the weights too.
    """
    m = onnx.ModelProto()
    m.CopyFrom(model)
    known = {o.name for o in m.graph.output}
    for node in m.graph.node:
        for out in node.output:
            if out and out not in known:
                m.graph.output.append(onnx.ValueInfoProto(name=out))
                known.add(out)
    so = ort.SessionOptions()
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    values = {**feeds, **dict(zip(names, sess.run(None, feeds)))}
    if initializers:
        for init in m.graph.initializer:
            values[init.name] = onnx.numpy_helper.to_array(init)
    return values
