"""Losses: NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..registry import op


def _nll(x, target, weight, ignore_index, reduction):
    if reduction not in ("none", "sum", "mean"):
        raise ValueError(f"unknown reduction {reduction!r}")
    if x.dim() < 2:
        raise ValueError(f"the input must be (N, C, ...), got rank {x.dim()}")
    # without ignore_index every target must be a class: torch's -100 default cannot occur
    ii = -100 if ignore_index is None else int(ignore_index)
    return F.nll_loss(
        x, target.to(torch.int64), weight=weight, ignore_index=ii, reduction=reduction
    )


@op("NegativeLogLikelihoodLoss", since=12)
def nll_loss(x, target, weight=None, ignore_index=None, reduction="mean"):
    return _nll(x, target, weight, ignore_index, reduction)


@op("SoftmaxCrossEntropyLoss", since=12)
def softmax_cross_entropy_loss(scores, labels, weights=None, ignore_index=None, reduction="mean"):
    log_prob = torch.log_softmax(scores, dim=1)
    return _nll(log_prob, labels, weights, ignore_index, reduction), log_prob
