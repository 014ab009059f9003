"""The input sets a ``torch.onnx.InputObserver`` captured, as the many inputs of a run.

``InputObserver`` (torch >= 2.11) replaces a model's ``forward`` while the user runs it
(``with observer(model): model(x1); model(x2)``), stores each call's inputs, then gives
the arguments to export with (``infer_arguments()``: optional inputs a call left out
become empty tensors, so every set has the exported program's structure).  Those sets
are what a comparison should run on: ``run_aligned(ep, onx, inputs=observer)`` runs one
per observed call, ``infer_arguments(i, as_args_kwargs=True)`` each;
:func:`save_observed_inputs` writes them as ``.pt`` files for ``onnx-sbs run --inputs
FOLDER``.  Duck-typed (``num_obs`` and ``infer_arguments``): nothing of torch's private
modules is imported here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ...errors import SbsInputError


def is_input_observer(obj: Any) -> bool:
    return callable(getattr(obj, "num_obs", None)) and callable(
        getattr(obj, "infer_arguments", None)
    )


def observed_inputs(observer: Any) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """One ``(args, kwargs)`` per call the observer stored, shaped as the program
    exported from ``observer.infer_arguments()`` takes them."""
    n = observer.num_obs()
    if not n:
        raise SbsInputError(
            "the InputObserver captured no call: run the model inside `with observer(model):` "
            "before passing it as inputs="
        )
    return [_input_set(observer, i) for i in range(n)]


def _input_set(observer: Any, i: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    # as infer_arguments() gave them to the export: a tuple (positional) or a dict (by
    # name, what it gives when a call named any input); both only when neither fits
    try:
        try:
            found = observer.infer_arguments(i)
        except Exception:
            found = observer.infer_arguments(i, as_args_kwargs=True)
            return tuple(found[0] or ()), dict(found[1] or {})
    except Exception as e:  # torch's own check of the observed structures
        raise SbsInputError(
            f"the InputObserver cannot give input set {i}: {type(e).__name__}: {e}"
        ) from None
    if isinstance(found, dict):
        return (), dict(found)
    return tuple(found), {}


def save_observed_inputs(observer: Any, folder: str | Path) -> list[Path]:
    """Writes each observed input set as ``folder/input_NNN.pt`` (``(args, kwargs)``,
    loadable with ``weights_only=True``), for ``onnx-sbs run prog.pt2 model.onnx
    --inputs FOLDER``; returns the files."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for i, item in enumerate(observed_inputs(observer)):
        path = folder / f"input_{i:03d}.pt"
        torch.save(item, path)
        files.append(path)
    return files


__all__ = ["is_input_observer", "observed_inputs", "save_observed_inputs"]
