"""Triton RMSNorm: ``SimplifiedLayerNormalization`` and ``SkipSimplifiedLayerNormalization`` in one
kernel launch each, beside their torch definitions in ``crossml.ops.contrib.norm``; the same kernel
centers the sum and adds beta for ``SkipLayerNormalization`` (``skip_layer_norm``).

One program per row of the ``[rows, hidden]`` view. The arithmetic follows the torch ops step by
step, in float32 whatever the storage types (fp16 / bf16 / fp32): ``s = x (+ skip) (+ bias)``,
``inv_std = rsqrt(mean(s * s) + eps)``, ``y = (s * inv_std) * weight`` cast to the output type,
so the results agree with the ops within an ulp of the output type (the sum of squares is
reduced in a different order than torch's, and the compiler may fuse ``mean + eps`` into an FMA).
The skip variant normalizes the float32 sum; the ``sum`` output is that sum cast to the input type.

A row up to ``_SINGLE_MAX`` elements is held in registers (one read of each input); longer rows
are walked twice in ``_LOOP_BLOCK`` chunks. The wrappers allocate with ``torch.empty`` and never
read a device value on the host, so they can be captured into a CUDA graph. Under
TRITON_INTERPRET=1 the kernels run in Triton's interpreter (see ``_launch``).
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from crossml.kernels._launch import next_power_of_2, pdl, pdl_wait, use_interpreter
from crossml.ops._util import broadcast_shapes

__all__ = ["DTYPES", "FOLDED_MAX", "LAYER_NORM_MAX", "folded_skip_rms_norm", "gather_rms_norm", "rms_norm",
           "skip_layer_norm", "skip_rms_norm"]

#: storage types the kernels take (statistics are float32 for all of them)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: longest row kept in registers whole (a power of two); longer rows loop over _LOOP_BLOCK chunks
_SINGLE_MAX = 16384
_LOOP_BLOCK = 4096
#: longest row skip_layer_norm takes (whole rows in registers)
LAYER_NORM_MAX = _SINGLE_MAX
#: longest row folded_skip_rms_norm takes (whole rows in registers)
FOLDED_MAX = _SINGLE_MAX


@triton.jit
def _cast(v, dst_ptr, BF16_RTNE: tl.constexpr):
    """float32 ``v`` in ``dst_ptr``'s element type, rounded to nearest even (compiled casts do that;
    Triton 3.6's interpreter truncates float32 -> bfloat16, so BF16_RTNE rounds on the bits there)."""
    if BF16_RTNE:
        u = v.to(tl.uint32, bitcast=True)
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        return tl.where(v != v, v.to(tl.bfloat16), u.to(tl.uint16).to(tl.bfloat16, bitcast=True))
    return v.to(dst_ptr.dtype.element_ty)


