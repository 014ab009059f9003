"""Sequence ops (ai.onnx); a sequence value is a Python list of tensors."""

from __future__ import annotations

import torch

from ..registry import op
from ._helpers import as_ints, norm_axis


def _pos(position, n: int, insert: bool = False) -> int:
    p = int(position.reshape(-1)[0].item())
    if p < 0:
        p += n
    if p < 0 or p > n or (p == n and not insert):
        raise IndexError(f"sequence position {p} out of range for length {n}")
    return p


@op("SequenceConstruct", since=11, placement="any")
def sequence_construct(*xs):
    return list(xs)


@op("SequenceEmpty", since=11)
def sequence_empty(dtype=None):
    return []


@op("SequenceInsert", since=11, host_inputs=(2,), placement="any")
def sequence_insert(seq, tensor, position=None):
    out = list(seq)
    if position is None:
        out.append(tensor)
    else:
        out.insert(_pos(position, len(out), insert=True), tensor)
    return out


@op("SequenceAt", since=11, host_inputs=(1,), placement="any")
def sequence_at(seq, position):
    return seq[_pos(position, len(seq))]


@op("SequenceErase", since=11, host_inputs=(1,), placement="any")
def sequence_erase(seq, position=None):
    out = list(seq)
    if position is None:
        out.pop()
    else:
        out.pop(_pos(position, len(out)))
    return out


@op("SequenceLength", since=11)
def sequence_length(seq):
    return torch.tensor(len(seq), dtype=torch.int64)


@op("SplitToSequence", since=11, host_inputs=(1,), placement="any")
def split_to_sequence(x, split=None, axis=0, keepdims=1):
    axis = norm_axis(axis, x.dim())
    if split is None:
        parts = torch.split(x, 1, dim=axis)
        return [p.squeeze(axis) if not keepdims else p for p in parts]
    sizes = as_ints(split)
    if split.dim() == 0:
        return list(torch.split(x, sizes[0], dim=axis))
    return list(torch.split(x, sizes, dim=axis))


@op("ConcatFromSequence", since=11, placement="any")
def concat_from_sequence(seq, axis=0, new_axis=0):
    if new_axis:
        rank = seq[0].dim() + 1
        return torch.stack(seq, norm_axis(axis, rank))
    return torch.cat(seq, norm_axis(axis, seq[0].dim()))


@op("SequenceMap", since=17, context=True, placement="any")
def sequence_map(seq, *additional, body=None, ctx=None):
    run = ctx.graph_runner(body)
    n = len(seq)
    outs: list[list] | None = None
    for i in range(n):
        args = [seq[i]] + [a[i] if isinstance(a, list) else a for a in additional]
        res = run(args)
        if outs is None:
            outs = [[] for _ in res]
        for k, r in enumerate(res):
            outs[k].append(r)
    if outs is None:
        outs = [[] for _ in body.output]
    return tuple(outs)
