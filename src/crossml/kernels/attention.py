"""Triton attention over whole sequences: ``softmax(scale · q @ kᵀ + mask) @ v`` in one launch (flash attention).

What com.crossml ScaledDotProductAttention (the MatMul-Softmax-MatMul rewrite of encoder models such as BERT)
runs for float32 tensors on GPUs: torch's fp32 path is the memory-efficient CUTLASS kernel in strict fp32,
~18 µs per BERT-base layer at batch 1; this kernel computes both products with TF32 tensor cores where the
session allows TF32 (onnxruntime's CUDA provider runs the unfused MatMuls in TF32 too), IEEE fp32 otherwise.

One program owns ``BLOCK_M`` query rows of one (batch, head) and walks the keys in ``BLOCK_N``-row chunks with
an online softmax in float32 (exp2 of log2e-scaled logits). Every operand is read through its strides: a
transposed K (``[.., D, S]``), broadcast batch or head axes and a broadcast additive or boolean mask
(``[B, 1, 1, S]``, ``[S, S]`` ...) need no copy. A row whose keys are all masked out gives NaN, as softmax of
only -inf does. ``attention_reference`` is the torch definition the tests compare against. Under
TRITON_INTERPRET=1 the kernel runs in Triton's interpreter (see ``_launch``).
"""

from __future__ import annotations

import contextlib
import math

import torch
import triton
import triton.language as tl

from crossml.kernels._launch import batch_grid, cdiv, check_float, next_power_of_2, use_interpreter, want_tf32

__all__ = ["MAX_HEAD_DIM", "attention", "attention_reference", "supported", "tf32_products"]

#: the largest head size the kernel holds in registers (query tile, accumulator)
MAX_HEAD_DIM = 256
_LOG2E = 1.4426950408889634


