"""``onnx-sbs precision``: the nodes to keep in float32 for a model to run in float16/bfloat16.

Exit codes: 0 the advised conversion agrees with the float32 model, 1 it still disagrees,
2 bad input (as the other commands).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from typing import Any

from ..errors import SbsInputError
from ..files import writable_location

EXIT_AGREES = 0
EXIT_DISAGREES = 1


def add_precision_command(sub: Any) -> None:
    p = sub.add_parser(
        "precision",
        help="which nodes must stay in float32 for a model to run in float16 or bfloat16",
    )
    p.add_argument("--onnx", required=True, help="the float32 ONNX model (.onnx)")
    p.add_argument(
        "--inputs",
        required=True,
        help="inputs saved with torch.save: tuple (in input order), dict or (args, kwargs)",
    )
    p.add_argument("--ep", help="the exported program (.pt2): names the inputs")
    p.add_argument(
        "--converted",
        help="your own float16/bfloat16 conversion of the model (default: converted here "
        "with onnxconverter-common, keep_io_types=True)",
    )
    p.add_argument(
        "--dtype",
        choices=("float16", "bfloat16"),
        default="float16",
        help="the low precision the model is (or is to be) converted to",
    )
    p.add_argument("--atol", type=float, help="tolerance (default: the dtype's)")
    p.add_argument("--rtol", type=float, help="tolerance (default: the dtype's)")
    p.add_argument(
        "--max-rounds", type=int, default=4, help="conversions tried with the block list"
    )
    p.add_argument(
        "-o",
        "--output",
        nargs="+",
        default=[],
        metavar="FILE",
        help="FILE.json: the advice (node_block_list, op_block_list, ranked nodes); "
        "FILE.html: the float32 model against its conversion with the advice on top; "
        ".xlsx, .csv, .jsonl: that run's records",
    )
    p.add_argument(
        "--save-model", metavar="FILE.onnx", help="the model converted with the block list"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def cmd_precision(args: argparse.Namespace) -> int:
    from ..align.precision_advice import save_advised_model
    from ..align.precision_advisor import advise_precision
    from ..reports.precision import ADVICE_SUFFIX, write_precision_outputs
    from ..reports.report import REPORT_SUFFIXES

    for flag, value in (
        ("--onnx", args.onnx),
        ("--inputs", args.inputs),
        ("--ep", args.ep),
        ("--converted", args.converted),
    ):
        if value is not None and not _path(value, flag).is_file():
            raise SbsInputError(f"{flag} {value!r}: no such file")
    suffixes = (ADVICE_SUFFIX, *REPORT_SUFFIXES)
    checked = [("-o", o, suffixes) for o in args.output]
    if args.save_model is not None:
        checked.append(("--save-model", args.save_model, (".onnx",)))
    for flag, value, allowed in checked:
        path = _path(value, flag)
        if path.suffix.lower() not in allowed:
            raise SbsInputError(f"{flag} {value!r}: name it with one of {', '.join(allowed)}")
        why = writable_location(path)
        if why:
            raise SbsInputError(why)
    if args.max_rounds < 1:
        raise SbsInputError("--max-rounds must be at least 1")
    with _Bar(not args.no_progress) as bar:
        advice = advise_precision(
            args.ep,
            args.onnx,
            args.inputs,
            args.dtype,
            converted=args.converted,
            atol=args.atol,
            rtol=args.rtol,
            max_rounds=args.max_rounds,
            progress=bar,
        )
    print(advice.to_text())
    for path in write_precision_outputs(advice, args.output):
        print(f"wrote {path}")
    if args.save_model:
        if advice.model is None:
            raise SbsInputError("no advised model to save")
        save_advised_model(advice, args.save_model)
        print(f"wrote {args.save_model}")
    return EXIT_AGREES if advice.agrees else EXIT_DISAGREES


def _path(value: str, what: str) -> pathlib.Path:
    if "\x00" in value or not value:
        raise SbsInputError(f"{what} path {value!r} is not a path")
    return pathlib.Path(value)


class _Bar:
    """A tqdm bar over the rounds of the advisor, on stderr."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.bar: Any = None
        self.phase: str | None = None

    def __enter__(self) -> _Bar:
        return self

    def __call__(self, phase: str, fraction: float) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            from tqdm.auto import tqdm

            self.bar = tqdm(
                total=100,
                desc="precision",
                file=sys.stderr,
                bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed}",
            )
        if phase != self.phase:
            self.phase = phase
            self.bar.set_description_str(f"precision: {phase}", refresh=False)
        self.bar.n = int(100 * fraction)
        self.bar.refresh()

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()
