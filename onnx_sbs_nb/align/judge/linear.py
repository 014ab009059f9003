"""A failing linear also says whether torch's product agrees on the ONNX inputs (a
kernel's precision, or the weight): one more matmul, only where it helps."""

from __future__ import annotations

from typing import Any

import onnx
import torch

from ...compare.diff import compare
from ...convert import to_torch
from ...records import Record
from ...records import join_comments as _join
from ..pairing.pairs import Pair
from .context import STAGE_AFTER, RuleContext

LINEAR_TARGETS = ("aten.linear", "aten.addmm", "aten.mm", "aten.matmul", "aten.bmm")


def linear_check(node: onnx.NodeProto, inputs: list | None, got: Any) -> str | None:
    """Compares a Gemm/MatMul output with torch on the same (ONNX-side) inputs."""
    if not inputs or any(x is None for x in inputs[:2]):
        return None
    try:
        a, b = to_torch(inputs[0]), to_torch(inputs[1])
        if node.op_type == "MatMul":
            ref = torch.matmul(a, b)
        else:
            attrs = {x.name: onnx.helper.get_attribute_value(x) for x in node.attribute}
            if attrs.get("transA", 0):
                a = a.t()
            if attrs.get("transB", 0):
                b = b.t()
            ref = attrs.get("alpha", 1.0) * (a @ b)
            if len(inputs) > 2 and inputs[2] is not None:
                ref = ref + attrs.get("beta", 1.0) * to_torch(inputs[2])
        d = compare(ref, got)
        return f"vs torch.nn.functional.linear on the ONNX inputs: err_abs={d.err_abs:.3g}"
    except Exception:
        return None


class LinearCheck:
    """Annotates only: a Gemm or MatMul of a torch linear that fails (first or own
    comparison) is compared with torch's product of its ONNX inputs."""

    name = "linear_check"
    stage = STAGE_AFTER
    own_error = False

    def applies(self, pair: Pair, ctx: RuleContext) -> bool:
        return ctx.has_own and ctx.node_inputs is not None

    def judge(self, record: Record, expected: Any, got: Any, ctx: RuleContext) -> bool:
        if not (record.failed or record.passed2 is False):
            return False
        if record.onnx_op_type not in ("Gemm", "MatMul"):
            return False
        if not (record.ep_target or "").startswith(LINEAR_TARGETS):
            return False
        found = ctx.node_inputs(ctx.name)
        if found is None:
            return False
        note = linear_check(found[0], found[1], got)
        if note:
            record.comment = _join(record.comment, note)
        return False


__all__ = ["LINEAR_TARGETS", "LinearCheck", "linear_check"]
