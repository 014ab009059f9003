"""A decoder with a KV cache exported with dynamic dims against the same model exported
with static shapes (issue 40, item 6): the first run's time in a fresh process, the second
run's, and the share of torch nodes compared, with the dynamic/static ratios.

Each variant runs in its own interpreter: the child exports the model (not timed: a user
has exported it already), then times ``list(run_aligned(ep, onx, args))`` twice.  The
cold run is the one a notebook user waits on; it includes preparing the program, which
for symbolic sizes used to mean the exporter's re-trace.

    .venv/bin/python benchmarks/bench_kv_cache.py [--repeats 3] [--model llama_kv_cache gpt2@auto ...]

``cache:NAME`` is a decoder taking a transformers cache object as its ``past_key_values``
keyword (tests/corpus/cache_decoders.py: dynamic_cache, static_cache, sliding_cache,
hybrid_cache, encoder_decoder_cache), exported with ``Dim.DYNAMIC`` (``cache:NAME@auto``:
``Dim.AUTO``) against its static export.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import warnings
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (  # noqa: E402
    emit_result,
    fmt_ratio,
    fmt_s,
    median_of,
    print_table,
    ratio,
    run_child,
)

VARIANTS = ("static", "dynamic")


def _auto_shapes(entry) -> tuple:
    """Every input's first two dims left to export (``Dim.AUTO``), as users export LLMs."""
    import inspect

    import torch

    model, args = entry.build()
    auto = torch.export.Dim.AUTO
    shapes = tuple({0: auto, 1: auto} if a.dim() >= 2 else None for a in args)
    params = list(inspect.signature(model.forward).parameters.values())
    starred = params and params[0].kind == inspect.Parameter.VAR_POSITIONAL
    return (shapes,) if starred else shapes


def _measure_cache(model: str, variant: str) -> dict:
    """A cache decoder (``cache:NAME[@auto]``): kwargs with the cache object, fresh per run
    (a static cache is written in place)."""
    from onnx_sbs_nb import run_aligned, summarize
    from onnx_sbs_nb.align.run import AlignedRun
    from tests.corpus.cache_decoders import export_case

    name, _, dims = model.removeprefix("cache:").partition("@")
    dims = "static" if variant == "static" else (dims or "dynamic")
    ex = export_case(name, dims)
    start = time.perf_counter()
    run = AlignedRun(ex.ep, ex.onx, (), ex.kwargs())  # run_aligned's, keeping its status
    records = list(run)
    cold = time.perf_counter() - start
    # how the program was prepared: reproduced, or the exporter's re-trace (the slow part)
    source = run.status.extra.get("program_source", "?")
    start = time.perf_counter()
    list(run_aligned(ex.ep, ex.onx, (), ex.kwargs()))
    warm = time.perf_counter() - start
    coverage = summarize(records).coverage
    return {
        "cold": cold,
        "warm": warm,
        "records": len(records),
        "verdict": summarize(records).verdict,
        "torch_compared": coverage.torch_compared,
        "torch_nodes": coverage.torch_nodes,
        "unpaired_outputs": sum(r.status == "unpaired_output" for r in records),
        "program": source,
    }


def measure(model: str, variant: str) -> dict:
    """Exports ``model`` (a corpus entry with dynamic shapes) as ``variant`` and times two runs."""
    if model.startswith("cache:"):
        return _measure_cache(model, variant)
    from onnx_sbs_nb import run_aligned, summarize
    from tests.corpus.zoo import ZOO_BY_NAME, export_entry
    from tests.corpus.zoo_kv_cache_and_popular_exports import ZOO3_BY_NAME
    from tests.corpus.zoo_vision_and_program_features import ZOO2_BY_NAME

    name, _, dims = model.partition("@")
    entry = {**ZOO_BY_NAME, **ZOO2_BY_NAME, **ZOO3_BY_NAME}[name]
    if variant == "static":
        entry = dataclasses.replace(entry, dynamic_shapes=None)
    elif dims == "auto":
        entry = dataclasses.replace(entry, dynamic_shapes=_auto_shapes(entry))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ex = export_entry(entry)
    start = time.perf_counter()
    records = list(run_aligned(ex.ep, ex.onx, ex.args))
    cold = time.perf_counter() - start
    start = time.perf_counter()
    list(run_aligned(ex.ep, ex.onx, ex.args))
    warm = time.perf_counter() - start
    summary = summarize(records)
    coverage = summary.coverage
    return {
        "cold": cold,
        "warm": warm,
        "records": len(records),
        "verdict": summary.verdict,
        "torch_compared": coverage.torch_compared,
        "torch_nodes": coverage.torch_nodes,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model",
        nargs="+",
        default=["llama_kv_cache"],
        help="corpus entries; NAME@auto exports NAME with Dim.AUTO on every input",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", choices=VARIANTS)
    args = parser.parse_args(argv)
    if args.child:
        emit_result(measure(args.model[0], args.child))
        return
    ratios = [(model, *_compare(model, args.repeats)) for model in args.model]
    if len(ratios) > 1:
        print_table(
            "dynamic / static, every model",
            ["model", "cold", "warm"],
            [[m, fmt_ratio(c), fmt_ratio(w)] for m, c, w in ratios],
        )


def _compare(model: str, repeats: int) -> tuple[float, float]:
    """Prints ``model``'s table; returns its cold and warm dynamic/static ratios."""
    runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for _ in range(repeats):
        for variant in VARIANTS:  # interleaved: a load spike hits both
            runs[variant].append(run_child(Path(__file__), ["--child", variant, "--model", model]))
    rows = []
    for variant in VARIANTS:
        last = runs[variant][-1]
        rows.append(
            [
                variant,
                fmt_s(median_of(runs[variant], "cold")),
                fmt_s(median_of(runs[variant], "warm")),
                last["records"],
                f"{last['torch_compared']} of {last['torch_nodes']}",
                f"{last['torch_compared'] / max(last['torch_nodes'], 1):.0%}",
                last["verdict"],
                last.get("unpaired_outputs", "-"),
                last.get("program", "-"),
            ]
        )
    print_table(
        f"{model}: median of {repeats} fresh processes",
        [
            "export",
            "cold run",
            "warm run",
            "records",
            "torch nodes compared",
            "share",
            "verdict",
            "unpaired outputs",
            "program",
        ],  # fmt: skip
        rows,
    )
    static, dynamic = (runs[v] for v in VARIANTS)
    cold = ratio(median_of(dynamic, "cold"), median_of(static, "cold"))
    warm = ratio(median_of(dynamic, "warm"), median_of(static, "warm"))
    print(
        f"\ndynamic / static: cold {fmt_ratio(cold)}, warm {fmt_ratio(warm)}"
        " (goal: cold at most 1.5x)"
    )
    return cold, warm


if __name__ == "__main__":
    main()
