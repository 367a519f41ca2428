"""Layer normalizations of onnxruntime's contrib set (RMSNorm and the fused skip variants).

* ``SimplifiedLayerNormalization`` (RMSNorm) and ``LayerNormalization`` (opset-1 form): onnxruntime
  registers both in the ai.onnx domain, and GenAI builder models use them that way.
* ``SkipLayerNormalization`` / ``SkipSimplifiedLayerNormalization`` (com.microsoft): normalize
  ``input + skip (+ bias)`` over the last axis, optionally returning the mean, the inverse standard
  deviation and the residual sum itself.

Statistics are computed in float32 for half-precision inputs (``stash_type`` 1), as onnxruntime does.
"""

from __future__ import annotations

import torch

from crossml.ops._util import norm_axis
from crossml.ops.registry import MS_DOMAIN, OpContext, op

_HALF = (torch.float16, torch.bfloat16)


def _stash(x: torch.Tensor, stash_type: int) -> torch.Tensor:
    if stash_type == 11:
        return x.double()
    return x.float() if x.dtype in _HALF or stash_type == 1 and x.dtype != torch.float64 else x


def _normalize(x: torch.Tensor, axis: int, epsilon: float, simplified: bool, stash_type: int = 1):
    """(normalized x in the stash type, mean or None, inverse std) over dims axis..rank-1."""
    dims = tuple(range(norm_axis(axis, x.dim()), x.dim()))
    w = _stash(x, stash_type)
    mean = None
    if simplified:
        var = w.square().mean(dim=dims, keepdim=True)
    else:
        mean = w.mean(dim=dims, keepdim=True)
        w = w - mean
        var = w.square().mean(dim=dims, keepdim=True)
    inv = torch.rsqrt(var + epsilon)
    return w * inv, mean, inv


def _stat_type(x: torch.Tensor, stash_type: int) -> torch.dtype:
    return torch.float64 if stash_type == 11 else torch.float32


@op("SimplifiedLayerNormalization", since=1)
def simplified_layer_normalization(
    X: torch.Tensor, scale: torch.Tensor, *, axis: int = -1, epsilon: float = 1e-5, stash_type: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    y, _, inv = _normalize(X, axis, epsilon, True, stash_type)
    out = (y * _stash(scale, stash_type)).to(scale.dtype)
    return out, inv.to(_stat_type(X, stash_type))


@op("LayerNormalization", since=1)
def layer_normalization(
    X: torch.Tensor,
    Scale: torch.Tensor,
    B: torch.Tensor | None = None,
    *,
    axis: int = -1,
    epsilon: float = 1e-5,
    stash_type: int = 1,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y, mean, inv = _normalize(X, axis, epsilon, False, stash_type)
    y = y * _stash(Scale, stash_type)
    if B is not None:
        y = y + _stash(B, stash_type)
    st = _stat_type(X, stash_type)
    return y.to(X.dtype), mean.to(st), inv.to(st)


def _skip_sum(x: torch.Tensor, skip: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if x.dim() not in (2, 3):
        raise ValueError(f"input is expected to have rank 2 or 3, got shape {tuple(x.shape)}")
    if skip.shape[-1] != x.shape[-1] or skip.dim() > x.dim():
        raise ValueError(f"skip of shape {tuple(skip.shape)} does not broadcast to input {tuple(x.shape)}")
    s = _stash(x, 1) + _stash(skip, 1)
    return s if bias is None else s + _stash(bias, 1)


def _skip_outputs(ctx: OpContext, x: torch.Tensor, y: torch.Tensor, mean, inv, s: torch.Tensor) -> tuple:
    want = ctx.outputs_wanted + (False,) * (4 - len(ctx.outputs_wanted))
    return (
        y.to(x.dtype),
        mean if want[1] and mean is not None else None,
        inv if want[2] else None,
        s.to(x.dtype) if want[3] else None,
    )


@op("SkipLayerNormalization", domain=MS_DOMAIN, ctx=True)
def skip_layer_normalization(
    x: torch.Tensor,
    skip: torch.Tensor,
    gamma: torch.Tensor,
    beta: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    *,
    epsilon: float = 1e-12,
    ctx: OpContext,
) -> tuple:
    s = _skip_sum(x, skip, bias)
    y, mean, inv = _normalize(s, -1, epsilon, False)
    y = y * _stash(gamma, 1)
    if beta is not None:
        y = y + _stash(beta, 1)
    return _skip_outputs(ctx, x, y, mean, inv, s)


@op("SkipSimplifiedLayerNormalization", domain=MS_DOMAIN, ctx=True)
def skip_simplified_layer_normalization(
    x: torch.Tensor,
    skip: torch.Tensor,
    gamma: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    epsilon: float = 1e-12,
    ctx: OpContext,
) -> tuple:
    s = _skip_sum(x, skip, bias)
    y, _, inv = _normalize(s, -1, epsilon, True)
    return _skip_outputs(ctx, x, y * _stash(gamma, 1), None, inv, s)
