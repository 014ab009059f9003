"""Benchmark: onnx_sbs_nb's TorchOnnxEvaluator vs onnxruntime (CPU) vs onnx-diagnostic's.

    python benchmarks/bench_evaluator.py [--repeat 30] [--device cpu|cuda] [--quick]
    python benchmarks/bench_evaluator.py --instructions 50 [--baseline DIR]  # callgrind

Everything runs in the same process on the same inputs: a tiny Llama (hidden 64,
2 layers, seq 8), a larger one (hidden 256, 4 layers, seq 64), and a chain of 500 Add
nodes on 4-element tensors that measures the per-node dispatch cost. onnx-diagnostic is
optional (``pip install onnx-diagnostic``); without it its column is skipped, saying so.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import torch
from onnx import TensorProto
from onnx import helper as oh

from onnx_sbs_nb.evaluator.compiled import JIT_AFTER
from onnx_sbs_nb.evaluator.evaluator import TorchOnnxEvaluator, compile_node


def _llama(hidden: int, layers: int, seq: int, batch: int = 2, dynamic: bool = False):
    import transformers

    cfg = transformers.LlamaConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=hidden * 2,
        vocab_size=1000,
        max_position_embeddings=max(128, seq * 2),
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=input_ids, use_cache=False).logits

    wrapper = Logits().eval()
    ids = torch.randint(0, 1000, (batch, seq))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dims = ({0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")},) if dynamic else None
        onx = torch.onnx.export(
            wrapper, (ids,), dynamo=True, verbose=False, dynamic_shapes=dims
        ).model_proto
    return wrapper, ids, onx


def _add_chain(n: int) -> onnx.ModelProto:
    nodes = [
        oh.make_node("Add", ["x" if i == 0 else f"t{i - 1}", "x"], [f"t{i}" if i < n - 1 else "y"])
        for i in range(n)
    ]
    vi = oh.make_tensor_value_info
    g = oh.make_graph(
        nodes, "chain", [vi("x", TensorProto.FLOAT, [4])], [vi("y", TensorProto.FLOAT, [4])]
    )
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 18)], ir_version=10)


_ORT_THREADS: int | None = None


def _session_options():
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = _ORT_THREADS or torch.get_num_threads()
    so.inter_op_num_threads = 1
    # onnxruntime's threads busy-wait after a run by default: in one process with torch,
    # they would steal the cores torch's next call needs and distort both timings
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return so


# --baseline: another checkout's TorchOnnxEvaluator, timed beside this one in the same run
_BASELINE: Any = None


def _load_baseline(checkout: str) -> Any:
    """The evaluator class of another checkout, imported under another package name so
    that both versions live in this process (the package imports itself relatively)."""
    import importlib
    import importlib.util
    import pathlib
    import sys

    pkg = pathlib.Path(checkout).resolve() / "onnx_sbs_nb"
    if not (pkg / "__init__.py").exists():
        raise SystemExit(f"--baseline: {checkout} holds no onnx_sbs_nb package")
    name = "baseline_onnx_sbs_nb"
    spec = importlib.util.spec_from_file_location(
        name, pkg / "__init__.py", submodule_search_locations=[str(pkg)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return importlib.import_module(f"{name}.evaluator.evaluator").TorchOnnxEvaluator


def _runners(onx: onnx.ModelProto, device: str) -> dict[str, Callable[[dict], Any] | str]:
    """name -> run(feeds as torch tensors), or a string saying why it is skipped."""
    import onnxruntime as ort

    res: dict[str, Callable[[dict], Any] | str] = {}
    ours = TorchOnnxEvaluator(onx, device=device)
    res["onnx_sbs_nb"] = lambda feeds: ours.run(None, feeds)
    if _BASELINE is not None:
        theirs = _BASELINE(onx, device=device)
        res["baseline checkout"] = lambda feeds: theirs.run(None, feeds)
    if device == "cpu":
        # the Python code alone: what runs before a plan moves to TorchScript
        python_code = TorchOnnxEvaluator(onx, device=device, jit=False)
        res["ours, jit=False"] = lambda feeds: python_code.run(None, feeds)
    if device == "cpu":
        sess = ort.InferenceSession(
            onx.SerializeToString(), _session_options(), providers=["CPUExecutionProvider"]
        )
        res["onnxruntime"] = lambda feeds: sess.run(None, {k: v.numpy() for k, v in feeds.items()})
        # the same without graph fusions: what kernel-by-kernel execution costs in ORT
        so = _session_options()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        plain = ort.InferenceSession(
            onx.SerializeToString(), so, providers=["CPUExecutionProvider"]
        )
        res["ort (no fusion)"] = lambda feeds: plain.run(
            None, {k: v.numpy() for k, v in feeds.items()}
        )
    else:
        provs = ort.get_available_providers()
        if "CUDAExecutionProvider" in provs:
            sess = ort.InferenceSession(
                onx.SerializeToString(), providers=["CUDAExecutionProvider"]
            )
            res["onnxruntime"] = lambda feeds: sess.run(
                None, {k: v.cpu().numpy() for k, v in feeds.items()}
            )
        else:
            res["onnxruntime"] = "skipped: this onnxruntime build has no CUDAExecutionProvider"
    try:
        from onnx_diagnostic.reference import TorchOnnxEvaluator as DiagEvaluator
    except ImportError:
        res["onnx_diagnostic"] = "skipped: onnx-diagnostic is not installed in this environment"
    else:
        providers = ("CUDAExecutionProvider",) if device == "cuda" else ("CPUExecutionProvider",)
        try:
            diag = DiagEvaluator(onx, providers=providers)
        except Exception as e:  # it lacks kernels for some exported ops
            res["onnx_diagnostic"] = f"cannot run it: {type(e).__name__}: {str(e)[:80]}"
        else:
            res["onnx_diagnostic"] = lambda feeds: diag.run(None, feeds)
    return res


def _report(
    title: str,
    times: dict[str, float | str],
    baseline: str = "onnxruntime",
    mins: dict[str, float] | None = None,
) -> None:
    """Medians (and the fastest calls, ``mins``: the least disturbed by a busy machine),
    each with its ratio to ``baseline``'s."""
    print(f"\n== {title}")
    base = times.get(baseline)
    mins = mins or {}
    for name, t in times.items():
        if isinstance(t, str):
            print(f"  {name:<16} {t}")
            continue
        ratio = f"  x{t / base:.2f} vs {baseline}" if isinstance(base, float) else ""
        low = ""
        if name in mins and baseline in mins:
            low = f"   (min {mins[name]:.3f} ms, x{mins[name] / mins[baseline]:.2f})"
        print(f"  {name:<16} {t:9.3f} ms{ratio}{low}")