@triton.jit
def _row_sum(x_row, skip_row, b_ptr, offs, mask, HAS_SKIP: tl.constexpr, HAS_BIAS: tl.constexpr,
             GATHER: tl.constexpr = False, inside=None, s_h=1):
    """float32 ``x (+ skip) (+ bias)`` at ``offs`` of one row, added in that order (GATHER: x's elements ``s_h``
    apart, zeros unless ``inside``)."""
    if GATHER:
        s = tl.load(x_row + offs.to(tl.int64) * s_h, mask=mask & inside, other=0.0).to(tl.float32)
    else:
        s = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_SKIP:
        s = s + tl.load(skip_row + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        s = s + tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    return s


@triton.jit
def _rms_norm_kernel(x_ptr, skip_ptr, w_ptr, b_ptr, beta_ptr, y_ptr, inv_ptr, sum_ptr, H, S, s_skip_b, s_skip_s,
                     inv_n, eps, HAS_SKIP: tl.constexpr, HAS_BIAS: tl.constexpr, STORE_INV: tl.constexpr,
                     STORE_SUM: tl.constexpr, BLOCK: tl.constexpr, SINGLE: tl.constexpr, Y_RTNE: tl.constexpr,
                     SUM_RTNE: tl.constexpr, PDL: tl.constexpr = False, CENTER: tl.constexpr = False,
                     HAS_BETA: tl.constexpr = False, GATHER: tl.constexpr = False, idx_ptr=None, V=1, s_v=0, s_h=1):
    """Row ``program_id(0)`` = (b, s) of a [B, S, H] input: s = x (+ skip) (+ bias) in float32, then
    y = (s * rsqrt(mean(s * s) + eps)) * w. ``skip`` is read through (batch, sequence) strides, so a
    broadcast skip (stride 0) needs no copy. CENTER (LayerNorm; whole rows only, SINGLE): s - mean(s) in
    place of s, then + beta (HAS_BETA). GATHER: x is a [V, H] table of strides (``s_v``, ``s_h``) and the row's
    x is table row ``idx_ptr[row]`` (negative: counted from the end; outside [-V, V): a row of zeros, as the
    Gather kernel writes)."""
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    if GATHER:
        idx = tl.load(idx_ptr + row).to(tl.int64)
        idx = tl.where(idx < 0, idx + V, idx)
        inside = (idx >= 0) & (idx < V)
        x_row = x_ptr + tl.where(inside, idx, 0) * s_v
    else:
        inside = True
        x_row = x_ptr + row * H
    y_row = y_ptr + row * H
    sum_row = sum_ptr + row * H
    skip_row = skip_ptr + (row // S) * s_skip_b + (row % S) * s_skip_s
    cols = tl.arange(0, BLOCK)
    if SINGLE:
        mask = cols < H
        s = _row_sum(x_row, skip_row, b_ptr, cols, mask, HAS_SKIP, HAS_BIAS, GATHER, inside, s_h)
        if STORE_SUM:
            tl.store(sum_row + cols, _cast(s, sum_ptr, SUM_RTNE), mask=mask)
        if CENTER:
            s = tl.where(mask, s - tl.sum(s, axis=0) * inv_n, 0.0)
        inv = tl.math.rsqrt(tl.sum(s * s, axis=0) * inv_n + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        y = s * inv * w
        if HAS_BETA:
            y += tl.load(beta_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_row + cols, _cast(y, y_ptr, Y_RTNE), mask=mask)
    else:
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for c0 in range(0, H, BLOCK):
            mask = c0 + cols < H
            s = _row_sum(x_row, skip_row, b_ptr, c0 + cols, mask, HAS_SKIP, HAS_BIAS, GATHER, inside, s_h)
            if STORE_SUM:
                tl.store(sum_row + c0 + cols, _cast(s, sum_ptr, SUM_RTNE), mask=mask)
            acc += s * s
        inv = tl.math.rsqrt(tl.sum(acc, axis=0) * inv_n + eps)
        for c0 in range(0, H, BLOCK):  # the float32 sum again (the stored one is rounded to the input type)
            mask = c0 + cols < H
            s = _row_sum(x_row, skip_row, b_ptr, c0 + cols, mask, HAS_SKIP, HAS_BIAS, GATHER, inside, s_h)
            w = tl.load(w_ptr + c0 + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(y_row + c0 + cols, _cast(s * inv * w, y_ptr, Y_RTNE), mask=mask)
    if STORE_INV:
        tl.store(inv_ptr + row, inv)


@triton.jit
def _folded_skip_kernel(x_ptr, skip_ptr, w_ptr, b_ptr, kw_ptr, y_ptr, sum_ptr, H, inv_n, eps, k_eps, x_scale, k_scale,
                        HAS_BIAS: tl.constexpr, SKIP_NORM: tl.constexpr, X_SCALE: tl.constexpr,
                        K_SCALE: tl.constexpr, STORE_SUM: tl.constexpr, BLOCK: tl.constexpr, SINGLE: tl.constexpr,
                        Y_RTNE: tl.constexpr, SUM_RTNE: tl.constexpr, PDL: tl.constexpr = False):
    """Row ``program_id(0)`` of contiguous [rows, H] x and skip (whole rows: SINGLE, BLOCK >= H): the nodes
    ``folded_skip_rms_norm`` stands for, each intermediate rounded to x's type as its node's output is (a no-op for
    float32): k = RMSNorm(skip) * kw (SKIP_NORM), x * x_scale (X_SCALE), k * k_scale (K_SCALE), then s = x + k
    (+ bias) and y = (s * rsqrt(mean(s * s) + eps)) * w, in float32, as ``_rms_norm_kernel`` computes them; y rounded
    to x's type, then to y's (the Cast)."""
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    xv = tl.load(x_ptr + row * H + cols, mask=mask, other=0.0).to(tl.float32)
    k = tl.load(skip_ptr + row * H + cols, mask=mask, other=0.0).to(tl.float32)
    if SKIP_NORM:
        k_inv = tl.math.rsqrt(tl.sum(k * k, axis=0) * inv_n + k_eps)
        k = _cast(k * k_inv * tl.load(kw_ptr + cols, mask=mask, other=0.0).to(tl.float32), x_ptr,
                  SUM_RTNE).to(tl.float32)
    if X_SCALE:
        xv = _cast(xv * x_scale, x_ptr, SUM_RTNE).to(tl.float32)
    if K_SCALE:
        k = _cast(k * k_scale, x_ptr, SUM_RTNE).to(tl.float32)
    s = xv + k
    if HAS_BIAS:
        s = s + tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if STORE_SUM:
        tl.store(sum_ptr + row * H + cols, _cast(s, sum_ptr, SUM_RTNE), mask=mask)
    inv = tl.math.rsqrt(tl.sum(s * s, axis=0) * inv_n + eps)
    y = s * inv * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = _cast(y, x_ptr, SUM_RTNE).to(tl.float32)  # the norm's result of x's type, then the Cast's
    tl.store(y_ptr + row * H + cols, _cast(y, y_ptr, Y_RTNE), mask=mask)


def _tiling(H: int) -> tuple[int, bool, int]:
    """(BLOCK, whole row in one block, num_warps) for rows of H elements."""
    block = next_power_of_2(H)
    single = block <= _SINGLE_MAX
    if not single:
        block = _LOOP_BLOCK
    warps = 4 if block <= 2048 else 8 if block <= 8192 else 16
    return block, single, warps


def _check(what: str, x: torch.Tensor, *ts: torch.Tensor | None) -> int:
    """Hidden size of ``x``; every tensor a fp16/bf16/fp32 one on x's device, vectors of that size."""
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"{what}: input of shape {tuple(x.shape)} has no last axis to normalize")
    H = x.shape[-1]
    for t in (x, *ts):
        if t is None:
            continue
        if t.dtype not in DTYPES:
            raise TypeError(f"{what} Triton kernel takes float16/bfloat16/float32 tensors, got {t.dtype}; "
                            "use the registered op for other types")
        if t.device != x.device:
            raise ValueError(f"{what} inputs are on different devices: {x.device} and {t.device}")
    return H


def _vector(what: str, name: str, t: torch.Tensor, H: int) -> torch.Tensor:
    """``t`` (any shape of H elements along its last axis) as a contiguous [H] vector."""
    if t.dim() < 1 or t.shape[-1] != H or t.numel() != H:
        raise ValueError(f"{what}: {name} of shape {tuple(t.shape)} is not a vector of the hidden size {H}")
    return t.reshape(H).contiguous()


def _launch(kernel: triton.JITFunction, x: torch.Tensor, rows: int, H: int, args: tuple, flags: dict,
            what: str, *outs: torch.Tensor | None) -> None:
    """``kernel`` over ``rows`` programs; ``outs`` name the rounded outputs' flags (Y_RTNE, SUM_RTNE)."""
    block, single, warps = _tiling(H)
    if use_interpreter(x, what):
        rtne = {f"{n}_RTNE": t is not None and t.dtype == torch.bfloat16 for n, t in zip(("Y", "SUM"), outs)}
        kernel[(rows,)](*args, **flags, **rtne, BLOCK=block, SINGLE=single)
        return
    rtne = {f"{n}_RTNE": False for n, _ in zip(("Y", "SUM"), outs)}
    with torch.cuda.device(x.device) if x.device.type == "cuda" else contextlib.nullcontext():
        kernel[(rows,)](*args, **flags, **rtne, BLOCK=block, SINGLE=single, num_warps=warps, **pdl(x))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             out_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over the last axis of ``x`` (``SimplifiedLayerNormalization`` with axis -1, stash_type 1).

    Returns ``y`` (x's shape, ``out_dtype`` or else weight's dtype: the float32 result rounded once) and the float32
    inverse standard deviation of shape ``x.shape[:-1] + (1,)``. ``weight`` holds ``x.shape[-1]`` elements.
    """
    H = _check("RMSNorm", x, weight)
    w = _vector("RMSNorm", "weight", weight, H)
    xc = x.contiguous()
    y = torch.empty(x.shape, dtype=out_dtype or weight.dtype, device=x.device)
    inv = torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device)
    rows = xc.numel() // H
    if rows:  # the skip kernel with no skip, no bias and no sum output (their pointers are never read)
        args = (xc, xc, w, w, w, y, inv, y, H, 1, 0, 0, 1.0 / H, float(eps))
        flags = {"HAS_SKIP": False, "HAS_BIAS": False, "STORE_INV": True, "STORE_SUM": False}
        _launch(_rms_norm_kernel, xc, rows, H, args, flags, "RMSNorm", y, None)
    return y, inv


def gather_rms_norm(table: torch.Tensor, indices: torch.Tensor, weight: torch.Tensor, eps: float, *,
                    store_rows: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """RMSNorm of the rows of ``table`` [V, H] at ``indices`` (any shape, int32 / int64; negative ones counted
    from the end, ones outside [-V, V) give a row of zeros, as the Gather kernel): ONNX Gather (axis 0) then
    SimplifiedLayerNormalization (axis -1, stash_type 1) in one launch, one program per index.

    Returns ``y`` (``indices.shape + (H,)``, weight's dtype), the float32 inverse standard deviation
    (``indices.shape + (1,)``) and, with ``store_rows``, the gathered rows (table's dtype, bit for bit; else None).
    The table may have any strides: a tied model's embedding table is the transpose of its output projection's
    weight, whose rows are then read with a stride of the vocabulary size, as the Gather kernel reads them."""
    if table.dim() != 2:
        raise ValueError(f"GatherRMSNorm: the table must be 2-D, got shape {tuple(table.shape)}")
    if indices.dtype not in (torch.int32, torch.int64) or indices.device != table.device:
        raise ValueError(f"GatherRMSNorm: indices must be int32/int64 on {table.device}, got {indices.dtype} on "
                         f"{indices.device}")
    H = _check("GatherRMSNorm", table, weight)
    w = _vector("GatherRMSNorm", "weight", weight, H)
    idx = indices.contiguous()
    y = torch.empty((*indices.shape, H), dtype=weight.dtype, device=table.device)
    inv = torch.empty((*indices.shape, 1), dtype=torch.float32, device=table.device)
    rows_out = torch.empty((*indices.shape, H), dtype=table.dtype, device=table.device) if store_rows else None
    rows = idx.numel()
    if rows and H:
        args = (table, table, w, w, w, y, inv, rows_out if rows_out is not None else y, H, 1, 0, 0, 1.0 / H,
                float(eps))
        flags = {"HAS_SKIP": False, "HAS_BIAS": False, "STORE_INV": True, "STORE_SUM": store_rows, "GATHER": True,
                 "idx_ptr": idx, "V": table.shape[0], "s_v": table.stride(0), "s_h": table.stride(1)}
        _launch(_rms_norm_kernel, table, rows, H, args, flags, "GatherRMSNorm", y, rows_out)
    return y, inv, rows_out


def skip_rms_norm(x: torch.Tensor, skip: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  eps: float, *, store_inv: bool = True,
                  store_sum: bool = True) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """RMSNorm of ``x + skip (+ bias)`` over the last axis (``SkipSimplifiedLayerNormalization``).

    ``skip`` broadcasts to ``x`` (e.g. [H], [S, H] or [B, S, H] for a [B, S, H] input) and is read
    in place; ``weight`` and ``bias`` hold ``x.shape[-1]`` elements. Returns ``y`` (x's dtype), the
    float32 inverse standard deviation (shape ``x.shape[:-1] + (1,)``) and the residual sum cast to
    x's dtype; ``store_inv`` / ``store_sum`` False leave those out (None), writing nothing for them.
    """
    return _skip_norm("SkipRMSNorm", x, skip, weight, None, bias, eps, store_inv, store_sum)


def skip_layer_norm(x: torch.Tensor, skip: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor | None,
                    bias: torch.Tensor | None, eps: float, *, store_inv: bool = True,
                    store_sum: bool = True) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """LayerNorm of ``x + skip (+ bias)`` over the last axis, times ``gamma`` plus ``beta``
    (``SkipLayerNormalization``; rows of at most ``LAYER_NORM_MAX`` elements). Inputs and results as
    ``skip_rms_norm``'s; the statistics are float32 (the mean is not returned)."""
    if x.dim() and x.shape[-1] > LAYER_NORM_MAX:
        raise ValueError(f"SkipLayerNorm: the kernel normalizes rows of at most {LAYER_NORM_MAX} elements, got "
                         f"{x.shape[-1]}; use the registered op")
    return _skip_norm("SkipLayerNorm", x, skip, gamma, beta, bias, eps, store_inv, store_sum, center=True)


def _skip_norm(what: str, x: torch.Tensor, skip: torch.Tensor, weight: torch.Tensor, beta: torch.Tensor | None,
               bias: torch.Tensor | None, eps: float, store_inv: bool, store_sum: bool,
               center: bool = False) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    H = _check(what, x, skip, weight, beta, bias)
    w = _vector(what, "weight", weight, H)
    b = _vector(what, "bias", bias, H) if bias is not None else None
    bt = _vector(what, "beta", beta, H) if beta is not None else None
    try:
        grows = skip.dim() > x.dim() or broadcast_shapes(skip.shape, x.shape) != x.shape
    except RuntimeError:
        grows = True
    if grows:
        raise ValueError(f"{what}: skip of shape {tuple(skip.shape)} does not broadcast to input {tuple(x.shape)}")
    xc = x.contiguous()
    # skip viewed as [B, S, H] with x's shape: broadcast dims get stride 0, nothing is copied
    sk = skip.expand(x.shape)
    if sk.stride(-1) != 1:
        sk = sk.contiguous()
    if x.dim() == 1:
        S, s_b, s_s = 1, 0, 0
    elif x.dim() == 2:
        S, s_b, s_s = max(1, x.shape[0]), 0, sk.stride(0)
    else:
        sk = sk.reshape(-1, x.shape[-2], H)  # a view unless leading dims > 1 cannot merge
        S, s_b, s_s = max(1, x.shape[-2]), sk.stride(0), sk.stride(1)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    inv = torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device) if store_inv else None
    s = torch.empty(x.shape, dtype=x.dtype, device=x.device) if store_sum else None
    rows = xc.numel() // H
    if rows:
        args = (xc, sk, w, b if b is not None else w, bt if bt is not None else w, y,
                inv if inv is not None else y, s if s is not None else y, H, S, s_b, s_s, 1.0 / H, float(eps))
        flags = {"HAS_SKIP": True, "HAS_BIAS": b is not None, "STORE_INV": store_inv, "STORE_SUM": store_sum,
                 "CENTER": center, "HAS_BETA": bt is not None}
        _launch(_rms_norm_kernel, xc, rows, H, args, flags, what, y, s)
    return y, inv, s


def folded_skip_rms_norm(x: torch.Tensor, skip: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         eps: float, *, out_dtype: torch.dtype | None = None, x_scale: float | None = None,
                         skip_scale: float | None = None, skip_weight: torch.Tensor | None = None,
                         skip_eps: float = 1e-6, store_sum: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``SkipSimplifiedLayerNormalization(x * x_scale, RMSNorm(skip) * skip_weight * skip_scale, weight, bias)`` in
    one launch: com.crossml SkipSimplifiedLayerNormalization (graph rule FoldSkipNorm), the residual stream's norm
    with the nodes around it that a builder's Gemma export writes (the layer scalars' Muls on both inputs, the
    post-attention / post-feed-forward RMSNorm on the skip, the Cast of the result). Each of those nodes' results is
    rounded to x's type as the node stores it; the result ``y`` is ``out_dtype`` (x's type by default): the norm's
    result of x's type cast to it. ``skip`` has x's shape (no broadcasting); rows of at most FOLDED_MAX elements. Returns y and the residual
    sum (x's type; None without ``store_sum``)."""
    what = "FoldedSkipRMSNorm"
    H = _check(what, x, skip, weight, bias, skip_weight)
    if H > FOLDED_MAX:
        raise ValueError(f"{what}: the kernel normalizes rows of at most {FOLDED_MAX} elements, got {H}; use the "
                         "registered op")
    if skip.shape != x.shape:
        raise ValueError(f"{what}: skip of shape {tuple(skip.shape)} must have the input's shape {tuple(x.shape)}")
    w = _vector(what, "weight", weight, H)
    b = _vector(what, "bias", bias, H) if bias is not None else None
    kw = _vector(what, "skip weight", skip_weight, H) if skip_weight is not None else None
    xc, sk = x.contiguous(), skip.contiguous()
    y = torch.empty(x.shape, dtype=out_dtype or x.dtype, device=x.device)
    s = torch.empty(x.shape, dtype=x.dtype, device=x.device) if store_sum else None
    rows = xc.numel() // H
    if rows:
        args = (xc, sk, w, b if b is not None else w, kw if kw is not None else w, y, s if s is not None else y, H,
                1.0 / H, float(eps), float(skip_eps), float(x_scale or 1.0), float(skip_scale or 1.0))
        flags = {"HAS_BIAS": b is not None, "SKIP_NORM": kw is not None, "X_SCALE": x_scale is not None,
                 "K_SCALE": skip_scale is not None, "STORE_SUM": store_sum}
        # SUM_RTNE follows x's type (xc in the sum's place): the kernel rounds every intermediate to it
        _launch(_folded_skip_kernel, xc, rows, H, args, flags, what, y, xc)
    return y, s
