#!/usr/bin/env python
"""Replay one ONNX node of a side-by-side run (written by onnx_sbs_nb).

Needs only torch, onnx and onnxruntime.  This folder holds:

- ``model.onnx``: a sub-model computing the node's outputs from the nearest values that
  had a torch partner during the run;
- ``torch_inputs.pt`` / ``onnx_inputs.pt``: those values as torch computed them and as
  the ONNX model computed them (keys: ONNX value names);
- ``expected.pt``: the torch outputs the node's outputs were compared with;
- ``mapping.json``: ONNX value name -> torch.fx node name; ``record.json``: the record of
  the run; optionally ``prefix_model.onnx`` + ``prefix_inputs.pt`` (from the original
  inputs to this node).

Run ``python replay.py`` to print the discrepancy again (``--json`` for one JSON line,
``--provider cuda`` for onnxruntime's CUDA provider, ``--prefix`` to run the prefix model
too).  The script always exits 0 once the files load, whatever the discrepancy; a bundle it
cannot read (damaged, or written by something else) exits 2 with one line.

This script is for bundles you made yourself: running a script runs whatever it holds.
To open a bundle someone else sent, use ``onnx-sbs replay BUNDLE`` (or
the package's ``load_replay``), which reads the files without executing anything from them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import onnx
import onnxruntime
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REL_EPS = 1e-5  # relative error = |diff| / (|expected| + REL_EPS)


def _load_pt(name):
    path = os.path.join(HERE, name)
    return torch.load(path, weights_only=True) if os.path.exists(path) else None


def _load_json(name):
    path = os.path.join(HERE, name)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


_TORCH_DTYPE = {
    onnx.TensorProto.FLOAT: torch.float32,
    onnx.TensorProto.DOUBLE: torch.float64,
    onnx.TensorProto.FLOAT16: torch.float16,
    onnx.TensorProto.BFLOAT16: torch.bfloat16,
    onnx.TensorProto.INT8: torch.int8,
    onnx.TensorProto.INT16: torch.int16,
    onnx.TensorProto.INT32: torch.int32,
    onnx.TensorProto.INT64: torch.int64,
    onnx.TensorProto.UINT8: torch.uint8,
    onnx.TensorProto.BOOL: torch.bool,
}


def _to_ort(t, elem_type):
    """An OrtValue (bfloat16 has no numpy dtype: pass its bits with the ONNX type)."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        bits = t.view(torch.int16).numpy().view("uint16")
        return onnxruntime.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, elem_type)
    return onnxruntime.OrtValue.ortvalue_from_numpy(t.numpy())


def _from_ort(value, elem_type):
    if elem_type == onnx.TensorProto.BFLOAT16:
        import ctypes

        # numpy has no bfloat16: copy the raw bytes of the (CPU) result
        raw = ctypes.string_at(value.data_ptr(), value.tensor_size_in_bytes())
        flat = torch.frombuffer(bytearray(raw), dtype=torch.int16).view(torch.bfloat16)
        return flat.reshape(value.shape())
    return torch.from_numpy(value.numpy().copy())


def run_model(path, feeds, provider="cpu"):
    """Run an ONNX file on torch tensors; returns {output name: torch tensor}."""
    model = onnx.load(path, load_external_data=False)  # only the signature is read
    providers = ["CPUExecutionProvider"]
    if provider == "cuda":
        providers.insert(0, "CUDAExecutionProvider")
    sess = onnxruntime.InferenceSession(path, providers=providers)
    ort_feeds = {}
    notes = []
    for inp in model.graph.input:
        if inp.name not in feeds:
            raise KeyError(f"no value for input {inp.name!r} of {os.path.basename(path)}")
        elem = inp.type.tensor_type.elem_type
        t = feeds[inp.name]
        want = _TORCH_DTYPE.get(elem)
        if want is not None and t.dtype != want:
            notes.append(f"{inp.name}: cast {t.dtype} -> {want}")
            t = t.to(want)
        ort_feeds[inp.name] = _to_ort(t, elem)
    names = [o.name for o in model.graph.output]
    results = sess.run_with_ort_values(names, ort_feeds)
    elems = {o.name: o.type.tensor_type.elem_type for o in model.graph.output}
    return {n: _from_ort(v, elems[n]) for n, v in zip(names, results)}, notes


def compare(got, expected):
    """max abs / rel difference and NaN mismatches between two tensors (float64)."""
    if tuple(got.shape) != tuple(expected.shape):
        return {
            "max_abs": None,
            "max_rel": None,
            "nan": None,
            "error": f"shape {tuple(got.shape)} != expected {tuple(expected.shape)}",
        }
    if got.dtype == torch.bool or expected.dtype == torch.bool:
        got, expected = got.to(torch.int64), expected.to(torch.int64)
    a = got.detach().cpu().to(torch.float64)
    b = expected.detach().cpu().to(torch.float64)
    nan_a, nan_b = ~torch.isfinite(a), ~torch.isfinite(b)
    both = nan_a & nan_b
    same_special = both & ((a == b) | (torch.isnan(a) & torch.isnan(b)))
    nan_mismatch = int(((nan_a | nan_b) & ~same_special).sum())
    finite = ~(nan_a | nan_b)
    diff = (a - b).abs()[finite]
    if diff.numel() == 0:
        max_abs = max_rel = 0.0
    else:
        max_abs = float(diff.max())
        max_rel = float((diff / (b.abs()[finite] + REL_EPS)).max())
    return {"max_abs": max_abs, "max_rel": max_rel, "nan": nan_mismatch, "error": None}


