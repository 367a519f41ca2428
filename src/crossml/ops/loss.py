"""Losses: NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss.

Both take class scores of shape [N, C] or [N, C, d1, ...] and integer targets of shape [N] or
[N, d1, ...], an optional per-class ``weight``, an ``ignore_index`` whose targets contribute
nothing (and whose weight is not counted by ``mean``), and a ``reduction`` of none / sum / mean.
float16 / bfloat16 inputs are computed in float32 and cast back.
"""

from __future__ import annotations

import torch

from crossml.ops.registry import OpContext, op

_REDUCTIONS = ("none", "sum", "mean")


def nll(log_prob: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, ignore_index: int | None,
        reduction: str) -> torch.Tensor:
    """Negative log-likelihood of ``target`` under ``log_prob`` (class axis 1), ONNX semantics."""
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {', '.join(_REDUCTIONS)}, got '{reduction}'")
    if log_prob.dim() < 2:
        raise ValueError(f"input must be [N, C] or [N, C, d1, ...], got shape {tuple(log_prob.shape)}")
    expected = (log_prob.shape[0],) + tuple(log_prob.shape[2:])
    if tuple(target.shape) != expected:
        raise ValueError(f"target shape {tuple(target.shape)} does not match input shape {tuple(log_prob.shape)}; "
                         f"expected {expected}")
    dtype = log_prob.dtype
    x = log_prob.to(torch.float32) if dtype in (torch.float16, torch.bfloat16) else log_prob
    t = target.to(torch.int64)
    keep = t != ignore_index if ignore_index is not None else torch.ones_like(t, dtype=torch.bool)
    safe = torch.where(keep, t, torch.zeros_like(t))
    picked = -torch.gather(x, 1, safe.unsqueeze(1)).squeeze(1)
    w = weight.to(x.dtype)[safe] if weight is not None else torch.ones_like(picked)
    w = torch.where(keep, w, torch.zeros_like(w))
    loss = picked * w
    if reduction == "none":
        out = loss
    elif reduction == "sum":
        out = loss.sum()
    else:
        out = loss.sum() / w.sum()
    return out.to(dtype)


@op("NegativeLogLikelihoodLoss", since=12)
@op("NegativeLogLikelihoodLoss", since=13)
@op("NegativeLogLikelihoodLoss", since=22)
def negative_log_likelihood_loss(x: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None, *,
                                 ignore_index: int | None = None, reduction: str = "mean") -> torch.Tensor:
    return nll(x, target, weight, ignore_index, reduction)


@op("SoftmaxCrossEntropyLoss", since=12, ctx=True)
@op("SoftmaxCrossEntropyLoss", since=13, ctx=True)
def softmax_cross_entropy_loss(scores: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor | None = None, *,
                               ignore_index: int | None = None, reduction: str = "mean",
                               ctx: OpContext | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    x = scores.to(torch.float32) if scores.dtype in (torch.float16, torch.bfloat16) else scores
    log_prob = torch.log_softmax(x, dim=1)
    loss = nll(log_prob, labels, weights, ignore_index, reduction).to(scores.dtype)
    if ctx is not None and ctx.num_outputs > 1:
        return loss, log_prob.to(scores.dtype)
    return loss
