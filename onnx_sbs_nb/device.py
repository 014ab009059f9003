"""Which device a run, an action or an evaluator uses: one check for all of them."""

from __future__ import annotations

import re

import torch

from .errors import DeviceUnavailableError, SbsInputError

_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?|meta)$")


def cuda_availability() -> tuple[bool, str]:
    """Whether CUDA can be used, and the reason shown to the user when it cannot."""
    if not torch.cuda.is_available():
        return False, "no CUDA device is visible (torch.cuda.is_available() is False)"
    return True, ""


def resolve_device(device: str | torch.device | None, *, allow_meta: bool = False) -> torch.device:
    """The torch device for ``device`` (None: the CPU), checked against this machine.

    Raises :class:`DeviceUnavailableError` when CUDA is asked for but torch sees no GPU,
    and :class:`SbsInputError` for anything that is not ``cpu`` or ``cuda[:N]``.
    """
    if device is None:
        return torch.device("cpu")
    text = str(device)
    if not _DEVICE.match(text) or (text == "meta" and not allow_meta):
        raise SbsInputError(f"device must be 'cpu' or 'cuda[:N]', got {device!r}")
    dev = torch.device(text)
    if dev.type == "cuda":
        ok, why = cuda_availability()
        if not ok:
            raise DeviceUnavailableError(
                f"device {text!r} was asked for but {why}: run on a machine with a GPU and a "
                "CUDA build of torch, or use device='cpu'"
            )
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        elif dev.index >= torch.cuda.device_count():
            raise DeviceUnavailableError(
                f"device {text!r} was asked for but torch sees {torch.cuda.device_count()} GPU(s)"
            )
    return dev


def device_name(device: str | torch.device | None) -> str:
    """``resolve_device`` as the string the engine and the views keep (``cpu``, ``cuda:0``)."""
    return str(resolve_device(device))


__all__ = ["cuda_availability", "device_name", "resolve_device"]