def _clean(text):
    """Model-supplied names with control characters escaped before they reach a terminal."""
    text = str(text)
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _fmt(v):
    if v is None:
        return "-"
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return f"{v:.4g}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument("--provider", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--prefix", action="store_true", help="also run prefix_model.onnx")
    args = parser.parse_args(argv)
    try:
        return _replay(args)
    except Exception as e:  # a damaged or hostile bundle: one line, not a traceback
        lines = str(e).strip().splitlines() or [""]
        print(
            f"replay.py: this bundle cannot be replayed: {type(e).__name__}: "
            f"{_clean(lines[0][:300])}",
            file=sys.stderr,
        )
        return 2


def _replay(args):
    node = _load_json("node.json") or {}
    mapping = _load_json("mapping.json") or {}
    record = _load_json("record.json")
    expected = _load_pt("expected.pt")
    torch_inputs = _load_pt("torch_inputs.pt")
    onnx_inputs = _load_pt("onnx_inputs.pt")
    model_path = os.path.join(HERE, "model.onnx")

    out = {"node": node.get("node_name"), "op_type": node.get("op_type"), "outputs": []}
    runs = {}
    for label, feeds in (("torch_inputs", torch_inputs), ("onnx_inputs", onnx_inputs)):
        try:
            runs[label], notes = run_model(model_path, feeds, args.provider)
            out[f"notes_{label}"] = notes
        except Exception as e:  # the failure itself is the reproduction
            runs[label] = None
            out[f"error_{label}"] = f"{type(e).__name__}: {e}"
    output_names = [o.name for o in onnx.load(model_path, load_external_data=False).graph.output]
    for name in output_names:
        entry = {"name": name, "fx_name": mapping.get(name), "has_expected": name in expected}
        for label, res in runs.items():
            if res is None or name not in res or name not in expected:
                entry[label] = None
            else:
                entry[label] = compare(res[name], expected[name])
        # the two runs against each other: all that is left for an output with no
        # torch partner, and the inherited part of the error for the others
        t_run, o_run = runs.get("torch_inputs"), runs.get("onnx_inputs")
        if t_run is not None and o_run is not None:
            entry["between_runs"] = compare(o_run[name], t_run[name])
        out["outputs"].append(entry)
    for label in runs:
        values = [
            e[label]["max_abs"]
            for e in out["outputs"]
            if e.get(label) and e[label]["max_abs"] is not None
        ]
        out[f"max_abs_{label}"] = max(values) if values else None
    if args.prefix and os.path.exists(os.path.join(HERE, "prefix_model.onnx")):
        try:
            res, _ = run_model(
                os.path.join(HERE, "prefix_model.onnx"), _load_pt("prefix_inputs.pt"), args.provider
            )
            diffs = [compare(res[n], e)["max_abs"] for n, e in expected.items() if n in res]
            out["max_abs_prefix"] = max((d for d in diffs if d is not None), default=None)
        except Exception as e:
            out["error_prefix"] = f"{type(e).__name__}: {e}"
    if record:
        out["recorded"] = {k: record.get(k) for k in ("err_abs", "err_rel", "err_abs2", "err_rel2")}

    if args.json:
        print(json.dumps(out))
        return 0
    print(f"node {_clean(out['node'])} ({_clean(out['op_type'])}): {_clean(model_path)}")
    for e in out["outputs"]:
        print(f"  output {_clean(e['name'])} (fx: {_clean(e['fx_name'])})")
        for label in ("torch_inputs", "onnx_inputs"):
            c = e.get(label)
            if not e["has_expected"]:
                print("    no torch value to compare with (no torch partner)")
                break
            if c is None:
                print(f"    on {label:<12}: {_clean(out.get('error_' + label, 'not produced'))}")
            elif c["error"]:
                print(f"    on {label:<12}: {_clean(c['error'])}")
            else:
                print(
                    f"    on {label:<12}: max abs {_fmt(c['max_abs'])}  "
                    f"max rel {_fmt(c['max_rel'])}  nan/inf mismatches {c['nan']}"
                )
        b = e.get("between_runs")
        if b is not None and not b["error"]:
            print(f"    run on onnx inputs vs run on torch inputs: max abs {_fmt(b['max_abs'])}")
    if "max_abs_prefix" in out or "error_prefix" in out:
        print(
            f"  prefix model: max abs {_fmt(out.get('max_abs_prefix'))} "
            f"{_clean(out.get('error_prefix', ''))}"
        )
    if "recorded" in out:
        r = out["recorded"]
        print(
            f"  recorded during the run: err_abs {_fmt(r['err_abs'])}  own err_abs2 {_fmt(r['err_abs2'])}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
