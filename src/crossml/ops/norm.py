"""Normalisations: BatchNormalization, InstanceNormalization, LayerNormalization,
GroupNormalization, RMSNormalization, LRN, LpNormalization, MeanVarianceNormalization.

Inference forms go to the fused ``torch.nn.functional`` kernels. ``stash_type`` = 1 (float32
statistics) is honoured by computing half-precision inputs in float32 and casting back; on CUDA/ROCm
LayerNormalization hands half inputs to torch's kernel as they are (it computes in float32 itself).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from crossml.dtypes import torch_dtype
from crossml.ops._util import cpu_kernels, gpu_kernels, norm_axes, norm_axis
from crossml.ops.registry import OpContext, op

_HALF = (torch.float16, torch.bfloat16)


def _stash(x: torch.Tensor, stash_type: int = 1) -> torch.dtype:
    """The dtype statistics are computed in: float32 for half inputs (stash_type 1), else the input's."""
    return torch.float32 if stash_type == 1 and x.dtype in _HALF else x.dtype


def _cpu_half(x: torch.Tensor) -> torch.dtype:
    """float32 for float16 on the CPU (few fused CPU kernels take it), else the input's dtype."""
    return torch.float32 if x.dtype == torch.float16 and x.device.type == "cpu" else x.dtype


def _native_half(x: torch.Tensor, scale: torch.Tensor, b: torch.Tensor | None) -> bool:
    """Half inputs on CUDA/ROCm with weights of their type: torch's fused kernels accumulate in float32."""
    return x.is_cuda and x.dtype in _HALF and scale.dtype == x.dtype and (b is None or b.dtype == x.dtype)


def _channel_shape(x: torch.Tensor) -> list[int]:
    return [1, -1] + [1] * (x.dim() - 2)


@op("BatchNormalization", since=1, ctx=True)
def batch_normalization(x: torch.Tensor, scale: torch.Tensor, b: torch.Tensor, mean: torch.Tensor,
                        var: torch.Tensor, *, epsilon: float = 1e-5, momentum: float = 0.9,
                        training_mode: int = 0, spatial: int = 1, ctx: OpContext) -> Any:
    dt = _stash(x)
    if training_mode:
        dims = [d for d in range(x.dim()) if d != 1]
        xc = x.to(dt)
        cur_var, cur_mean = torch.var_mean(xc, dim=dims, correction=0)
        y = F.batch_norm(xc, cur_mean, cur_var, scale.to(dt), b.to(dt), training=False, eps=epsilon)
        run_mean = mean.to(dt) * momentum + cur_mean * (1 - momentum)
        run_var = var.to(dt) * momentum + cur_var * (1 - momentum)
        outs = (y.to(x.dtype), run_mean.to(mean.dtype), run_var.to(var.dtype))
        return outs[: ctx.num_outputs] if ctx.num_outputs > 1 else outs[0]
    if scale.dim() > 1 or not spatial:
        # opset < 9, spatial=0: statistics per (C, spatial...) element, broadcast over the batch
        inv = torch.rsqrt(var.to(dt) + epsilon)
        y = (x.to(dt) - mean.to(dt)) * inv * scale.to(dt) + b.to(dt)
    else:
        dt = _cpu_half(x) if dt == x.dtype else dt
        y = F.batch_norm(x.to(dt), mean.to(dt), var.to(dt), scale.to(dt), b.to(dt), training=False, eps=epsilon)
    y = y.to(x.dtype)
    return y if ctx.num_outputs == 1 else (y,) + (None,) * (ctx.num_outputs - 1)


@op("InstanceNormalization", since=1)
def instance_normalization(x: torch.Tensor, scale: torch.Tensor, b: torch.Tensor, *,
                           epsilon: float = 1e-5) -> torch.Tensor:
    dt = _stash(x)
    xc = x.to(dt)
    if x.dim() < 3:
        xc = xc.unsqueeze(-1)
    y = F.instance_norm(xc, weight=scale.to(dt), bias=b.to(dt), eps=epsilon)
    return y.reshape(x.shape).to(x.dtype)


def _stat_type(ctx: OpContext, i: int, stash: torch.dtype) -> torch.dtype:
    et = ctx.output_types[i] if len(ctx.output_types) > i else None
    return torch_dtype(et) if et else stash


