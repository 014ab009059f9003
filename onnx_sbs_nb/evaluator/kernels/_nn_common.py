"""Helpers shared by the neural-network kernel modules (no kernels here)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch

from ..registry import Kernel, op


def register_versions(
    op_type: str,
    impl: Kernel,
    attrs: Mapping[int, Collection[str]],
    *,
    max_inputs: Mapping[int, int] | None = None,
    ignored: Collection[str] = (),
    domain: str = "",
    host_inputs: tuple[int, ...] = (),
) -> None:
    """Registers ``impl`` once per since-version in ``attrs``, each accepting only the
    attributes (and at most the inputs) of its version, as a kernel with that exact
    signature would. Attributes in ``ignored`` are accepted and dropped (no effect on
    results); ``impl`` takes every other attribute as a keyword with the spec's default.
    """
    for since, names in attrs.items():
        limit = (max_inputs or {}).get(since)
        op(op_type, since=since, domain=domain, host_inputs=host_inputs)(
            _versioned(op_type, since, impl, frozenset(names), limit, frozenset(ignored))
        )


def _versioned(
    op_type: str,
    since: int,
    impl: Kernel,
    allowed: frozenset[str],
    max_inputs: int | None,
    ignored: frozenset[str],
) -> Kernel:
    def kernel(*inputs: Any, **attrs: Any) -> Any:
        unknown = attrs.keys() - allowed
        if unknown:
            raise TypeError(f"{op_type} (opset {since}) has no attribute {sorted(unknown)}")
        if max_inputs is not None and len(inputs) > max_inputs:
            raise TypeError(
                f"{op_type} (opset {since}) takes at most {max_inputs} inputs, got {len(inputs)}"
            )
        return impl(*inputs, **{k: v for k, v in attrs.items() if k not in ignored})

    kernel.__name__ = kernel.__qualname__ = f"{op_type.lower()}_{since}"
    kernel.__doc__ = impl.__doc__
    kernel.onnx_attributes = allowed | ignored  # what the evaluator checks when built
    return kernel


def spatial_attrs(
    x: torch.Tensor,
    kernel: Sequence[int],
    strides: Sequence[int] | None,
    dilations: Sequence[int] | None,
) -> tuple[int, list[int], list[int], list[int]]:
    """(spatial rank, kernel, strides, dilations) of a convolution or pooling as lists,
    absent strides and dilations defaulted to ones."""
    n = x.dim() - 2
    strides = list(strides) if strides else [1] * n
    dilations = list(dilations) if dilations else [1] * n
    return n, list(kernel), strides, dilations
