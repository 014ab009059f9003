"""Values drawn at random in the forward: each side draws its own, so they are checked
on shape and type only, and the candidate continues from the torch draw; everything
computed after them is compared as usual (align/engine/randomness.py)."""

from __future__ import annotations

import onnx
import pytest
import torch
from onnx import numpy_helper

from onnx_sbs_nb.align.blame.summary import summarize
from onnx_sbs_nb.align.engine.plan import SideGraph
from onnx_sbs_nb.align.engine.randomness import random_values
from onnx_sbs_nb.align.run import AlignedRun

from ...models import export


class _Vae(torch.nn.Module):
    """A VAE's reparameterisation: z = mu + sigma * eps, eps ~ N(0, 1), then a decoder."""

    def __init__(self):
        super().__init__()
        self.enc = torch.nn.Linear(8, 12)
        self.dec = torch.nn.Linear(6, 8)

    def forward(self, x):
        mu, logvar = self.enc(x).chunk(2, dim=-1)
        z = mu + torch.exp(0.5 * logvar) * torch.randn_like(mu)
        keep = (torch.rand(z.shape) > 0.1).to(z.dtype)  # a mask drawn in forward
        return torch.tanh(self.dec(z * keep))


@pytest.fixture(scope="module")
def vae():
    torch.manual_seed(0)
    x = torch.randn(3, 8)
    ep, onx = export(_Vae().eval(), (x,))
    ops = {n.op_type for n in onx.graph.node}
    assert {"RandomNormalLike"} <= ops and ops & {"RandomUniform", "RandomUniformLike"}
    return ep, onx, (x,)


@pytest.mark.parametrize("own_error", [False, True])
def test_a_faithful_export_with_noise_passes_and_is_compared_after_it(vae, own_error):
    ep, onx, args = vae
    records = list(AlignedRun(ep, onx, args, runner="onnxruntime", own_error=own_error))
    assert not [r for r in records if r.failed]
    drawn = [r for r in records if "drawn at random" in (r.comment or "")]
    assert {r.onnx_op_type for r in drawn} == {"RandomNormalLike", "RandomUniformLike"}, drawn
    assert all(r.status == "not_compared" and r.reset and r.err_abs is None for r in drawn)
    # what comes after the draws is compared: the decoder, its tanh, the output
    after = [r for r in records if r.ep_name in ("linear_1", "tanh")]
    assert len(after) == 2 and all(r.status == "ok" and r.err_abs is not None for r in after)
    assert summarize(records).verdict == "pass"


def test_a_fault_after_the_noise_is_named_not_the_noise(vae):
    ep, onx, args = vae
    bad = onnx.ModelProto()
    bad.CopyFrom(onx)
    init = next(i for i in bad.graph.initializer if i.name == "dec.weight")
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.5, init.name))
    records = list(AlignedRun(ep, bad, args, runner="onnxruntime", own_error=True))
    s = summarize(records)
    assert s.verdict == "fail"
    named = s.first_own_failure
    assert named is not None and named.onnx_name in ("dec.weight", "linear_1"), named
    assert all(
        r.status == "not_compared" for r in records if "drawn at random" in (r.comment or "")
    )


def test_a_draw_reaches_the_first_paired_values_through_unpaired_ones():
    # 0: a draw r (unpaired); 1: c = Cast(r); 2: y = c + x; 3: m = x * x; 4: n = -y
    graph = SideGraph(
        inputs=[(), ("r",), ("c", "x"), ("x", "x"), ("y",)],
        outputs=[("r",), ("c",), ("y",), ("m",), ("n",)],
        available={"x"},
    )
    assert random_values(graph, (0,), {"c", "y", "m", "n"}) == {"c"}
    assert random_values(graph, (0,), {"y", "m", "n"}) == {"y"}
    assert random_values(graph, (), {"c"}) == frozenset()


def test_a_draw_of_another_shape_is_still_a_mismatch(vae):
    ep, onx, args = vae
    bad = onnx.ModelProto()
    bad.CopyFrom(onx)
    node = next(n for n in bad.graph.node if n.op_type == "RandomNormalLike")
    node.attribute.append(onnx.helper.make_attribute("dtype", onnx.TensorProto.DOUBLE))
    records = list(AlignedRun(ep, bad, args, runner="onnxruntime"))
    (draw,) = [r for r in records if r.onnx_name == node.output[0]]
    assert draw.status == "dtype_mismatch" and draw.failed


def test_a_dropout_in_training_mode_is_a_draw_and_one_in_inference_is_not():
    from onnx import TensorProto, helper

    from onnx_sbs_nb.align.engine.randomness import random_nodes

    def dropout(mode: str):
        return helper.make_node("Dropout", ["x", "r", mode], ["y", f"m_{mode}"])

    nodes = [
        helper.make_node(
            "Constant", [], ["on"], value=helper.make_tensor("t", TensorProto.BOOL, [], [True])
        ),
        dropout("on"),  # a constant true: trains
        dropout("off"),  # an initializer false: the identity
        dropout("computed"),  # decided at run time: may train
        helper.make_node("Dropout", ["x"], ["z"]),  # no training_mode: inference
        helper.make_node("RandomNormalLike", ["x"], ["n"]),
    ]
    off = numpy_helper.from_array(__import__("numpy").array(False), "off")
    assert random_nodes(nodes, {"off": off}) == (1, 3, 5)

    class TrainDropout(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.dropout(x.sin(), 0.5, training=True) + 1

    x = torch.rand(4, 6)
    ep, onx = export(TrainDropout(), (x,))
    records = list(AlignedRun(ep, onx, (x,), runner="onnxruntime", own_error=True))
    assert not [r for r in records if r.failed]
    drawn = [r for r in records if r.status == "not_compared" and r.reset]
    assert drawn and {r.onnx_op_type for r in drawn} == {"Dropout"}
    (add,) = [r for r in records if r.ep_name == "add"]
    assert add.status == "ok" and add.err_abs is not None
