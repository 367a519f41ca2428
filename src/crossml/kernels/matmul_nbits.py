"""Triton kernels for com.microsoft MatMulNBits with 4-bit weights: a GEMV at decode sizes (few rows
of A), and a one-pass dequantization for the prompt sizes (many rows), which multiply a dense matrix.

``y[M, N] = A[M, K] @ dequant(B)^T (+ bias)`` reading the packed weight once, without a dense
dequantized copy. The layout is the op's (see ``crossml.ops.contrib.matmul_nbits``): B is uint8
``[N, n_blocks, block_size / 2]``, two 4-bit values per byte, low nibble first; one scale per
(row, block), ``scales`` of shape ``[N * n_blocks]`` or ``[N, n_blocks]``; zero points either
packed uint8 (two per byte, low nibble first, ``ceil(n_blocks / 2)`` bytes per row), floats (one
per block), or absent (8). K need not be a multiple of block_size: B's padding past K is ignored.

Each program owns BLOCK_N output columns (weight rows) and walks K in chunks of BLOCK_K =
G * block_size: it loads a ``[BLOCK_N, G, block_size / 2]`` tile of packed bytes (each row's
bytes contiguous), and per row m of A accumulates in float32, block by block,
``scale * (sum_k q * a - zero_point * sum_k a)``. Scales, float zero points and bias are first
rounded to A's dtype, as the op's dequantization in A's dtype does.

With fp16 activations on NVIDIA GPUs that per-nibble float32 arithmetic (shift, mask, conversion, product:
about four instructions a weight) bound the kernel, not memory: Llama-3.2-1B's lm_head read 1.7 TB/s. The
fp16-pair kernel (``_matmul_nbits_f16x2_kernel``) turns two nibbles into an fp16 pair with one lop3, multiplies
in fp16 pairs and sums each word pair's sixteen products into float32 (``_PAIR_DOT_PTX``); ``pick_pair_tiles``
says where it pays (results/gemv_int4.md: that lm_head 84.5 -> 46.5 us, 2.8 TB/s). The grid has no host syncs and
the output is allocated with ``torch.empty``, so a call is safe inside CUDA graph capture; tiles
are picked by a fixed rule (no autotuning, which would time kernels during capture).

Batched decode and beam search (4 to 64 rows of fp16 / bf16 activations; 2 to 16 rows of fp16 on NVIDIA GPUs take the
Gluon kernel of ``crossml.kernels.nbits_mma`` first, ``mma_eligible``) take the matrix-unit kernel
(``_matmul_nbits_dot_kernel``): each program dequantizes a 64-row weight tile per K step in registers, in A's dtype (a
nibble or-ed under the exponent of 1024 in fp16, 128 in bf16, so q - zero point is one exact subtraction and the
scale one rounded product: bit for bit ``dequantize``; for fp16 in PTX fp16 pairs, ``_NIBBLE_DQ_PTX``), and
multiplies a 16-row (64-row) tile of A with it by ``tl.dot`` (16-row tiles in two dots, the low nibbles' weights with
the even K positions and the high with the odd, so no weight is interleaved in registers), K split where the weight
tiles are few. The per-row GEMVs' arithmetic grows with the rows: at 16 rows Llama-3.2-1B's gate+up took 84.6 us
against 19.9 (H200, results/int4_batch.md, results/int4_batch_variants2.md), and the GenAI benchmark's int4 decode
went from 2,574 to 13,658 tokens/s at a batch of 16 with the kernel's first version (results/genai_batch.md).

Where K is a multiple of the K step (every decode shape of the benchmarks) the kernel takes no per-position masks:
a step's bytes and activations load whole, in vectors. The masked loads of a K that ends inside a step
(``EVEN_K`` off) cost a select per weight.

Gating an MLP's down projection as its activations are loaded (SiluMul folded into the product, as the fp16
GEMV does) gave bit-identical results but slower int4 decode replays on an H200: Qwen2.5-0.5B 0.486 -> 0.636 ms,
Llama-3.2-1B 0.508 -> 0.553-0.559 ms (alternating with the unfused step in one call). Every N slice recomputes the
sigmoid of all of K, in kernels already bound by their arithmetic, so the SiluMul keeps its launch. Gating in the
merged gate/up product instead (each program holding the g and up rows of its outputs and storing SiluMul of them,
bit-identical at both models' shapes) was faster alone but not in the decode step, and was dropped. In CUDA graphs
of calls on distinct weights, product then SiluMul kernel took 6.93 us (Qwen2.5-0.5B, norm fused) and 9.57 us
(Llama-3.2-1B); the gated product took 5.73 and 7.90 us with each program's g rows first, 4.91 and 7.92 with g and
up rows in pairs. Yet the int4 decode replays (alternating with the unfused step in one call) went from 0.488 to
0.495-0.498 ms (Qwen) with either order, and from 0.508 to 0.499-0.501 ms (Llama) with g rows first but to 0.516
with pairs: the step's time moved with how the next launches overlap, not with the kernel's own.
"""

from __future__ import annotations

import contextlib
import math
import os

import torch
import triton
import triton.language as tl

from crossml.kernels._launch import (
    GRID_YZ_MAX,
    cdiv,
    dot_acc,
    gluon_kernels,
    next_power_of_2,
    nvidia_sm80,
    pdl,
    pdl_wait,
    product_output,
    rule_processors,
    store_tile,
    use_interpreter,
)

__all__ = ["DOT_MAX_M", "DOT_MIN_M", "MMA_MAX_M", "MMA_MIN_M", "dequantize", "dot_eligible", "fp16_pairs", "gather_rows",
           "matmul_nbits", "mma_eligible", "pick_dot_tiles", "pick_pair_tiles", "pick_tiles"]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: largest M one program handles (rows beyond it are more programs along grid dimension 1)
MAX_BLOCK_M = 16
#: weight values one program holds per K step (BLOCK_N * BLOCK_K): 16 packed bytes per thread at 4 warps
_TILE_ELEMS = 4096
#: zero-point modes (constexpr ZP)
_ZP_NONE, _ZP_PACKED, _ZP_FLOAT = 0, 1, 2


