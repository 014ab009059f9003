"""ONNX ops whose every output element depends only on the elements at the same position
of their inputs.

Run on exact inputs, such an op rounds each element by a few ulps of that element at
most, whatever the other elements' sizes: an element far off relative to itself is the
op's error, not rounding, however small beside the tensor's largest value (``log1p(x)``
lowered as ``Log(1 + x)`` gives 0 for x = 1e-9).  A reduction or a product sums terms of
other sizes, and its elements near 0 (cancellation) are not judged this way.
"""

from __future__ import annotations

ELEMENTWISE_OPS = frozenset(
    {
        "Abs", "Acos", "Acosh", "Add", "And", "Asin", "Asinh", "Atan", "Atanh", "BitShift",
        "Cast", "CastLike", "Ceil", "Celu", "Clip", "Cos", "Cosh", "Div", "Elu", "Equal",
        "Erf", "Exp", "Expm1", "Floor", "Gelu", "Greater", "GreaterOrEqual", "HardSigmoid",
        "HardSwish", "Identity", "IsInf", "IsNaN", "LeakyRelu", "Less", "LessOrEqual", "Log",
        "Log1p", "Max", "Mean", "Min", "Mish", "Mod", "Mul", "Neg", "Not", "Or", "Pow",
        "PRelu", "Reciprocal", "Relu", "Round", "Selu", "Sigmoid", "Sign", "Sin", "Sinh",
        "Softplus", "Softsign", "Sqrt", "Sub", "Sum", "Tan", "Tanh", "ThresholdedRelu",
        "Where", "Xor",
    }
)  # fmt: skip

#: An element this far off relative to itself (elementwise ops only) is no rounding: a
#: thousand float32 ulps, and beyond float16's and bfloat16's own precision.
ELEMENT_ERROR_FLOOR = 1e-2


def is_elementwise(op_type: str | None) -> bool:
    return op_type in ELEMENTWISE_OPS


__all__ = ["ELEMENTWISE_OPS", "ELEMENT_ERROR_FLOOR", "is_elementwise"]
