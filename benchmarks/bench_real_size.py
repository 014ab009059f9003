"""Real sizes (issue 13, goal 5): a Llama-style model above 2 GB, side by side.

Builds a transformers Llama in code (random weights; default hidden 2048, 10 layers,
intermediate 5632, vocabulary 32000: about 2.5 GB of float32 weights), exports it once
(``model.pt2``; ``model.onnx`` with its weights in ``model.onnx.data``, the only way
past protobuf's 2 GB limit), then measures in fresh processes, one variant each:

* ``ort_whole_model``: an onnxruntime session created from the file and run once;
* ``ours``: our engine on the three files (the program prepared by the reproduction
  that the ONNX model's metadata vouches for, as ``onnx-sbs run`` does), the ``.onnx``
  given by path: the engine loads it during the run (its ``run`` time includes that),
  leaving the large weights in ``model.onnx.data`` until a node or comparison reads them;
* ``ours_retrace``: the same with the exporter's re-trace as the preparation;
* ``onnx-diagnostic`` with ``--theirs`` (run in .venv-bench).

For each: seconds to load the files and to run, and the peak resident memory of the
process above its size after imports (loading included: both copies of the weights, the
program's and the ONNX model's, are what a user's machine must hold), as a multiple of
the weights.  Goal: at most 2.2x the weights, and no step that copies all weights again
per node.  It needs about 3 times the weights in free memory for the export: run it
alone, not in CI.

    .venv/bin/python benchmarks/bench_real_size.py --workdir /tmp/real --keep
    PYTHONPATH=$PWD .venv-bench/bin/python benchmarks/bench_real_size.py --workdir /tmp/real --reuse --theirs
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_engine import (  # noqa: E402
    MEMORY_BASE,
    OURS,
    THEIRS,
    count_ours,
    count_theirs,
    stream_ours,
    stream_theirs,
)
from benchmarks.common import (  # noqa: E402
    PeakRss,
    emit_result,
    fmt_mb,
    fmt_ratio,
    fmt_s,
    has_onnx_diagnostic,
    print_table,
    ratio,
    run_child,
    state_bytes,
)

VARIANTS = [MEMORY_BASE, "ours", "ours_retrace"]


def _config(a: argparse.Namespace) -> dict[str, int]:
    return {
        "hidden": a.hidden,
        "layers": a.layers,
        "intermediate": a.intermediate,
        "vocab": a.vocab,
        "seq": a.seq,
    }


def export_child(folder: Path, config: dict[str, int]) -> dict[str, Any]:
    """Builds and exports the model (in its own process: the export's memory goes)."""
    import torch
    from transformers import LlamaConfig

    from tests.models import LlamaLogits

    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=config["hidden"],
        intermediate_size=config["intermediate"],
        num_hidden_layers=config["layers"],
        num_attention_heads=16,
        num_key_value_heads=8,
        vocab_size=config["vocab"],
        max_position_embeddings=max(256, config["seq"]),
    )
    t = time.perf_counter()
    with torch.no_grad():
        model = LlamaLogits(cfg).eval()
    ids = torch.randint(0, config["vocab"], (1, config["seq"]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(model, (ids,))
        program = torch.onnx.export(ep, (ids,), dynamo=True, verbose=False)
    folder.mkdir(parents=True, exist_ok=True)
    torch.export.save(ep, str(folder / "model.pt2"))
    program.save(str(folder / "model.onnx"), external_data=True)
    torch.save((ids,), str(folder / "inputs.pt"))
    meta = {"config": config, "weight_bytes": state_bytes(ep), "export_s": time.perf_counter() - t}
    (folder / "meta.json").write_text(json.dumps(meta))
    return meta


def measure_child(name: str, folder: Path) -> dict[str, Any]:
    """One variant in this fresh process: load the files, run once, peak memory."""
    import onnx
    import onnxruntime as ort
    import torch

    import onnx_sbs_nb.align.run  # noqa: F401

    if name == THEIRS:
        import onnx_diagnostic.torch_onnx.sbs  # noqa: F401
    warnings.simplefilter("ignore")
    result: dict[str, Any] = {"variant": name}
    # two sections one after the other (each resets the kernel's high-water mark)
    with PeakRss() as loading:
        t = time.perf_counter()
        if name == MEMORY_BASE:
            sess = ort.InferenceSession(
                str(folder / "model.onnx"), providers=["CPUExecutionProvider"]
            )
        elif name == THEIRS:
            ep = torch.export.load(str(folder / "model.pt2"))
            onx = onnx.load(str(folder / "model.onnx"), load_external_data=True)
        else:
            # the path, as `onnx-sbs run` gives it: the engine loads the model in the run,
            # its large weights left in the data file until read (external.py)
            ep = torch.export.load(str(folder / "model.pt2"))
            onx = str(folder / "model.onnx")
        args = tuple(torch.load(str(folder / "inputs.pt"), weights_only=True))
        result["load"] = time.perf_counter() - t
    with PeakRss() as running:
        t = time.perf_counter()
        if name == MEMORY_BASE:
            sess.run(None, {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)})
        elif name == THEIRS:
            records = list(stream_theirs(ep, onx, args))
            counts = count_theirs(records)
        else:
            records = list(stream_ours(ep, onx, args, OURS[name]))
            counts = count_ours(records)
        result["run"] = time.perf_counter() - t
    if name != MEMORY_BASE:
        result.update(records=len(records), paired=counts[0], failing=counts[1])
    base = loading.baseline  # after imports
    result.update(
        increase=max(loading.peak, running.peak) - base,
        resident_after_load=running.baseline - base,
        run_increase=running.increase,  # above what loading left resident
        baseline=base,
        method=loading.method,
    )
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=10)
    p.add_argument("--intermediate", type=int, default=5632)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--workdir", help="folder for the exported model (default: a temp folder)")
    p.add_argument("--reuse", action="store_true", help="reuse the export left in --workdir")
    p.add_argument("--keep", action="store_true", help="keep the exported model")
    p.add_argument("--theirs", action="store_true", help="also onnx-diagnostic (.venv-bench)")
    p.add_argument("--variants", help=f"comma-separated, default {','.join(VARIANTS)}")
    p.add_argument("--export-child", help=argparse.SUPPRESS)
    p.add_argument("--measure-child", help=argparse.SUPPRESS)
    p.add_argument("--folder", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.export_child:
        emit_result(export_child(Path(a.folder), json.loads(a.export_child)))
        return 0
    if a.measure_child:
        emit_result(measure_child(a.measure_child, Path(a.folder)))
        return 0

    script = Path(__file__).resolve()
    tmp = None
    root = Path(a.workdir) if a.workdir else Path(tmp := tempfile.mkdtemp(prefix="sbs_real_"))
    folder = root / "real_llama"
    config = _config(a)
    try:
        meta_path = folder / "meta.json"
        if a.reuse and meta_path.exists() and json.loads(meta_path.read_text())["config"] == config:
            meta = json.loads(meta_path.read_text())
            print(f"reusing the export in {folder}", flush=True)
        else:
            print(f"exporting a Llama {config} into {folder} ...", flush=True)
            meta = run_child(
                script, ["--export-child", json.dumps(config), "--folder", str(folder)], 7200
            )
        weights = meta["weight_bytes"]
        data = folder / "model.onnx.data"
        print(
            f"weights {fmt_mb(weights)}; model.onnx.data {fmt_mb(data.stat().st_size)}"
            + (f"; export {fmt_s(meta['export_s'])}" if "export_s" in meta else ""),
            flush=True,
        )
        names = a.variants.split(",") if a.variants else list(VARIANTS)
        if a.theirs and has_onnx_diagnostic():
            names.append(THEIRS)
        rows = []
        base = None
        for name in names:
            print(f"measuring {name} ...", flush=True)
            t = time.perf_counter()
            r = run_child(script, ["--measure-child", name, "--folder", str(folder)], 7200)
            r["wall"] = time.perf_counter() - t
            if name == MEMORY_BASE:
                base = r
            rows.append(
                [
                    name,
                    fmt_s(r["wall"]),
                    fmt_s(r["load"]),
                    fmt_s(r["run"]),
                    fmt_ratio(ratio(r["run"], base["load"] + base["run"])) if base else "-",
                    fmt_mb(r["resident_after_load"]),
                    fmt_mb(r["run_increase"]),
                    fmt_mb(r["increase"]),
                    fmt_ratio(ratio(r["increase"], weights)),
                    fmt_ratio(ratio(r["increase"], base["increase"])) if base else "-",
                    r.get("paired", "-"),
                    r.get("failing", "-"),
                ]
            )
        print_table(
            f"Llama {config}, weights {fmt_mb(weights)}: fresh process per variant; peak RSS "
            "above the process after imports (loading the files included)",
            [
                "variant",
                "wall",
                "load files",
                "run",
                "run / ORT session+run",
                "resident after load",
                "run adds",
                "peak RSS increase",
                "peak / weights",
                "peak / ORT",
                "paired",
                "failing",
            ],
            rows,
        )
        print("Goal: peak <= 2.2x the weights")
    finally:
        if tmp is not None and not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
