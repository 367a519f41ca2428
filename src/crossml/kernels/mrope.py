"""com.microsoft MRotaryEmbedding (multimodal RoPE: Qwen2.5-VL, Qwen3-VL and Qwen3.5's text decoders) as one Triton
launch. Its torch path (``crossml.ops.contrib.rotary.m_rotary_embedding``) is about eighteen kernels a call (the
three streams' cos/sin gathers and clamps, their concatenation or interleaving, the float32 casts, the rotation's
products and concatenations): in a Qwen3.5-0.8B decode step its twelve calls took about 200 µs.

Each program takes one token (b, s) and BLOCK_N of its heads: it reads the token's three positions, picks for each
rotary frequency j its stream (``mrope_layout`` 0: contiguous sections; 1: interleaved, height at j % 3 == 1 below
3 * section[1], width at j % 3 == 2 below 3 * section[2], temporal elsewhere), loads that stream's cos/sin entry
(the position clamped into the cache), and rotates the halves (or the interleaved pairs) in float32 with each
product rounded separately (no FMA contraction), as the torch path computes them, so the two agree bit for bit;
channels past ``rotary_embedding_dim`` are copied. Under TRITON_INTERPRET=1 the kernel runs in Triton's interpreter
(see ``_launch``).

``rotary`` runs com.microsoft RotaryEmbedding (one position stream: Gemma 4's global and local layers, Phi-2-style
partial rotary) on the same kernel, every frequency from stream 0 of a position tensor whose three streams are one
(stride 0): a Gemma-4-shaped decode step made about ten torch kernels a call of it, two calls a layer. With
``norm_weight`` each head is RMS-normalized first (Gemma 3/4's query and key norms, graph rule NormRotary): its
statistics in float32 over the head's channels, the normalized channels rounded to the output type as the norm node
stores them, then rotated.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from crossml.kernels._launch import cdiv, next_power_of_2, on_device, use_interpreter

__all__ = ["m_rotary", "rotary"]

#: longest head the kernel normalizes (its channels held in registers)
NORM_MAX_HEAD = 1024


@triton.jit
def _mrope_kernel(x_ptr, pos_ptr, cos_ptr, sin_ptr, y_ptr, S, N, H, HALF, ROT, MAX_POS, S0, S1, S2,
                  s_xb, s_xs, s_xn, s_xh, s_yb, s_ys, s_yn, s_yh, s_p0, s_pb, s_ps, s_c, s_s,
                  INTERLEAVED_LAYOUT: tl.constexpr, PAIRS: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_J: tl.constexpr, BLOCK_P: tl.constexpr, NORM: tl.constexpr = False, w_ptr=None, eps=0.0):
    row = tl.program_id(0)
    b = (row // S).to(tl.int64)
    s = (row % S).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    j = tl.arange(0, BLOCK_J)
    j_ok = j < HALF
    p = pos_ptr + b * s_pb + s * s_ps
    p0 = tl.load(p)
    p1 = tl.load(p + s_p0)
    p2 = tl.load(p + 2 * s_p0)
    if INTERLEAVED_LAYOUT:
        stream = tl.where((j % 3 == 1) & (j < 3 * S1), 1, tl.where((j % 3 == 2) & (j < 3 * S2), 2, 0))
    else:
        stream = tl.where(j < S0, 0, tl.where(j < S0 + S1, 1, 2))
    pos = tl.where(stream == 0, p0, tl.where(stream == 1, p1, p2)).to(tl.int64)
    pos = tl.minimum(tl.maximum(pos, 0), MAX_POS - 1)
    c = tl.load(cos_ptr + pos * s_c + j, mask=j_ok, other=0.0).to(tl.float32)[None, :]
    sn = tl.load(sin_ptr + pos * s_s + j, mask=j_ok, other=0.0).to(tl.float32)[None, :]
    if PAIRS:  # interleaved pairs (2j, 2j + 1)
        c1, c2 = 2 * j, 2 * j + 1
    else:  # halves (j, j + HALF)
        c1, c2 = j, j + HALF
    ok = n_ok[:, None] & j_ok[None, :]
    xb = x_ptr + b * s_xb + s * s_xs + n[:, None].to(tl.int64) * s_xn
    yb = y_ptr + b * s_yb + s * s_ys + n[:, None].to(tl.int64) * s_yn
    x1 = tl.load(xb + c1[None, :] * s_xh, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(xb + c2[None, :] * s_xh, mask=ok, other=0.0).to(tl.float32)
    out_ty = y_ptr.dtype.element_ty
    if BLOCK_P > 0:  # channels past the rotary ones
        q = ROT + tl.arange(0, BLOCK_P)
        q_ok = n_ok[:, None] & (q < H)[None, :]
        xp = tl.load(xb + q[None, :] * s_xh, mask=q_ok, other=0.0)
    if NORM:  # each head's RMSNorm first, rounded to the output type as the norm node stores it
        ss = tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)
        if BLOCK_P > 0:
            xpf = xp.to(tl.float32)
            ss += tl.sum(xpf * xpf, axis=1)
        inv = tl.math.rsqrt(ss / H + eps)[:, None]
        x1 = (x1 * inv * tl.load(w_ptr + c1, mask=j_ok, other=0.0).to(tl.float32)[None, :]).to(out_ty).to(tl.float32)
        x2 = (x2 * inv * tl.load(w_ptr + c2, mask=j_ok, other=0.0).to(tl.float32)[None, :]).to(out_ty).to(tl.float32)
        if BLOCK_P > 0:
            xp = xpf * inv * tl.load(w_ptr + q, mask=q < H, other=0.0).to(tl.float32)[None, :]
    tl.store(yb + c1[None, :] * s_yh, (x1 * c - x2 * sn).to(out_ty), mask=ok)
    tl.store(yb + c2[None, :] * s_yh, (x1 * sn + x2 * c).to(out_ty), mask=ok)
    if BLOCK_P > 0:  # pass through
        tl.store(yb + q[None, :] * s_yh, xp.to(out_ty), mask=q_ok)


def m_rotary(h: torch.Tensor, position_ids: torch.Tensor, cos_cache: torch.Tensor, sin_cache: torch.Tensor,
             out: torch.Tensor, section: list[int], layout: int, interleaved: bool, rot: int,
             norm_weight: torch.Tensor | None = None, norm_eps: float = 0.0) -> torch.Tensor:
    """Rotate ``h`` (a [B, S, N, H] view, any strides) into ``out`` (a [B, S, N, H] view of the result) with
    position_ids [3, B, S] and the caches [max_pos, >= rot / 2]; the caller has checked the shapes. ``norm_weight``
    (H values, contiguous): each head RMS-normalized (epsilon ``norm_eps``) with it first. Returns out."""
    B, S, N, H = h.shape
    half = rot // 2
    if B * S == 0 or N == 0:
        return out
    interpret = use_interpreter(h, "MRotaryEmbedding")
    block_n = min(next_power_of_2(N), 16)
    launch = on_device(h, interpret)
    with launch:
        _mrope_kernel[(B * S, cdiv(N, block_n))](
            h, position_ids, cos_cache, sin_cache, out, S, N, H, half, rot, cos_cache.shape[0], *section,
            *h.stride(), *out.stride(), *position_ids.stride(), cos_cache.stride(0), sin_cache.stride(0),
            INTERLEAVED_LAYOUT=layout == 1, PAIRS=interleaved, BLOCK_N=block_n, BLOCK_J=max(2, next_power_of_2(half)),
            BLOCK_P=next_power_of_2(H - rot) if H > rot else 0,
            **({"NORM": True, "w_ptr": norm_weight, "eps": float(norm_eps)} if norm_weight is not None else {}),
            **({} if interpret else {"num_warps": 4, "enable_fp_fusion": False}))
    return out


def rotary(h: torch.Tensor, positions: torch.Tensor, cos_cache: torch.Tensor, sin_cache: torch.Tensor,
           out: torch.Tensor, interleaved: bool, rot: int, norm_weight: torch.Tensor | None = None,
           norm_eps: float = 0.0) -> torch.Tensor:
    """RotaryEmbedding: rotate ``h`` (a [B, S, N, H] view) into ``out`` with integer ``positions`` [B, S] (any strides)
    and the caches [max_pos, >= rot / 2], as ``m_rotary`` with all frequencies from the one stream (and its
    ``norm_weight``). Returns out."""
    B, S = h.shape[0], h.shape[1]
    return m_rotary(h, positions.expand(B, S).unsqueeze(0).expand(3, B, S), cos_cache, sin_cache, out,
                    [rot // 2, 0, 0], 0, interleaved, rot, norm_weight, norm_eps)
