"""Loading and validating what the user gives: the program, the ONNX model, the inputs."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
import torch
from onnx.external_data_helper import load_external_data_for_model

from ...errors import SbsInputError
from ...external import check_external_data, defer_external_data
from ...records import NONFINITE_INPUT_NOTE
from .pt2_sizes import check_pt_sizes
from .untrusted_pt2 import TRUST_HINT, torch_logs_to_debug, unpickling_reason

PathLike = str | os.PathLike
log = logging.getLogger(__name__)


def _existing(path: PathLike, what: str, fix: str) -> Path:
    path = Path(path)
    if not path.exists():
        raise SbsInputError(f"{what} {str(path)!r} does not exist: {fix}")
    if not path.is_file() and not path.is_dir():
        # a FIFO or a device: reading it would block or never end
        raise SbsInputError(f"{what} {str(path)!r} is not a regular file (a FIFO or a device)")
    return path


def load_exported_program(ep: Any, *, trust_pickles: bool = False) -> torch.export.ExportedProgram:
    """The program from an ExportedProgram or the path of a ``.pt2``.

    A file is loaded without running code from it (see ``untrusted_pt2.py``): a file that
    needs more is refused with SbsInputError, unless ``trust_pickles=True`` says the file
    is trusted, which loads it as ``torch.export.load`` does.
    """
    if isinstance(ep, torch.export.ExportedProgram):
        return ep
    if isinstance(ep, str | os.PathLike):
        path = _existing(
            ep,
            "exported program file",
            "pass the path of a file written by torch.export.save(ep, 'model.pt2'), "
            "or the ExportedProgram",
        )
        if not path.is_file():
            raise SbsInputError(f"exported program {str(path)!r} is not a file")
        return _load_pt2(path, trust_pickles)
    if isinstance(ep, torch.nn.Module):
        raise SbsInputError(
            "got a torch.nn.Module where an ExportedProgram is expected: pass "
            "torch.export.export(model, args) (the program the ONNX model was exported from)"
        )
    raise SbsInputError(
        f"expected a torch.export.ExportedProgram or the path of a .pt2 file, got {type(ep).__name__}"
    )


def _load_pt2(path: Path, trust_pickles: bool) -> torch.export.ExportedProgram:
    from .pt2_sizes import check_pt2_sizes
    from .quant_ops import register_quantized_ops
    from .quiet import quiet_torch_internals
    from .untrusted_pt2 import UntrustedContentError, load_trusted, load_untrusted

    if not isinstance(trust_pickles, bool):
        raise SbsInputError(f"trust_pickles must be True or False, got {trust_pickles!r}")
    # quantized programs call operators that exist once this module is imported
    register_quantized_ops()
    # before torch inflates anything, trusted or not: a zip bomb is no pickle
    check_pt2_sizes(path)
    try:
        with quiet_torch_internals(), torch_logs_to_debug():
            if trust_pickles:
                return load_trusted(str(path))
            return load_untrusted(str(path))[0]
    except UntrustedContentError as e:
        log.debug("refused %s", path, exc_info=True)
        raise SbsInputError(
            f"{str(path)!r} was not loaded: {e.reason}. onnx-sbs reads model files without "
            f"running code from them (pickles with torch's weights-only unpickler); {TRUST_HINT}"
        ) from None
    except Exception as e:
        # torch's traceback says nothing the message does not: it goes to the debug log
        log.debug("cannot load %s", path, exc_info=True)
        from .pt2_types import unregistered_types, unregistered_types_message

        missing = unregistered_types(path)  # torch only logs this cause as a warning
        if missing:
            raise SbsInputError(unregistered_types_message(path, missing)) from None
        raise SbsInputError(
            f"{str(path)!r} is not an exported program ({type(e).__name__}: {_first_line(e)}); "
            "write one with torch.export.save(torch.export.export(model, args), path)"
        ) from None


def _first_line(e: BaseException, limit: int = 300) -> str:
    text = str(e).strip().splitlines()
    line = text[0] if text else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


@dataclass(frozen=True)
class LoadedOnnx:
    """An ONNX file loaded once (its large weights possibly left in their data file), to
    run again on other inputs without reading the file again."""

    model: onnx.ModelProto
    folder: Path

    @classmethod
    def of(cls, onx: Any, *, defer_weights: bool = False) -> Any:
        """``onx`` loaded now when it is a path, else ``onx`` itself."""
        if not isinstance(onx, str | os.PathLike):
            return onx
        model = load_onnx_model(onx, defer_weights=defer_weights)
        return cls(model, Path(onx).resolve().parent)


def onnx_folder(onx: Any) -> Path | None:
    """The folder of an ONNX model given by path (where its external data lives)."""
    if isinstance(onx, LoadedOnnx):
        return onx.folder
    if isinstance(onx, str | os.PathLike):
        return Path(onx).resolve().parent
    return None


def load_onnx_model(onx: Any, *, defer_weights: bool = False) -> onnx.ModelProto:
    """The model from a ModelProto, an ONNXProgram or a path.  ``defer_weights``: a file's
    large initializers kept in an external data file stay there, checked, until read
    (``external.py``: :func:`onnx_folder` says where)."""
    if isinstance(onx, onnx.ModelProto):
        return onx
    if isinstance(onx, LoadedOnnx):
        return onx.model
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
            # references are checked before any is opened (a FIFO would block the read)
            model = onnx.load(str(path), load_external_data=False)
        except Exception as e:
            raise SbsInputError(
                f"{str(path)!r} is not an ONNX model ({type(e).__name__}: {e}); pass the .onnx "
                "file produced by torch.onnx.export"
            ) from e
        if not model.graph.node and not model.graph.output:
            raise SbsInputError(f"{str(path)!r} holds no ONNX graph: is it really an .onnx file?")
        try:
            if defer_weights:
                defer_external_data(model, path.resolve().parent)
            else:
                check_external_data(model, path.resolve().parent)
                load_external_data_for_model(model, str(path.resolve().parent))
        except SbsInputError:
            raise
        except Exception as e:  # onnx's own checks of a reference
            raise SbsInputError(
                f"{str(path)!r} refers to external data it cannot load ({type(e).__name__}: {e})"
            ) from e
        return model
    raise SbsInputError(
        f"expected an onnx.ModelProto, a torch.onnx.ONNXProgram or the path of a .onnx file, "
        f"got {type(onx).__name__}"
    )


def load_inputs(
    args: Any, kwargs: dict[str, Any] | None, *, trust_pickles: bool = False
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Normalises inputs to (args, kwargs); a path is read with torch.load(weights_only=True)
    (``weights_only=False`` with ``trust_pickles=True``: the file is trusted).

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
        check_pt_sizes(path, "inputs")  # before torch.load inflates a compressed member
        try:
            with torch_logs_to_debug():
                loaded = torch.load(str(path), weights_only=not trust_pickles, map_location="cpu")
        except Exception as e:
            log.debug("cannot load %s", path, exc_info=True)
            reason = unpickling_reason(e)
            if reason is not None:
                raise SbsInputError(
                    f"inputs {str(path)!r} were not loaded: {reason}. onnx-sbs reads input "
                    f"files without running code from them; save plain tensors, tuples, lists "
                    f"and dicts, or, {TRUST_HINT}"
                ) from None
            raise SbsInputError(
                f"cannot load inputs from {str(path)!r} with torch.load ({type(e).__name__}: "
                f"{_first_line(e)}); save plain tensors, tuples, lists and dicts with torch.save"
            ) from None
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
    kwargs = dict(kwargs or {})
    _check_depth((args, kwargs))
    return args, kwargs


# inputs nested deeper than this are refused before anything (torch's pytree) recurses
MAX_INPUT_DEPTH = 64


def _check_depth(inputs: Any) -> None:
    """Refuses lists, tuples and dicts nested more than MAX_INPUT_DEPTH deep (walked
    without recursion: a file can hold a list 100,000 deep)."""
    stack = [(inputs, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, list | tuple):
            children = value
        else:
            continue
        if depth > MAX_INPUT_DEPTH:
            raise SbsInputError(
                f"the inputs are nested more than {MAX_INPUT_DEPTH} lists, tuples or dicts "
                "deep: no program takes such inputs; save the tensors the program takes"
            )
        stack.extend((c, depth + 1) for c in children)


def nonfinite_inputs(feeds: dict[str, Any]) -> dict[str, str]:
    """``{input name: note}`` for the inputs holding NaN or infinities: values computed
    from them agree where both sides have NaN/inf at the same places, so the summary says
    which values were compared that way."""
    notes = {}
    for name, value in feeds.items():
        if not isinstance(value, torch.Tensor) or not (
            value.is_floating_point() or value.is_complex()
        ):
            continue
        if value.device.type == "meta" or bool(torch.isfinite(value).all()):
            continue
        nan = int(torch.isnan(value).sum())
        inf = int(torch.isinf(value).sum())
        notes[name] = (
            f"{NONFINITE_INPUT_NOTE} ({nan} NaN, {inf} inf of {value.numel()}): values "
            "computed from it are compared as NaN/inf patterns where they have them"
        )
    return notes
