"""Triton convolution: ONNX Conv without a vendor math library, beside its torch reference.

Implicit GEMM: the output's (batch, spatial) positions are the GEMM rows, a group's output
channels its columns, and (input channel, kernel tap) its reduction; input patches are gathered
straight from ``x`` (no im2col buffer), zero padding is a load mask. The kernel is 3-D; 1-D and
2-D convolutions are views of it with unit axes. Every tensor is read through its strides, so
NCHW and NHWC (channels-last) inputs and weights both work without copies; the output keeps the
input's memory format. Any stride, dilation and (asymmetric) padding; groups of any size, with
a direct kernel for depthwise-style groups of one input channel; bias, ReLU and a clamp (ReLU6)
fused into the epilogue; fp16 / bf16 / fp32 accumulating in fp32 (fp64 in fp64), TF32 for fp32 when allowed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from crossml.kernels._launch import cdiv, check_float, conv_tap, grouped_tile, prune_tiles, use_interpreter, want_tf32
from crossml.ops.conv import spatial_pads, torch_pad_arg

__all__ = ["conv", "conv_reference"]

#: the reduction walks (tap, channel block) instead of one flat index when a group has this many channels
_CHANNEL_LOOP_MIN = 32


@triton.jit
def _store_output(acc, b_ptr, y_ptr, oc, n, od, oh, ow, s_yn, s_yc, s_yd, s_yh, s_yw, mask, top,
                  HAS_BIAS: tl.constexpr, RELU: tl.constexpr, CLIP: tl.constexpr, ACC_DTYPE: tl.constexpr):
    """Both kernels' epilogue: + bias[oc], ReLU, min(., top) (CLIP), store the [rows, channels] tile at output
    rows (n, od, oh, ow)."""
    if HAS_BIAS:
        acc += tl.load(b_ptr + oc).to(ACC_DTYPE)[None, :]
    if RELU:
        acc = tl.maximum(acc, 0.0)
    if CLIP:
        acc = tl.minimum(acc, top)
    y_rows = y_ptr + n.to(tl.int64) * s_yn + od * s_yd + oh * s_yh + ow * s_yw
    tl.store(y_rows[:, None] + oc.to(tl.int64)[None, :] * s_yc, acc.to(y_ptr.dtype.element_ty), mask=mask)


def _conv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, C_G, D, H, W, OC_G, OD, OH, OW, KD, KH, KW, K_TOTAL,
                 sd, sh, sw, pd, ph, pw, dd, dh, dw,
                 s_xn, s_xc, s_xd, s_xh, s_xw, s_wo, s_wc, s_wd, s_wh, s_ww, s_yn, s_yc, s_yd, s_yh, s_yw, top,
                 HAS_BIAS: tl.constexpr, RELU: tl.constexpr, CLIP: tl.constexpr, CHANNEL_LOOP: tl.constexpr,
                 PRECISION: tl.constexpr,
                 DOT_IN_FP32: tl.constexpr, ACC_DTYPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """One (BLOCK_M positions, BLOCK_N output channels) tile of group ``program_id(1)``."""
    pid = tl.program_id(0)
    g = tl.program_id(1)
    pid_m, pid_n = grouped_tile(pid, M, OC_G, BLOCK_M, BLOCK_N, GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    rows = offs_m % M  # past-the-edge rows/columns re-read valid ones and are never stored
    ow = rows % OW
    oh = (rows // OW) % OH
    od = (rows // (OW * OH)) % OD
    n = rows // (OW * OH * OD)
    oc = g * OC_G + offs_n % OC_G
    d0 = od * sd - pd
    h0 = oh * sh - ph
    w0 = ow * sw - pw
    x_rows = x_ptr + n.to(tl.int64) * s_xn + (g * C_G).to(tl.int64) * s_xc
    w_cols = w_ptr + oc.to(tl.int64) * s_wo

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC_DTYPE)
    if CHANNEL_LOOP:
        # per kernel tap: bounds once, then contiguous blocks of channels
        for tap in range(0, KD * KH * KW):
            kd, kh, kw, di, hi, wi, inside = conv_tap(tap, KH, KW, d0, h0, w0, dd, dh, dw, D, H, W)
            a_rows = x_rows + di * s_xd + hi * s_xh + wi * s_xw
            b_cols = w_cols + kd * s_wd + kh * s_wh + kw * s_ww
            for c0 in range(0, C_G, BLOCK_K):
                cs = c0 + offs_k
                c_ok = cs < C_G
                a = tl.load(a_rows[:, None] + cs[None, :] * s_xc, mask=inside[:, None] & c_ok[None, :], other=0.0)
                b = tl.load(b_cols[None, :] + cs[:, None] * s_wc, mask=c_ok[:, None], other=0.0)
                if DOT_IN_FP32:
                    a = a.to(tl.float32)
                    b = b.to(tl.float32)
                acc = tl.dot(a, b, acc, input_precision=PRECISION, out_dtype=ACC_DTYPE)
    else:
        # few channels per group: one flat reduction index k = (tap, channel), channel fastest
        for k0 in range(0, K_TOTAL, BLOCK_K):
            ks = k0 + offs_k
            k_ok = ks < K_TOTAL
            c = ks % C_G
            tap = ks // C_G
            kw = tap % KW
            kh = (tap // KW) % KH
            kd = tap // (KW * KH)
            di = d0[:, None] + (kd * dd)[None, :]
            hi = h0[:, None] + (kh * dh)[None, :]
            wi = w0[:, None] + (kw * dw)[None, :]
            inside = (di >= 0) & (di < D) & (hi >= 0) & (hi < H) & (wi >= 0) & (wi < W) & k_ok[None, :]
            a = tl.load(x_rows[:, None] + c[None, :] * s_xc + di * s_xd + hi * s_xh + wi * s_xw, mask=inside,
                        other=0.0)
            b_off = c * s_wc + kd * s_wd + kh * s_wh + kw * s_ww
            b = tl.load(w_cols[None, :] + b_off[:, None], mask=k_ok[:, None], other=0.0)
            if DOT_IN_FP32:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc, input_precision=PRECISION, out_dtype=ACC_DTYPE)

    _store_output(acc, b_ptr, y_ptr, oc, n, od, oh, ow, s_yn, s_yc, s_yd, s_yh, s_yw,
                  (offs_m[:, None] < M) & (offs_n[None, :] < OC_G), top, HAS_BIAS, RELU, CLIP, ACC_DTYPE)


@triton.jit
def _depthwise_tap(tap, x_rows, x_cols, w_cols, c_ok, KH, KW, d0, h0, w0, dd, dh, dw, D, H, W,
                   s_xd, s_xh, s_xw, s_wd, s_wh, s_ww, ACC_DTYPE: tl.constexpr):
    """One kernel tap's products: inputs ``[BLOCK_M, BLOCK_C]`` times the tap's weight per channel."""
    kd, kh, kw, di, hi, wi, inside = conv_tap(tap, KH, KW, d0, h0, w0, dd, dh, dw, D, H, W)
    a_rows = x_rows + di * s_xd + hi * s_xh + wi * s_xw
    a = tl.load(a_rows[:, None] + x_cols[None, :], mask=inside[:, None] & c_ok[None, :], other=0.0)
    wv = tl.load(w_cols + kd * s_wd + kh * s_wh + kw * s_ww)
    return a.to(ACC_DTYPE) * wv.to(ACC_DTYPE)[None, :]


def _depthwise_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, OC, MULT, D, H, W, OD, OH, OW, KD, KH, KW,
                      sd, sh, sw, pd, ph, pw, dd, dh, dw,
                      s_xn, s_xc, s_xd, s_xh, s_xw, s_wo, s_wd, s_wh, s_ww, s_yn, s_yc, s_yd, s_yh, s_yw, top,
                      HAS_BIAS: tl.constexpr, RELU: tl.constexpr, CLIP: tl.constexpr, ACC_DTYPE: tl.constexpr,
                      UNROLL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr):
    """Groups of one input channel (output channel ``oc`` reads input channel ``oc // MULT``):
    no reduction over channels, so a direct multiply-accumulate over the taps (``UNROLL`` of them unrolled,
    or 0: a loop)."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    m_ok = offs_m < M
    c_ok = offs_c < OC
    rows = offs_m % M
    ow = rows % OW
    oh = (rows // OW) % OH
    od = (rows // (OW * OH)) % OD
    n = rows // (OW * OH * OD)
    oc = offs_c % OC
    ic = oc // MULT
    d0 = od * sd - pd
    h0 = oh * sh - ph
    w0 = ow * sw - pw
    x_rows = x_ptr + n.to(tl.int64) * s_xn
    x_cols = ic.to(tl.int64) * s_xc
    w_cols = w_ptr + oc.to(tl.int64) * s_wo
    acc = tl.zeros((BLOCK_M, BLOCK_C), dtype=ACC_DTYPE)
    if UNROLL > 0:  # every tap's load in flight at once, not one memory latency per tap
        for tap in tl.static_range(UNROLL):
            acc += _depthwise_tap(tap, x_rows, x_cols, w_cols, c_ok, KH, KW, d0, h0, w0, dd, dh, dw, D, H, W,
                                  s_xd, s_xh, s_xw, s_wd, s_wh, s_ww, ACC_DTYPE)
    else:
        for tap in range(0, KD * KH * KW):
            acc += _depthwise_tap(tap, x_rows, x_cols, w_cols, c_ok, KH, KW, d0, h0, w0, dd, dh, dw, D, H, W,
                                  s_xd, s_xh, s_xw, s_wd, s_wh, s_ww, ACC_DTYPE)
    _store_output(acc, b_ptr, y_ptr, oc, n, od, oh, ow, s_yn, s_yc, s_yd, s_yh, s_yw,
                  m_ok[:, None] & c_ok[None, :], top, HAS_BIAS, RELU, CLIP, ACC_DTYPE)


def _conv_configs() -> list[triton.Config]:
    shapes = [  # (BLOCK_M, BLOCK_N, BLOCK_K, stages, warps)
        (128, 128, 64, 3, 8), (128, 128, 32, 4, 4), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4),
        (64, 64, 32, 4, 4), (128, 32, 32, 4, 4), (64, 32, 32, 5, 2), (128, 16, 32, 4, 4),
    ]
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8}, num_stages=s, num_warps=w)
            for m, n, k, s, w in shapes]


