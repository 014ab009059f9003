"""``onnx-sbs generate``: a decoder exported with its cache, decoded greedily by torch and by
the ONNX model side by side (:func:`~onnx_sbs_nb.align.generation.generation_parity`).

Exit codes: 0 the two decodes agree on every step, 1 they part (the step, why, and with
``--step-report`` that step compared node by node), 2 bad input (as the other commands).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from typing import Any

from ..errors import SbsInputError
from ..files import writable_location, write_json_atomic

EXIT_AGREE = 0
EXIT_PART = 1


def add_generate_command(sub: Any) -> None:
    p = sub.add_parser(
        "generate",
        help="decode N greedy steps with the program and the ONNX model: where do they part?",
    )
    p.add_argument("--ep", required=True, help="the exported program (.pt2)")
    p.add_argument("--onnx", required=True, help="its ONNX export (.onnx), dynamic dims")
    p.add_argument(
        "--inputs",
        required=True,
        help="the first step's keyword inputs saved with torch.save as a dict (input_ids, "
        "attention_mask, the cache object under the keyword the program takes...)",
    )
    p.add_argument("--steps", type=int, default=32, help="greedy steps to decode (default 32)")
    p.add_argument("--atol", type=float, help="the logits' tolerance (default: their dtype's)")
    p.add_argument("--rtol", type=float, help="the logits' tolerance (default: their dtype's)")
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE.json",
        help="the two decodes step by step (tokens, errors, margins, where they part)",
    )
    p.add_argument(
        "--step-report",
        metavar="FILE",
        help="the step where they part, compared node by node with own errors "
        "(.html, .xlsx, .csv or .jsonl)",
    )
    p.add_argument(
        "--trust-pickles",
        action="store_true",
        help="the files are yours: load objects torch's safe loader refuses (a cache object "
        "in the inputs file needs it) and register transformers' cache types to load the "
        "program (it imports transformers)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _check_outputs(args: argparse.Namespace) -> None:
    from ..reports.report import report_format

    for flag, value in (("--ep", args.ep), ("--onnx", args.onnx), ("--inputs", args.inputs)):
        if not pathlib.Path(value).is_file():
            raise SbsInputError(f"{flag} {value!r}: no such file")
    if args.steps < 1:
        raise SbsInputError("--steps must be at least 1")
    if args.output is not None and pathlib.Path(args.output).suffix.lower() != ".json":
        raise SbsInputError(f"-o {args.output!r}: name it FILE.json")
    if args.step_report is not None:
        report_format(args.step_report)
    for value in (args.output, args.step_report):
        why = value is not None and writable_location(pathlib.Path(value))
        if why:
            raise SbsInputError(why)


def cmd_generate(args: argparse.Namespace) -> int:
    from ..align.generation import generation_parity
    from ..align.source.loading import load_exported_program, load_inputs

    _check_outputs(args)
    if args.trust_pickles:
        _register_transformers_caches()
    ep = load_exported_program(args.ep, trust_pickles=args.trust_pickles)
    positional, kwargs = load_inputs(args.inputs, None, trust_pickles=args.trust_pickles)
    if positional or not kwargs:
        raise SbsInputError(
            f"--inputs {args.inputs!r}: save the first step's keyword inputs as a dict "
            f"({_save_hint(ep)})"
        )
    bar = _bar(args.steps) if not args.no_progress else None
    try:
        parity = generation_parity(
            ep,
            args.onnx,
            kwargs,
            steps=args.steps,
            atol=args.atol,
            rtol=args.rtol,
            progress=(lambda done, total: bar.update(1)) if bar is not None else None,
        )
    finally:
        if bar is not None:
            bar.close()
    parity.step_hint = "--step-report FILE compares it node by node"
    print(parity.to_text())
    if args.output:
        write_json_atomic(args.output, parity.to_dict())
        print(f"wrote {args.output}")
    if args.step_report and parity.diverged_at is None:
        # said on stderr: a script asking for the file learns why there is none
        print(f"no step report: the decodes agree on all {args.steps} steps", file=sys.stderr)
    elif args.step_report:
        from ..align.blame.summary import summarize
        from ..reports.report import write_report

        records = parity.records or list(parity.step_run(own_error=True))
        summary = summarize(records)
        print(f"step {parity.diverged_at}, node by node: {summary.to_text().splitlines()[0]}")
        title = f"generation step {parity.diverged_at}"
        print(f"wrote {write_report(records, args.step_report, summary, title=title)}")
    return EXIT_AGREE if parity.verdict == "pass" else EXIT_PART


def _save_hint(ep: Any) -> str:
    """``torch.save({...})`` with the keywords the program takes, the cache object under
    its own (``cache`` in transformers 5, ``past_key_values`` before): the keyword inputs
    of its input spec, the cache the one that is no tensor."""
    try:
        spec = ep.call_spec.in_spec.children()[1]
        keys = list(spec.context)
        cache = [k for k, child in zip(keys, spec.children()) if not child.is_leaf()]
    except (AttributeError, IndexError, TypeError):
        keys, cache = [], []
    if not keys:  # a program of positional inputs (or no spec): the usual names
        return (
            "torch.save({'input_ids': ..., 'attention_mask': ..., 'cache': cache}, FILE), the "
            "cache under the keyword the decoder takes; this program takes no keyword input: "
            "export the decoder with its keyword inputs"
        )
    items = ", ".join(f"{k!r}: {'cache' if k in cache else '...'}" for k in keys)
    return f"torch.save({{{items}}}, FILE)"


def _register_transformers_caches() -> None:
    """transformers' cache types as pytree nodes, as its exporter registers them: a program
    exported with a cache object names its type, which a fresh process must know to load
    it.  Only for files the user trusts (``--trust-pickles``): it imports transformers."""
    try:
        from transformers.cache_utils import Cache
        from transformers.exporters.exporter_dynamo import register_pytree_node
    except ImportError:
        return
    todo = [Cache]
    while todo:
        cls = todo.pop()
        register_pytree_node(cls)
        todo.extend(cls.__subclasses__())


def _bar(total: int) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="generate", unit="step", file=sys.stderr)
