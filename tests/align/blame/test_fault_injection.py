"""Fault injection: corrupt one ONNX node, the summary must name exactly that node.

A tiny Llama (transformers, random weights) and a small attention model are exported
once per module with the real exporter; each case edits one thing in a copy of the ONNX
model (a constant, an attribute, an op swapped for a near neighbour, a weight) at an
early, middle or late position, runs the engine with ``own_error=True``
(and without), and checks :func:`onnx_sbs_nb.align.blame.summary.summarize`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper

run_mod = pytest.importorskip("onnx_sbs_nb.align.run", reason="the engine is not there yet")
from onnx_sbs_nb.align.blame.summary import summarize  # noqa: E402

from ...models import CausalAttention  # noqa: E402

run_aligned = run_mod.run_aligned
AlignedRun = run_mod.AlignedRun


# --------------------------------------------------------------------------- corruptions


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    return m


def _node(model: onnx.ModelProto, name: str) -> onnx.NodeProto:
    for n in model.graph.node:
        if n.name == name:
            return n
    raise KeyError(f"no node {name!r}; the exporter's naming changed: pick another node")


def change_initializer(name: str, fn: Callable[[np.ndarray], np.ndarray]):
    def apply(model: onnx.ModelProto) -> onnx.ModelProto:
        m = _copy(model)
        for i, t in enumerate(m.graph.initializer):
            if t.name == name:
                m.graph.initializer[i].CopyFrom(
                    numpy_helper.from_array(fn(numpy_helper.to_array(t).copy()), name)
                )
                return m
        raise KeyError(f"no initializer {name!r}")

    return apply


def swap_op(node_name: str, new_op: str):
    def apply(model: onnx.ModelProto) -> onnx.ModelProto:
        m = _copy(model)
        _node(m, node_name).op_type = new_op
        return m

    return apply


def set_attribute(node_name: str, key: str, value):
    def apply(model: onnx.ModelProto) -> onnx.ModelProto:
        m = _copy(model)
        node = _node(m, node_name)
        kept = [a for a in node.attribute if a.name != key]
        del node.attribute[:]
        node.attribute.extend([*kept, helper.make_attribute(key, value)])
        return m

    return apply


@dataclass
class Case:
    id: str
    corrupt: Callable[[onnx.ModelProto], onnx.ModelProto]
    culprit: str  # ONNX value the summary must name as the first own failure
    node: str | None  # the ONNX node producing it (None for a weight)
    inherits: tuple[str, ...] = ()  # downstream values whose own error must pass


# --------------------------------------------------------------------------- tiny Llama


@pytest.fixture(scope="module")
def llama():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        use_cache=False,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    input_ids = torch.randint(0, 128, (1, 8))
    ep = torch.export.export(model, (input_ids,))
    onx = torch.onnx.export(ep, (input_ids,), dynamo=True, verbose=False).model_proto
    return ep, onx, (input_ids,)


LLAMA_CASES = [
    # early: the RMSNorm epsilon constant; its first consumer is the first norm's Add
    Case(
        "early-constant-eps",
        change_initializer("val_103", lambda a: a + 1.0),
        "add_3",
        "node_add_3",
        inherits=("rsqrt", "mul_3"),
    ),  # fmt: skip
    # early weight: the (transposed) q_proj weight of layer 0, paired with the state dict
    Case("early-weight-q_proj", change_initializer("val_105", lambda a: a * 1.5), "val_105", None),
    # middle: the SwiGLU product of layer 0 turned into a sum
    Case(
        "middle-op-Mul-to-Add",
        swap_op("node_mul_11", "Add"),
        "mul_11",
        "node_mul_11",
        inherits=("linear_6",),
    ),  # fmt: skip
    # middle: a head transpose of layer 1 with another permutation (shape changes)
    Case(
        "middle-attribute-perm",
        set_attribute("node_transpose_4", "perm", [0, 2, 3, 1]),
        "transpose_4",
        "node_transpose_4",
    ),  # fmt: skip
    # late: the last residual Add turned into Sub
    Case(
        "late-op-Add-to-Sub",
        swap_op("node_add_14", "Sub"),
        "add_14",
        "node_add_14",
        inherits=("pow_5",),
    ),  # fmt: skip
    # late: the final norm's Reciprocal replaced by its neighbour Sqrt
    Case(
        "late-op-Reciprocal-to-Sqrt",
        swap_op("node_rsqrt_4", "Sqrt"),
        "rsqrt_4",
        "node_rsqrt_4",
        inherits=("mul_21",),
    ),  # fmt: skip
]


def _check(ep, onx, args, case: Case, rerun: bool):
    bad = case.corrupt(onx)
    records = list(run_aligned(ep, bad, args, own_error=rerun))
    s = summarize(records)
    assert s.verdict == "fail"
    culprit = s.first_own_failure
    assert culprit is not None, s.to_text()
    assert culprit.onnx_name == case.culprit, s.to_text()
    if case.node is not None:
        producer = next(n for n in bad.graph.node if case.culprit in n.output)
        assert producer.name == case.node
        assert culprit.onnx_id_node == list(bad.graph.node).index(producer)
    else:
        assert culprit.kind == "weight"
    assert case.culprit in s.to_text()
    c = s.culprit
    assert c is not None and c.step == culprit.step and c.onnx_name == case.culprit
    if case.node is not None:
        assert c.onnx_node == case.node and case.node in c.onnx_nodes
        assert c.ep_source  # the line of model code the node comes from
        assert c.ep_user_name in {n.name for n in ep.graph.nodes}
    assert s.top_suspects and json.dumps(s.to_dict())
    return records, s


@pytest.mark.parametrize("case", LLAMA_CASES, ids=lambda c: c.id)
def test_llama_summary_names_the_corrupted_node(llama, case):
    ep, onx, args = llama
    records, s = _check(ep, onx, args, case, rerun=True)
    if case.node is not None:
        assert s.first_own_failure_rule == "rerun"
        assert s.first_own_failure.passed2 is False
    # without the rerun, the fallback rule lands on the same node (a second run of the
    # same corrupted model runs stretches, which may list records in another order)
    _, s2 = _check(ep, onx, args, case, rerun=False)
    assert s2.first_own_failure.onnx_name == s.first_own_failure.onnx_name
    assert s2.first_own_failure.ep_name == s.first_own_failure.ep_name


@pytest.mark.parametrize("case", [c for c in LLAMA_CASES if c.inherits], ids=lambda c: c.id)
def test_llama_downstream_nodes_inherit_the_error(llama, case):
    """Values right after the culprit fail their first comparison, not their own."""
    ep, onx, args = llama
    records = list(run_aligned(ep, case.corrupt(onx), args, own_error=True))
    by_name = {r.onnx_name: r for r in records}
    for name in case.inherits:
        r = by_name[name]
        assert r.passed is False, (name, r.err_abs)
        assert r.passed2 is True, (name, r.err_abs, r.err_abs2)
    s = summarize(records)
    assert s.top_suspects[0].onnx_name == case.culprit


def test_llama_clean_export_passes(llama):
    ep, onx, args = llama
    s = summarize(run_aligned(ep, onx, args, own_error=True))
    assert s.verdict == "pass", s.to_text()
    assert s.first_own_failure is None and s.first_failure is None


def test_llama_culprit_bundle_replays_in_a_subprocess(llama, tmp_path):
    ep, onx, args = llama
    bad = swap_op("node_mul_11", "Add")(onx)
    run = AlignedRun(ep, bad, args, own_error=True)
    s = summarize(run)
    culprit = s.first_own_failure
    folder = run.actions.save_replay("node_mul_11", tmp_path)
    assert folder.resolve().parent == tmp_path.resolve()
    out = subprocess.run(
        [sys.executable, "replay.py", "--json"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["node"] == "node_mul_11"
    assert result["max_abs_torch_inputs"] == pytest.approx(culprit.err_abs2, rel=1e-3, abs=1e-6)
    assert result["max_abs_onnx_inputs"] == pytest.approx(culprit.err_abs, rel=1e-3, abs=1e-6)
    assert result["recorded"]["err_abs2"] == culprit.err_abs2


# --------------------------------------------------------------------------- attention


@pytest.fixture(scope="module")
def attention():
    torch.manual_seed(0)
    args = (torch.randn(2, 5, 16),)
    ep = torch.export.export(CausalAttention().eval(), args)
    onx = torch.onnx.export(ep, args, dynamo=True, verbose=False).model_proto
    return ep, onx, args


def _sdpa_scale(model: onnx.ModelProto) -> str:
    """The scale constant of the SDPA decomposition (a Mul's scalar initializer)."""
    inits = {t.name: t for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Mul":
            for i in n.input:
                if i in inits and list(inits[i].dims) in ([], [1]):
                    return i
    raise KeyError("no scalar Mul constant: the SDPA decomposition changed")


ATTENTION_CASES = [
    # early: the qkv projection's bias Add turned into Sub
    Case(
        "early-op-Add-to-Sub",
        swap_op("node_linear", "Sub"),
        "linear",
        "node_linear",
        inherits=("view", "transpose"),
    ),  # fmt: skip
    # middle: the softmax axis inside the SDPA decomposition: its values have no torch
    # partner, so the culprit is the SDPA output, the first value both sides have
    Case(
        "middle-attribute-softmax-axis",
        set_attribute("node_Softmax_70", "axis", 2),
        "scaled_dot_product_attention",
        "node_scaled_dot_product_attention",
        inherits=("transpose_3",),
    ),  # fmt: skip
    # late: the output projection's bias Add turned into Sub
    Case("late-op-Add-to-Sub", swap_op("node_linear_1", "Sub"), "linear_1", "node_linear_1"),
    # late weight: the (transposed) output projection weight
    Case(
        "late-weight-out", change_initializer("val_76", lambda a: a[::-1].copy()), "val_76", None
    ),  # fmt: skip
]


@pytest.mark.parametrize("case", ATTENTION_CASES, ids=lambda c: c.id)
def test_attention_summary_names_the_corrupted_node(attention, case):
    ep, onx, args = attention
    _, s = _check(ep, onx, args, case, rerun=True)
    _, s2 = _check(ep, onx, args, case, rerun=False)
    assert s2.first_own_failure.step == s.first_own_failure.step


def test_attention_sdpa_scale_constant(attention):
    """A constant inside the SDPA decomposition: blamed on the SDPA output, own error."""
    ep, onx, args = attention
    name = _sdpa_scale(onx)
    case = Case("sdpa-scale", change_initializer(name, lambda a: a * 2), "scaled_dot_product_attention",
                "node_scaled_dot_product_attention", inherits=("transpose_3",))  # fmt: skip
    records, s = _check(ep, onx, args, case, rerun=True)
    assert s.first_own_failure_rule == "rerun"
    by_name = {r.onnx_name: r for r in records}
    assert by_name["transpose_3"].passed is False and by_name["transpose_3"].passed2 is True


@pytest.mark.parametrize("case", [c for c in ATTENTION_CASES if c.inherits], ids=lambda c: c.id)
def test_attention_downstream_nodes_inherit_the_error(attention, case):
    ep, onx, args = attention
    records = list(run_aligned(ep, case.corrupt(onx), args, own_error=True))
    by_name = {r.onnx_name: r for r in records}
    for name in case.inherits:
        assert by_name[name].passed is False, name
        assert by_name[name].passed2 is True, (name, by_name[name].err_abs2)