def _depthwise_configs() -> list[triton.Config]:
    # (BLOCK_M, BLOCK_C, warps); the small tiles give batch-1 layers (e.g. 7x7x960) enough programs to fill a GPU
    shapes = [(64, 64, 4), (128, 32, 4), (32, 128, 4), (128, 64, 8), (256, 16, 4),
              (32, 32, 2), (16, 64, 2), (32, 64, 2), (16, 32, 1)]
    return [triton.Config({"BLOCK_M": m, "BLOCK_C": c}, num_warps=w) for m, c, w in shapes]


_conv_jit = triton.jit(_conv_kernel)
_conv_tuned = triton.autotune(configs=_conv_configs(), key=["M", "OC_G", "K_TOTAL", "CHANNEL_LOOP", "PRECISION"],
                              prune_configs_by={"early_config_prune": prune_tiles("M", "OC_G")})(_conv_jit)
#: depthwise kernels of at most this many taps (7x7) run with their tap loop unrolled
DEPTHWISE_UNROLL_MAX = 49
_depthwise_jit = triton.jit(_depthwise_kernel)
_depthwise_tuned = triton.autotune(configs=_depthwise_configs(), key=["M", "OC", "KD", "KH", "KW"])(_depthwise_jit)
#: the interpreter's tiles
_INTERP_TILE = {"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2}
_INTERP_DW_TILE = {"BLOCK_M": 32, "BLOCK_C": 16}


def _as_3d(t: torch.Tensor, n: int) -> torch.Tensor:
    """(N, C, *spatial) with 1 to 3 spatial axes as a (N, C, D, H, W) view."""
    for _ in range(3 - n):
        t = t.unsqueeze(2)
    return t


def _triple(v: Sequence[int], fill: int) -> list[int]:
    return [fill] * (3 - len(v)) + list(v)


def conv(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, *, strides: Sequence[int] | None = None,
         pads: Sequence[int] | None = None, dilations: Sequence[int] | None = None, group: int = 1,
         auto_pad: str = "NOTSET", relu: bool = False, clip_max: float | None = None, layout: str = "NCHW",
         allow_tf32: bool | None = None) -> torch.Tensor:
    """ONNX Conv (1 to 3 spatial axes) with the Triton kernels; ``relu`` fuses a ReLU, ``clip_max`` a clamp
    to that bound after it (ReLU6: ``relu=True, clip_max=6``).

    ``layout="NHWC"`` takes and returns channels-last tensors ``(N, *spatial, C)``; the weight is
    ONNX's ``(OC, C / group, *kernel)`` either way (any strides). With the default NCHW layout a
    channels-last *strided* input is read in place and gives a channels-last strided output.
    ``allow_tf32`` None follows ``torch.backends.cudnn.allow_tf32`` (set by the session from use_tf32).
    """
    check_float("Conv", x, w, *([b] if b is not None else []))
    if layout not in ("NCHW", "NHWC"):
        raise ValueError(f"Conv layout must be 'NCHW' or 'NHWC', got {layout!r}")
    if layout == "NHWC":
        y = conv(x.movedim(-1, 1), w, b, strides=strides, pads=pads, dilations=dilations, group=group,
                 auto_pad=auto_pad, relu=relu, clip_max=clip_max, allow_tf32=allow_tf32)
        return y.movedim(1, -1)
    n = x.dim() - 2
    if n not in (1, 2, 3):
        raise ValueError(f"Conv supports 1 to 3 spatial axes (rank 3 to 5 input), got input shape {tuple(x.shape)}")
    if w.dim() != x.dim():
        raise ValueError(f"Conv weight must have rank {x.dim()} like the input, got shape {tuple(w.shape)}")
    nb, c = x.shape[:2]
    oc, c_g = w.shape[:2]
    if group < 1 or c % group or oc % group or c_g * group != c:
        raise ValueError(f"Conv group={group} does not fit input channels {c} and weight shape {tuple(w.shape)} "
                         f"(expected weight (OC, C / group, ...) with OC divisible by group)")
    if b is not None and tuple(b.shape) != (oc,):
        raise ValueError(f"Conv bias must have shape ({oc},), got {tuple(b.shape)}")
    kernel = list(w.shape[2:])
    strides = list(strides) if strides else [1] * n
    dilations = list(dilations) if dilations else [1] * n
    begin, end = spatial_pads(list(x.shape[2:]), kernel, strides, dilations, list(pads) if pads else None, auto_pad)
    out = [(x.shape[2 + i] + begin[i] + end[i] - dilations[i] * (kernel[i] - 1) - 1) // strides[i] + 1
           for i in range(n)]
    if any(o <= 0 for o in out):
        raise ValueError(f"Conv output would be empty: input {tuple(x.shape)}, kernel {kernel}, strides {strides}, "
                         f"dilations {dilations}, pads {begin + end}")

    # output in the input's memory format: channels-last when the input's channels are its densest axis
    channels_last = c > 1 and x.stride(1) == 1
    if channels_last:
        y = torch.empty((nb, *out, oc), dtype=x.dtype, device=x.device).movedim(-1, 1)
    else:
        y = torch.empty((nb, oc, *out), dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        return y
    x5, w5, y5 = _as_3d(x, n), _as_3d(w, n), _as_3d(y, n)
    kd, kh, kw = _triple(kernel, 1)
    geometry = (*_triple(strides, 1), *_triple(begin, 0), *_triple(dilations, 1))
    m = y5.shape[0] * y5.shape[2] * y5.shape[3] * y5.shape[4]
    acc = tl.float64 if x.dtype == torch.float64 else tl.float32
    bias = b if b is not None else y
    top = 0.0 if clip_max is None else float(clip_max)
    interp = use_interpreter(x, "Conv")
    device_ctx = torch.cuda.device(x.device) if x.device.type == "cuda" else contextlib.nullcontext()
    if c_g == 1:
        args = (x5, w5, bias, y5, m, oc, oc // c, *x5.shape[2:], *y5.shape[2:], kd, kh, kw, *geometry,
                *x5.stride(), w5.stride(0), *w5.stride()[2:], *y5.stride(), top)
        taps = kd * kh * kw
        flags = {"HAS_BIAS": b is not None, "RELU": relu, "CLIP": clip_max is not None, "ACC_DTYPE": acc,
                 "UNROLL": taps if taps <= DEPTHWISE_UNROLL_MAX else 0}
        if interp:
            t = _INTERP_DW_TILE
            _depthwise_jit[(cdiv(m, t["BLOCK_M"]), cdiv(oc, t["BLOCK_C"]))](*args, **flags, **t)
            return y
        with device_ctx:
            _depthwise_tuned[lambda meta: (cdiv(m, meta["BLOCK_M"]), cdiv(oc, meta["BLOCK_C"]))](*args, **flags)
        return y

    oc_g = oc // group
    args = (x5, w5, bias, y5, m, c_g, *x5.shape[2:], oc_g, *y5.shape[2:], kd, kh, kw, c_g * kd * kh * kw,
            *geometry, *x5.stride(), *w5.stride(), *y5.stride(), top)
    tf32 = want_tf32(x, allow_tf32, torch.backends.cudnn.allow_tf32)
    flags = {"HAS_BIAS": b is not None, "RELU": relu, "CLIP": clip_max is not None,
             "CHANNEL_LOOP": c_g >= _CHANNEL_LOOP_MIN,
             "PRECISION": "tf32" if tf32 else "ieee", "ACC_DTYPE": acc}
    if interp:
        # numpy has no bfloat16 matmul: the interpreter multiplies bf16 tiles in fp32 (exact products)
        t = _INTERP_TILE
        grid = (cdiv(m, t["BLOCK_M"]) * cdiv(oc_g, t["BLOCK_N"]), group)
        _conv_jit[grid](*args, **flags, DOT_IN_FP32=x.dtype == torch.bfloat16, **t)
        return y
    with device_ctx:
        _conv_tuned[lambda meta: (cdiv(m, meta["BLOCK_M"]) * cdiv(oc_g, meta["BLOCK_N"]), group)](
            *args, **flags, DOT_IN_FP32=False)
    return y


def conv_reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, *,
                   strides: Sequence[int] | None = None, pads: Sequence[int] | None = None,
                   dilations: Sequence[int] | None = None, group: int = 1, auto_pad: str = "NOTSET",
                   relu: bool = False, clip_max: float | None = None, layout: str = "NCHW") -> torch.Tensor:
    """What ``conv`` computes, in torch: fp64 on the CPU, explicit padding, ``F.conv{1,2,3}d``."""
    if layout == "NHWC":
        x = x.movedim(-1, 1)
    n = x.dim() - 2
    x, w = x.double().cpu(), w.double().cpu()
    b = None if b is None else b.double().cpu()
    strides = list(strides) if strides else [1] * n
    dilations = list(dilations) if dilations else [1] * n
    begin, end = spatial_pads(list(x.shape[2:]), list(w.shape[2:]), strides, dilations,
                              list(pads) if pads else None, auto_pad)
    x = F.pad(x, torch_pad_arg(begin, end))
    y = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[n](x, w, b, stride=strides, dilation=dilations, groups=group)
    if relu:
        y = y.relu()
    if clip_max is not None:
        y = y.clamp_max(clip_max)
    return y.movedim(1, -1) if layout == "NHWC" else y