def _interleaved(
    fns: dict[str, Callable[[], Any]],
    repeat: int,
    warmup: int = 3,
    sync: bool = False,
    mins: dict[str, float] | None = None,
) -> dict[str, float]:
    """Median ms per call of each function, calls interleaved (in an order shuffled each
    round) so that a change of machine load affects every contender alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns.items())
    shuffle = random.Random(0).shuffle
    for _ in range(repeat):
        # a new order each round: the contender timed right after another one (eager
        # torch leaves the caches cold) is not always the same one; rotating the order
        # would keep who follows whom, and it measured the same code 12-20% apart
        shuffle(order)
        for name, fn in order:
            if sync:
                torch.cuda.synchronize()
            t = time.perf_counter()
            fn()
            if sync:
                torch.cuda.synchronize()
            samples[name].append(time.perf_counter() - t)
    if mins is not None:
        mins.update({name: min(v) * 1e3 for name, v in samples.items()})
    return {name: statistics.median(v) * 1e3 for name, v in samples.items()}


def bench_model(title: str, model, ids, onx, repeat: int, device: str) -> dict[str, float | str]:
    sync = device == "cuda"
    model = model.to(device)
    ids = ids.to(device)
    feeds_name = onx.graph.input[0].name
    times: dict[str, float | str] = {}
    fns: dict[str, Callable[[], Any]] = {"eager torch": lambda: model(ids)}
    for name, run in _runners(onx, device).items():
        if isinstance(run, str):
            times[name] = run
        else:
            fns[name] = lambda run=run: run({feeds_name: ids})
    with torch.no_grad():
        # steady state: past the runs after which a CPU plan moves to TorchScript
        mins: dict[str, float] = {}
        measured = _interleaved(fns, repeat, warmup=JIT_AFTER + 5, sync=sync, mins=mins)
    times = {**{k: measured[k] for k in fns}, **times}
    if device == "cpu":
        times["ours, first runs"] = _first_runs(onx, feeds_name, ids)
    n_nodes = len(onx.graph.node)
    # on CUDA the reference is eager torch (the plain onnxruntime wheel has no CUDA provider)
    baseline = "eager torch" if device == "cuda" else "onnxruntime"
    _report(f"{title} ({n_nodes} ONNX nodes, {device})", times, baseline, mins)
    return times


def _first_runs(onx, feeds_name: str, ids) -> str:
    """What a fresh evaluator costs before its steady state: the first run, and the
    one-time cost of moving to TorchScript (the runs that compile and profile it)."""
    ev = TorchOnnxEvaluator(onx)
    times = []
    for _ in range(JIT_AFTER + 10):
        t = time.perf_counter()
        ev.run(None, {feeds_name: ids})
        times.append((time.perf_counter() - t) * 1e3)
    # the generic plan, and the plans specialised on input shapes (from the second run)
    plans = [*ev._plans.values()]
    plans += [p for seen in ev._specializer._seen.values() for p in seen.values()]
    if not any(getattr(p, "script", None) for p in plans):
        return f"first run {times[0]:.3f} ms; stays in Python (not every node is inline)"
    steady = statistics.median(times[-5:])
    jit_cost = sum(t - steady for t in times[JIT_AFTER - 1 : JIT_AFTER + 5])
    return f"first run {times[0]:.3f} ms, TorchScript one-time {jit_cost:.1f} ms"


def bench_dispatch(repeat: int, n: int = 500) -> None:
    onx = _add_chain(n)
    x = torch.randn(4)
    skipped: dict[str, str] = {}
    fns: dict[str, Callable[[], Any]] = {}
    for name, run in _runners(onx, "cpu").items():
        if isinstance(run, str):
            skipped[name] = run
        else:
            fns[name] = lambda run=run: run({"x": x})

    def bare() -> None:
        y = x
        for _ in range(n):
            y = torch.add(y, x)

    f = compile_node(onx.graph.node[0], {"": 18})

    def single_nodes() -> None:
        y = x
        for _ in range(n):
            (y,) = f([y, x])

    fns["bare torch.add"] = bare
    fns["compile_node call"] = single_nodes
    measured = _interleaved(fns, repeat, warmup=JIT_AFTER + 5)
    times: dict[str, float | str] = {k: v * 1e3 / n for k, v in measured.items()}
    times.update(skipped)
    print(f"\n== per-node dispatch: chain of {n} Add on 4 floats (microseconds per node)")
    base = times.get("onnxruntime")
    for name, t in times.items():
        if isinstance(t, str):
            print(f"  {name:<18} {t}")
        else:
            ratio = f"  x{t / base:.2f} vs onnxruntime" if isinstance(base, float) else ""
            print(f"  {name:<18} {t:8.2f} us{ratio}")


def _count_child(who: str, folder: str, runs: int) -> None:
    """Inside callgrind (instrumentation off): warm runs, then ``runs`` counted ones
    between the parent's ``callgrind_control -i on`` and ``off`` (signalled by files)."""
    import pathlib

    torch.set_num_threads(1)
    flag = pathlib.Path(folder) / _flag_name(who)
    onx = onnx.load(str(pathlib.Path(folder) / "model.onnx"))
    ids = torch.load(str(pathlib.Path(folder) / "ids.pt"))
    name = onx.graph.input[0].name
    if who == "onnxruntime":
        import onnxruntime as ort

        sess = ort.InferenceSession(
            onx.SerializeToString(), _session_options(), providers=["CPUExecutionProvider"]
        )

        def run() -> Any:
            return sess.run(None, {name: ids.numpy()})
    else:
        cls = _load_baseline(who) if who != "onnx_sbs_nb" else TorchOnnxEvaluator
        ev = cls(onx)

        def run() -> Any:
            return ev.run(None, {name: ids})

    with torch.no_grad():
        for _ in range(JIT_AFTER + 20):
            run()
        flag.with_suffix(".ready").touch()
        _wait_for(flag.with_suffix(".go"))
        for _ in range(runs):
            run()
        flag.with_suffix(".done").touch()
        _wait_for(flag.with_suffix(".end"))


