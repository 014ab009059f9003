"""The torch operators that quantized programs call, registered before anything reads them.

Programs quantized with the PT2E flow call ``torch.ops.quantized_decomposed.*``
(``quantize_per_tensor``, ``dequantize_per_tensor``, ...).  Those operators exist only
once ``torch.ao.quantization.fx._decomposed`` has been imported: before that,
``torch.export.load`` of such a ``.pt2`` fails ("We failed to resolve
torch.ops.quantized_decomposed.quantize_per_tensor.default to an operator") and the
exporter cannot lower them.  Importing the module registers the operators and runs
nothing from the file being loaded.
"""

from __future__ import annotations

import functools


@functools.cache
def register_quantized_ops() -> bool:
    """Registers ``torch.ops.quantized_decomposed``; False if this torch has no such module.

    Cheap after the first call; the loader calls it before ``torch.export.load``.
    """
    try:
        import torch.ao.quantization.fx._decomposed  # noqa: F401
    except ImportError:  # pragma: no cover - every torch this package supports has it
        return False
    return True


__all__ = ["register_quantized_ops"]