@triton.jit
def _scales_zero_points(s_ptr, z_ptr, y_ptr, n2, blk, ok, N_BLOCKS, s_zn, ZP: tl.constexpr):
    """float32 scales and zero points of weight rows ``n2`` [R, 1] and quantization blocks ``blk`` [1, G] (both
    [R, G]; 0 where not ``ok``): scales and float zero points rounded to y's dtype first, packed zero points
    unpacked (low nibble first), 8 without zero points."""
    out_ty = y_ptr.dtype.element_ty
    scale = tl.load(s_ptr + n2 * N_BLOCKS + blk, mask=ok, other=0.0).to(out_ty).to(tl.float32)
    if ZP == 0:
        zp = tl.full(scale.shape, 8.0, tl.float32)
    elif ZP == 1:
        zb = tl.load(z_ptr + n2 * s_zn + blk // 2, mask=ok, other=0).to(tl.int32)
        zp = ((zb >> ((blk % 2) * 4)) & 0xF).to(tl.float32)
    else:
        zp = tl.load(z_ptr + n2 * N_BLOCKS + blk, mask=ok, other=0.0).to(out_ty).to(tl.float32)
    return scale, zp


@triton.jit
def _weight_step(w_ptr, s_ptr, z_ptr, y_ptr, n2, w_idx, g2, k, ROW_WORDS, N_BLOCKS, s_zn, BS: tl.constexpr,
                 ZP: tl.constexpr):
    """Packed words [BLOCK_N, WORDS], scales and zero points [BLOCK_N, G] of weight rows ``n2`` for the K step
    that starts at ``k`` (zeros past the row's end)."""
    word = k // 8
    words = tl.load(w_ptr + n2 * ROW_WORDS + word + w_idx, mask=word + w_idx < ROW_WORDS, other=0)
    blk = k // BS + g2
    scale, zp = _scales_zero_points(s_ptr, z_ptr, y_ptr, n2, blk, blk < N_BLOCKS, N_BLOCKS, s_zn, ZP)
    return words, scale, zp


@triton.jit
def _matmul_nbits_kernel(a_ptr, w_ptr, s_ptr, z_ptr, bias_ptr, y_ptr, skip_ptr, gamma_ptr, sum_ptr,
                         M, N, K, N_BLOCKS, ROW_WORDS, s_am, s_zn, s_ym, s_skm, s_sum, inv_k, eps,
                         BS: tl.constexpr, ZP: tl.constexpr, HAS_BIAS: tl.constexpr, NORM: tl.constexpr,
                         STORE_SUM: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, CONST_W: tl.constexpr = False,
                         PDL: tl.constexpr = False):
    """Columns [pid0 * BLOCK_N, +BLOCK_N) of rows [pid1 * BLOCK_M, +BLOCK_M) of y.

    The packed weight is read as int32 words (8 nibbles, K order: low nibble of the lowest byte
    first), a row's BLOCK_K / 8 words per K step in one contiguous run; activations are read
    contiguously and the tile is viewed as [BLOCK_N, quantization blocks, block_size].

    NORM (see ``matmul_nbits``'s ``norm``): 1 multiplies RMSNorm(a) * gamma, 2 RMSNorm(a + skip) *
    gamma (STORE_SUM: programs of the first column tile also store a + skip to ``sum_ptr``). Every
    program walks all of K, so it sums the squares as it goes and scales its float32 sums by
    rsqrt(mean + eps) at the end (the product is linear in the activations)."""
    G: tl.constexpr = BLOCK_K // BS  # quantization blocks per K step
    WORDS: tl.constexpr = BLOCK_K // 8
    pid_n = tl.program_id(0)
    m0 = tl.program_id(1).to(tl.int64) * BLOCK_M

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # columns past N re-read the last row (never stored): no load mask along N
    n2 = tl.minimum(offs_n, N - 1).to(tl.int64)[:, None]  # [BLOCK_N, 1]
    w_idx = tl.arange(0, WORDS)[None, :]  # [1, WORDS]
    shifts = (tl.arange(0, 8) * 4)[None, None, :]  # [1, 1, 8]
    kk = tl.arange(0, BLOCK_K)
    g2 = tl.arange(0, G)[None, :]  # [1, G]
    m_idx = tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    squares = tl.zeros((BLOCK_M,), dtype=tl.float32)

    # the next K step's words, scales and zero points are requested one step ahead of their use; the
    # first step's before the wait for the previous kernel when they are constants (CONST_W)
    if not CONST_W:
        pdl_wait(PDL)
    words, scale, zp = _weight_step(w_ptr, s_ptr, z_ptr, y_ptr, n2, w_idx, g2, 0, ROW_WORDS, N_BLOCKS, s_zn, BS, ZP)
    if CONST_W:
        pdl_wait(PDL)
    for k0 in range(0, K, BLOCK_K):
        words_k, scale_k, zp_k = words, scale, zp
        words, scale, zp = _weight_step(w_ptr, s_ptr, z_ptr, y_ptr, n2, w_idx, g2, k0 + BLOCK_K, ROW_WORDS, N_BLOCKS,
                                        s_zn, BS, ZP)
        q = (words_k[:, :, None] >> shifts) & 0xF  # [BLOCK_N, WORDS, 8]
        # nibble -> float without an int-to-float conversion (a quarter-rate instruction on NVIDIA
        # GPUs): or-ing q into the mantissa of 2**23 gives the float 2**23 + q exactly
        qf = (q | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
        q3 = tl.reshape(qf, (BLOCK_N, G, BS))
        k_ok = k0 + kk < K
        if NORM > 0:
            gam = tl.load(gamma_ptr + k0 + kk, mask=k_ok, other=0.0).to(tl.float32)
        for mi in tl.static_range(BLOCK_M):
            m_ok = m0 + mi < M
            av = tl.load(a_ptr + (m0 + mi) * s_am + k0 + kk, mask=k_ok & m_ok, other=0.0).to(tl.float32)
            if NORM == 2:
                av += tl.load(skip_ptr + (m0 + mi) * s_skm + k0 + kk, mask=k_ok & m_ok, other=0.0).to(tl.float32)
                if STORE_SUM:
                    tl.store(sum_ptr + (m0 + mi) * s_sum + k0 + kk, av.to(sum_ptr.dtype.element_ty),
                             mask=k_ok & m_ok & (pid_n == 0))
            if NORM > 0:
                squares = tl.where(m_idx == mi, squares + tl.sum(av * av, axis=0), squares)
                av = av * gam
            a3 = tl.reshape(av, (1, G, BS))
            dot = tl.sum(q3 * a3, axis=2)  # [BLOCK_N, G]
            a_sum = tl.sum(a3, axis=2)  # [1, G]
            part = tl.sum(scale_k * (dot - zp_k * a_sum), axis=1)  # [BLOCK_N]
            acc = tl.where(m_idx[:, None] == mi, acc + part[None, :], acc)

    if NORM > 0:
        acc = acc * tl.math.rsqrt(squares * inv_k + eps)[:, None]
    store_tile(acc, bias_ptr, y_ptr, offs_n, m0 + m_idx, M, N, s_ym, HAS_BIAS)


def _nibble_pairs_ptx(word: str) -> str:
    """PTX leaving in t0..t3 the fp16 pairs (q_j, q_j+4), j = 0..3, of the int32 word of nibbles ``word``."""
    return f"""lop3.b32 t0, {word}, 0x000F000F, m, 0xEA;
lop3.b32 t1, {word}, 0x00F000F0, m, 0xEA;
shr.u32 x, {word}, 8;
lop3.b32 t2, x, 0x000F000F, m, 0xEA;
lop3.b32 t3, x, 0x00F000F0, m, 0xEA;
sub.f16x2 t0, t0, m;
fma.rn.f16x2 t1, t1, s, c;
sub.f16x2 t2, t2, m;
fma.rn.f16x2 t3, t3, s, c;
"""


#: PTX: the 16 products of two int32 words of nibbles ($1, $2) with their activations, packed as fp16 pairs
#: ($3..$6 for $1, $7..$10 for $2; pair j holds the activations of nibbles j and j + 4), summed into one float32
#: ($0). A lop3 puts two nibbles under the exponent of 1024 in each fp16 half (0x6400 | q), a subtraction or
#: a multiply-add by 1/16 takes the 1024 (or the 1024 and the x16 of an upper nibble) back out, leaving q
#: exactly; the products accumulate in fp16 pairs, eight per half, then go to float32. Eight weights cost about
#: a dozen instructions, against four per weight in the float32 path (the shift, mask, conversion and product
#: that made the 4-bit GEMV bound by arithmetic rather than by memory).
_PAIR_DOT_PTX = ("""
{
.reg .b32 m, s, c, x, t0, t1, t2, t3, acc;
.reg .b16 lo, hi;
.reg .f32 fl, fh;
mov.b32 m, 0x64006400;
mov.b32 s, 0x2C002C00;
mov.b32 c, 0xD400D400;
""" + _nibble_pairs_ptx("$1") + """mul.f16x2 acc, t0, $3;
fma.rn.f16x2 acc, t1, $4, acc;
fma.rn.f16x2 acc, t2, $5, acc;
fma.rn.f16x2 acc, t3, $6, acc;
""" + _nibble_pairs_ptx("$2") + """fma.rn.f16x2 acc, t0, $7, acc;
fma.rn.f16x2 acc, t1, $8, acc;
fma.rn.f16x2 acc, t2, $9, acc;
fma.rn.f16x2 acc, t3, $10, acc;
mov.b32 {lo, hi}, acc;
cvt.f32.f16 fl, lo;
cvt.f32.f16 fh, hi;
add.f32 $0, fl, fh;
}
""")
_PAIR_DOT_PTX_C = tl.constexpr(_PAIR_DOT_PTX)
#: activations above this magnitude scale a K step down by a power of two first: a half's sum of eight products
#: of nibbles (<= 15) stays within fp16 (8 * 15 * 512 = 61,440 < 65,504)
_F16X2_ACT_MAX = tl.constexpr(512.0)


@triton.jit
def _split4(p):
    """The four [R] columns of ``p`` [R, 4]."""
    a, b = tl.split(tl.reshape(p, (p.shape[0], 2, 2)))  # columns {0, 2} and {1, 3}
    p0, p2 = tl.split(a)
    p1, p3 = tl.split(b)
    return p0, p1, p2, p3


@triton.jit
def _activations_f16x2(a_ptr, skip_ptr, gamma_ptr, sum_ptr, row, m_ok, k0, K, s_am, s_skm, s_sum, rstd, store_sum,
                       inv_k, eps, PAIRS: tl.constexpr, NORM: tl.constexpr, STORE_SUM: tl.constexpr,
                       ONE_STEP: tl.constexpr):
    """One row's activations of K step k0 for ``_pair_dot``: float32 [PAIRS, 16] (k = k0 + 16 p + c; normalized
    and rounded to fp16 as SimplifiedLayerNormalization's output would be, then scaled by ``inv``), the pairs
    of the even and odd words of each pair p, and the scale ``inv`` (1, or a power of two below it when an
    activation exceeds _F16X2_ACT_MAX)."""
    k = k0 + tl.arange(0, PAIRS)[:, None] * 16 + tl.arange(0, 16)[None, :]
    ok = (k < K) & m_ok
    av = tl.load(a_ptr + row * s_am + k, mask=ok, other=0.0).to(tl.float32)
    if NORM == 2:
        av += tl.load(skip_ptr + row * s_skm + k, mask=ok, other=0.0).to(tl.float32)
        if STORE_SUM:
            tl.store(sum_ptr + row * s_sum + k, av.to(sum_ptr.dtype.element_ty), mask=ok & store_sum)
    if NORM > 0:
        if ONE_STEP:  # the tile is all of K: the row's statistics come from it
            rstd = tl.math.rsqrt(tl.sum(tl.sum(av * av, axis=1), axis=0) * inv_k + eps)
        gam = tl.load(gamma_ptr + k, mask=k < K, other=0.0).to(tl.float32)
        av = av * rstd * gam
    av = av.to(tl.float16).to(tl.float32)
    amax = tl.max(tl.max(tl.abs(av), axis=1), axis=0)
    # 2^-e as float bits: e = ceil(log2(amax / max)), at most 126 (inf and NaN keep their own way through)
    e = tl.minimum(tl.ceil(tl.log2(amax / _F16X2_ACT_MAX)), 126.0)
    inv = tl.where(amax > _F16X2_ACT_MAX, ((127 - e.to(tl.int32)) << 23).to(tl.float32, bitcast=True), 1.0)
    h = (av * inv).to(tl.float16)
    av = h.to(tl.float32)
    bits = h.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    # c = 8 e + 4 h + i: the pair (i, i + 4) of word e is bits[.., e, 0, i] | bits[.., e, 1, i] << 16
    lo, hi = tl.split(tl.permute(tl.reshape(bits, (PAIRS, 2, 2, 4)), (0, 1, 3, 2)))
    ev, od = tl.split(tl.permute(lo | (hi << 16), (0, 2, 1)))  # [PAIRS, 4] each
    return av, ev, od, inv


@triton.jit
def _pair_dot(w_even, w_odd, ev, od):
    """float32 [R, PAIRS]: per pair of words, the 16 products of their nibbles with the activations (see
    _PAIR_DOT_PTX); ``ev`` / ``od`` [PAIRS, 4] are the even and odd words' activation pairs."""
    e0, e1, e2, e3 = _split4(ev)
    o0, o1, o2, o3 = _split4(od)
    return tl.inline_asm_elementwise(
        _PAIR_DOT_PTX_C, "=r,r,r,r,r,r,r,r,r,r,r",
        [w_even, w_odd, e0[None, :], e1[None, :], e2[None, :], e3[None, :], o0[None, :], o1[None, :],
         o2[None, :], o3[None, :]], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _matmul_nbits_f16x2_kernel(a_ptr, w_ptr, s_ptr, z_ptr, bias_ptr, y_ptr, skip_ptr, gamma_ptr, sum_ptr,
                               M, N, K, N_BLOCKS, ROW_WORDS, s_am, s_zn, s_ym, s_skm, s_sum, inv_k, eps,
                               BS: tl.constexpr, ZP: tl.constexpr, HAS_BIAS: tl.constexpr, NORM: tl.constexpr,
                               STORE_SUM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                               BLOCK_K: tl.constexpr, CONST_W: tl.constexpr = False, ONE_STEP: tl.constexpr = False,
                               PDL: tl.constexpr = False):
    """``_matmul_nbits_kernel`` for fp16 activations on NVIDIA GPUs, with the products in fp16 pairs
    (``_PAIR_DOT_PTX``): same arguments, grid and results within fp16 rounding of the products.

    Per quantization block: scale * (sum of q * a - zero_point * sum of a), the sums in float32 from float32
    pair sums. With NORM the row's statistics come first (a pass over K, or with ONE_STEP, K <= BLOCK_K, from
    the one step's tile), so the activations are normalized before they are rounded to fp16, as the unfused
    ops round them. (Requesting a row's next activations a step ahead, as the fp16 GEMV does, made the int4
    decode steps slower on an H200: Llama-3.2-1B 0.515 -> 0.554 ms, Qwen2.5-0.5B 0.490 -> 0.535 ms.)"""
    G: tl.constexpr = BLOCK_K // BS
    WORDS: tl.constexpr = BLOCK_K // 8
    PAIRS: tl.constexpr = BLOCK_K // 16
    PPB: tl.constexpr = BS // 16  # word pairs per quantization block
    pid_n = tl.program_id(0)
    m0 = tl.program_id(1).to(tl.int64) * BLOCK_M
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n2 = tl.minimum(offs_n, N - 1).to(tl.int64)[:, None]
    w_idx = tl.arange(0, WORDS)[None, :]
    g2 = tl.arange(0, G)[None, :]
    m_idx = tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)

    if not CONST_W:
        pdl_wait(PDL)
    words, scale, zp = _weight_step(w_ptr, s_ptr, z_ptr, y_ptr, n2, w_idx, g2, 0, ROW_WORDS, N_BLOCKS, s_zn, BS, ZP)
    if CONST_W:
        pdl_wait(PDL)
    rstd = tl.full((BLOCK_M,), 1.0, tl.float32)
    if NORM > 0 and not ONE_STEP:  # the rows' statistics first: a pass over K (the activations are few, and cached)
        squares = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            for mi in tl.static_range(BLOCK_M):
                ok = (kk < K) & (m0 + mi < M)
                av = tl.load(a_ptr + (m0 + mi) * s_am + kk, mask=ok, other=0.0).to(tl.float32)
                if NORM == 2:
                    av += tl.load(skip_ptr + (m0 + mi) * s_skm + kk, mask=ok, other=0.0).to(tl.float32)
                squares = tl.where(m_idx == mi, squares + tl.sum(av * av, axis=0), squares)
        rstd = tl.math.rsqrt(squares * inv_k + eps)
    for k0 in range(0, K, BLOCK_K):
        words_k, scale_k, zp_k = words, scale, zp
        words, scale, zp = _weight_step(w_ptr, s_ptr, z_ptr, y_ptr, n2, w_idx, g2, k0 + BLOCK_K, ROW_WORDS, N_BLOCKS,
                                        s_zn, BS, ZP)
        w_even, w_odd = tl.split(tl.reshape(words_k, (BLOCK_N, PAIRS, 2)))
        for mi in tl.static_range(BLOCK_M):
            r = tl.sum(tl.where(m_idx == mi, rstd, 0.0), axis=0)
            av, ev, od, inv = _activations_f16x2(a_ptr, skip_ptr, gamma_ptr, sum_ptr, m0 + mi, m0 + mi < M, k0, K,
                                                 s_am, s_skm, s_sum, r, pid_n == 0, inv_k, eps, PAIRS, NORM, STORE_SUM,
                                                 ONE_STEP)
            pair = _pair_dot(w_even, w_odd, ev, od)  # [BLOCK_N, PAIRS]
            dot = tl.sum(tl.reshape(pair, (BLOCK_N, G, PPB)), axis=2)  # [BLOCK_N, G]
            a_sum = tl.sum(tl.reshape(tl.sum(av, axis=1), (G, PPB)), axis=1)[None, :]  # [1, G]
            part = tl.sum(scale_k * (dot - zp_k * a_sum), axis=1) / inv  # [BLOCK_N]
            acc = tl.where(m_idx[:, None] == mi, acc + part[None, :], acc)

    store_tile(acc, bias_ptr, y_ptr, offs_n, m0 + m_idx, M, N, s_ym, HAS_BIAS)


@triton.jit
def _dot_weight_step(w_ptr, s_ptr, z_ptr, t_ptr, n2, byte, g2, k, k_end, ROW_BYTES, N_BLOCKS, s_zn, BS: tl.constexpr,
                     ZP: tl.constexpr, EVEN_K: tl.constexpr):
    """Packed bytes [BLOCK_N, BLOCK_K / 2], scales and zero points [BLOCK_N, G] of weight rows ``n2`` for the K
    step that starts at ``k`` (zeros past the row's end), scales and float zero points rounded to ``t_ptr``'s
    dtype. EVEN_K: K is a multiple of BLOCK_K (so rows end at ``k_end`` = K, on a step's boundary), and a step's
    bytes are loaded whole or not at all, in vectors."""
    b = tl.multiple_of(k // 2, 8) + byte
    if EVEN_K:
        packed = tl.load(w_ptr + n2 * ROW_BYTES + tl.max_contiguous(b, [1, BS // 2]), mask=k < k_end, other=0)
    else:
        packed = tl.load(w_ptr + n2 * ROW_BYTES + b, mask=b < ROW_BYTES, other=0)
    blk = k // BS + g2
    scale, zp = _scales_zero_points(s_ptr, z_ptr, t_ptr, n2, blk, blk < N_BLOCKS, N_BLOCKS, s_zn, ZP)
    return packed, scale, zp


#: PTX: the weights of four bytes of nibbles ($4, byte j holding q_2j low and q_2j+1 high) dequantized as
#: ``dequantize`` rounds them, in fp16 pairs: the low nibbles' (q - zero point) * scale to $0 (bytes 0, 1) and $1
#: (bytes 2, 3), the high nibbles' to $2 and $3. $5, $6 hold -(1024 + zero point), $7, $8 -(64 + zero point), $9,
#: $10 the scales, each value twice. A prmt puts a byte in both halves of a register; a lop3 or-s the low (high)
#: nibble under the exponent of 1024 (the high nibble lands as 16 q); one exact add (an fma by 1/16 for the high
#: nibble) leaves q - zero point, and the product with the scale rounds once: 14 instructions for eight weights.
_NIBBLE_DQ_PTX = tl.constexpr("""
{
.reg .b32 m, s, t0, t1, u0, u1;
mov.b32 m, 0x64006400;
mov.b32 s, 0x2C002C00;
prmt.b32 t0, $4, $4, 0x1100;
prmt.b32 t1, $4, $4, 0x3322;
lop3.b32 u0, t0, 0x00F000F0, m, 0xEA;
lop3.b32 u1, t1, 0x00F000F0, m, 0xEA;
lop3.b32 t0, t0, 0x000F000F, m, 0xEA;
lop3.b32 t1, t1, 0x000F000F, m, 0xEA;
add.rn.f16x2 t0, t0, $5;
add.rn.f16x2 t1, t1, $6;
fma.rn.f16x2 u0, u0, s, $7;
fma.rn.f16x2 u1, u1, s, $8;
mul.rn.f16x2 $0, t0, $9;
mul.rn.f16x2 $1, t1, $10;
mul.rn.f16x2 $2, u0, $9;
mul.rn.f16x2 $3, u1, $10;
}
""")


@triton.jit
def _dequantize_tile(packed, scale, zp, MAGIC_BITS: tl.constexpr, MAGIC: tl.constexpr, FAST_DQ: tl.constexpr,
                     PTX_DQ: tl.constexpr, ZP: tl.constexpr, OUT_TY: tl.constexpr):
    """A K step's weights [BLOCK_N, 2 * HALF] in OUT_TY from its packed bytes [BLOCK_N, HALF] (low nibble first) and
    the float32 scales and zero points [BLOCK_N, G] (scales and float zero points already rounded to OUT_TY), as
    ``dequantize`` rounds them: ((q - zero point) in OUT_TY) * scale in OUT_TY."""
    BLOCK_N: tl.constexpr = packed.shape[0]
    HALF: tl.constexpr = packed.shape[1]
    G: tl.constexpr = scale.shape[1]
    BS2: tl.constexpr = HALF // G  # bytes per quantization block
    if PTX_DQ or FAST_DQ:  # the two nibbles' weights of each byte side by side, low first
        lo, hi = _dequantize_halves(packed, scale, zp, MAGIC_BITS, MAGIC, PTX_DQ, ZP, OUT_TY)
        w = tl.reshape(tl.join(lo, hi), (BLOCK_N, 2 * HALF))
    else:
        p32 = packed.to(tl.int32)
        q = tl.reshape(tl.join(p32 & 0xF, p32 >> 4), (BLOCK_N, G, 2 * BS2)).to(tl.float32)  # low nibble first
        d = (q - zp[:, :, None]).to(OUT_TY).to(tl.float32)
        w = tl.reshape((d * scale[:, :, None]).to(OUT_TY), (BLOCK_N, 2 * HALF))
    return w


@triton.jit
def _dequantize_halves(packed, scale, zp, MAGIC_BITS: tl.constexpr, MAGIC: tl.constexpr, PTX_DQ: tl.constexpr,
                       ZP: tl.constexpr, OUT_TY: tl.constexpr):
    """``_dequantize_tile``'s weights as two [BLOCK_N, HALF] tiles: the low nibbles' (even K positions) and the
    high nibbles' (odd), exponent-trick or PTX dequantization."""
    BLOCK_N: tl.constexpr = packed.shape[0]
    HALF: tl.constexpr = packed.shape[1]
    G: tl.constexpr = scale.shape[1]
    BS2: tl.constexpr = HALF // G
    if PTX_DQ:
        s = tl.reshape(tl.broadcast_to(scale.to(tl.float16)[:, :, None], (BLOCK_N, G, BS2)), (BLOCK_N, HALF))
        c_lo = tl.reshape(tl.broadcast_to((-(zp + 1024.0)).to(tl.float16)[:, :, None], (BLOCK_N, G, BS2)),
                          (BLOCK_N, HALF))
        c_hi = tl.reshape(tl.broadcast_to((-(zp + 64.0)).to(tl.float16)[:, :, None], (BLOCK_N, G, BS2)),
                          (BLOCK_N, HALF))
        lo, hi = tl.inline_asm_elementwise(_NIBBLE_DQ_PTX, "=r,=r,=r,=r,r,r,r,r,r,r,r", [packed, c_lo, c_hi, s],
                                           dtype=(tl.float16, tl.float16), is_pure=True, pack=4)
    else:
        # in OUT_TY throughout: a nibble or-ed under the exponent of MAGIC (1024 in fp16, 128 in bf16) is MAGIC + q
        # exactly, so q - zero point is one exact subtraction (two with float zero points, the second rounded as
        # the float32 difference would be), and the product with the scale rounds once
        p16 = tl.reshape(packed.to(tl.int16), (BLOCK_N, G, BS2))
        sc = scale.to(OUT_TY)[:, :, None]
        if ZP == 2:
            z = zp.to(OUT_TY)[:, :, None]
            lo = ((p16 & 0xF | MAGIC_BITS).to(OUT_TY, bitcast=True) - MAGIC) - z
            hi = ((p16 >> 4 | MAGIC_BITS).to(OUT_TY, bitcast=True) - MAGIC) - z
        else:
            z = (zp + MAGIC).to(OUT_TY)[:, :, None]
            lo = (p16 & 0xF | MAGIC_BITS).to(OUT_TY, bitcast=True) - z
            hi = (p16 >> 4 | MAGIC_BITS).to(OUT_TY, bitcast=True) - z
        lo = tl.reshape(lo * sc, (BLOCK_N, HALF))
        hi = tl.reshape(hi * sc, (BLOCK_N, HALF))
    return lo, hi


@triton.jit
def _dot_activations(a_ptrs, k, k_hi, rows, M, kk, EVEN_K: tl.constexpr):
    """Rows ``rows`` of a's K step at ``k`` [BLOCK_M, BLOCK_K] (``a_ptrs`` at its K offset 0; zeros past M and
    ``k_hi``): with EVEN_K the step is whole or past ``k_hi`` altogether, so each row loads in vectors."""
    if EVEN_K:
        av = tl.load(a_ptrs + k, mask=(rows[:, None] < M) & (k < k_hi), other=0.0)
    else:
        av = tl.load(a_ptrs + k, mask=(rows[:, None] < M) & ((k + kk) < k_hi)[None, :], other=0.0)
    return av


@triton.jit
def _matmul_nbits_dot_kernel(a_ptr, w_ptr, s_ptr, z_ptr, bias_ptr, y_ptr, M, N, K, N_BLOCKS, ROW_BYTES, K_PER_SPLIT,
                             s_am, s_zn, s_ym, s_ys,
                             BS: tl.constexpr, ZP: tl.constexpr, HAS_BIAS: tl.constexpr, PARTIAL: tl.constexpr,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                             CONST_W: tl.constexpr = False, F32_DOT: tl.constexpr = False,
                             FAST_DQ: tl.constexpr = False, PTX_DQ: tl.constexpr = False,
                             A_AHEAD: tl.constexpr = False, EVEN_K: tl.constexpr = False, HALVES: tl.constexpr = False,
                             MAGIC_BITS: tl.constexpr = 0x6400,
                             MAGIC: tl.constexpr = 1024.0, PDL: tl.constexpr = False):
    """Columns [pid0 * BLOCK_N, +BLOCK_N) of rows [pid2 * BLOCK_M, +BLOCK_M) of y over K range pid1, on the
    matrix units: each K step's weight tile is dequantized in registers as ``dequantize`` rounds it ((q -
    zero point) in y's dtype, times the scale, in y's dtype; ``_dequantize_tile``), then one ``tl.dot`` of the rows'
    activations with it accumulates in float32 (so the product is the dequantize-then-matmul one, up to the order of
    the float32 sums); with HALVES two, the low nibbles' weights with the even K positions' activations and the high
    with the odd (``_dequantize_halves``). y's dtype is a's (the scales are rounded to a's dtype: ``_dot_weight_step`` is handed
    ``a_ptr``).

    PARTIAL: store the float32 sums to workspace slice pid1 (``y_ptr + pid1 * s_ys``), no bias; else add the
    bias (rounded to y's dtype) and store in y's dtype. CONST_W with PDL: the first K step's weights are requested
    before waiting for the previous kernel. A_AHEAD: each step's activations are requested a step ahead, as its
    weights are. EVEN_K: K is a multiple of BLOCK_K (``_dot_weight_step``), so no step is partial.

    The dequantized tiles reach the matrix units through shared memory (fp16 [BLOCK_N, HALF] stores, then ldmatrix
    loads; Triton 3.6 does not move the dequantization past the layout conversion into the dot operand's registers,
    with the weight tile as the dot's first operand or second, PTX or not: read from the compiled TTGIR). That round
    trip, with the dequantization, bounds the kernel: Llama-3.2-1B's lm_head reads its 131 MB at about 1.1 TB/s."""
    HALF: tl.constexpr = BLOCK_K // 2
    out_ty = a_ptr.dtype.element_ty  # (y's too, unless y is the PARTIAL workspace)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    m0 = tl.program_id(2).to(tl.int64) * BLOCK_M
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # columns past N re-read the last row (never stored): no load mask along N
    n2 = tl.minimum(offs_n, N - 1).to(tl.int64)[:, None]
    byte = tl.arange(0, HALF)[None, :]
    g2 = tl.arange(0, BLOCK_K // BS)[None, :]
    rows = m0 + tl.arange(0, BLOCK_M)
    kk = tl.arange(0, BLOCK_K)
    k_lo = pid_k * K_PER_SPLIT
    k_hi = tl.minimum(K, k_lo + K_PER_SPLIT)
    a_ptrs = a_ptr + rows[:, None] * s_am + tl.max_contiguous(kk, BLOCK_K)[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if not CONST_W:
        pdl_wait(PDL)
    packed, scale, zp = _dot_weight_step(w_ptr, s_ptr, z_ptr, a_ptr, n2, byte, g2, k_lo, k_hi, ROW_BYTES, N_BLOCKS,
                                         s_zn, BS, ZP, EVEN_K)
    if CONST_W:
        pdl_wait(PDL)
    if A_AHEAD:
        a = _dot_activations(a_ptrs, k_lo, k_hi, rows, M, kk, EVEN_K)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        packed_k, scale_k, zp_k = packed, scale, zp
        packed, scale, zp = _dot_weight_step(w_ptr, s_ptr, z_ptr, a_ptr, n2, byte, g2, k0 + BLOCK_K, k_hi,
                                             ROW_BYTES, N_BLOCKS, s_zn, BS, ZP, EVEN_K)
        k = k0 + kk
        if A_AHEAD:
            a_k = a
            a = _dot_activations(a_ptrs, k0 + BLOCK_K, k_hi, rows, M, kk, EVEN_K)
        else:
            a_k = _dot_activations(a_ptrs, k0, k_hi, rows, M, kk, EVEN_K)
        if HALVES:  # two dots: the even K positions' activations with the low nibbles' weights, the odd with the high
            lo, hi = _dequantize_halves(packed_k, scale_k, zp_k, MAGIC_BITS, MAGIC, PTX_DQ, ZP, out_ty)
            a_even, a_odd = tl.split(tl.reshape(a_k, (BLOCK_M, HALF, 2)))
            if not EVEN_K:
                k_even = k0 + 2 * tl.arange(0, HALF)
                lo = tl.where((k_even < k_hi)[None, :], lo, 0.0).to(out_ty)
                hi = tl.where((k_even + 1 < k_hi)[None, :], hi, 0.0).to(out_ty)
            acc = dot_acc(a_even, tl.trans(lo), acc, F32_DOT)
            acc = dot_acc(a_odd, tl.trans(hi), acc, F32_DOT)
        else:
            w = _dequantize_tile(packed_k, scale_k, zp_k, MAGIC_BITS, MAGIC, FAST_DQ, PTX_DQ, ZP, out_ty)
            if not EVEN_K:  # K positions past K are zeros in w too, not only in a: 0 * inf would be NaN
                w = tl.where((k < k_hi)[None, :], w, 0.0).to(out_ty)
            acc = dot_acc(a_k, tl.trans(w), acc, F32_DOT)
    store_tile(acc, bias_ptr, y_ptr, offs_n, rows, M, N, s_ym, HAS_BIAS, PARTIAL, pid_k, s_ys)


@triton.jit
def _dequantize_kernel(w_ptr, s_ptr, z_ptr, y_ptr, idx_ptr, N, K, N_BLOCKS, ROW_BYTES, s_zn, V,
                       BS: tl.constexpr, ZP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       GATHER: tl.constexpr = False, PDL: tl.constexpr = False):
    """y[n, k] = (q[n, k] - zero_point) * scale of block (n, k // BS), for rows [pid0 * BLOCK_N, +BLOCK_N) and
    columns [pid1 * BLOCK_K, +BLOCK_K), rounded as the op's dequantization in y's dtype rounds: q - zero_point
    to y's dtype, then the product (both exact in float32 before the rounding).

    GATHER: output row n is weight row idx[n] of V (negative indices count from the end; rows of indices
    outside [-V, V) are zeros), as GatherBlockQuantized gathers."""
    pdl_wait(PDL)
    G: tl.constexpr = BLOCK_K // BS
    HALF: tl.constexpr = BLOCK_K // 2
    out_ty = y_ptr.dtype.element_ty
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows_ok = offs_n < N
    if GATHER:
        row = tl.load(idx_ptr + offs_n, mask=rows_ok, other=0).to(tl.int64)
        row = tl.where(row < 0, row + V, row)
        n_ok = rows_ok & (row >= 0) & (row < V)
        src = tl.where(n_ok, row, 0)[:, None]
    else:
        n_ok = rows_ok
        src = offs_n.to(tl.int64)[:, None]
    n2 = offs_n.to(tl.int64)[:, None]
    byte = tl.program_id(1) * HALF + tl.arange(0, HALF)[None, :]
    packed = tl.load(w_ptr + src * ROW_BYTES + byte, mask=n_ok[:, None] & (byte < ROW_BYTES), other=0).to(tl.int32)
    q = tl.reshape(tl.join(packed & 0xF, packed >> 4), (BLOCK_N, G, BS)).to(tl.float32)  # low nibble first
    blk = tl.program_id(1) * G + tl.arange(0, G)[None, :]  # [1, G]
    scale, zp = _scales_zero_points(s_ptr, z_ptr, y_ptr, src, blk, n_ok[:, None] & (blk < N_BLOCKS), N_BLOCKS, s_zn,
                                    ZP)
    d = (q - zp[:, :, None]).to(out_ty).to(tl.float32)
    w = tl.reshape((d * scale[:, :, None]).to(out_ty), (BLOCK_N, BLOCK_K))
    kk = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)[None, :]
    # rows of invalid indices (GATHER) are zeros; otherwise n_ok is rows_ok and the where keeps w
    tl.store(y_ptr + n2 * K + kk, tl.where(n_ok[:, None], w, 0.0).to(out_ty), mask=rows_ok[:, None] & (kk < K))


def pick_tiles(M: int, N: int, K: int, block_size: int, processors: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps) for a problem on a GPU of ``processors`` SMs.

    From the in-graph sweep of benchmarks/gemv_tiles.py on an H200 (results/gemv_tiles.md; weights not in
    L2, constant-weight launches): one warp per program (two since, below), BLOCK_K the whole of K up to 2048 (K
    rounded up to a power of two), two weight rows per program, or one when K spans more than two such steps (more
    programs for the long products, e.g. down: each still takes three or more K steps); for wide
    products, where two-row programs would exceed 16 per SM (merged gate+up, lm_head), four rows by 512
    (many short programs cost more than they hide). BLOCK_K is at least one quantization block. In the GenAI
    benchmark's captured int4 decode steps, half as many programs (twice the rows and warps each, of this kernel or
    of the fp16-pair one) measured the same: Qwen2.5-0.5B 0.472-0.492 against 0.490-0.493 ms, Llama-3.2-1B 0.510
    against 0.509 ms (unlike the fp16 GEMV on column-major weights, crossml.kernels.gemv). Gating the MLP's down
    projection's activations as this kernel loads them (SiLU of [g | up], as the fp16 GEMV does, one launch fewer per
    layer) made those steps slower, 0.635 against 0.492 ms and 0.56 against 0.51: each program of one or two weight
    rows recomputes the gate for all of K.

    The one- and two-row programs run two warps, not one: with the fp16-pair kernel's merged gate+up at 8 rows
    by 896 (``pick_pair_tiles``), that took the captured Qwen2.5-0.5B int4 decode step from 0.485 / 0.494 / 0.493
    to 0.474 / 0.469 / 0.469 ms on an H100 (down projection alone 0.478-0.483, gate+up alone 0.478-0.483;
    ``decode_replay.py --variants`` with the tiles forced, alternated rounds; results/decode_tiles.md), and on an
    H200 from 0.478-0.479 to 0.454-0.456 ms (the rules before and after, alternated).
    """
    block_m = min(MAX_BLOCK_M, next_power_of_2(max(M, 1)))
    block_k = min(2048, next_power_of_2(max(K, 1)))
    warps = 1
    if cdiv(N, 2) > 16 * processors:
        block_n, block_k = 4, min(block_k, 512)
    else:
        block_n, warps = (1 if K > 2 * block_k else 2), 2
    return block_m, block_n, max(block_size, block_k), warps


#: after an early-launching gate (``pick_pair_tiles``' ``early_input``), narrow products of a long K (Qwen2.5-0.5B's
#: down projection) take the fp16-pair kernel at 4 rows a program with all of K (to 8192) in one step. Off: the
#: Qwen2.5-0.5B int4 decode step on an H200 stayed level, 0.440-0.442 ms with the float32 kernel's tiles against 0.442
#: (results/norm_early.md, run 2)
EARLY_NARROW = False


def pick_pair_tiles(M: int, N: int, K: int, block_size: int, processors: int,
                    early_input: bool = False) -> tuple[int, int, int, int] | None:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps) of the fp16-pair kernel for a problem on a GPU of ``processors`` SMs,
    or None where the float32 kernel is faster.

    From the in-graph sweep at Qwen2.5-0.5B and Llama-3.2-1B decode shapes on an H200
    (``benchmarks/gemv_tiles.py --int4``, results/gemv_int4.md; fp16 activations, block size 32, weights not in
    L2): the pair kernel's programs hold 4 or more rows and its
    activation preparation is paid once per program, so below about 12 output rows per SM (Qwen2-0.5B's qkv,
    o and down products, N <= 1152) the float32 kernel's one- and two-row programs win by 0.05-0.1 us. Above
    it: 32 rows by 256 for the lm_head (N of a vocabulary); for the merged gate+up 4 rows by all of K up to
    1024 (8 at two warps since, below), 8 by 512 for longer K; 8 rows by all of K
    (to 2048) at two warps otherwise. For the gate+up of K up to 1024, 8 rows at two warps (half the programs, each
    normalizing the row once when NormMatMulNBits fuses the norm) instead of 4 at one: in the captured Qwen2.5-0.5B
    int4 decode step on an H100, with ``pick_tiles``' two-warp programs, 0.485-0.494 -> 0.469-0.474 ms (results/
    decode_tiles.md); Llama-3.2-1B's gate+up (K = 2048) at 8 rows by 1024, two warps, or 4 by 2048, one, was
    slower (0.541-0.543 -> 0.562-0.614 ms), as were its down projection at 4 rows by 2048, one warp, or 16 by 2048,
    four (0.554-0.556), and its qkv and o at 4 rows by 2048 (0.559-0.560).

    The down projections' long K (K > 2048, N <= 16 per SM) was measured with BLOCK_K past 2048 on an H100
    (``benchmarks/int4_long_k.py``, results/int4_long_k.md): about two programs per SM of 4096 packed words a step at
    four warps (4 rows by 8192, 8 by 4096) took the products alone, in CUDA graphs of like products, from 4.14 to
    3.34 us (Qwen2.5-0.5B, 896 x 4864) and from 7.14 to 5.85 us (Llama-3.2-1B, 2048 x 8192), but the captured int4
    decode steps slower (rules alternated in one process, three rounds): Qwen2.5-0.5B 0.486-0.495 -> 0.497-0.498 ms,
    Llama-3.2-1B 0.541-0.543 -> 0.549-0.550 ms.

    ``early_input``: the activations come from a kernel that let this one launch before its own wait (the SiluMul of
    ``crossml.ops.fused``'s SiluMulMatMulNBits), so the programs are resident, and their first K step requested,
    while the product before that kernel still runs. Then a long K (past 2048, N <= 64 per SM) takes steps of 4096 at
    four warps: half of Llama-3.2-1B's down projection is read before the wait. Its int4 decode step on an H200 went
    from 0.489-0.490 to 0.467-0.468 ms with both (``benchmarks/decode_replay.py --variants
    cols,no-SiluMulMatMulNBits``, three alternated rounds; results/norm_early.md run 1), on an H100 from 0.531-0.533 to
    0.519-0.520 (run 3); in the sweep before, the early launch alone took it to 0.492-0.496 and steps of 8192 at 4 rows
    a program to 0.483-0.484.
    """
    block_m = min(MAX_BLOCK_M, next_power_of_2(max(M, 1)))
    k2 = next_power_of_2(max(K, 16))
    if N < 12 * processors:
        if early_input and EARLY_NARROW and K > 2048:
            return block_m, 4, max(block_size, min(8192, k2)), 4
        return None
    if N >= 512 * processors:
        block_n, block_k, warps = 32, min(256, k2), 1
    elif N >= 64 * processors:
        block_n, block_k, warps = (8, k2, 2) if K <= 1024 else (8, 512, 1)
    elif early_input and K > 2048:
        block_n, block_k, warps = 8, min(4096, k2), 4
    else:
        block_n, block_k, warps = 8, min(2048, k2), 2
    return block_m, block_n, max(block_size, block_k), warps


#: fewest rows of fp16 / bf16 A that take the matrix-unit kernel (``_matmul_nbits_dot_kernel``) rather than the
#: per-row GEMVs, whose arithmetic grows with the rows. At 4 rows (results/int4_batch_variants2.md, H200) the kernel
#: was ahead at every decode product but Llama-3.2-1B's lm_head, where it took 115.9 us against the fp16-pair GEMV's
#: 111.7 (Qwen2.5-0.5B's: 56.8 against 72.5); on an H100 (results/int4_batch_h100.md) it led there too, 114.9 against
#: 119.7. At 2 rows the GEMVs lead (Llama-3.2-1B's lm_head 72.3 against 115.0 us on the H100).
DOT_MIN_M = 4
#: most rows the op sends to the matrix-unit kernel: past them the dequantize-then-matmul path (which writes the
#: dense weight once, then runs cuBLAS) costs about as much at Qwen2.5-0.5B's gate+up product, and less beyond
DOT_MAX_M = 64
_DOT_DTYPES = (torch.float16, torch.bfloat16)
#: most K splits of the matrix-unit kernel (its reduction loads all of an output's partial sums at once)
_DOT_MAX_SPLIT = 64


def dot_eligible(a: torch.Tensor, M: int, N: int) -> bool:
    """Whether ``matmul_nbits`` (without ``norm``) of ``a`` with M rows and N outputs takes the matrix-unit kernel:
    fp16 or bf16 activations, at least DOT_MIN_M rows (any N). fp32 activations keep the GEMVs: ``tl.dot`` would
    round them to tf32."""
    return a.dtype in _DOT_DTYPES and M >= DOT_MIN_M


def pick_dot_tiles(M: int, N: int, K: int, block_size: int, processors: int) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, num_warps) of the matrix-unit kernel for a problem on a GPU of
    ``processors`` SMs: 16-row tiles of A (64 for more rows), 64 weight rows by 128 values of K a step, four
    warps, and K split (in whole steps, at most _DOT_MAX_SPLIT ranges) until there are about four programs per SM.

    From the in-graph sweep at Qwen2.5-0.5B's and Llama-3.2-1B's decode shapes, 8 rows, on an H200
    (``benchmarks/int4_batch.py``, results/int4_batch.md): 64 x 128 tiles were the fastest or within 0.2 us of it at
    every shape but Qwen2.5-0.5B's o projection, with K split to 4-6 programs per SM for the narrow products and
    not at all for the vocabulary's (2,000+ programs). At 4 rows the rule's tiles were within 1 us of the sweep's
    best (Qwen2.5-0.5B's down projection 7.1 against 6.1 us with 32 weight rows and 19 splits, Llama-3.2-1B's o
    projection 6.4 against 5.5 with 9 splits, the rest within 0.1 us). For 17 to 64 rows, 64-row tiles beat 32-row
    ones even at 32 rows (Llama-3.2-1B's lm_head 184 against 241 us): the weight tile's dequantization, not the
    matrix product, bounds the kernel, and the program count halves."""
    block_m = 16 if M <= 16 else 64
    block_n = 64
    block_k = max(block_size, 128)
    n_prog = cdiv(N, block_n) * cdiv(M, block_m)
    split = 1
    if n_prog < 4 * processors:
        split = max(1, min(cdiv(4 * processors, n_prog), cdiv(K, block_k), _DOT_MAX_SPLIT))
    return block_m, block_n, block_k, split, 4


#: rows of fp16 activations that take the Gluon mma kernel (``crossml.kernels.nbits_mma``) where it applies
#: (``mma_eligible``); set MMA_MAX_M to 0 to keep them on the kernels above (benchmarks' ``--set``). At 2 to 16 rows it
#: led the fp16-pair GEMV and ``_matmul_nbits_dot_kernel`` at the larger decode products of the GenAI benchmark's
#: models (H200, results/int4_mma.md: Llama-3.2-1B's lm_head 67.1 -> 65.8 us at 2 rows, 116.7 -> 68.9 at 8) and was
#: within 0.4 us of the better of them at the small ones (its o projection 3.3 -> 3.7 at 2 rows, Qwen2.5-0.5B's qkv
#: 2.9 -> 3.2 at 16), and in their int4 decode steps at B = 2-16 it gained (results/genai_batch_int4_mma*.md:
#: Llama-3.2-1B 2,573 -> 3,186 tokens/s at B = 2, 8,626 -> 11,366 at 8).
MMA_MIN_M, MMA_MAX_M = 2, 16
#: fewest rows with which a narrow product (K <= MMA_NARROW_K and N <= MMA_NARROW_N: the attention's qkv and output
#: projections of small models, whose preceding RMSNorm the GEMVs fuse) takes the mma kernel; fewer take the GEMVs.
#: In the GenAI benchmark's int4 decode steps (H200, results/genai_batch_int4_mma.md's setup, two alternated rounds)
#: that took Qwen2.5-0.5B at B = 2 from 3,475-3,492 to 3,644-3,646 tokens/s; from 4 rows it cost B = 3 (5,195-5,219 ->
#: 5,112-5,124), and for K up to 2048 it did not help Llama-3.2-1B (B = 2: 3,203-3,229 against 3,192-3,199; B = 3 with
#: 4 rows 4,816-4,823 -> 3,985-3,993)
MMA_NARROW_MIN_M, MMA_NARROW_K, MMA_NARROW_N = 3, 1024, 4096
#: MMA_MAX_M + 1 to MMA_WIDE_MAX_M rows take the mma kernel (two 16-row tiles of A on each dequantized step) for weights
#: of at least MMA_WIDE_MIN_WEIGHT values: on an H100 (results/int4_mma_rows.md) at 17-32 rows it led the tl.dot
#: kernel at Llama-3.2-1B's lm_head (124.9-140.9 against 153.0-158.4 us), down (11.6-12.9 against 18.5-18.7) and
#: gate+up up to 24 rows (22.8-24.8 against 25.5-25.7; 27.1 against 26.3 at 32), and Qwen2.5-0.5B's lm_head (65.2-75.4
#: against 77.3-79.3); it trailed at the smaller products (Qwen2.5-0.5B's qkv 3.8-3.9 against 3.3-3.5 us, its down
#: 8.7-10.0 against 7.8-8.4) and, with four tiles, everywhere past 32 rows but Llama-3.2-1B's down. In the GenAI
#: benchmark's int4 decode on an H100 (two rounds alternated with MMA_WIDE_MAX_M=16) it took Llama-3.2-1B from
#: 18,657-19,260 to 21,615-21,763 tokens/s at B = 24 and from 24,866-24,934 to 26,312-26,419 at B = 32 (Qwen2.5-0.5B,
#: whose lm_head alone is wide enough, 25,567-25,702 -> 25,762-25,810 and 31,406-31,418 -> 31,581-31,703)
MMA_WIDE_MAX_M, MMA_WIDE_MIN_WEIGHT = 32, 16_000_000


def _mma_kernels():
    """``crossml.kernels.nbits_mma``, or None without the Gluon of Triton 3.6 (``_launch.gluon_kernels``)."""
    return gluon_kernels("nbits_mma")


def mma_eligible(a: torch.Tensor, M: int, K: int, N: int, block_size: int, zero_points: torch.Tensor | None) -> bool:
    """Whether ``matmul_nbits`` (without ``norm``) of ``a`` with M rows takes the Gluon mma kernel: MMA_MIN_M to
    MMA_MAX_M rows (from MMA_NARROW_MIN_M for narrow products; to MMA_WIDE_MAX_M for weights of MMA_WIDE_MIN_WEIGHT
    values or more) and ``crossml.kernels.nbits_mma.supported`` (fp16 on NVIDIA sm80+, K a multiple of 128, block size
    32 to 256, zero points packed or absent)."""
    wide = MMA_MAX_M < M <= MMA_WIDE_MAX_M and N * K >= MMA_WIDE_MIN_WEIGHT
    if not (MMA_MIN_M <= M <= MMA_MAX_M or wide) or a.dtype != torch.float16 or a.device.type != "cuda":
        return False
    if M < MMA_NARROW_MIN_M and K <= MMA_NARROW_K and N <= MMA_NARROW_N:
        return False
    kernels = _mma_kernels()
    return kernels is not None and kernels.supported(a, K, N, block_size, zero_points)


def _check_weight(b: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None, *, K: int, N: int,
                  block_size: int, whole_blocks: bool = True) -> tuple[int, int]:
    """Validate the packed weight, scales and zero points; returns (n_blocks, zero-point mode). ``whole_blocks``:
    B holds whole blocks (MatMulNBits' [N, n_blocks, block_size / 2]); False for GatherBlockQuantized's
    [V, K / 2] rows, whose shape defines K."""
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of 2 and >= 16, got {block_size}")
    n_blocks = cdiv(K, block_size)
    blob = block_size // 2
    if whole_blocks and (b.dtype != torch.uint8 or b.numel() != N * n_blocks * blob):
        raise ValueError(f"B must be uint8 of shape [N={N}, k_blocks={n_blocks}, blob_size={blob}], "
                         f"got {b.dtype} {tuple(b.shape)}")
    if not scales.is_floating_point() or scales.numel() != N * n_blocks:
        raise ValueError(f"scales must be floats of shape [N={N}, k_blocks={n_blocks}], "
                         f"got {scales.dtype} {tuple(scales.shape)}")
    zp_mode = _ZP_NONE
    if zero_points is not None:
        if zero_points.dtype == torch.uint8:
            zp_mode = _ZP_PACKED
            if N == 0 or zero_points.numel() % N or zero_points.numel() // N < cdiv(n_blocks, 2):
                raise ValueError(f"packed zero_points need >= {cdiv(n_blocks, 2)} bytes per row of N={N}, "
                                 f"got shape {tuple(zero_points.shape)}")
        elif zero_points.is_floating_point():
            zp_mode = _ZP_FLOAT
            if zero_points.numel() != N * n_blocks:
                raise ValueError(f"float zero_points must have shape [N={N}, k_blocks={n_blocks}], "
                                 f"got {tuple(zero_points.shape)}")
        else:
            raise TypeError(f"zero_points must be uint8 (packed) or floats, got {zero_points.dtype}")
    return n_blocks, zp_mode


def matmul_nbits(a: torch.Tensor, b: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None = None,
                 bias: torch.Tensor | None = None, *, K: int, N: int, block_size: int, bits: int = 4,
                 tiles: tuple[int, int, int, int] | None = None,
                 norm: tuple[torch.Tensor | None, torch.Tensor, float] | None = None,
                 sum_out: torch.Tensor | None = None, const_w: bool = False,
                 pairs: bool | None = None, dot: bool | None = None, mma: bool | None = None,
                 early_input: bool = False) -> torch.Tensor:
    """MatMulNBits (bits=4, no g_idx) of ``a`` [..., K] -> [..., N] in ``a``'s dtype, one Triton launch (two when
    the matrix-unit kernel splits K).

    ``tiles`` (BLOCK_M, BLOCK_N, BLOCK_K, num_warps) overrides ``pick_tiles`` (tests); BLOCK_K must be
    a multiple of block_size, all powers of two.

    ``norm`` = (skip or None, gamma [K], epsilon): the product of RMSNorm(a (+ skip)) * gamma instead of
    ``a`` (SimplifiedLayerNormalization / SkipSimplifiedLayerNormalization feeding the product), the
    statistics in float32; the float32 kernel does not round the normalized activations to a's dtype, the
    fp16-pair kernel does (to fp16, once, as the two ops in a row round them). ``sum_out`` (with a skip): receives a + skip in its dtype, as the skip norm's
    fourth output. ``const_w``: ``b``, ``scales`` and ``zero_points`` are constants of the model that no kernel
    writes (initializers), so with programmatic dependent launch the first K step's are read while the
    previous kernel finishes. ``pairs`` (tests, benchmarks): take the fp16-pair kernel or not, instead of
    ``fp16_pairs(a)``.

    Without ``norm``, fp16 / bf16 activations of at least DOT_MIN_M rows (``dot_eligible``) take the matrix-unit
    kernel (``_matmul_nbits_dot_kernel``: the dequantize-then-matmul product, fused), whose arithmetic does not grow
    with the rows as the GEMVs' does; ``dot`` (tests, benchmarks) forces it on or off, and ``tiles`` then are
    (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, num_warps) (``pick_dot_tiles``).

    Before it, fp16 activations where ``mma_eligible`` holds (2 to 16 rows, to 32 for large weights) take the Gluon
    mma kernel
    (``crossml.kernels.nbits_mma``); ``mma`` (tests, benchmarks) forces it on or off, and ``tiles`` then are
    (BLOCK_N, WARPS, DEPTH, SPLIT_K) (``nbits_mma.pick_tiles``).

    ``early_input``: ``a`` comes from a kernel launched with ``pdl``'s ``early`` just before (``pick_pair_tiles``).
    """
    if bits != 4:
        raise ValueError(f"MatMulNBits Triton kernel: bits must be 4, got {bits}")
    if a.dtype not in _DTYPES:
        raise TypeError(f"MatMulNBits Triton kernel: A must be float16/bfloat16/float32, got {a.dtype}")
    if a.shape[-1] != K:
        raise ValueError(f"MatMulNBits: A's last dimension {a.shape[-1]} != K={K}")
    n_blocks, zp_mode = _check_weight(b, scales, zero_points, K=K, N=N, block_size=block_size)
    if bias is not None and bias.numel() != N:
        raise ValueError(f"bias must have N={N} values, got shape {tuple(bias.shape)}")
    others = [t for t in (b, scales, zero_points, bias) if t is not None]
    if any(t.device != a.device for t in others):
        raise ValueError(f"MatMulNBits inputs are on different devices: {', '.join(str(t.device) for t in [a, *others])}")

    M = math.prod(a.shape[:-1])
    y, final = product_output(a, N, K, bias)
    if final:
        return y
    a2 = a.reshape(M, K).contiguous()
    b2 = b.reshape(N, n_blocks * block_size // 2).contiguous()
    row_words = b2.shape[1] // 4  # block_size / 2 >= 8 bytes per block: whole int32 words
    w2 = b2.view(torch.int32)
    s2 = scales.reshape(N, n_blocks).contiguous()
    z2 = zero_points.reshape(N, -1).contiguous() if zero_points is not None else s2
    bias1 = bias.reshape(N).contiguous() if bias is not None else s2
    y2 = y.view(M, N)

    interpret = use_interpreter(a, "MatMulNBits")
    sms = rule_processors(a)
    if mma is None:
        mma = norm is None and dot is None and tiles is None and mma_eligible(a, M, K, N, block_size, zero_points)
    if mma:
        kernels = _mma_kernels()
        if norm is not None or kernels is None or M > kernels.MAX_M \
                or not kernels.supported(a, K, N, block_size, zero_points):
            raise ValueError(f"MatMulNBits mma kernel: takes no norm, at most 64 rows of fp16 A on an NVIDIA GPU of "
                             f"compute capability 8.0+ with Gluon, K a multiple of 128, block size 32-256, zero points "
                             f"packed or absent; got M={M}, K={K}, block_size={block_size}, A {a.dtype} on {a.device}, "
                             f"zero points {None if zero_points is None else zero_points.dtype}")
        kernels.mma_product(a2, b2, s2, z2 if zero_points is not None else None, bias1 if bias is not None else None, y2, K=K, N=N, block_size=block_size,
                            tiles=tiles or kernels.pick_tiles(M, N, K, sms), const_w=const_w)
        return y
    if norm is None and (dot_eligible(a, M, N) if dot is None else dot):
        if a.dtype not in _DOT_DTYPES:
            raise TypeError(f"MatMulNBits matrix-unit kernel: A must be float16/bfloat16, got {a.dtype}")
        _dot_product(a2, b2, s2, z2, bias1, bias is not None, y2, K=K, N=N, n_blocks=n_blocks, block_size=block_size,
                     zp_mode=zp_mode, tiles=tiles or pick_dot_tiles(M, N, K, block_size, sms), const_w=const_w,
                     interpret=interpret)
        return y
    skip, gamma, eps = norm if norm is not None else (None, None, 0.0)
    if norm is not None:
        if gamma.numel() != K or (skip is not None and skip.shape != a.shape):
            raise ValueError(f"MatMulNBits with RMSNorm: gamma must have K={K} values and skip a's shape "
                             f"{tuple(a.shape)}, got {tuple(gamma.shape)} and "
                             f"{None if skip is None else tuple(skip.shape)}")
        if sum_out is not None and (skip is None or sum_out.shape != a.shape):
            raise ValueError("MatMulNBits with RMSNorm: sum_out needs a skip and a's shape")
    skip2 = skip.reshape(M, K).contiguous() if skip is not None else a2
    gamma1 = gamma.reshape(K).contiguous() if gamma is not None else a2
    sum2 = sum_out.view(M, K) if sum_out is not None else a2
    pair_tiles = pick_pair_tiles(M, N, K, block_size, sms, early_input)
    fp16_pairs_ = not interpret and (fp16_pairs(a) and pair_tiles is not None if pairs is None else pairs)
    if tiles is None:
        if fp16_pairs_:  # (a pair kernel asked for where it does not pay: the rule's tiles for narrow products)
            tiles = pair_tiles or pick_pair_tiles(M, max(N, 12), K, block_size, max(1, N // 12))
        else:
            tiles = pick_tiles(M, N, K, block_size, sms)
    block_m, block_n, block_k, num_warps = tiles
    if block_k % block_size or block_k & (block_k - 1) or block_n & (block_n - 1) or block_m & (block_m - 1):
        raise ValueError(f"tiles {tiles}: BLOCK_K must be a power-of-two multiple of block_size={block_size}, "
                         "BLOCK_M and BLOCK_N powers of two")
    grid = (cdiv(N, block_n), cdiv(M, block_m))
    if grid[1] > GRID_YZ_MAX:
        raise ValueError(f"MatMulNBits Triton kernel: M={M} rows need more than {GRID_YZ_MAX} programs along the "
                         "grid's second dimension; this kernel is for decode sizes, use the dequantize path")
    args = (a2, w2, s2, z2, bias1, y2, skip2, gamma1, sum2, M, N, K, n_blocks, row_words, a2.stride(0),
            z2.stride(0), y2.stride(0), skip2.stride(0), sum2.stride(0), 1.0 / K, float(eps))
    meta = {"BS": block_size, "ZP": zp_mode, "HAS_BIAS": bias is not None,
            "NORM": 0 if norm is None else 1 if skip is None else 2, "STORE_SUM": sum_out is not None,
            "BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, "CONST_W": const_w}
    if interpret:
        _matmul_nbits_kernel[grid](*args, **meta)
        return y
    kernel = _matmul_nbits_kernel
    if fp16_pairs_:  # one K step: the fused norm's statistics come from the step's tile, without a pass of their own
        kernel, meta["ONE_STEP"] = _matmul_nbits_f16x2_kernel, K <= block_k
    with torch.cuda.device(a.device) if a.device.type == "cuda" else contextlib.nullcontext():
        kernel[grid](*args, **meta, num_warps=num_warps, num_stages=2, **pdl(a))
    return y


#: the matrix-unit kernel's variants, for benchmarks/int4_batch.py's A/B (in-graph, rule's tiles, H200):
#:
#: * ``fast_dq``: the exponent-trick dequantization (else float32 arithmetic); it took the best swept tiles from
#:   10.2 to 9.0 us at Qwen2.5-0.5B's gate+up and 193 to 161 us at Llama-3.2-1B's lm_head, 8 rows
#:   (results/int4_batch_variants.md, where the weight tile as the dot's first operand and three pipeline stages
#:   moved the best times by -0.8 to +1 us either way: neither is kept);
#: * ``ptx_dq``: fp16 with zero points 8 or packed: the dequantization in PTX fp16 pairs (``_NIBBLE_DQ_PTX``);
#: * ``halves``: up to this BLOCK_M, two dots per K step (``_dequantize_halves``: the low nibbles' weights with the
#:   even K positions' activations, the high with the odd), so the weights are never interleaved in registers;
#: * ``a_ahead``: up to this BLOCK_M, each step's activations are requested a step ahead.
#:
#: As shipped they took 8 rows from 81.5 to 57.1 us at Qwen2.5-0.5B's lm_head and from 160.5 to 116.5 us at
#: Llama-3.2-1B's, its down projection from 16.0 to 12.1 us (results/int4_batch_variants2.md, the kernel before
#: them measured in the same call). With 64-row tiles the halves and the early activations were slower
#: (Llama-3.2-1B's lm_head 153.0 us with ``ptx_dq`` alone, 158.5 with halves, 191.5 with both): registers, not
#: instructions, bound those tiles.
DOT_OPTIONS = {"fast_dq": True, "ptx_dq": True, "halves": 16, "a_ahead": 16, "stages": 2}


def _dot_product(a2: torch.Tensor, b2: torch.Tensor, s2: torch.Tensor, z2: torch.Tensor, bias1: torch.Tensor,
                 has_bias: bool, y2: torch.Tensor, *, K: int, N: int, n_blocks: int, block_size: int, zp_mode: int,
                 tiles: tuple[int, ...], const_w: bool, interpret: bool) -> None:
    """``y2 [M, N] = a2 [M, K] @ dequantize(b2)^T (+ bias1)`` by ``_matmul_nbits_dot_kernel`` (``matmul_nbits``'
    operands: z2 and bias1 stand in with s2 where absent): one launch, or with K split the partial sums' float32
    workspace and ``crossml.kernels.gemv``'s reduction (bias and cast), which adds them in a fixed order (replays of a
    captured graph give the eager result bit for bit)."""
    from crossml.kernels.gemv import _k_per_split, _reduce_tiles, _split_k_reduce_kernel

    if len(tiles) != 5:
        raise ValueError(f"tiles {tiles}: the matrix-unit kernel takes (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, num_warps)")
    block_m, block_n, block_k, split, num_warps = tiles
    if block_k % block_size or block_k & (block_k - 1) or block_n & (block_n - 1) or block_m & (block_m - 1) \
            or min(block_m, block_n, block_k) < 16 or not 1 <= split <= _DOT_MAX_SPLIT:
        raise ValueError(f"tiles {tiles}: BLOCK_M, BLOCK_N and BLOCK_K must be powers of two >= 16, BLOCK_K a multiple "
                         f"of block_size={block_size}, SPLIT_K in [1, {_DOT_MAX_SPLIT}]")
    M = a2.shape[0]
    k_per_split = _k_per_split(K, split, block_k)
    split = cdiv(K, k_per_split)  # no empty splits
    grid = (cdiv(N, block_n), split, cdiv(M, block_m))
    if max(grid[1:]) > GRID_YZ_MAX:
        raise ValueError(f"MatMulNBits matrix-unit kernel: M={M} rows need more than {GRID_YZ_MAX} programs along "
                         "the grid's third dimension; use the dequantize path")
    out = y2 if split == 1 else torch.empty((split, M, N), dtype=torch.float32, device=a2.device)
    args = (a2, b2, s2, z2, bias1, out, M, N, K, n_blocks, b2.shape[1], k_per_split, a2.stride(0), z2.stride(0),
            out.stride(-2), M * N)
    meta = {"BS": block_size, "ZP": zp_mode, "HAS_BIAS": has_bias, "PARTIAL": split > 1, "BLOCK_M": block_m,
            "BLOCK_N": block_n, "BLOCK_K": block_k, "CONST_W": const_w, "FAST_DQ": DOT_OPTIONS["fast_dq"],
            "A_AHEAD": block_m <= DOT_OPTIONS["a_ahead"], "EVEN_K": K % block_k == 0,
            "HALVES": block_m <= DOT_OPTIONS["halves"] and (DOT_OPTIONS["fast_dq"] or DOT_OPTIONS["ptx_dq"])}
    if a2.dtype == torch.bfloat16:
        meta.update(MAGIC_BITS=0x4300, MAGIC=128.0)
    with torch.cuda.device(a2.device) if a2.device.type == "cuda" else contextlib.nullcontext():
        if interpret:  # Triton 3.6's interpreter computes bf16 dots wrongly (F32_DOT) and lacks bf16 constants
            bf16 = a2.dtype == torch.bfloat16
            _matmul_nbits_dot_kernel[grid](*args, **{**meta, "FAST_DQ": meta["FAST_DQ"] and not bf16,
                                                   "HALVES": meta["HALVES"] and not bf16}, F32_DOT=bf16)
        else:
            ptx = DOT_OPTIONS["ptx_dq"] and zp_mode != _ZP_FLOAT and fp16_pairs(a2)
            _matmul_nbits_dot_kernel[grid](*args, **meta, PTX_DQ=ptx, num_warps=num_warps,
                                           num_stages=DOT_OPTIONS["stages"], **pdl(a2))
        if split > 1:
            block_s, block, warps = _reduce_tiles(split)
            reduce_meta = {} if interpret else {"num_warps": warps, **pdl(a2)}
            _split_k_reduce_kernel[(cdiv(M * N, block),)](out, bias1, y2, M * N, N, split, HAS_BIAS=has_bias,
                                                           BLOCK_S=block_s, BLOCK=block, **reduce_meta)


#: CROSSML_INT4_FP16_PAIRS=0 keeps fp16 activations on the float32 path (for A/B measurements)
_FP16_PAIRS_ENABLED = os.environ.get("CROSSML_INT4_FP16_PAIRS", "1") != "0"


def fp16_pairs(a: torch.Tensor) -> bool:
    """Whether ``matmul_nbits`` of ``a`` takes the fp16-pair kernel (``_PAIR_DOT_PTX``): fp16 activations on an
    NVIDIA GPU of compute capability 8.0 or later (its PTX), outside the interpreter."""
    return _FP16_PAIRS_ENABLED and a.dtype == torch.float16 and nvidia_sm80(a)


#: dequantization tile: rows x columns per program (8192 values at 4 warps)
_DQ_BLOCK_N, _DQ_BLOCK_K = 32, 256


def dequantize(b: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None = None, *, K: int, N: int,
               block_size: int, dtype: torch.dtype) -> torch.Tensor:
    """MatMulNBits' 4-bit B as a dense [N, K] matrix of ``dtype`` in one Triton launch, equal bit for bit to
    ``crossml.ops.contrib.matmul_nbits.dequantize_nbits`` (which takes a dozen elementwise kernels and
    temporaries of the full matrix's size)."""
    if dtype not in _DTYPES:
        raise TypeError(f"MatMulNBits dequantization: dtype must be float16/bfloat16/float32, got {dtype}")
    n_blocks, zp_mode = _check_weight(b, scales, zero_points, K=K, N=N, block_size=block_size)
    others = [t for t in (scales, zero_points) if t is not None]
    if any(t.device != b.device for t in others):
        raise ValueError(f"MatMulNBits inputs are on different devices: {', '.join(str(t.device) for t in [b, *others])}")
    y = torch.empty((N, K), dtype=dtype, device=b.device)
    if y.numel() == 0:
        return y
    b2 = b.reshape(N, n_blocks * block_size // 2).contiguous()
    _run_dequantize("MatMulNBits", b2, scales, zero_points, y, None, rows=N, V=N, K=K, n_blocks=n_blocks,
                    block_size=block_size, zp_mode=zp_mode, block_n=_DQ_BLOCK_N)
    return y


def _run_dequantize(what: str, w2: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None,
                    y: torch.Tensor, idx: torch.Tensor | None, *, rows: int, V: int, K: int, n_blocks: int,
                    block_size: int, zp_mode: int, block_n: int) -> None:
    """Launch ``_dequantize_kernel`` for ``rows`` output rows of packed weight rows ``w2`` [V, row bytes] into
    ``y``: every row in order, or (``idx`` given) the gathered ones, which launch with PDL where available."""
    s2 = scales.reshape(V, n_blocks).contiguous()
    z2 = zero_points.reshape(V, -1).contiguous() if zero_points is not None else s2
    block_k = max(_DQ_BLOCK_K, block_size)
    grid = (cdiv(rows, block_n), cdiv(K, block_k))
    if grid[1] > GRID_YZ_MAX:
        raise ValueError(f"{what} dequantization: K={K} needs more than {GRID_YZ_MAX} column tiles")
    args = (w2, s2, z2, y, s2 if idx is None else idx, rows, K, n_blocks, w2.shape[1], z2.stride(0), V)
    meta = {"BS": block_size, "ZP": zp_mode, "BLOCK_N": block_n, "BLOCK_K": block_k, "GATHER": idx is not None}
    if use_interpreter(w2, what):
        _dequantize_kernel[grid](*args, **meta)
        return
    launch = pdl(w2) if idx is not None else {}
    with torch.cuda.device(w2.device) if w2.device.type == "cuda" else contextlib.nullcontext():
        _dequantize_kernel[grid](*args, **meta, num_warps=4, **launch)


def gather_rows(data: torch.Tensor, indices: torch.Tensor, scales: torch.Tensor,
                zero_points: torch.Tensor | None = None, *, block_size: int) -> torch.Tensor:
    """GatherBlockQuantized of 4-bit rows (gather_axis 0, quantize_axis 1) in one Triton launch:
    ``data`` uint8 [V, K / 2] (two values per byte, low nibble first), ``scales`` [V, ceil(K / block_size)],
    ``zero_points`` packed uint8 [V, >= ceil(n_blocks / 2)] or None (8) -> [*indices.shape, K] in the scales'
    dtype, each row ``(q - zero_point) * scale`` rounded once. Rows of indices outside [-V, V) are zeros.
    What an int4 model's embedding lookup runs at every decode step (the op's torch composition takes a dozen
    kernels)."""
    if data.dtype != torch.uint8 or data.dim() != 2:
        raise ValueError(f"GatherBlockQuantized kernel: data must be uint8 [V, K / 2], got {data.dtype} "
                         f"{tuple(data.shape)}")
    if scales.dtype not in _DTYPES:
        raise TypeError(f"GatherBlockQuantized kernel: scales must be float16/bfloat16/float32, got {scales.dtype}")
    if zero_points is not None and zero_points.dtype != torch.uint8:
        raise TypeError(f"GatherBlockQuantized kernel: zero_points must be packed uint8, got {zero_points.dtype}")
    if indices.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"GatherBlockQuantized kernel: indices must be int32/int64, got {indices.dtype}")
    V, row_bytes = data.shape
    K = row_bytes * 2
    n_blocks, zp_mode = _check_weight(data, scales, zero_points, K=K, N=V, block_size=block_size,
                                      whole_blocks=False)
    if any(t.device != data.device for t in (indices, scales, zero_points) if t is not None):
        raise ValueError("GatherBlockQuantized kernel: data, indices, scales and zero_points must share a device")
    y = torch.empty((*indices.shape, K), dtype=scales.dtype, device=data.device)
    rows = indices.numel()
    if y.numel() == 0:
        return y
    _run_dequantize("GatherBlockQuantized", data.contiguous(), scales, zero_points, y,
                    indices.reshape(rows).contiguous(), rows=rows, V=V, K=K, n_blocks=n_blocks, block_size=block_size,
                    zp_mode=zp_mode, block_n=min(_DQ_BLOCK_N, next_power_of_2(rows)))
    return y
