"""Cost of watching a run, and of showing a big one.

1. The same side-by-side run bare, through SbsSession, and through SbsWidget (no browser
   attached: what the kernel pays), on a tiny Llama (hidden 256, 4 layers, random
   weights).  Prints the times and the overhead ratios (goal <= 1.10).
2. (``--rows N``, default 20,000; ``--rows 0`` skips it) The front end on N synthetic
   records in headless Chromium (the offline report, which is the widget's own renderer):
   the size of the state (columns against one JSON list per record, and gzipped), the
   time to mount, to draw table and chart, to sort by error, to filter, and the JS cost of
   a redraw on scroll, each against the same measurement on N/100 records timed in the
   same browser.

    python benchmarks/bench_widget.py [--repeat 3] [--rerun] [--rows 20000] [--no-run]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ and the checkout


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


# JS run in the report page: time each step from the moment the view exists.
_MEASURE = """async () => {
  const frame = () => new Promise((r) => requestAnimationFrame(() => r()));
  const until = async (f) => { while (!f()) await frame(); };
  const t0 = window.__t0;
  await until(() => document.querySelector('.sbs-tr') && document.querySelector('.sbs-chart .scatterlayer .trace'));
  const drawn = performance.now() - t0;
  await new Promise((r) => setTimeout(r, 1000));  // let the deferred redraws settle
  const root = document.querySelector('.sbs-root');
  const first = () => root.querySelector('.sbs-tr').dataset.row;
  let t = performance.now();
  const before = first();
  [...root.querySelectorAll('.sbs-th')].find((e) => e.textContent.startsWith('err abs')).click();
  await until(() => first() !== before);
  const sort = performance.now() - t;
  const input = root.querySelector('.sbs-f-text');
  t = performance.now();
  input.value = 'MatMul'; input.dispatchEvent(new Event('input'));
  await until(() => /of/.test(root.querySelector('.sbs-count').textContent));
  const filter = performance.now() - t - 120;  // minus the typing debounce
  input.value = ''; input.dispatchEvent(new Event('input'));
  await until(() => !/of/.test(root.querySelector('.sbs-count').textContent));
  const vp = root.querySelector('.sbs-viewport');
  const times = [];
  for (let k = 0; k < 40; k++) {
    vp.scrollTop = (vp.scrollHeight * k) / 40;
    const s = performance.now();
    vp.dispatchEvent(new Event('scroll'));
    await frame();
    times.push(performance.now() - s);
  }
  times.sort((a, b) => a - b);
  return {drawn, sort, filter, scroll: times[20], scrollMax: times[39],
          domRows: root.querySelectorAll('.sbs-tr').length};
}"""

# the loader renders on load; mark when it starts
_T0 = "<script>window.__t0 = performance.now();</script>"


def synthetic_records(n: int) -> list:
    from onnx_sbs_nb.records import Record

    ops = ("MatMul", "Add", "Mul", "Softmax", "Reshape", "Transpose")
    return [
        Record(
            step=i,
            ep_id_node=i,
            onnx_id_node=i,
            ep_name=f"fx_node_{i}",
            onnx_name=f"val_{i}",
            ep_target="aten.mm.default",
            onnx_op_type=ops[i % len(ops)],
            ep_shape_type="float32[2x64x64]",
            onnx_shape_type="float32[2x64x64]",
            err_abs=0.0 if i % 5 == 0 else 1e-7 * (1 + i % 97),
            err_rel=1e-6 * (1 + i % 7),
            err_abs2=0.0 if i % 3 else 1e-8 * (i % 13),
            passed=True,
            passed2=True,
            atol=1e-4,
            rtol=1e-4,
            paired_by="name",
            status="ok",
            ep_time_run=1e-5 * (1 + i % 17),
            onnx_time_run=2e-5 * (1 + i % 11),
        )
        for i in range(n)
    ]


def bench_browser(n: int, repeat: int) -> None:
    """Prints the front end's numbers for n records against n/100 in the same browser."""
    import gzip
    import json
    import tempfile
    from pathlib import Path

    from playwright.sync_api import sync_playwright

    from onnx_sbs_nb.reports.html import report_html
    from onnx_sbs_nb.reports.view_state import BUNDLE_PATH, encode_rows, record_row
    from tests.browser import launch

    bundle = BUNDLE_PATH.stat().st_size
    print(
        f"\nJS bundle: {bundle / 1e6:.2f} MB ({len(gzip.compress(BUNDLE_PATH.read_bytes())) / 1e6:.2f} MB gzipped)"
    )
    sizes = {}
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as pw:
        browser = launch(pw)
        results: dict[int, list[dict]] = {}
        for count in (max(1, n // 100), n):
            recs = synthetic_records(count)
            if count == n:
                per_row = len(json.dumps([record_row(r) for r in recs]))
                columns = json.dumps(encode_rows(recs))
                sizes = {
                    "per-record JSON lists": per_row,
                    "columns (the rows trait)": len(columns),
                    "columns, gzipped (the HTML report)": len(gzip.compress(columns.encode())),
                }
            path = Path(tmp) / f"report_{count}.html"
            path.write_text(
                report_html(recs).replace("<body>", "<body>" + _T0, 1), encoding="utf-8"
            )
            results[count] = []
            for _ in range(repeat):
                page = browser.new_page(viewport={"width": 1500, "height": 1000})
                page.goto(path.as_uri())
                results[count].append(page.evaluate(_MEASURE))
                page.close()
        browser.close()
    print(f"state of {n:,} records:")
    base = sizes["per-record JSON lists"]
    for name, size in sizes.items():
        print(f"  {name:36s} {size / 1e6:6.2f} MB  ({size / base:.2f}x)")
    small, big = (
        {k: statistics.median(r[k] for r in results[c]) for k in results[c][0]} for c in results
    )
    label = {"drawn": "load to table + chart drawn", "sort": "sort by error",
             "filter": "text filter", "scroll": "redraw on scroll (median)",
             "scrollMax": "redraw on scroll (max)"}  # fmt: skip
    print(f"front end, median of {repeat} loads ({n // 100:,} records vs {n:,}):")
    for key, text in label.items():
        ratio = big[key] / small[key] if small[key] > 0 else float("nan")
        print(f"  {text:30s} {small[key]:8.1f} ms  {big[key]:8.1f} ms  ({ratio:.1f}x)")
    print(f"  row elements in the DOM: {int(big['domRows'])} (virtualised)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--rerun", action="store_true", help="own_error=True")
    parser.add_argument("--rows", type=int, default=20_000, help="records for the browser part")
    parser.add_argument("--no-run", action="store_true", help="only the browser part")
    args = parser.parse_args()
    if not args.no_run:
        bench_run(args)
    if args.rows:
        bench_browser(args.rows, args.repeat)


def bench_run(args: argparse.Namespace) -> None:
    warnings.simplefilter("ignore")
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)

    from onnx_sbs_nb.align.run import run_aligned
    from onnx_sbs_nb.notebook.session import SbsSession
    from onnx_sbs_nb.notebook.widget import SbsWidget

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
        assert w.rows["n"] == len(w.session.records)  # the full sync happened
        return w.rows["n"]

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
