"""The errors every floor of the package raises for bad input."""

from __future__ import annotations


class SbsInputError(ValueError):
    """Bad input to a side-by-side run: the message names the problem and the fix."""


class DeviceUnavailableError(SbsInputError):
    """A device was asked for that this machine cannot use."""


__all__ = ["DeviceUnavailableError", "SbsInputError"]
