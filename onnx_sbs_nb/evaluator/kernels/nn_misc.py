"""NonMaxSuppression, TfIdfVectorizer (data-dependent loops on host values) and the string
operators StringConcat, StringSplit, StringNormalizer, RegexFullMatch."""

from __future__ import annotations

import re

import numpy as np
import torch

from ..registry import op


def _first(t, default):
    if t is None or t.numel() == 0:
        return default
    return t.reshape(-1)[0].item()


def _iou_matrix(boxes: torch.Tensor, center_point_box: int) -> torch.Tensor:
    """IoU of every pair of boxes (n, 4); 0 for degenerate pairs, as the reference."""
    b = boxes.to(torch.float64)
    if center_point_box:
        x0, x1 = b[:, 0] - b[:, 2] / 2, b[:, 0] + b[:, 2] / 2
        y0, y1 = b[:, 1] - b[:, 3] / 2, b[:, 1] + b[:, 3] / 2
    else:
        # corners may come in any order
        y0, y1 = torch.minimum(b[:, 0], b[:, 2]), torch.maximum(b[:, 0], b[:, 2])
        x0, x1 = torch.minimum(b[:, 1], b[:, 3]), torch.maximum(b[:, 1], b[:, 3])
    iw = torch.minimum(x1[:, None], x1[None]) - torch.maximum(x0[:, None], x0[None])
    ih = torch.minimum(y1[:, None], y1[None]) - torch.maximum(y0[:, None], y0[None])
    inter = iw.clamp(min=0) * ih.clamp(min=0)
    area = (x1 - x0) * (y1 - y0)
    union = area[:, None] + area[None] - inter
    ok = (iw > 0) & (ih > 0) & (area[:, None] > 0) & (area[None] > 0) & (union > 0)
    return torch.where(
        ok, inter / torch.where(union > 0, union, torch.ones_like(union)), torch.zeros_like(inter)
    )


@op("NonMaxSuppression", since=10, host_inputs=(2, 3, 4))
def non_max_suppression(
    boxes,
    scores,
    max_output_boxes_per_class=None,
    iou_threshold=None,
    score_threshold=None,
    center_point_box=0,
):
    max_out = max(int(_first(max_output_boxes_per_class, 0)), 0)
    iou_thr = float(_first(iou_threshold, 0.0))
    score_thr = _first(score_threshold, None)
    selected: list[tuple[int, int, int]] = []
    if max_out > 0:
        for bi in range(boxes.shape[0]):
            iou = _iou_matrix(boxes[bi], center_point_box).cpu()
            suppress = (iou > iou_thr).tolist()
            for ci in range(scores.shape[1]):
                sc = scores[bi, ci].tolist()
                cand = [i for i, s in enumerate(sc) if score_thr is None or s > score_thr]
                # highest score first, the lower index first among equal scores
                cand.sort(key=lambda i: (-sc[i], i))
                kept: list[int] = []
                for i in cand:
                    if len(kept) >= max_out:
                        break
                    if not any(suppress[i][k] for k in kept):
                        kept.append(i)
                selected.extend((bi, ci, k) for k in kept)
    out = torch.tensor(selected, dtype=torch.int64).reshape(-1, 3)
    return out.to(boxes.device)


