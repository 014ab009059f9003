"""Cost of watching a run: the same side-by-side run bare, through SbsSession, and through
SbsWidget (no browser attached: what the kernel pays), on a tiny Llama (hidden 256,
4 layers, random weights).  Prints the times and the overhead ratios (goal <= 1.10).

    python benchmarks/bench_widget.py [--repeat 3] [--rerun]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
import warnings


def build(hidden: int, layers: int, seq: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    class Logits(torch.nn.Module):
        def __init__(self, config):
            super().__init__()
            self.model = LlamaForCausalLM(config)

        def forward(self, input_ids):
            return self.model(input_ids, use_cache=False).logits

    config = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1024,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    model = Logits(config).eval()
    ids = torch.randint(0, 1024, (1, seq))
    ep = torch.export.export(model, (ids,))
    onx = torch.onnx.export(ep, (ids,), dynamo=True, verbose=False).model_proto
    return ep, onx, (ids,)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--rerun", action="store_true", help="own_error=True")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)

    from onnx_sbs_nb.align.run import run_aligned
    from onnx_sbs_nb.session import SbsSession
    from onnx_sbs_nb.widget import SbsWidget

    t = time.perf_counter()
    ep, onx, inputs = build(args.hidden, args.layers, args.seq)
    print(f"export: {time.perf_counter() - t:.1f} s, {len(onx.graph.node)} ONNX nodes")
    opts = {"own_error": args.rerun}

    def bare() -> int:
        return len(list(run_aligned(ep, onx, inputs, **opts)))

    def session() -> int:
        s = SbsSession(ep, onx, inputs, **opts)
        s.start()
        return len(s.records)

    def widget() -> int:
        w = SbsWidget(ep, onx, inputs, **opts)
        w.wait()
        assert len(w.rows) == len(w.session.records)  # the full sync happened
        return len(w.rows)

    ways = {"bare": bare, "session": session, "widget": widget}
    bare()  # warm-up: imports, onnxruntime sessions, torch caches
    times: dict[str, list[float]] = {k: [] for k in ways}
    counts = {}
    for _ in range(args.repeat):
        for name, fn in ways.items():  # interleaved, so drift hits all three alike
            t = time.perf_counter()
            counts[name] = fn()
            times[name].append(time.perf_counter() - t)
    assert len(set(counts.values())) == 1, counts
    base = statistics.median(times["bare"])
    print(f"records per run: {counts['bare']}")
    for name in ways:
        med = statistics.median(times[name])
        print(
            f"{name:8s} median {med:7.3f} s  (runs: {', '.join(f'{x:.3f}' for x in times[name])})"
        )
    for name in ("session", "widget"):
        ratio = statistics.median(times[name]) / base
        verdict = "OK" if ratio <= 1.10 else "ABOVE GOAL"
        print(f"overhead ratio {name}/bare: {ratio:.3f} (goal <= 1.10: {verdict})")


if __name__ == "__main__":
    main()
