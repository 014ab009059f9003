"""Generation parity against the two decodes it is made of (issue 51, item 4).

Three tiny decoders with a ``DynamicCache`` (tests/corpus/cache_decoders.py: Llama, Phi-3,
GPT-2), each exported with dynamic dims, decoded ``--steps`` greedy steps three ways,
interleaved ``--repeats`` times:

- ``torch``: the program alone (``ep.module()``), feeding its cache back;
- ``onnx``: the ONNX model alone in one onnxruntime session, feeding its cache back;
- ``parity``: :func:`onnx_sbs_nb.generation_parity` (both decodes, the comparisons of the
  logits and of the cache written at every step).

It prints, for each decoder, the median of each and ``parity / (torch + onnx)``: what the
parity run costs over the two decodes alone (goal: at most 2x).  The same runs again with
``--load`` busy processes beside them (default 2: this machine's cores), so the ratio is
shown on a quiet and on a loaded machine.

    python benchmarks/bench_generation.py [--steps 32] [--repeats 5] [--load 2]
        [--decoders dynamic_cache,phi3_cache,gpt2_cache]
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from onnx_sbs_nb.align.generation import _logits_and_cache, generation_parity, next_step_inputs
from tests.corpus.cache_decoders import GENERATION_DECODERS, export_case


def _torch_decode(ep, kwargs, steps):
    module = ep.module()
    for k in range(steps):
        with torch.no_grad():
            logits, cache = _logits_and_cache(module(**kwargs))
        if k + 1 < steps:
            kwargs = next_step_inputs(kwargs, logits[:, -1].argmax(-1), cache)


def _onnx_decode(onx, ep, kwargs, steps):
    import onnxruntime as ort

    session = ort.InferenceSession(onx.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    with torch.no_grad():
        spec = torch.utils._pytree.tree_flatten(ep.module()(**kwargs))[1]
    for k in range(steps):
        flat = [v for v in torch.utils._pytree.tree_leaves(kwargs) if isinstance(v, torch.Tensor)]
        outs = session.run(None, {n: v.numpy() for n, v in zip(names, flat)})
        logits, cache = _logits_and_cache(
            torch.utils._pytree.tree_unflatten([torch.from_numpy(o) for o in outs], spec)
        )
        if k + 1 < steps:
            kwargs = next_step_inputs(kwargs, logits[:, -1].argmax(-1), cache)


def _burn(stop) -> None:
    x = 0
    while not stop.is_set():
        x = (x * 7 + 1) % 1000003


def measure(case, kwargs, steps: int, repeats: int) -> dict[str, float]:
    times: dict[str, list[float]] = {"torch": [], "onnx": [], "parity": []}
    runs = {
        "torch": lambda: _torch_decode(case.ep, kwargs, steps),
        "onnx": lambda: _onnx_decode(case.onx, case.ep, kwargs, steps),
        "parity": lambda: generation_parity(case.ep, case.onx, kwargs, steps=steps),
    }
    for _ in range(repeats):
        for name, fn in runs.items():  # interleaved: a load spike hits all three
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def _loaded(load: int, fn):
    """``fn()`` with ``load`` busy processes beside it."""
    stop = multiprocessing.Event()
    burners = [multiprocessing.Process(target=_burn, args=(stop,)) for _ in range(load)]
    for p in burners:
        p.start()
    try:
        return fn()
    finally:
        stop.set()
        for p in burners:
            p.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--load", type=int, default=2, help="busy processes for the loaded run")
    ap.add_argument("--decoders", default=",".join(GENERATION_DECODERS))
    args = ap.parse_args()
    rows = []
    for name in args.decoders.split(","):
        case = export_case(name, "dynamic")
        kwargs = case.kwargs()
        generation_parity(case.ep, case.onx, kwargs, steps=2)  # warm-up
        rows.append((name, "quiet", measure(case, kwargs, args.steps, args.repeats)))
        if args.load:
            run = functools.partial(measure, case, kwargs, args.steps, args.repeats)
            t = _loaded(args.load, run)
            rows.append((name, f"{args.load} busy", t))
    print(f"generation parity, {args.steps} steps, median of {args.repeats}")
    print(
        f"{'decoder':<14} {'machine':<8} {'torch s':>8} {'onnx s':>8} {'parity s':>9} "
        f"{'parity/(torch+onnx)':>20}"
    )
    for name, label, t in rows:
        r = t["parity"] / (t["torch"] + t["onnx"])
        print(
            f"{name:<14} {label:<8} {t['torch']:8.3f} {t['onnx']:8.3f} {t['parity']:9.3f} "
            f"{r:20.2f}x"
        )


if __name__ == "__main__":
    main()
