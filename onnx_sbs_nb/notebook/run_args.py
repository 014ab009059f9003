"""The run options as command-line flags, shared by ``onnx-sbs run`` and ``%sbs``."""

from __future__ import annotations

import argparse
import pathlib
from typing import TYPE_CHECKING, Any

from ..errors import SbsInputError
from ..option_names import OPTIMIZE_LEVELS, RESET_ALL, RUNNER_NAMES

if TYPE_CHECKING:
    from ..align.engine.options import RunOptions


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of :class:`RunOptions` (the same spelling in a terminal and a notebook)."""
    p.add_argument(
        "--runner",
        default="onnxruntime",
        choices=RUNNER_NAMES,
        help="what runs each ONNX node: onnxruntime (default), the ONNX reference "
        "evaluator, or this package's torch evaluator",
    )
    p.add_argument(
        "--atol", type=float, default=None, help="absolute tolerance (default: per dtype)"
    )
    p.add_argument(
        "--rtol", type=float, default=None, help="relative tolerance (default: per dtype)"
    )
    p.add_argument(
        "--verdict",
        nargs="+",
        metavar="EXPR",
        help="judge pairs on other measures than atol/rtol: <measure><op><number>, e.g. "
        "'snr>=30' 'cos>=0.999' (all must hold); measures: abs rel nan h01 h001 cos snr "
        "l2 p50 p99 ulp; 'float16:snr>=30' applies to one dtype only",
    )
    p.add_argument(
        "--compare-func",
        metavar="MODULE:FN",
        help="your own check, f(expected, got) -> dict (torch tensors in): its fields "
        "become report columns, its 'passed' decides the verdict; module:function (the "
        "current folder searched first, as python -m does) or path/to/file.py:function",
    )
    p.add_argument(
        "--no-measures",
        dest="measures",
        action="store_false",
        help="skip cosine, SNR, L2, quantiles and ulps (faster on large values that differ)",
    )
    p.add_argument(
        "--own-error",
        "--rerun",
        dest="own_error",
        action="store_true",
        help="also run each ONNX node on the torch values of its inputs: its own error",
    )
    reset = p.add_mutually_exclusive_group()
    reset.add_argument(
        "--reset", nargs="+", metavar="NAME", help="ONNX values replaced by their torch value"
    )
    reset.add_argument(
        "--reset-all", action="store_true", help="every ONNX node runs on the torch inputs"
    )
    p.add_argument("--replay-dir", help="folder where replay bundles are written")
    p.add_argument("--replay-config", help="replay selection saved as JSON (by the widget)")
    p.add_argument("--replay-names", nargs="+", metavar="NAME", help="ONNX nodes to dump")
    p.add_argument("--replay-op-types", nargs="+", metavar="OP", help="op types to dump")
    p.add_argument(
        "--replay-threshold", type=float, help="dump every node whose error exceeds this"
    )
    p.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default=None,
        help="where both sides run (default: where the inputs are; cuda needs a GPU and "
        "torch built for it)",
    )
    p.add_argument(
        "--trust-pickles",
        action="store_true",
        help="the .pt2 and inputs files are trusted: load them even if that runs code "
        "from them (off: a file that needs code to load is refused)",
    )
    p.add_argument(
        "--time-nodes",
        action="store_true",
        help="time every ONNX node on its own (one session per node) on every run, "
        "instead of running stretches of nodes as one session on a second run",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="a PASS that compared under half of the ONNX nodes (PASS on N of M) exits 1 "
        "like a FAIL",
    )
    add_deployment_arguments(p)


def add_deployment_arguments(p: argparse.ArgumentParser) -> None:
    """``--optimize`` / ``--providers``: compare the graph onnxruntime runs when deployed."""
    p.add_argument(
        "--optimize",
        choices=OPTIMIZE_LEVELS,
        default=None,
        help="compare the graph onnxruntime runs after its optimizations at this level "
        "(fused nodes included) instead of the model as given",
    )
    p.add_argument(
        "--providers",
        nargs="+",
        metavar="EP",
        default=None,
        help="execution providers whose optimized graph is compared (with --optimize; "
        "default CPUExecutionProvider)",
    )


def replay_config_from_args(args: argparse.Namespace) -> Any:
    """A ReplayConfig from --replay-config and/or --replay-names/op-types/threshold, or None."""
    wants = args.replay_config or args.replay_names or args.replay_op_types
    wants = wants or args.replay_threshold is not None
    if not wants:
        if args.replay_dir and not getattr(args, "replay_culprit", False):
            raise SbsInputError(
                "--replay-dir needs a selection: --replay-names, --replay-op-types, "
                "--replay-threshold, --replay-config or (onnx-sbs run) --replay-culprit"
            )
        return None
    from ..align.post.replay import ReplayConfig

    if args.replay_config:
        path = pathlib.Path(args.replay_config)
        if not path.is_file():
            raise SbsInputError(f"replay configuration {str(path)!r} does not exist")
        try:
            config = ReplayConfig.load(path)
        except (OSError, TypeError, ValueError) as e:
            raise SbsInputError(f"replay configuration {str(path)!r} is not valid: {e}") from None
    else:
        config = ReplayConfig()
    if args.replay_names:
        config.names = list(args.replay_names)
    if args.replay_op_types:
        config.op_types = list(args.replay_op_types)
    if args.replay_threshold is not None:
        config.threshold = args.replay_threshold
    if not args.replay_dir:
        raise SbsInputError("a replay selection needs --replay-dir DIR: where bundles are written")
    return config


def options_from_args(args: argparse.Namespace) -> RunOptions:
    """RunOptions from parsed flags (SbsInputError for a bad value)."""
    # the engine's modules (torch, onnx) load here, once the flags parsed: --help and
    # argument errors answer without them
    from ..align.engine.options import RunOptions
    from ..compare.verdict_policy import load_compare_function

    return RunOptions(
        runner=args.runner,
        atol=args.atol,
        rtol=args.rtol,
        own_error=args.own_error,
        reset_names=tuple(args.reset or ()),
        reset=RESET_ALL if args.reset_all else None,
        replay=replay_config_from_args(args),
        replay_dir=args.replay_dir,
        device=args.device,
        optimize=args.optimize,
        providers=tuple(args.providers) if args.providers else None,
        trust_pickles=args.trust_pickles,
        time_nodes=args.time_nodes,
        strict=args.strict,
        verdict=verdict_from_args(getattr(args, "verdict", None)),
        measures=getattr(args, "measures", True),
        compare=(
            load_compare_function(args.compare_func)
            if getattr(args, "compare_func", None)
            else None
        ),
    )


def verdict_from_args(exprs: list[str] | None) -> Any:
    """``--verdict`` values as a verdict policy: a list of expressions, or a dict per
    dtype when some are written ``dtype:expr`` (the others then hold for every dtype)."""
    if not exprs:
        return None
    by_dtype: dict[str, list[str]] = {}
    for e in exprs:
        dtype, sep, expr = e.partition(":")
        key = dtype.strip() if sep else "*"
        by_dtype.setdefault(key, []).append(expr if sep else e)
    if list(by_dtype) == ["*"]:
        return by_dtype["*"]
    common = by_dtype.pop("*", [])
    policy: dict[str, Any] = {k: common + v for k, v in by_dtype.items()}
    if common:
        policy["*"] = common
    return policy


__all__ = ["add_run_arguments", "options_from_args", "replay_config_from_args", "verdict_from_args"]
