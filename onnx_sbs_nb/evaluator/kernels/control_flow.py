"""Control flow (ai.onnx): If, Loop, Scan. Subgraphs run through the kernel context."""

from __future__ import annotations

from typing import Any

import onnx
import torch

from ...dtypes import ONNX_TO_TORCH
from ..registry import op


def _truth(cond) -> bool:
    if isinstance(cond, torch.Tensor):
        return bool(cond.reshape(-1)[0].item())
    return bool(cond)


@op("If", since=1, context=True, host_inputs=(0,), placement="any")
def if_(cond, then_branch=None, else_branch=None, ctx=None):
    branch = then_branch if _truth(cond) else else_branch
    return tuple(ctx.run_graph(branch, []))


def _stack(values: list, declared: onnx.ValueInfoProto, device: torch.device) -> Any:
    if values and isinstance(values[0], list):
        return values  # a sequence scan output: one sequence per iteration
    if values:
        return torch.stack(values, 0)
    # no iteration: an empty stack with the element type and known dims the body declares
    tt = declared.type.tensor_type
    dtype = ONNX_TO_TORCH.get(tt.elem_type, torch.float32)
    dims = [d.dim_value if d.HasField("dim_value") else 0 for d in tt.shape.dim]
    return torch.zeros((0, *dims), dtype=dtype, device=device)


@op("Loop", since=1, context=True, host_inputs=(0, 1), placement="any")
def loop(m=None, cond=None, *carried, body=None, ctx=None):
    run = ctx.graph_runner(body)
    n_carried = len(carried)
    max_iter = int(m.reshape(-1)[0].item()) if m is not None else None
    keep = _truth(cond) if cond is not None else True
    values = list(carried)
    n_scan = len(body.output) - 1 - n_carried
    scans = [[] for _ in range(n_scan)]
    i = 0
    while keep and (max_iter is None or i < max_iter):
        outs = run([torch.tensor(i, dtype=torch.int64), torch.tensor(keep), *values])
        keep = _truth(outs[0])
        values = outs[1 : 1 + n_carried]
        for k, s in enumerate(outs[1 + n_carried :]):
            scans[k].append(s)
        i += 1
    # Scan outputs are stacked along a new first axis (not concatenated).
    declared = list(body.output)[1 + n_carried :]
    dev = ctx.default_device(*values)
    return (*values, *[_stack(s, d, dev) for s, d in zip(scans, declared)])


def _scan_run(run, states, scan_inputs, n_scan_in, in_axes, in_dirs, out_axes, out_dirs):
    seq_len = scan_inputs[0].shape[in_axes[0]] if scan_inputs else 0
    n_states = len(states)
    outs_per_iter: list[list] = []
    for t in range(seq_len):
        slices = []
        for k, x in enumerate(scan_inputs):
            idx = seq_len - 1 - t if in_dirs[k] else t
            slices.append(x.select(in_axes[k], idx))
        outs = run([*states, *slices])
        states = outs[:n_states]
        outs_per_iter.append(outs[n_states:])
    n_scan_out = len(outs_per_iter[0]) if outs_per_iter else 0
    scan_outs = []
    for k in range(n_scan_out):
        vals = [o[k] for o in outs_per_iter]
        if out_dirs[k]:
            vals = vals[::-1]
        axis = out_axes[k]
        if axis < 0:
            axis += vals[0].dim() + 1
        scan_outs.append(torch.stack(vals, axis))
    return states, scan_outs


@op("Scan", since=9, context=True, placement="any")
def scan(
    *inputs,
    body=None,
    num_scan_inputs=None,
    scan_input_axes=None,
    scan_input_directions=None,
    scan_output_axes=None,
    scan_output_directions=None,
    ctx=None,
):
    run = ctx.graph_runner(body)
    m = num_scan_inputs
    n_states = len(inputs) - m
    states, scan_inputs = list(inputs[:n_states]), list(inputs[n_states:])
    in_axes = [a + x.dim() if a < 0 else a for a, x in zip(scan_input_axes or [0] * m, scan_inputs)]
    n_out = len(body.output) - n_states
    states, scan_outs = _scan_run(
        run,
        states,
        scan_inputs,
        m,
        in_axes,
        scan_input_directions or [0] * m,
        scan_output_axes or [0] * n_out,
        scan_output_directions or [0] * n_out,
    )
    return (*states, *scan_outs)


@op("Scan", since=8, context=True, placement="any")
def scan_v8(
    sequence_lens=None,
    *inputs,
    body=None,
    num_scan_inputs=None,
    directions=None,
    ctx=None,
):
    # Opset 8: a batch axis 0 in front of everything, the scan axis is 1.
    run = ctx.graph_runner(body)
    m = num_scan_inputs
    n_states = len(inputs) - m
    batch = inputs[0].shape[0]
    n_out = len(body.output) - n_states
    results: list[list] = []
    for b in range(batch):
        states = [x[b] for x in inputs[:n_states]]
        scans = [x[b] for x in inputs[n_states:]]
        if sequence_lens is not None:
            n = int(sequence_lens[b].item())
            scans = [s[:n] for s in scans]
        st, so = _scan_run(
            run, states, scans, m, [0] * m, directions or [0] * m, [0] * n_out, [0] * n_out
        )
        results.append([*st, *so])
    return tuple(torch.stack([r[k] for r in results], 0) for k in range(len(results[0])))
