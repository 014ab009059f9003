"""Silence for what torch's exporter machinery says about itself."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator


@contextlib.contextmanager
def quiet_torch_internals() -> Iterator[None]:
    """Silences what torch's exporter machinery prints about itself (missing torchvision
    ops, deprecations inside torch): it says nothing about the user's model."""
    logger = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning, module="copyreg")
            warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\..*")
            yield
    finally:
        logger.setLevel(level)