@op("LayerNormalization", since=17, ctx=True)
def layer_normalization(x: torch.Tensor, scale: torch.Tensor, b: torch.Tensor | None = None, *, axis: int = -1,
                        epsilon: float = 1e-5, stash_type: int = 1, ctx: OpContext) -> Any:
    ax = norm_axis(axis, x.dim())
    shape = list(x.shape[ax:])
    dt = _stash(x, stash_type)
    dt = _cpu_half(x) if dt == x.dtype else dt
    if ctx.num_outputs == 1 and _native_half(x, scale, b):
        # CUDA/ROCm's kernel keeps half inputs' statistics and arithmetic in float32 and rounds once
        # (stash_type 1): the same values as the upcast below, without three casts in and one out
        return F.layer_norm(x, shape, scale.expand(shape), None if b is None else b.expand(shape), epsilon)
    w = scale.to(dt).expand(shape)
    bias = None if b is None else b.to(dt).expand(shape)
    if ctx.num_outputs == 1:
        return F.layer_norm(x.to(dt), shape, w, bias, epsilon).to(x.dtype)
    y, mean, rstd = torch.native_layer_norm(x.to(dt), shape, w, bias, epsilon)
    stat_shape = list(x.shape[:ax]) + [1] * len(shape)
    mean = mean.reshape(stat_shape).to(_stat_type(ctx, 1, dt))
    rstd = rstd.reshape(stat_shape).to(_stat_type(ctx, 2, dt))
    return (y.to(x.dtype), mean, rstd)[: ctx.num_outputs]


def _group_norm(x: torch.Tensor, num_groups: int, scale: torch.Tensor, b: torch.Tensor, epsilon: float,
                dt: torch.dtype) -> torch.Tensor:
    xc = x.to(dt)
    if x.dim() == 2:
        xc = xc.unsqueeze(-1)
    y = F.group_norm(xc, num_groups, scale.to(dt), b.to(dt), epsilon)
    return y.reshape(x.shape).to(x.dtype)


@op("GroupNormalization", since=18)
def group_normalization_18(x: torch.Tensor, scale: torch.Tensor, b: torch.Tensor, *, epsilon: float = 1e-5,
                           num_groups: int) -> torch.Tensor:
    per = x.shape[1] // num_groups  # opset 18: one scale / bias per group
    return _group_norm(x, num_groups, scale.repeat_interleave(per), b.repeat_interleave(per), epsilon,
                       _cpu_half(x))


@op("GroupNormalization", since=21)
def group_normalization(x: torch.Tensor, scale: torch.Tensor, b: torch.Tensor, *, epsilon: float = 1e-5,
                        num_groups: int, stash_type: int = 1) -> torch.Tensor:
    dt = _stash(x, stash_type)
    return _group_norm(x, num_groups, scale, b, epsilon, _cpu_half(x) if dt == x.dtype else dt)


@op("RMSNormalization", since=23)
def rms_normalization(x: torch.Tensor, scale: torch.Tensor, *, axis: int = -1, epsilon: float = 1e-5,
                      stash_type: int = 1) -> torch.Tensor:
    ax = norm_axis(axis, x.dim())
    dt = _stash(x, stash_type)
    xc = x.to(dt)
    dims = tuple(range(ax, x.dim()))
    inv = torch.rsqrt(xc.square().mean(dim=dims, keepdim=True) + epsilon)
    return (xc * inv).to(x.dtype).to(scale.dtype) * scale


@op("LRN", since=1)
def lrn(x: torch.Tensor, *, alpha: float = 1e-4, beta: float = 0.75, bias: float = 1.0, size: int) -> torch.Tensor:
    dt = _stash(x)
    xc = x.to(dt)
    nb, c = x.shape[:2]
    sq = xc.square().reshape(nb, 1, c, -1)
    # ONNX window: floor((size-1)/2) channels before, ceil((size-1)/2) after (torch's LRN is the reverse)
    sq = F.pad(sq, (0, 0, (size - 1) // 2, size // 2))
    avg = F.avg_pool2d(sq, (size, 1), stride=1).reshape(x.shape)
    return (xc / (bias + alpha * avg).pow(beta)).to(x.dtype)


@op("LpNormalization", since=1)
def lp_normalization(x: torch.Tensor, *, axis: int = -1, p: int = 2) -> torch.Tensor:
    if p not in (1, 2):
        raise ValueError(f"LpNormalization p must be 1 or 2, got {p}")
    if p == 2 and x.dim() and norm_axis(axis, x.dim()) == x.dim() - 1:  # Qwen3.5's query and key heads
        if 0 < x.shape[-1] <= 16384 and (kernels := gpu_kernels("gated_delta", x)) is not None:
            return kernels.lp_normalize(x)  # one launch
        if x.numel() and (cpu := cpu_kernels("cpu_gated_delta", x)) is not None:
            return cpu.lp_normalize(x)  # numba's one call
    dt = _stash(x)
    xc = x.to(dt)
    norm = torch.linalg.vector_norm(xc, ord=p, dim=norm_axis(axis, x.dim()), keepdim=True)
    norm = torch.where(norm == 0, torch.ones_like(norm), norm)  # an all-zero slice stays zero
    return (xc / norm).to(x.dtype)


@op("MeanVarianceNormalization", since=9)
def mean_variance_normalization(x: torch.Tensor, *, axes: list[int] | None = None) -> torch.Tensor:
    dims = tuple(norm_axes(axes if axes is not None else [0, 2, 3], x.dim()))
    dt = _stash(x)
    xc = x.to(dt)
    mean = xc.mean(dim=dims, keepdim=True)
    var = xc.square().mean(dim=dims, keepdim=True) - mean.square()
    return ((xc - mean) / (var.clamp(min=0).sqrt() + 1e-9)).to(x.dtype)
