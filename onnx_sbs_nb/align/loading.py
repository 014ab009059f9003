"""Loading and validating what the user gives: the program, the ONNX model, the inputs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import onnx
import torch

from ..errors import SbsInputError

PathLike = str | os.PathLike


def _existing(path: PathLike, what: str, fix: str) -> Path:
    path = Path(path)
    if not path.exists():
        raise SbsInputError(f"{what} {str(path)!r} does not exist: {fix}")
    return path


def load_exported_program(ep: Any) -> torch.export.ExportedProgram:
    if isinstance(ep, torch.export.ExportedProgram):
        return ep
    if isinstance(ep, str | os.PathLike):
        path = _existing(
            ep,
            "exported program file",
            "pass the path of a file written by torch.export.save(ep, 'model.pt2'), "
            "or the ExportedProgram",
        )
        try:
            from .program import quiet_torch_internals
            from .quant_ops import register_quantized_ops

            register_quantized_ops()  # quantized programs call ops torch registers lazily
            with quiet_torch_internals():
                return torch.export.load(str(path))
        except Exception as e:
            raise SbsInputError(
                f"{str(path)!r} is not an exported program ({type(e).__name__}: {e}); "
                "write one with torch.export.save(torch.export.export(model, args), path)"
            ) from e
    if isinstance(ep, torch.nn.Module):
        raise SbsInputError(
            "got a torch.nn.Module where an ExportedProgram is expected: pass "
            "torch.export.export(model, args) (the program the ONNX model was exported from)"
        )
    raise SbsInputError(
        f"expected a torch.export.ExportedProgram or the path of a .pt2 file, got {type(ep).__name__}"
    )


def load_onnx_model(onx: Any) -> onnx.ModelProto:
    if isinstance(onx, onnx.ModelProto):
        return onx
    if hasattr(onx, "model_proto") and isinstance(onx.model_proto, onnx.ModelProto):
        # torch.onnx.ONNXProgram
        return onx.model_proto
    if isinstance(onx, str | os.PathLike):
        path = _existing(
            onx,
            "ONNX file",
            "pass the path of the .onnx file written by torch.onnx.export(..., dynamo=True), "
            "or the ModelProto",
        )
        try:
            model = onnx.load(str(path), load_external_data=True)
        except Exception as e:
            raise SbsInputError(
                f"{str(path)!r} is not an ONNX model ({type(e).__name__}: {e}); pass the .onnx "
                "file produced by torch.onnx.export"
            ) from e
        if not model.graph.node and not model.graph.output:
            raise SbsInputError(f"{str(path)!r} holds no ONNX graph: is it really an .onnx file?")
        return model
    raise SbsInputError(
        f"expected an onnx.ModelProto, a torch.onnx.ONNXProgram or the path of a .onnx file, "
        f"got {type(onx).__name__}"
    )


def load_inputs(args: Any, kwargs: dict[str, Any] | None) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Normalises inputs to (args, kwargs); a path is read with torch.load(weights_only=True).

    A saved file may hold a tuple/list (positional inputs), a dict (keyword inputs) or a
    pair ``(args_tuple, kwargs_dict)``.
    """
    if isinstance(args, str | os.PathLike):
        path = _existing(
            args,
            "inputs file",
            "save the inputs with torch.save((x, y), 'inputs.pt') or "
            "torch.save({'x': x}, 'inputs.pt')",
        )
        try:
            loaded = torch.load(str(path), weights_only=True, map_location="cpu")
        except Exception as e:
            raise SbsInputError(
                f"cannot load inputs from {str(path)!r} with torch.load(weights_only=True) "
                f"({type(e).__name__}: {e}); save plain tensors, tuples, lists and dicts"
            ) from e
        if (
            isinstance(loaded, tuple | list)
            and len(loaded) == 2
            and isinstance(loaded[0], tuple | list)
            and isinstance(loaded[1], dict)
        ):
            args, saved_kwargs = tuple(loaded[0]), loaded[1]
            kwargs = {**saved_kwargs, **(kwargs or {})}
        elif isinstance(loaded, dict):
            args, kwargs = (), {**loaded, **(kwargs or {})}
        elif isinstance(loaded, tuple | list):
            args = tuple(loaded)
        elif isinstance(loaded, torch.Tensor):
            args = (loaded,)
        else:
            raise SbsInputError(
                f"{str(path)!r} holds a {type(loaded).__name__}; expected a tensor, a tuple/list "
                "of inputs, a dict of keyword inputs or a pair (args, kwargs)"
            )
    if args is None:
        args = ()
    elif isinstance(args, torch.Tensor):
        args = (args,)
    elif isinstance(args, list):
        args = tuple(args)
    elif isinstance(args, dict) and kwargs is None:
        args, kwargs = (), args
    if not isinstance(args, tuple):
        raise SbsInputError(
            f"inputs must be a tuple of positional inputs, got {type(args).__name__}"
        )
    return args, dict(kwargs or {})