def _attention_kernel(q_ptr, k_ptr, v_ptr, m_ptr, o_ptr, SQ, SK, D, HEADS, BH,
                      s_qb, s_qh, s_qm, s_qd, s_kb, s_kh, s_kn, s_kd, s_vb, s_vh, s_vn, s_vd,
                      s_mb, s_mh, s_mm, s_mn, s_ob, s_oh, s_om, s_od, qk_scale,
                      HAS_MASK: tl.constexpr, BOOL_MASK: tl.constexpr, PRECISION: tl.constexpr,
                      DOT_IN_FP32: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Query rows ``[program_id(0) · BLOCK_M, +BLOCK_M)`` of (batch, head) ``program_id(1) + 65535 · program_id(2)``;
    ``qk_scale`` is the softmax scale times log2(e)."""
    bh = tl.program_id(1) + tl.program_id(2) * 65535  # _launch.GRID_YZ_MAX
    if bh < BH:
        b = (bh // HEADS).to(tl.int64)
        h = (bh % HEADS).to(tl.int64)
        offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        m_ok = offs_m < SQ
        d_ok = offs_d < D
        q = tl.load(q_ptr + b * s_qb + h * s_qh + offs_m[:, None] * s_qm + offs_d[None, :] * s_qd,
                    mask=m_ok[:, None] & d_ok[None, :], other=0.0)
        if DOT_IN_FP32:  # Triton's interpreter multiplies bfloat16 wrongly
            q = q.to(tl.float32)
        k_base = k_ptr + b * s_kb + h * s_kh + offs_d[:, None] * s_kd
        v_base = v_ptr + b * s_vb + h * s_vh + offs_d[None, :] * s_vd
        m_base = m_ptr + b * s_mb + h * s_mh + offs_m[:, None] * s_mm
        row_max = tl.full((BLOCK_M,), float("-inf"), tl.float32)
        row_sum = tl.zeros((BLOCK_M,), tl.float32)
        acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
        for n0 in range(0, SK, BLOCK_N):
            cols = n0 + offs_n
            n_ok = cols < SK
            k = tl.load(k_base + cols[None, :] * s_kn, mask=d_ok[:, None] & n_ok[None, :], other=0.0)
            if DOT_IN_FP32:
                k = k.to(tl.float32)
            s = tl.dot(q, k, input_precision=PRECISION) * qk_scale
            if HAS_MASK:
                mv = tl.load(m_base + cols[None, :] * s_mn, mask=m_ok[:, None] & n_ok[None, :], other=0)
                if BOOL_MASK:
                    s = tl.where(mv != 0, s, float("-inf"))
                else:
                    s += mv.to(tl.float32) * 1.4426950408889634  # _LOG2E
            s = tl.where(n_ok[None, :], s, float("-inf"))
            new_max = tl.maximum(row_max, tl.max(s, 1))
            # rows with every key so far masked keep a finite shift (their sum stays 0: NaN at the end)
            shift = tl.where(new_max == float("-inf"), 0.0, new_max)
            p = tl.math.exp2(s - shift[:, None])
            alpha = tl.math.exp2(row_max - shift)
            row_sum = row_sum * alpha + tl.sum(p, 1)
            v = tl.load(v_base + cols[:, None] * s_vn, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
            if DOT_IN_FP32:
                v = v.to(tl.float32)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            row_max = new_max
        out = acc / row_sum[:, None]
        tl.store(o_ptr + b * s_ob + h * s_oh + offs_m[:, None] * s_om + offs_d[None, :] * s_od,
                 out.to(o_ptr.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])


def _configs() -> list[triton.Config]:
    # (BLOCK_M, BLOCK_N, warps, stages); small query tiles give batch-1 encoders (12 heads x 128 rows) programs
    # enough to fill a GPU
    shapes = [(16, 64, 4, 2), (32, 64, 4, 2), (32, 32, 2, 2), (64, 64, 4, 2), (64, 32, 4, 3), (128, 64, 8, 2),
              (128, 32, 4, 2), (64, 128, 8, 2)]
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s) for m, n, w, s in shapes]


def _prune(configs: list[triton.Config], named_args: dict, **kwargs: object) -> list[triton.Config]:
    """Drop query / key tiles far larger than the sequences; a 256-wide head keeps the smaller tiles."""
    sq = max(16, next_power_of_2(int(named_args["SQ"])))
    sk = max(16, next_power_of_2(int(named_args["SK"])))
    big_d = int(kwargs["BLOCK_D"]) > 128  # (a launch keyword, not a positional argument)
    kept = [c for c in configs if c.kwargs["BLOCK_M"] <= sq and c.kwargs["BLOCK_N"] <= max(sk, 32)
            and not (big_d and c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] > 64 * 64)]
    return kept or [configs[0]]


_jit = triton.jit(_attention_kernel)
_tuned = triton.autotune(configs=_configs(), key=["SQ", "SK", "BH", "BLOCK_D", "PRECISION", "HAS_MASK"],
                         prune_configs_by={"early_config_prune": _prune})(_jit)
#: the interpreter's tile
_INTERP_TILE = {"BLOCK_M": 16, "BLOCK_N": 16}


def supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """Whether ``attention`` takes these operands: float tensors of one dtype and rank >= 2 whose batch axes
    broadcast to q's, one key length, a head size of at most MAX_HEAD_DIM, v's head size equal to q's, and a
    mask (float or bool) broadcastable to ``[..., SQ, SK]``."""
    if q.dim() < 2 or k.dim() < 2 or v.dim() < 2 or q.dim() > 4:
        return False
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return False
    sq, d = q.shape[-2:]
    sk = k.shape[-2]
    if k.shape[-1] != d or v.shape[-2] != sk or v.shape[-1] != d or d > MAX_HEAD_DIM or d == 0:
        return False
    try:
        batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        if tuple(batch) != tuple(q.shape[:-2]):
            return False
        if mask is not None:
            if mask.dtype != torch.bool and not mask.is_floating_point():
                return False
            if tuple(torch.broadcast_shapes(mask.shape, (*q.shape[:-1], sk))) != (*q.shape[:-1], sk):
                return False
    except RuntimeError:
        return False
    return True


def tf32_products(q: torch.Tensor, allow_tf32: bool | None = None) -> bool:
    """Whether ``attention`` multiplies float32 ``q`` with TF32 tensor cores (``allow_tf32`` None: torch's
    ``backends.cuda.matmul.allow_tf32``). In strict fp32 the kernel is faster than torch's at batch 1 (11.0 vs
    17.6 µs per BERT-base layer on an H200) but slower at batch 32 (159 vs 67), so the op only calls it with TF32."""
    return want_tf32(q, allow_tf32, torch.backends.cuda.matmul.allow_tf32)


def _as_4d(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """``t`` broadcast (stride-0 views, no copy) to ``shape`` and viewed as ``[B, H, rows, cols]``."""
    t = t.expand(shape)
    while t.dim() < 4:
        t = t.unsqueeze(0)
    return t


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, *,
              scale: float | None = None, allow_tf32: bool | None = None) -> torch.Tensor:
    """``softmax(scale · q @ kᵀ + mask) @ v`` for q ``[..., SQ, D]``, k and v ``[..., SK, D]`` (batch axes
    broadcast to q's); ``mask`` float (added) or bool (False masks out), broadcastable to ``[..., SQ, SK]``;
    ``scale`` None is 1/sqrt(D). Returns q's shape and dtype, contiguous. fp32 products use TF32 when
    ``allow_tf32`` (None: ``torch.backends.cuda.matmul.allow_tf32``, which the session sets from use_tf32)."""
    check_float("Attention", q, k, v)
    if not supported(q, k, v, mask):
        raise ValueError(f"Attention kernel: unsupported operands q {tuple(q.shape)} {q.dtype}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}, mask {None if mask is None else (tuple(mask.shape), mask.dtype)}; "
                         f"head size at most {MAX_HEAD_DIM}, batch axes broadcasting to q's, a float or bool mask")
    sq, d = q.shape[-2:]
    sk = k.shape[-2]
    batch = tuple(q.shape[:-2])
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if out.numel() == 0:
        return out
    if sk == 0:
        return out.fill_(float("nan"))
    q4, o4 = _as_4d(q, q.shape), _as_4d(out, out.shape)
    k4, v4 = _as_4d(k, (*batch, sk, d)), _as_4d(v, (*batch, sk, d))
    m4 = _as_4d(mask, (*batch, sq, sk)) if mask is not None else None
    bool_mask = m4 is not None and m4.dtype == torch.bool
    if bool_mask:
        m4 = m4.view(torch.uint8)
    heads = q4.shape[1]
    bh = q4.shape[0] * heads
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    precision = "tf32" if want_tf32(q, allow_tf32, torch.backends.cuda.matmul.allow_tf32) else "ieee"
    args = (q4, k4, v4, m4 if m4 is not None else q4, o4, sq, sk, d, heads, bh,
            *q4.stride(), *k4.stride(), *v4.stride(), *(m4.stride() if m4 is not None else (0, 0, 0, 0)),
            *o4.stride(), scale * _LOG2E)
    flags = {"HAS_MASK": m4 is not None, "BOOL_MASK": bool_mask, "PRECISION": precision,
             "BLOCK_D": max(16, next_power_of_2(d))}
    grid_bh = batch_grid(bh)
    if use_interpreter(q, "Attention"):
        t = _INTERP_TILE
        _jit[(cdiv(sq, t["BLOCK_M"]), *grid_bh)](*args, **flags, DOT_IN_FP32=q.dtype == torch.bfloat16, **t)
        return out
    device_ctx = torch.cuda.device(q.device) if q.device.type == "cuda" else contextlib.nullcontext()
    with device_ctx:
        _tuned[lambda meta: (cdiv(sq, meta["BLOCK_M"]), *grid_bh)](*args, **flags, DOT_IN_FP32=False)
    return out


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, *,
                        scale: float | None = None) -> torch.Tensor:
    """The definition, in float64: softmax(scale · q @ kᵀ + mask) @ v (a bool mask's False entries are -inf)."""
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.double()
    return (torch.softmax(s, -1) @ v.double()).to(q.dtype)