@op("TfIdfVectorizer", since=9)
def tfidf_vectorizer(
    x,
    max_gram_length=1,
    max_skip_count=0,
    min_gram_length=1,
    mode="TF",
    ngram_counts=(),
    ngram_indexes=(),
    pool_int64s=None,
    pool_strings=None,
    weights=None,
):
    pool = list(pool_int64s if pool_int64s is not None else (pool_strings or []))
    counts = list(ngram_counts)
    indexes = list(ngram_indexes)
    out_size = max(indexes) + 1 if indexes else 0
    table: dict[tuple, int] = {}
    gid = 0
    for n, start in enumerate(counts, start=1):
        end = counts[n] if n < len(counts) else len(pool)
        for k in range(start, end, n):
            if min_gram_length <= n <= max_gram_length:
                table[tuple(pool[k : k + n])] = indexes[gid]
            gid += 1
    rows = x.tolist() if x.dim() == 2 else [x.tolist()]
    freq = [[0] * out_size for _ in rows]
    for r, row in enumerate(rows):
        start_n = min_gram_length
        for skip in range(1, max_skip_count + 2):
            for s in range(len(row)):
                if s + skip * (start_n - 1) >= len(row):
                    break
                for n in range(1, max_gram_length + 1):
                    last = s + skip * (n - 1)
                    if last >= len(row):
                        break
                    if n >= start_n:
                        hit = table.get(tuple(row[s : last + 1 : skip]))
                        if hit is not None:
                            freq[r][hit] += 1
            if start_n == 1:
                # unigrams are counted in the first pass only
                start_n = 2
                if start_n > max_gram_length:
                    break
    f = torch.tensor(freq, dtype=torch.float32).reshape(len(rows), out_size)
    w = torch.tensor(list(weights), dtype=torch.float32) if weights else None
    if mode == "TF":
        y = f
    elif mode == "IDF":
        y = (f > 0).float() * (w if w is not None else 1.0)
    elif mode == "TFIDF":
        y = f * w if w is not None else f
    else:
        raise ValueError(f"TfIdfVectorizer: unknown mode {mode!r}")
    if x.dim() != 2:
        y = y.reshape(out_size)
    return y.to(x.device)


# -- string operators ------------------------------------------------------------------------
# torch has no string dtype: string tensors are numpy object arrays inside these kernels
# (numeric results are torch tensors). The evaluator must hand such arrays through as is.


def _strings(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        raise TypeError("expected a string tensor (numpy object array), got a torch tensor")
    a = np.asarray(x)
    if a.dtype.kind not in "OUS":
        raise TypeError(f"expected a string tensor, got dtype {a.dtype}")
    return a.astype(object)


@op("StringConcat", since=20)
def string_concat(x, y):
    a, b = np.broadcast_arrays(_strings(x), _strings(y))
    joined = [str(u) + str(v) for u, v in zip(a.reshape(-1), b.reshape(-1))]
    return np.array(joined, dtype=object).reshape(a.shape)


@op("RegexFullMatch", since=20)
def regex_full_match(x, pattern=""):
    # Python's re agrees with RE2 on the syntax both accept
    regex = re.compile(pattern)
    a = _strings(x)
    flat = [regex.fullmatch(str(s)) is not None for s in a.reshape(-1)]
    return torch.tensor(flat, dtype=torch.bool).reshape(a.shape)


@op("StringSplit", since=20)
def string_split(x, delimiter="", maxsplit=None):
    a = _strings(x)
    sep = delimiter or None  # empty delimiter: split on runs of whitespace
    parts = [str(s).split(sep, -1 if maxsplit is None else maxsplit) for s in a.reshape(-1)]
    width = max((len(p) for p in parts), default=0)
    y = np.full((len(parts), width), "", dtype=object)
    for i, p in enumerate(parts):
        y[i, : len(p)] = p
    counts = torch.tensor([len(p) for p in parts], dtype=torch.int64).reshape(a.shape)
    return y.reshape(*a.shape, width), counts


@op("StringNormalizer", since=10)
def string_normalizer(x, case_change_action="NONE", is_case_sensitive=0, locale="", stopwords=None):
    # locale: Python has no thread-safe per-call locale; case mapping is Unicode's
    a = _strings(x)
    if a.ndim not in (1, 2) or (a.ndim == 2 and a.shape[0] != 1):
        raise ValueError(f"StringNormalizer takes [C] or [1, C], got shape {a.shape}")
    words = [str(s) for s in a.reshape(-1)]
    stops = set(stopwords or ())
    if stops:
        if is_case_sensitive:
            words = [w for w in words if w not in stops]
        else:
            low = {s.lower() for s in stops}
            words = [w for w in words if w.lower() not in low]
    if case_change_action == "LOWER":
        words = [w.lower() for w in words]
    elif case_change_action == "UPPER":
        words = [w.upper() for w in words]
    elif case_change_action != "NONE":
        raise ValueError(f"StringNormalizer: unknown case_change_action {case_change_action!r}")
    if not words:
        words = [""]  # the spec keeps one empty string when every word is removed
    out = np.array(words, dtype=object)
    return out.reshape(1, -1) if a.ndim == 2 else out
