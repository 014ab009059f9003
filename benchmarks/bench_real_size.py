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
the weights.  Goals: at most 2.2x the weights (issue 13); at 8 GB, at most 1.3x and a run
no slower than onnxruntime's session build and run (issue 50).  ``ours_rerun``
(``own_error=True``, not in the default list) tells drift from the export's own errors:
its ``of them drifted`` column counts the failing pairs whose node, rerun on torch's
inputs, agrees with torch.

The export holds about 1.1x the weights in memory: the model is built in anonymous memory,
then each weight moves into a file-backed mapping (``_to_mapped_files``) that the kernel
can write back and drop while the exporter and the archive writers run.  Disk: about 3x
the weights (the mappings, deleted after the export; the ONNX data; the .pt2).  Each step
waits until the machine has the memory it needs.  Run it alone, not in CI.

    .venv/bin/python benchmarks/bench_real_size.py --workdir /tmp/real --keep
    PYTHONPATH=$PWD .venv-bench/bin/python benchmarks/bench_real_size.py --workdir /tmp/real --reuse --theirs
    # 8 GB (8,080 MB of float32 weights): hidden 4096, 10 layers, intermediate 11008
    .venv/bin/python benchmarks/bench_real_size.py --hidden 4096 --intermediate 11008 \
        --workdir /tmp/big --keep --variants ort_whole_model,ours,ours_rerun
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
# free memory a variant waits for, in weights (its peak was about 1.1x; the re-trace's 2.1x)
MEMORY_NEED = {"ours_retrace": 2.4}


def _config(a: argparse.Namespace) -> dict[str, int]:
    return {
        "hidden": a.hidden,
        "layers": a.layers,
        "intermediate": a.intermediate,
        "vocab": a.vocab,
        "seq": a.seq,
    }


def _anon_rss() -> int:
    """This process's anonymous resident memory (what the OOM killer weighs; mapped files'
    pages are left out: the kernel can drop them)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    return 0


def wait_for_memory(need: int, what: str, patience_s: float = 1800) -> None:
    """Waits until the machine has ``need`` bytes available (other processes share it:
    better late than the OOM killer taking theirs); raises after ``patience_s``."""
    import psutil

    end = time.monotonic() + patience_s
    while (free := psutil.virtual_memory().available) < need:
        if time.monotonic() > end:
            raise MemoryError(f"{what}: {fmt_mb(need)} needed, {fmt_mb(free)} available")
        print(f"{what}: waiting for {fmt_mb(need)} ({fmt_mb(free)} available)", flush=True)
        time.sleep(30)


def _to_mapped_files(model: Any, folder: Path) -> None:
    """Moves every weight and buffer into its own file-backed shared mapping, one tensor
    at a time (each tensor's anonymous copy is released as the next is made).

    Why: the export holds copies of its own (the exporter folds transposed weights into
    new initializers; the archive is written tensor by tensor). With the model's weights
    in anonymous memory the export peaked at about 3x the weights; mapped, the kernel can
    write those pages back and drop them, so an 8 GB model exports on a 23 GB machine.
    """
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    tensors = [(n, t) for n, t in model.named_parameters()]
    tensors += [(n, t) for n, t in model.named_buffers() if t is not None]
    for i, (name, tensor) in enumerate(tensors):
        path = folder / f"{i}.bin"
        mapped = torch.from_file(
            str(path), shared=True, size=tensor.numel(), dtype=tensor.dtype
        ).view(tensor.shape)
        with torch.no_grad():
            mapped.copy_(tensor)
        module_name, _, attr = name.rpartition(".")
        module = model.get_submodule(module_name)
        if attr in module._parameters:
            tensor.data = mapped  # the Parameter object stays (tied weights keep sharing it)
        else:
            module._buffers[attr] = mapped


def estimated_weight_bytes(config: dict[str, int]) -> int:
    """float32 bytes of the Llama's weights (half as many key/value heads as heads)."""
    h, i = config["hidden"], config["intermediate"]
    layer = 3 * h * h + 3 * h * i + 2 * h  # q, o, k+v at half width; the MLP; two norms
    return 4 * (2 * config["vocab"] * h + config["layers"] * layer + h)


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
    anon: dict[str, int] = {}
    t = time.perf_counter()
    with torch.no_grad():
        model = LlamaLogits(cfg).eval()
    anon["built"] = _anon_rss()
    mapped = folder / "mapped_weights"
    _to_mapped_files(model, mapped)
    anon["mapped"] = _anon_rss()
    ids = torch.randint(0, config["vocab"], (1, config["seq"]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(model, (ids,))
        program = torch.onnx.export(ep, (ids,), dynamo=True, verbose=False)
    anon["exported"] = _anon_rss()
    folder.mkdir(parents=True, exist_ok=True)
    program.save(str(folder / "model.onnx"), external_data=True)
    anon["onnx_saved"] = _anon_rss()
    del program
    torch.export.save(ep, str(folder / "model.pt2"))
    anon["pt2_saved"] = _anon_rss()
    torch.save((ids,), str(folder / "inputs.pt"))
    meta = {
        "config": config,
        "weight_bytes": state_bytes(ep),
        "export_s": time.perf_counter() - t,
        "export_anon_rss": anon,
    }
    del ep, model
    shutil.rmtree(mapped, ignore_errors=True)
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
        # drifted: failing, yet the node rerun on torch's inputs agrees (own_error=True
        # only): rounding carried from upstream, not an error of the export
        drifted = sum(1 for r in records if r.drifted)
        result.update(records=len(records), paired=counts[0], failing=counts[1], drifted=drifted)
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
            # built in anonymous memory once, then moved to mapped files (_to_mapped_files)
            wait_for_memory(int(1.3 * estimated_weight_bytes(config)), "export")
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
            wait_for_memory(int(MEMORY_NEED.get(name, 1.5) * weights), name)
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
                    r.get("drifted", "-") if name == "ours_rerun" else "-",
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
                "of them drifted",
            ],
            rows,
        )
        print("Goals: peak <= 2.2x the weights; at 8 GB, <= 1.3x and run <= 1x ORT session+run")
    finally:
        if tmp is not None and not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
