"""Quantization: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, QLinearMatMul,
QLinearConv, ConvInteger.

Scales and zero points are per tensor (a scalar), per axis (1-D along ``axis``) or blocked
(``block_size`` elements of ``axis`` share one value); :func:`expand_param` makes any of them
broadcastable to the input. The quantized type comes from the node's declared output type when
the engine knows it (int4 / uint4 / float4e2m1 are held in 8-bit torch dtypes, so the zero
point's dtype alone cannot tell int4 from int8), else from the zero point, ``output_dtype``, or
uint8. Integer results round half to even and saturate to the type's range.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from crossml import dtypes
from crossml.ops._util import norm_axis
from crossml.ops.cast import FLOAT4E2M1, FLOAT8, cast_to, fp4_to_float, input_type, output_type
from crossml.ops.conv import spatial_pads
from crossml.ops.matmul import int_matmul
from crossml.ops.registry import OpContext, op

TP = dtypes.TP

INT_RANGES = {
    TP.UINT8: (0, 255),
    TP.INT8: (-128, 127),
    TP.UINT16: (0, 65535),
    TP.INT16: (-32768, 32767),
    TP.UINT4: (0, 15),
    TP.INT4: (-8, 7),
}
if hasattr(TP, "INT2"):
    INT_RANGES.update({TP.UINT2: (0, 3), TP.INT2: (-2, 1)})


def expand_param(p: torch.Tensor | None, shape: tuple[int, ...], axis: int, block_size: int = 0) -> torch.Tensor | None:
    """A scale / zero point made broadcastable to ``shape`` (per tensor, per axis or blocked)."""
    if p is None or p.dim() == 0:
        return p
    if p.numel() == 1:
        return p.reshape(())
    rank = len(shape)
    axis = norm_axis(axis, rank)
    if not block_size:
        if p.dim() != 1 or p.shape[0] != shape[axis]:
            raise ValueError(f"a per-axis scale / zero point must be 1-D with {shape[axis]} elements "
                             f"(axis {axis} of input shape {tuple(shape)}), got shape {tuple(p.shape)}")
        dims = [1] * rank
        dims[axis] = p.shape[0]
        return p.reshape(dims)
    if block_size < 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    if p.dim() != rank:
        raise ValueError(f"a blocked scale / zero point needs the input's rank {rank}, got shape {tuple(p.shape)}")
    full = p.repeat_interleave(block_size, dim=axis)
    if full.shape[axis] < shape[axis]:
        raise ValueError(f"blocked scale of shape {tuple(p.shape)} with block_size {block_size} does not cover "
                         f"input shape {tuple(shape)} along axis {axis}")
    full = full.narrow(axis, 0, shape[axis])
    if tuple(full.shape) != tuple(shape):
        raise ValueError(f"blocked scale of shape {tuple(p.shape)} does not match input shape {tuple(shape)} "
                         f"outside axis {axis}")
    return full


def quantize_values(q: torch.Tensor, zp: torch.Tensor | None, to: int, saturate: int = 1) -> torch.Tensor:
    """Already-scaled values ``q`` (= x / scale) -> the quantized type ``to``, adding ``zp``."""
    if to in INT_RANGES:
        lo, hi = INT_RANGES[to]
        y = torch.round(q)
        y = y.to(torch.float64) if y.dtype != torch.float64 else y
        if zp is not None:
            y = y + zp.to(torch.float64)
        y = torch.clamp(y, lo, hi)
        return y.to(torch.int32).to(dtypes.torch_dtype(to))
    if to in FLOAT8:
        return cast_to(q, to, saturate=saturate)
    if to == FLOAT4E2M1:
        if zp is not None:
            q = q + fp4_to_float(zp, q.dtype)
        return cast_to(q, to)
    raise TypeError(f"QuantizeLinear cannot produce {dtypes.ort_type_name(to)}; expected an 8/16/4-bit "
                    "integer, float8 or float4e2m1 type")


def _quantized_type(ctx: OpContext | None, zp: torch.Tensor | None, output_dtype: int) -> int:
    declared = output_type(ctx, 0)
    if declared:
        return declared
    if zp is not None:
        return dtypes.TORCH_TO_ONNX[zp.dtype]
    return output_dtype or TP.UINT8


@op("QuantizeLinear", since=10, ctx=True)
@op("QuantizeLinear", since=13, ctx=True)
@op("QuantizeLinear", since=19, ctx=True)
@op("QuantizeLinear", since=21, ctx=True)
@op("QuantizeLinear", since=23, ctx=True)
@op("QuantizeLinear", since=24, ctx=True)
@op("QuantizeLinear", since=25, ctx=True)
def quantize_linear(x: torch.Tensor, y_scale: torch.Tensor, y_zero_point: torch.Tensor | None = None, *,
                    axis: int = 1, saturate: int = 1, block_size: int = 0, output_dtype: int = 0,
                    precision: int = 0, ctx: OpContext | None = None) -> torch.Tensor:
    to = _quantized_type(ctx, y_zero_point, output_dtype)
    shape = tuple(x.shape)
    scale = expand_param(y_scale, shape, axis, block_size)
    zp = expand_param(y_zero_point, shape, axis, block_size)
    if precision:
        p = dtypes.torch_dtype(precision)
        q = x.to(p) / scale.to(p)
    else:
        q = x / scale.to(x.dtype) if x.dtype != scale.dtype else x / scale
    return quantize_values(q, zp, to, saturate)


@op("DequantizeLinear", since=10, ctx=True)
@op("DequantizeLinear", since=13, ctx=True)
@op("DequantizeLinear", since=19, ctx=True)
@op("DequantizeLinear", since=21, ctx=True)
@op("DequantizeLinear", since=23, ctx=True)
@op("DequantizeLinear", since=24, ctx=True)
@op("DequantizeLinear", since=25, ctx=True)
def dequantize_linear(x: torch.Tensor, x_scale: torch.Tensor, x_zero_point: torch.Tensor | None = None, *,
                      axis: int = 1, block_size: int = 0, output_dtype: int = 0,
                      ctx: OpContext | None = None) -> torch.Tensor:
    shape = tuple(x.shape)
    compute = torch.float64 if x_scale.dtype == torch.float64 else torch.float32
    fp4 = input_type(ctx, 0) == FLOAT4E2M1
    dx = fp4_to_float(x, compute) if fp4 else x.to(compute)
    if x_zero_point is not None and not fp4 and x.dtype not in FLOAT8.values():
        dx = dx - expand_param(x_zero_point, shape, axis, block_size).to(compute)
    y = dx * expand_param(x_scale, shape, axis, block_size).to(compute)
    out = output_type(ctx, 0) or output_dtype
    target = dtypes.torch_dtype(out) if out else x_scale.dtype
    return y.to(target)


@op("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    f = x.to(torch.float32)
    zero = torch.zeros((), dtype=torch.float32, device=x.device)
    maxx = torch.maximum(zero, f.max()) if f.numel() else zero
    minx = torch.minimum(zero, f.min()) if f.numel() else zero
    span = torch.where(maxx == minx, torch.ones_like(maxx), maxx - minx)
    scale = span / 255.0
    zp = torch.round(torch.clamp(0.0 - minx / scale, 0.0, 255.0))
    y = torch.clamp(torch.round(f / scale) + zp, 0.0, 255.0)
    return y.to(torch.uint8), scale.to(x.dtype), zp.to(torch.uint8)


def _minus_zp(x: torch.Tensor, zp: torch.Tensor | None, per_row: bool = False) -> torch.Tensor:
    """``x - zp`` as int32; a 1-D zero point of A (``per_row``) has one value per row."""
    x32 = x.to(torch.int32)
    if zp is None:
        return x32
    z = zp.to(torch.int32)
    if per_row and z.dim() == 1 and z.numel() > 1:
        z = z.unsqueeze(-1)
    return x32 - z


def _requantize(acc: torch.Tensor, multiplier: torch.Tensor, y_zero_point: torch.Tensor | None,
                default: torch.dtype) -> torch.Tensor:
    """int32 accumulators * (scale_in / scale_out) + zp, rounded and saturated to the output type."""
    r = acc.to(torch.float64) * multiplier.to(torch.float64)
    dtype = y_zero_point.dtype if y_zero_point is not None else default
    if y_zero_point is not None:
        r = r + y_zero_point.to(torch.float64)
    if dtype in FLOAT8.values():
        return r.to(torch.float32).to(dtype)
    info = torch.iinfo(dtype)
    return torch.clamp(torch.round(r), info.min, info.max).to(dtype)


@op("QLinearMatMul", since=10)
@op("QLinearMatMul", since=21)
def qlinear_matmul(a: torch.Tensor, a_scale: torch.Tensor, a_zero_point: torch.Tensor | None, b: torch.Tensor,
                   b_scale: torch.Tensor, b_zero_point: torch.Tensor | None, y_scale: torch.Tensor,
                   y_zero_point: torch.Tensor | None) -> torch.Tensor:
    if a.dtype in FLOAT8.values():
        acc = torch.matmul(a.to(torch.float32), b.to(torch.float32))
    else:
        acc = int_matmul(_minus_zp(a, a_zero_point, per_row=True), _minus_zp(b, b_zero_point))
    sa = a_scale.unsqueeze(-1) if a_scale.dim() == 1 and a_scale.numel() > 1 else a_scale
    mult = sa.to(torch.float32) * b_scale.to(torch.float32) / y_scale.to(torch.float32)
    return _requantize(acc, mult, y_zero_point, a.dtype)


# --- integer convolution ---------------------------------------------------------------------


def conv_exact(x: torch.Tensor, w: torch.Tensor, *, auto_pad: str = "NOTSET", dilations: list[int] | None = None,
               group: int = 1, kernel_shape: list[int] | None = None, pads: list[int] | None = None,
               strides: list[int] | None = None) -> torch.Tensor:
    """ONNX Conv on integer-valued tensors, computed exactly in float64; returns int32."""
    nsp = x.dim() - 2
    if nsp < 1 or nsp > 3 or w.dim() != x.dim():
        raise ValueError(f"integer Conv needs X of rank 3..5 and W of the same rank, got shapes "
                         f"{tuple(x.shape)} and {tuple(w.shape)}")
    kernel = list(kernel_shape) if kernel_shape else list(w.shape[2:])
    strides = list(strides) if strides else [1] * nsp
    dilations = list(dilations) if dilations else [1] * nsp
    begin, end = spatial_pads(list(x.shape[2:]), kernel, strides, dilations, pads, auto_pad)
    p = begin + end
    xf = x.to(torch.float64)
    if any(p):
        flat = []
        for i in reversed(range(nsp)):
            flat += [p[i], p[i + nsp]]
        xf = F.pad(xf, flat)
    conv = (F.conv1d, F.conv2d, F.conv3d)[nsp - 1]
    y = conv(xf, w.to(torch.float64), stride=strides, dilation=dilations, groups=group)
    return y.to(torch.int32)


def _w_minus_zp(w: torch.Tensor, zp: torch.Tensor | None) -> torch.Tensor:
    w32 = w.to(torch.int32)
    if zp is None:
        return w32
    z = zp.to(torch.int32)
    if z.dim() == 1 and z.numel() > 1:  # per output channel
        z = z.reshape([-1] + [1] * (w.dim() - 1))
    return w32 - z.reshape(()) if z.numel() == 1 else w32 - z


@op("ConvInteger", since=10)
def conv_integer(x: torch.Tensor, w: torch.Tensor, x_zero_point: torch.Tensor | None = None,
                 w_zero_point: torch.Tensor | None = None, *, auto_pad: str = "NOTSET",
                 dilations: list[int] | None = None, group: int = 1, kernel_shape: list[int] | None = None,
                 pads: list[int] | None = None, strides: list[int] | None = None) -> torch.Tensor:
    xi = _minus_zp(x, x_zero_point.reshape(()) if x_zero_point is not None else None)
    return conv_exact(xi, _w_minus_zp(w, w_zero_point), auto_pad=auto_pad, dilations=dilations, group=group,
                      kernel_shape=kernel_shape, pads=pads, strides=strides)


@op("QLinearConv", since=10)
def qlinear_conv(x: torch.Tensor, x_scale: torch.Tensor, x_zero_point: torch.Tensor | None, w: torch.Tensor,
                 w_scale: torch.Tensor, w_zero_point: torch.Tensor | None, y_scale: torch.Tensor,
                 y_zero_point: torch.Tensor | None, bias: torch.Tensor | None = None, *, auto_pad: str = "NOTSET",
                 dilations: list[int] | None = None, group: int = 1, kernel_shape: list[int] | None = None,
                 pads: list[int] | None = None, strides: list[int] | None = None) -> torch.Tensor:
    xi = _minus_zp(x, x_zero_point.reshape(()) if x_zero_point is not None else None)
    acc = conv_exact(xi, _w_minus_zp(w, w_zero_point), auto_pad=auto_pad, dilations=dilations, group=group,
                     kernel_shape=kernel_shape, pads=pads, strides=strides)
    if bias is not None:
        acc = acc + bias.to(torch.int32).reshape([1, -1] + [1] * (x.dim() - 2))
    ws = w_scale.to(torch.float32)
    if ws.numel() > 1:
        ws = ws.reshape([1, -1] + [1] * (x.dim() - 2))
    mult = x_scale.to(torch.float32) * ws / y_scale.to(torch.float32)
    return _requantize(acc, mult, y_zero_point, x.dtype)
