"""``onnx-sbs quantize-advice``: which nodes to leave out of onnxruntime's int8 quantization
(:func:`~onnx_sbs_nb.align.quantization_advisor.advise_quantization`).

Exit codes: 0 the advice is written (whatever it gains: the text says how much), 2 bad
input (as the other commands).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from typing import Any

from ..errors import SbsInputError
from ..files import writable_location


def add_quantize_command(sub: Any) -> None:
    p = sub.add_parser(
        "quantize-advice",
        help="which nodes to leave out of int8 quantization, ranked by the output SQNR each costs",
    )
    p.add_argument("--onnx", required=True, help="the float ONNX model (.onnx)")
    p.add_argument(
        "--inputs",
        required=True,
        nargs="+",
        metavar="FILE.pt",
        help="inputs to calibrate and measure on, one per file saved with torch.save "
        "(a tuple in input order or a dict by input name)",
    )
    p.add_argument("--ep", help="the exported program (.pt2): names the inputs")
    p.add_argument(
        "--mode",
        choices=("static", "dynamic"),
        default="static",
        help="onnxruntime's quantize_static (calibrated on the inputs) or quantize_dynamic",
    )
    p.add_argument(
        "--format",
        choices=("QDQ", "QOperator"),
        default="QDQ",
        dest="quant_format",
        help="the quantized model's format (static only; default QDQ)",
    )
    p.add_argument("--per-channel", action="store_true", help="per-channel weight scales")
    p.add_argument(
        "--weight-type", choices=("int8", "uint8"), default="int8", help="the weights' type"
    )
    p.add_argument(
        "--budget",
        type=float,
        default=0.1,
        help="the most nodes to leave out: a fraction of the quantized nodes (below 1) or "
        "a count (default 0.1)",
    )
    p.add_argument("--target-db", type=float, help="stop once the output SQNR reaches this")
    p.add_argument(
        "--execution",
        choices=("deployed", "as-written"),
        default="deployed",
        help="where the quantized models are measured: 'deployed' (default), a default "
        "onnxruntime CPU session with graph optimizations on, as the model is deployed; "
        "'as-written', optimizations off, the QDQ graph computed in float (the advice says "
        "where the two disagree)",
    )
    p.add_argument("-o", "--output", metavar="FILE.json", help="the advice as JSON")
    p.add_argument("--save-model", metavar="FILE.onnx", help="the model quantized with it")
    p.add_argument("--trust-pickles", action="store_true", help="the input files are yours")


def cmd_quantize(args: argparse.Namespace) -> int:
    from ..align.quantization_advice import write_quantization_advice
    from ..align.quantization_advisor import advise_quantization
    from ..align.source.loading import load_inputs

    for flag, value in [
        ("--onnx", args.onnx),
        ("--ep", args.ep),
        *(("--inputs", i) for i in args.inputs),
    ]:
        if value is not None and not pathlib.Path(value).is_file():
            raise SbsInputError(f"{flag} {value!r}: no such file")
    for flag, value, suffix in (
        ("-o", args.output, ".json"),
        ("--save-model", args.save_model, ".onnx"),
    ):
        if value is None:
            continue
        if pathlib.Path(value).suffix.lower() != suffix:
            raise SbsInputError(f"{flag} {value!r}: name it FILE{suffix}")
        why = writable_location(pathlib.Path(value))
        if why:
            raise SbsInputError(why)
    inputs = []
    for path in args.inputs:
        positional, kwargs = load_inputs(path, None, trust_pickles=args.trust_pickles)
        inputs.append(kwargs if kwargs and not positional else tuple(positional))
    budget: int | float = int(args.budget) if args.budget >= 1 else args.budget
    progress = _Progress()
    with progress:
        advice = advise_quantization(
            args.onnx,
            inputs,
            mode=args.mode,
            ep=args.ep,
            quant_format=args.quant_format,
            per_channel=args.per_channel,
            weight_type=args.weight_type,
            budget=budget,
            target_db=args.target_db,
            execution=args.execution,
            progress=progress,
        )
    print(advice.to_text())
    if args.output:
        write_quantization_advice(advice, args.output)
        print(f"wrote {args.output}")
    if args.save_model:
        from ..align.quantization_advice import save_quantized_model

        save_quantized_model(advice, args.save_model)
        print(f"wrote {args.save_model}")
    return 0


class _Progress:
    """A tqdm bar over the advisor's phases, on stderr, closed however the advice ends."""

    def __init__(self) -> None:
        self.bar: Any = None

    def __enter__(self) -> _Progress:
        return self

    def __call__(self, phase: str, fraction: float) -> None:
        if self.bar is None:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=100, desc="quantize-advice", file=sys.stderr)
        self.bar.set_description_str(f"quantize-advice: {phase}", refresh=False)
        self.bar.n = int(100 * min(fraction, 1.0))
        self.bar.refresh()

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()