def _flag_name(who: str) -> str:
    """A file name for a contender (the baseline is a folder path)."""
    return who.strip("/").replace("/", "_").replace(".", "_")


def _wait_for(path, timeout: float = 1800.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {path.name}")
        time.sleep(0.1)


def bench_instructions(runs: int, baseline: str | None) -> None:
    """Instructions per warm run of the tiny Llama (callgrind, one thread): a measure the
    shared machine's load does not move, for A/B of the evaluator against onnxruntime
    (needs valgrind). Under valgrind torch picks its AVX2 kernels."""
    import os
    import pathlib
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bench_evaluator_cg_") as tmp:
        _, ids, onx = _llama(64, 2, 8)
        onnx.save(onx, os.path.join(tmp, "model.onnx"))
        torch.save(ids, os.path.join(tmp, "ids.pt"))
        counts = {}
        for who in ["onnx_sbs_nb", *([baseline] if baseline else []), "onnxruntime"]:
            child_flag = pathlib.Path(tmp) / _flag_name(who)
            out = child_flag.with_suffix(".callgrind")
            cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]
            cmd += [f"--callgrind-out-file={out}", sys.executable, __file__]
            cmd += ["--count-child", who, "--count-dir", tmp, "--instructions", str(runs)]
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            try:
                _wait_for(child_flag.with_suffix(".ready"))
                ctl = ["callgrind_control", "-i"]
                subprocess.run([*ctl, "on", str(proc.pid)], check=True, capture_output=True)
                child_flag.with_suffix(".go").touch()
                _wait_for(child_flag.with_suffix(".done"))
                subprocess.run([*ctl, "off", str(proc.pid)], check=True, capture_output=True)
                child_flag.with_suffix(".end").touch()
                proc.communicate(timeout=600)
            finally:
                if proc.poll() is None:
                    proc.kill()
            text = out.read_text()
            total = next(int(x.split()[1]) for x in text.splitlines() if x.startswith("totals:"))
            counts["baseline checkout" if who == baseline else who] = total / runs / 1e6
    print(f"\n== instructions per warm run, tiny Llama (callgrind, {runs} runs, one thread)")
    for name, m in counts.items():
        print(f"  {name:<18} {m:7.3f} M  x{m / counts['onnxruntime']:.3f} vs onnxruntime")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--quick", action="store_true", help="only the tiny Llama and dispatch")
    parser.add_argument(
        "--big",
        action="store_true",
        help="also Llama hidden 1024, 8 layers, seq 256, batch 2 (the issue's GPU reference)",
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="intra-op threads for torch and onnxruntime"
    )
    parser.add_argument(
        "--baseline",
        default=None,
        help="another checkout (folder holding onnx_sbs_nb/): its evaluator is timed beside "
        "this one, interleaved in the same run",
    )
    parser.add_argument(
        "--instructions",
        type=int,
        default=0,
        metavar="RUNS",
        help="only count instructions of RUNS warm runs of the tiny Llama under valgrind's "
        "callgrind (this checkout, --baseline, onnxruntime): immune to the machine's load",
    )
    parser.add_argument("--count-child", help=argparse.SUPPRESS)
    parser.add_argument("--count-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.count_child:
        _count_child(args.count_child, args.count_dir, args.instructions)
        return 0
    if args.instructions:
        bench_instructions(args.instructions, args.baseline)
        return 0
    if args.baseline:
        global _BASELINE
        _BASELINE = _load_baseline(args.baseline)
    if args.threads:
        global _ORT_THREADS
        _ORT_THREADS = args.threads
        torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, numpy {np.__version__}, "
        f"onnx {onnx.__version__}"
    )
    bench_model(
        "tiny Llama hidden 64, 2 layers, seq 8", *_llama(64, 2, 8), args.repeat, args.device
    )
    if not args.quick:
        bench_model(
            "the same, exported with dynamic batch and sequence (shape ops)",
            *_llama(64, 2, 8, dynamic=True),
            args.repeat,
            args.device,
        )
        bench_model(
            "Llama hidden 256, 4 layers, seq 64",
            *_llama(256, 4, 64),
            max(5, args.repeat // 3),
            args.device,
        )
    if args.big:
        bench_model(
            "Llama hidden 1024, 8 layers, seq 256, batch 2",
            *_llama(1024, 8, 256, batch=2),
            max(5, args.repeat // 3),
            args.device,
        )
    bench_dispatch(args.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
