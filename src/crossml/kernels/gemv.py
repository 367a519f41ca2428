"""Triton GEMV for decode: ``y[M, N] = a[M, K] @ W[K, N] (+ bias)`` with few rows of ``a`` (M <= 16), alone or
with the RMSNorm that follows it and the SiLU gate before it.

LLM decode runs MatMuls with one activation row against constant weights ``W[K, N]`` (ONNX's layout is
row-major, N contiguous). That product is bound by reading W once; vendor GEMMs reach
about a third of the memory bandwidth on it, so the MatMul and Linear ops route it here on GPUs
(``crossml.ops.matmul.gemv_eligible`` says when).

Each program owns BLOCK_N output columns and walks its range of K in BLOCK_K steps, loading a
``[BLOCK_K, BLOCK_N]`` tile of W (rows contiguous along N, so the loads coalesce; each tile is
requested two steps before its use) and the matching BLOCK_K values of each row of ``a`` (requested one step
before their use: a load of activations written by the previous kernel, in L2, would otherwise cost each step a
round trip; on an H200 that took the GenAI benchmark's Llama-3.2-1B fp16 decode step from 0.918 to 0.890-0.899 ms
and Qwen2.5-0.5B's from 0.658 to 0.648 ms, back-to-back replays alternating with the old kernel on one
machine). Products accumulate elementwise in float32 tiles, one per row of ``a`` (BLOCK_M of 1, 2 or 4), reduced
over K once at the end. When the N slices alone are too few programs to fill the GPU (N = 896 on a
132-SM H100 is 14 slices), K is split across SPLIT_K programs as well: each writes its float32
partial sums to a ``[SPLIT_K, M, N]`` workspace and a second small kernel adds them in a fixed
order (deterministic: replays of a captured graph give the eager result bit for bit), adds the bias
and casts. Otherwise the one launch adds the bias and stores y in a's dtype.

``gemv_skip_norm`` is the product feeding the residual stream's RMSNorm (SkipSimplifiedLayerNormalization of
an LLM's attention output and MLP down projections): the GEMV always writes the float32 partial sums, and one
program per row adds them, rounds the product, adds the residual and normalizes, so the norm costs no launch of
its own. With ``silu_mul`` the GEMV computes the SiLU-gated activations of an MLP (``SiluMul`` of [g | up]) as it
loads them, so the gate costs no launch either. With ``silu_out`` (graph rule MatMulSiluMul, which takes the gate
first where the gate/up product is a MatMul) it is the gate/up product that gates: each program adds up the g and up
columns of its outputs (two W tiles a step) and stores their SiluMul, or where K is split the reduction gates the
[g | up] partial sums, so the product writes I values instead of 2I. That took the GenAI benchmark's Qwen2.5-0.5B
fp16 one-row decode from 1,651-1,652 to 1,672-1,675 tokens/s on an H100 and from 1,918 to 1,943-1,949 on an H200
(its batched rows +0.5-1.1 % on the H200, unchanged on the H100), Llama-3.2-1B's from 1,213-1,215 to 1,224-1,226 on
the H200 (results/gate_product.md). On an H200 the captured decode step of the GenAI benchmark's
Llama-3.2-1B fp16 model went from 0.976 to 0.934 ms and Qwen2.5-0.5B's from 0.741 to 0.678 ms with both
(back-to-back replays; the session's graph rules MatMulSkipNorm and SiluMulSkipNorm removed or kept, one
process). Per call, in CUDA graphs of calls on distinct weights (``benchmarks/gemv_tiles.py --fused``,
results/gemv_fused.md), product + norm took 5.7 against 6.3 us (GEMV, then the RMSNorm kernel) at Llama's o
projection and 12.7 against 13.7 at its down projection, 13.6 against 14.4 with the gate. Where K is not split
(wide N, which no residual-norm product has in these models) the forced workspace makes it slightly slower.
(A first version walked the row in chunks in its single program, slower than the two kernels: 8.9 against 6.2 us
at 2048x2048; the row's partial sums are now one tile.)

Measured in the GenAI benchmark's captured Llama-3.2-1B fp16 decode step on an H200 and dropped (back-to-back
replays, 0.911-0.913 ms before each): asking L2 for the rest of each program's W slice before the PDL wait
(``prefetch.global.L2``; 1.027 ms), a third W tile in flight (0.919-0.952), launching the skip-norm's dependents
only when it ends (0.935), combining the split decode attention in the output projection's activation loads
(1.085: each of the N slices redoes the combination), and leaving the skip-norm's normalization to the next
GEMV's loads from per-slice sums of squares (0.953; Qwen2.5-0.5B 0.659 -> 0.652). With column-major weights (below),
dropping the skip-norm launch altogether, each program of the next GEMV adding up the row's statistics from this
GEMV's partial sums, the bias and the residual before its first step (a graph rule fusing the norm's product and the
product after it; back-to-back replays alternated in one process): Llama-3.2-1B 0.854-0.857 -> 1.042-1.051 ms, 0.90
with only the qkv product fused; Qwen2.5-0.5B 0.575-0.591 -> 0.608-0.623 ms. Every program reading the same row
before its first step costs more than the launch.

W may also be stored column-major (its transpose contiguous), as GPU plans store half-precision decode weights
(``crossml.ops.matmul.column_major_weight``): a program's slice is then BLOCK_N contiguous runs along K, loaded as
``[BLOCK_N, BLOCK_K]`` tiles of 256-byte to 1 KB rows (``_colmajor_tiles``), so a qkv or o projection of K = 896
asks for its whole slice in the two tiles it requests before the PDL wait, and needs no split K. On an H200 the
captured decode step of the GenAI benchmark's Qwen2.5-0.5B fp16 model went from 0.647-0.648 to 0.577-0.590 ms
and Llama-3.2-1B's from 0.892-0.903 to 0.862-0.870 ms (``benchmarks/decode_replay.py --layouts rows,cols``, one
process, alternated; results/decode_layout.md). Its tile rule is the one measured fastest in that chain, not
alone: per product in a graph of like products, 8-column slices were as fast or faster (results/gemv_colmajor.md),
but in the decode step, where each kernel's early-launched programs share the SMs with the previous kernel's,
16-column slices (half the programs) took Llama's step from 0.913 to 0.853 ms.

Reading later products' weights ahead across the launch boundaries was measured on an H200 and dropped
(``benchmarks/weight_streaming.py``, results/weight_streaming.md). Each GEMV's programs asking L2 for the next product's
weights with bulk prefetches (``cp.async.bulk.prefetch.L2``, 16 KB each, before the PDL wait) took the Qwen2.5-0.5B
fp16 decode step from 0.58 to 1.67 ms (1.75 two products ahead, 3.15 both; back-to-back replays, one process). Alone,
a side-stream prefetch of a 16 MB buffer during another buffer's read made the pair slower (11.3 -> 14.1 us).
Computing an MLP's gate+up and down products in one launch, the down programs waiting on per-K-range counters of the
gate+up slices done, took 13.0-17.6 us per Qwen2.5-0.5B layer against 11.3 for this GEMV's two launches and the
skip-norm (Llama-3.2-1B: 31.6-44.2 against 28.4). A Gluon GEMV streaming each program's W rows into shared memory
with TMA copies (one instruction a [16, 256] box, every stage requested before the PDL wait, so a qkv, o or Qwen2.5-0.5B
gate+up program has its whole slice in flight while the kernel before it finishes) was level with this GEMV per
product and slower at Llama-3.2-1B's gate+up and down (more programs than fit at once); in the decode steps on an H100
no combination of products on it beat this kernel by more than the rounds' drift (Qwen2.5-0.5B fp16 0.603-0.607 ->
0.602-0.783 ms, Llama-3.2-1B 1.041-1.057 -> 1.049-1.246; its products' critical time fell 380.6 -> 353.6 us with K
split for the skip-norm products, whose norms then rose 47.5 -> 84.0 us). Commit b40eeb9 holds it and
results/decode_tma.md the runs.

One row times a column-major weight of many column blocks (a vocabulary product: an LLM's lm_head, routed here by
``crossml.ops.matmul.GEMV_STREAM``) runs the streaming kernel (``_stream_kernel``, ``stream_tiles``): STREAM_PROGRAMS
programs per SM, each walking the column blocks p, p + P, ... with the whole of K in one [BLOCK_N, BLOCK_K] tile
and the next block's tile in flight, so the loads stream without the gaps of programs ending and starting. After
the RMSNorm kernel, in CUDA graphs (``benchmarks/vocab_gemv.py``): Qwen2.5-0.5B's lm_head (896 x 151936) 90.5 us on
an H100 and 66.4 on an H200, against 88.9 / 73.9 for this GEMV's tiles and 93.4 / 65.8 for cuBLAS; Llama-3.2-1B's
(2048 x 128256) 170.2 / 121.1 against 170.9 / 134.1 and 182.9 / 124.7 (4 programs an SM, each block's tile requested
two blocks before its use; 2 or 8 programs, 16K-value tiles or 8 warps were as fast or slower, three blocks ahead up to
20 % slower).

From 2 rows of fp16 / bf16 activations (a batched decode step, beam search) the products run on the matrix units
instead (``_gemv_dot_kernel``, ``pick_dot_tiles``): one ``tl.dot`` of a 16-row tile of a with a 64- or 128-column
tile of W per K step, same outputs and partial sums (the skip-norm and the gate included); the per-row GEMV's
arithmetic and registers grow with the rows. At 4 rows the GenAI benchmark's fp16 decode went from 4,950 to 6,326
tokens/s (Qwen2.5-0.5B) and from 3,412 to 3,900 (Llama-3.2-1B) on an H200 (results/genai_batch.md); with 5 to 16
rows routed here too (they had gone to cuBLAS), Qwen2.5-0.5B's went from 8,767-8,785 to 11,316-11,347 at 8 rows
(results/genai_batch_fp16_rows.md; ``crossml.ops.matmul.GEMV_MAX_M`` and ``GEMV_BATCHED_MAX_WEIGHT`` say which
products come here). Large weights with N <= K (Llama-3.2-1B's down projection) take a Gluon kernel instead
(``crossml.kernels.gemv_mma``, ``mma_eligible``), which loads W straight into the matrix units' operand registers.

Tiles come from a fixed rule of (M, K, N, element size, SM count) (``pick_tiles``), not from
autotuning, which would time kernels during graph capture; the grid needs no host syncs and the
outputs come from ``torch.empty``, so a call can be captured into a CUDA graph. Under
TRITON_INTERPRET=1 the kernels run in Triton's interpreter (see ``_launch``).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from crossml.kernels._launch import (
    GRID_YZ_MAX,
    cdiv,
    dot_acc,
    gluon_kernels,
    next_power_of_2,
    on_device,
    pdl,
    pdl_wait,
    product_output,
    rule_processors,
    store_tile,
    use_interpreter,
)
from crossml.kernels.rmsnorm import _cast

__all__ = ["DOT_MIN_M", "DTYPES", "MMA_MAX_M", "MMA_MIN_M", "column_major", "gemv", "gemv_skip_norm", "mma_eligible",
           "pick_dot_tiles", "pick_tiles"]

#: storage types the kernel takes (float32 accumulation for all of them)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: rows of a one program handles (more rows are more programs along grid dimension 2)
MAX_BLOCK_M = 4
#: most K splits (the reduction kernel loads all of an output's partial sums at once)
MAX_SPLIT_K = 64
#: weight values one program holds per K step (BLOCK_K * BLOCK_N): 32 per thread at 4 warps
_TILE_ELEMS = 4096
#: widest N slice of one program
_MAX_BLOCK_N = 256


@triton.jit
def _raw(ptrs, mask, up_off, SILU_MUL: tl.constexpr):
    """The stored values a K step's activations are computed from (``_finish``): (x at ``ptrs``, up ``up_off``
    elements on with SILU_MUL, else x again)."""
    x = tl.load(ptrs, mask=mask, other=0.0)
    up = x
    if SILU_MUL:
        up = tl.load(ptrs + up_off, mask=mask, other=0.0)
    return x, up


@triton.jit
def _finish(x, up, SILU_MUL: tl.constexpr):
    """float32 activations from ``_raw``'s values: x, or with SILU_MUL the SiLU-gated product of the g values x
    and the up values, rounded to their storage type (as the SiluMul kernel stores it)."""
    if SILU_MUL:
        g = x.to(tl.float32)
        x = ((g * tl.sigmoid(g)) * up.to(tl.float32)).to(up.dtype)
    return x.to(tl.float32)


@triton.jit
def _w_tile(w_ptrs, k_ok, n_ok, COLMAJOR: tl.constexpr):
    """A W tile: [BLOCK_K, BLOCK_N] (rows along N contiguous), or [BLOCK_N, BLOCK_K] for a COLMAJOR W (rows along K
    contiguous); ``k_ok`` / ``n_ok`` mask its K and N positions."""
    if COLMAJOR:
        w = tl.load(w_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
    else:
        w = tl.load(w_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
    return w


@triton.jit
def _w_start(w_ptr, offs_n, offs_k, k_lo, s_wk, s_wn, COLMAJOR: tl.constexpr):
    """Pointers of a program's first W tile at K offset ``k_lo`` (``_w_tile``'s layout; 64-bit arithmetic: W may
    exceed 2**31 elements); they advance by whole tiles."""
    if COLMAJOR:
        w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * s_wn + (k_lo + offs_k)[None, :]
    else:
        w_ptrs = w_ptr + k_lo.to(tl.int64) * s_wk + offs_k[:, None] * s_wk + offs_n[None, :]
    return w_ptrs


@triton.jit
def _times(w, a, COLMAJOR: tl.constexpr):
    """float32 W tile (``_w_tile``) times a step's activations, broadcast along N."""
    if COLMAJOR:
        p = w * a[None, :]
    else:
        p = w * a[:, None]
    return p


@triton.jit
def _over_k(acc, COLMAJOR: tl.constexpr):
    """A program's products summed over K: its accumulator tile reduced along its K axis."""
    if COLMAJOR:
        y = tl.sum(acc, axis=1)
    else:
        y = tl.sum(acc, axis=0)
    return y


@triton.jit
def _gemv_kernel(a_ptr, w_ptr, bias_ptr, y_ptr, M, N, K, K_PER_SPLIT, s_am, s_ak, s_wk, s_wn, s_ym, s_ys, up_off,
                 HAS_BIAS: tl.constexpr, PARTIAL: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, CONST_W: tl.constexpr = False,
                 SILU_MUL: tl.constexpr = False, COLMAJOR: tl.constexpr = False, GATE_OUT: tl.constexpr = False,
                 w_up=0, PDL: tl.constexpr = False):
    """Columns [pid0 * BLOCK_N, +BLOCK_N) of rows [pid2 * BLOCK_M, +BLOCK_M), summed over K range pid1.

    PARTIAL: store the float32 sums to workspace slice pid1 (``y_ptr + pid1 * s_ys``), no bias;
    else add the bias and store in y's dtype.

    W is row-major (``s_wn`` = 1: each program's slice is BLOCK_N-wide runs of its K rows, loaded as [BLOCK_K,
    BLOCK_N] tiles) or, with COLMAJOR, column-major (``s_wk`` = 1, its transpose contiguous: the slice is BLOCK_N
    runs along K, loaded as [BLOCK_N, BLOCK_K] tiles whose rows are contiguous).

    PDL (see ``_launch.pdl``) with CONST_W (W a constant of the model, which no kernel writes): the first
    two W tiles are requested before waiting for the previous kernel, so they arrive while it finishes.

    SILU_MUL: each row of a holds [g | up] (up ``up_off`` elements after g) and the product's activations
    are ``(g * sigmoid(g)) * up`` rounded to a's dtype, as the SiluMul kernel stores them.

    GATE_OUT (BLOCK_M 1, not PARTIAL, no bias): W holds [Wg | Wu] (Wu's column n ``w_up`` elements after Wg's)
    and the program stores SiluMul of its g and up products, each rounded to y's dtype first (the merged gate/up
    product's output, then the SiluMul kernel's): column n of y is ``silu(a @ Wg[:, n]) * (a @ Wu[:, n])``.
    """
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    m0 = tl.program_id(2) * BLOCK_M
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_ok = offs_n < N
    k_lo = pid_k * K_PER_SPLIT
    k_hi = tl.minimum(K, k_lo + K_PER_SPLIT)

    w_ptrs = _w_start(w_ptr, offs_n, offs_k, k_lo, s_wk, s_wn, COLMAJOR)
    a_ptrs = a_ptr + m0.to(tl.int64) * s_am + (k_lo + offs_k) * s_ak
    ok1 = m0 + 1 < M
    ok2 = m0 + 2 < M
    ok3 = m0 + 3 < M
    if COLMAJOR:
        acc0 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    else:
        acc0 = tl.zeros((BLOCK_K, BLOCK_N), dtype=tl.float32)
    acc1 = acc0
    acc2 = acc0
    acc3 = acc0
    # W tiles are requested two steps ahead of their use (a register double buffer): while a
    # program waits for one tile, the next is in flight too (loops without tl.dot get no
    # num_stages pipelining from Triton)
    if not CONST_W:
        pdl_wait(PDL)
    w_cur = _w_tile(w_ptrs, k_lo + offs_k < k_hi, n_ok, COLMAJOR)
    u_cur = w_cur
    if GATE_OUT:
        u_cur = _w_tile(w_ptrs + w_up, k_lo + offs_k < k_hi, n_ok, COLMAJOR)
    w_ptrs += BLOCK_K * s_wk
    w_nxt = _w_tile(w_ptrs, k_lo + BLOCK_K + offs_k < k_hi, n_ok, COLMAJOR)
    u_nxt = w_nxt
    if GATE_OUT:
        u_nxt = _w_tile(w_ptrs + w_up, k_lo + BLOCK_K + offs_k < k_hi, n_ok, COLMAJOR)
    if CONST_W:
        pdl_wait(PDL)
    # each step's activations are requested a step ahead too (after the wait: the previous kernel writes them)
    k_ok = k_lo + offs_k < k_hi
    x0, u0 = _raw(a_ptrs, k_ok, up_off, SILU_MUL)
    x1, u1 = x0, u0
    x2, u2 = x0, u0
    x3, u3 = x0, u0
    if BLOCK_M > 1:
        x1, u1 = _raw(a_ptrs + s_am, k_ok & ok1, up_off, SILU_MUL)
    if BLOCK_M > 2:
        x2, u2 = _raw(a_ptrs + 2 * s_am, k_ok & ok2, up_off, SILU_MUL)
        x3, u3 = _raw(a_ptrs + 3 * s_am, k_ok & ok3, up_off, SILU_MUL)
    for k in range(k_lo, k_hi, BLOCK_K):
        w = w_cur.to(tl.float32)
        w_cur = w_nxt
        wu = u_cur.to(tl.float32)
        u_cur = u_nxt
        w_ptrs += BLOCK_K * s_wk
        w_nxt = _w_tile(w_ptrs, k + 2 * BLOCK_K + offs_k < k_hi, n_ok, COLMAJOR)
        if GATE_OUT:
            u_nxt = _w_tile(w_ptrs + w_up, k + 2 * BLOCK_K + offs_k < k_hi, n_ok, COLMAJOR)
        a_ptrs += BLOCK_K * s_ak
        k_ok = k + BLOCK_K + offs_k < k_hi
        a0 = _finish(x0, u0, SILU_MUL)
        x0, u0 = _raw(a_ptrs, k_ok, up_off, SILU_MUL)
        acc0 += _times(w, a0, COLMAJOR)
        if GATE_OUT:
            acc1 += _times(wu, a0, COLMAJOR)
        if BLOCK_M > 1:
            a1 = _finish(x1, u1, SILU_MUL)
            x1, u1 = _raw(a_ptrs + s_am, k_ok & ok1, up_off, SILU_MUL)
            acc1 += _times(w, a1, COLMAJOR)
        if BLOCK_M > 2:
            a2 = _finish(x2, u2, SILU_MUL)
            x2, u2 = _raw(a_ptrs + 2 * s_am, k_ok & ok2, up_off, SILU_MUL)
            acc2 += _times(w, a2, COLMAJOR)
            a3 = _finish(x3, u3, SILU_MUL)
            x3, u3 = _raw(a_ptrs + 3 * s_am, k_ok & ok3, up_off, SILU_MUL)
            acc3 += _times(w, a3, COLMAJOR)

    if PARTIAL:
        y_row = y_ptr + pid_k.to(tl.int64) * s_ys + m0.to(tl.int64) * s_ym + offs_n
        bias = 0.0
    else:
        y_row = y_ptr + m0.to(tl.int64) * s_ym + offs_n
        if HAS_BIAS:
            bias = tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(y_ptr.dtype.element_ty).to(tl.float32)
        else:
            bias = 0.0
    out_ty = y_ptr.dtype.element_ty
    if GATE_OUT:  # acc1 holds the up products
        g = _over_k(acc0, COLMAJOR).to(out_ty)
        tl.store(y_row, _finish(g, _over_k(acc1, COLMAJOR).to(out_ty), True).to(out_ty), mask=n_ok)
    else:
        tl.store(y_row, (_over_k(acc0, COLMAJOR) + bias).to(out_ty), mask=n_ok)
    if BLOCK_M > 1:
        tl.store(y_row + s_ym, (_over_k(acc1, COLMAJOR) + bias).to(out_ty), mask=n_ok & ok1)
    if BLOCK_M > 2:
        tl.store(y_row + 2 * s_ym, (_over_k(acc2, COLMAJOR) + bias).to(out_ty), mask=n_ok & ok2)
        tl.store(y_row + 3 * s_ym, (_over_k(acc3, COLMAJOR) + bias).to(out_ty), mask=n_ok & ok3)


@triton.jit
def _gemv_dot_kernel(a_ptr, w_ptr, bias_ptr, y_ptr, M, N, K, K_PER_SPLIT, s_am, s_ak, s_wk, s_wn, s_ym, s_ys, up_off,
                     HAS_BIAS: tl.constexpr, PARTIAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, CONST_W: tl.constexpr = False, SILU_MUL: tl.constexpr = False,
                     COLMAJOR: tl.constexpr = False, F32_DOT: tl.constexpr = False, GATE_OUT: tl.constexpr = False,
                     w_up=0, PDL: tl.constexpr = False):
    """``_gemv_kernel`` on the matrix units, for a few rows of a (a batched decode step, beam search): rows [pid2 *
    BLOCK_M, +BLOCK_M) (BLOCK_M >= 16, rows past M zeros) times columns [pid0 * BLOCK_N, +BLOCK_N) of W over K
    range pid1, one ``tl.dot`` per K step accumulating in float32; same arguments, outputs and PARTIAL workspace
    (GATE_OUT: a second dot with the up columns, and the SiluMul of the two stored).
    The W tile and the activations of the next step are requested before this step's product (and, with CONST_W,
    the first W tile before the PDL wait); with SILU_MUL each step's activations are gated as they are loaded.
    (Without the activations' early request, an MLP's gated down projection with its skip-norm at 2-4 rows took
    12.0 against 7.7-9.1 us for the per-row GEMV at Qwen2.5-0.5B's shape and 33.8 against 15.7-22.3 at
    Llama-3.2-1B's, in CUDA graphs on an H200; with it 7.0 and 17.9 us.)"""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = tl.program_id(2).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_ok = offs_n < N
    m_ok = rows < M
    k_lo = pid_k * K_PER_SPLIT
    k_hi = tl.minimum(K, k_lo + K_PER_SPLIT)
    w_ptrs = _w_start(w_ptr, offs_n, offs_k, k_lo, s_wk, s_wn, COLMAJOR)
    a_ptrs = a_ptr + rows[:, None] * s_am + (k_lo + offs_k)[None, :] * s_ak
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = acc
    if not CONST_W:
        pdl_wait(PDL)
    w_nxt = _w_tile(w_ptrs, k_lo + offs_k < k_hi, n_ok, COLMAJOR)
    u_nxt = w_nxt
    if GATE_OUT:
        u_nxt = _w_tile(w_ptrs + w_up, k_lo + offs_k < k_hi, n_ok, COLMAJOR)
    if CONST_W:
        pdl_wait(PDL)
    # each step's activations are requested a step ahead too (after the wait: the previous kernel writes them)
    x_nxt, up_nxt = _raw(a_ptrs, m_ok[:, None] & (k_lo + offs_k < k_hi)[None, :], up_off, SILU_MUL)
    for k in range(k_lo, k_hi, BLOCK_K):
        w = w_nxt
        wu = u_nxt
        w_ptrs += BLOCK_K * s_wk
        w_nxt = _w_tile(w_ptrs, k + BLOCK_K + offs_k < k_hi, n_ok, COLMAJOR)
        if GATE_OUT:
            u_nxt = _w_tile(w_ptrs + w_up, k + BLOCK_K + offs_k < k_hi, n_ok, COLMAJOR)
        x, up = x_nxt, up_nxt
        a_ptrs += BLOCK_K * s_ak
        x_nxt, up_nxt = _raw(a_ptrs, m_ok[:, None] & (k + BLOCK_K + offs_k < k_hi)[None, :], up_off, SILU_MUL)
        if SILU_MUL:
            g = x.to(tl.float32)
            x = ((g * tl.sigmoid(g)) * up.to(tl.float32)).to(up.dtype)
        if COLMAJOR:
            w = tl.trans(w)
            wu = tl.trans(wu)
        acc = dot_acc(x, w, acc, F32_DOT)
        if GATE_OUT:
            acc_up = dot_acc(x, wu, acc_up, F32_DOT)
    if GATE_OUT:
        out_ty = y_ptr.dtype.element_ty
        gated = _finish(acc.to(out_ty), acc_up.to(out_ty), True)
        store_tile(gated, bias_ptr, y_ptr, offs_n, rows, M, N, s_ym, False)
    else:
        store_tile(acc, bias_ptr, y_ptr, offs_n, rows, M, N, s_ym, HAS_BIAS, PARTIAL, pid_k, s_ys)


@triton.jit
def _stream_kernel(a_ptr, w_ptr, bias_ptr, y_ptr, N, K, s_wn, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, AHEAD: tl.constexpr, CONST_W: tl.constexpr = False,
                   PDL: tl.constexpr = False):
    """One row of a times a column-major W [K, N] (``s_wn`` between its columns), the whole of K in one tile:
    program p of P computes the column blocks p, p + P, p + 2P, ... (BLOCK_N columns each), requesting each block's
    [BLOCK_N, BLOCK_K] tile AHEAD (2 or 3) blocks before its use, so its loads stream without the gaps of programs
    ending and starting. With CONST_W the first AHEAD tiles are requested before the PDL wait."""
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK_N
    rn = tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    k_ok = rk[None, :] < K
    c0 = pid * BLOCK_N
    ptrs = w_ptr + (c0 + rn)[:, None].to(tl.int64) * s_wn + rk[None, :]
    jump = step.to(tl.int64) * s_wn
    if not CONST_W:
        pdl_wait(PDL)
    w0 = tl.load(ptrs, mask=(c0 + rn < N)[:, None] & k_ok, other=0.0)
    w1 = tl.load(ptrs + jump, mask=(c0 + step + rn < N)[:, None] & k_ok, other=0.0)
    w2 = w1
    if AHEAD > 2:
        w2 = tl.load(ptrs + 2 * jump, mask=(c0 + 2 * step + rn < N)[:, None] & k_ok, other=0.0)
    if CONST_W:
        pdl_wait(PDL)
    a = tl.load(a_ptr + rk, mask=rk < K, other=0.0).to(tl.float32)
    out_ty = y_ptr.dtype.element_ty
    for c in range(c0, N, step):
        w = w0.to(tl.float32)
        w0 = w1
        ptrs += jump
        if AHEAD > 2:
            w1 = w2
            w2 = tl.load(ptrs + 2 * jump, mask=(c + 3 * step + rn < N)[:, None] & k_ok, other=0.0)
        else:
            w1 = tl.load(ptrs + jump, mask=(c + 2 * step + rn < N)[:, None] & k_ok, other=0.0)
        cols = c + rn
        y = tl.sum(w * a[None, :], 1)
        if HAS_BIAS:
            y += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(out_ty).to(tl.float32)
        tl.store(y_ptr + cols, y.to(out_ty), mask=cols < N)


@triton.jit
def _sum_splits(p, stride, ok, n, BLOCK_S: tl.constexpr):
    """The float32 partial sums ``p[s * stride]`` of splits s < n (at most BLOCK_S; ``ok`` masks the values) added
    in split order: all loads issued at once, then one add per split, so every kernel that adds a workspace's
    partial sums gets the same values bit for bit, whatever its tile layout (a ``tl.sum`` over the split axis adds
    in an order that depends on the layout)."""
    total = tl.load(p, mask=ok, other=0.0)
    for s in tl.static_range(1, BLOCK_S):
        p += stride
        total += tl.load(p, mask=ok & (n > s), other=0.0)
    return total


@triton.jit
def _split_k_reduce_kernel(ws_ptr, bias_ptr, y_ptr, MN, N, SPLIT_K,
                           HAS_BIAS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK: tl.constexpr,
                           GATE_OUT: tl.constexpr = False, PDL: tl.constexpr = False):
    """y.flat[i] = sum_s ws[s].flat[i] (+ bias[i % N]) for BLOCK values of i, in y's dtype.

    GATE_OUT (no bias): the workspace holds [g | up] products, ``[SPLIT_K, M, 2N]``, and y [M, N] their SiluMul, each
    sum rounded to y's dtype first (as ``_gemv_kernel``'s GATE_OUT stores it)."""
    pdl_wait(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < MN
    out_ty = y_ptr.dtype.element_ty
    if GATE_OUT:
        at = offs + (offs // N) * N  # [m, n] of y at [m, n] of the [M, 2N] workspace slices
        g = _sum_splits(ws_ptr + at, 2 * MN, ok, SPLIT_K, BLOCK_S).to(out_ty)
        up = _sum_splits(ws_ptr + at + N, 2 * MN, ok, SPLIT_K, BLOCK_S).to(out_ty)
        tl.store(y_ptr + offs, _finish(g, up, True).to(out_ty), mask=ok)
    else:
        total = _sum_splits(ws_ptr + offs, MN, ok, SPLIT_K, BLOCK_S)
        if HAS_BIAS:
            total += tl.load(bias_ptr + offs % N, mask=ok, other=0.0).to(out_ty).to(tl.float32)
        tl.store(y_ptr + offs, total.to(out_ty), mask=ok)


@triton.jit
def _partial_row_sum(ws_ptr, bias_ptr, res, y_ptr, row, MN, c0, N, SPLIT_K, HAS_BIAS: tl.constexpr,
                     BLOCK_S: tl.constexpr, BLOCK: tl.constexpr, RTNE: tl.constexpr):
    """float32 ``res + p`` at columns [c0, c0 + BLOCK) of a row (``res`` the residual's values there), p = the row's
    partial sums added (+ bias) and rounded to y's dtype (the product's output), the residual first as the rmsnorm
    kernel adds them."""
    cols = c0 + tl.arange(0, BLOCK)
    ok = cols < N
    p = _sum_splits(ws_ptr + row + cols, MN, ok, SPLIT_K, BLOCK_S)
    if HAS_BIAS:
        p += tl.load(bias_ptr + cols, mask=ok, other=0.0).to(y_ptr.dtype.element_ty).to(tl.float32)
    p = _cast(p, y_ptr, RTNE).to(tl.float32)
    return res + p


@triton.jit
def _split_k_norm_kernel(ws_ptr, bias_ptr, res_ptr, g_ptr, y_ptr, sum_ptr, M, N, SPLIT_K, inv_n, eps,
                         HAS_BIAS: tl.constexpr, STORE_SUM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK: tl.constexpr,
                         SINGLE: tl.constexpr, RTNE: tl.constexpr, PDL: tl.constexpr = False):
    """Row m = program_id(0): p = sum_s ws[s, m] (+ bias) rounded to y's dtype, s = res[m] + p in float32 (the
    rmsnorm kernel's order), sum[m] = s in y's dtype, y[m] = s * rsqrt(mean(s²) + eps) * g.

    SINGLE: the row's partial sums are one [BLOCK_S, BLOCK] tile (one round of loads; a single program walking
    the row in chunks is bound by the latency of each chunk's loads and reductions), and the row's residual and
    gamma are loaded before the PDL wait: the kernel this one waits for is the GEMV that wrote the partial sums,
    launched just before it by ``gemv_skip_norm`` (or a torch kernel, which starts nothing early), so whatever wrote
    the residual had finished before that GEMV started. On an H200, with the decode attention's early reads
    (``crossml.kernels.decode_attention``), the GenAI benchmark's decode steps went from 0.575 to 0.547 ms
    (Qwen2.5-0.5B fp16) and from 0.852-0.853 to 0.813-0.814 ms (Llama-3.2-1B fp16) (``benchmarks/decode_replay.py``,
    the trees before and after alternated three times); this kernel's part alone, in an earlier A/B in one process,
    took Llama's from 0.859 to 0.841-0.844 ms. Otherwise the row is walked twice in
    BLOCK chunks, the first pass keeping s in float32 in the workspace's first slice (each chunk is read before it is
    overwritten, by this program only), the second reading it back."""
    m = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    row = m * N
    MN = M * N
    if SINGLE:
        ok = cols < N
        res = tl.load(res_ptr + row + cols, mask=ok, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        pdl_wait(PDL)
        s = _partial_row_sum(ws_ptr, bias_ptr, res, y_ptr, row, MN, 0, N, SPLIT_K, HAS_BIAS, BLOCK_S, BLOCK, RTNE)
        if STORE_SUM:
            tl.store(sum_ptr + row + cols, _cast(s, sum_ptr, RTNE), mask=ok)
        inv = tl.math.rsqrt(tl.sum(s * s, axis=0) * inv_n + eps)
        tl.store(y_ptr + row + cols, _cast(s * inv * g, y_ptr, RTNE), mask=ok)
    else:
        pdl_wait(PDL)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for c0 in range(0, N, BLOCK):
            ok = c0 + cols < N
            res = tl.load(res_ptr + row + c0 + cols, mask=ok, other=0.0).to(tl.float32)
            s = _partial_row_sum(ws_ptr, bias_ptr, res, y_ptr, row, MN, c0, N, SPLIT_K, HAS_BIAS, BLOCK_S, BLOCK,
                                 RTNE)
            if STORE_SUM:
                tl.store(sum_ptr + row + c0 + cols, _cast(s, sum_ptr, RTNE), mask=ok)
            tl.store(ws_ptr + row + c0 + cols, s, mask=ok)
            acc += s * s
        inv = tl.math.rsqrt(tl.sum(acc, axis=0) * inv_n + eps)
        tl.debug_barrier()  # the float32 sums stored above by other threads of this program
        for c0 in range(0, N, BLOCK):
            ok = c0 + cols < N
            s = tl.load(ws_ptr + row + c0 + cols, mask=ok, other=0.0)
            g = tl.load(g_ptr + c0 + cols, mask=ok, other=0.0).to(tl.float32)
            tl.store(y_ptr + row + c0 + cols, _cast(s * inv * g, y_ptr, RTNE), mask=ok)


#: the skip-norm kernel lets the next kernel launch before its own PDL wait (``crossml.kernels._launch.pdl``'s
#: ``early``): the next product's programs then request their first weight tiles while the GEMV before the norm still
#: runs. On an H200 (``benchmarks/decode_replay.py --variants cols,set:crossml.kernels.gemv.NORM_EARLY=False``,
#: results/norm_early.md run 1) the GenAI benchmark's Llama-3.2-1B fp16 decode step went from 0.811-0.812 to
#: 0.780-0.782 ms, on an H100 (run 3) from 1.039 to 0.997-0.998; Qwen2.5-0.5B's stayed within the rounds' drift
#: (0.504-0.517 either way on the H200, 0.581-0.595 on the H100). Letting the RMSNorm kernel, the GEMVs, the decode
#: attention or ``combine_product`` launch early gained nothing (the same file's sweep)
NORM_EARLY = True
#: most rows the skip-norm kernel launches early at: batched decode steps on an H200 (``benchmarks/genai_batch.py
#: --batches 4,16 --set crossml.kernels.gemv.NORM_EARLY=False``, two runs each way, results/norm_early_batch.md) went
#: 6,325-6,343 -> 6,232-6,277 tokens/s (Qwen2.5-0.5B fp16, 4 rows) and 21,982-22,027 -> 21,547 (16 rows) with it,
#: Llama-3.2-1B 4,316-4,319 -> 4,367-4,368 and 14,941-14,953 -> 15,111-15,126
NORM_EARLY_MAX_ROWS = 1
#: most float32 partial sums the skip-norm kernel holds at once (a whole row's when they fit: 32 per thread at 16
#: warps)
_NORM_TILE = 16384


def pick_tiles(M: int, K: int, N: int, elem_size: int, processors: int, *,
               colmajor: bool = False) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, num_warps) for a problem on a GPU of ``processors`` SMs.

    The GEMV is bandwidth-bound, so the rule aims for enough programs in flight to cover memory
    latency (about 4 per SM) with wide, coalesced rows of W: BLOCK_N is the largest power of two
    <= 256 leaving >= 4 programs per SM, but never narrower than 64 bytes per row (32 fp16 values: on an
    H200, 32-column tiles beat 64-column ones at every decode shape measured, as twice the programs);
    BLOCK_K fills a 4096-value tile (2048 for 3-4 rows of a, whose four float32 accumulators
    would crowd the registers). When the N slices are fewer than 2 per SM, K is split to reach
    about 3 programs per SM (at most 64 splits, each at least one BLOCK_K step; in the in-graph
    sweep of benchmarks/gemv_tiles.py, 2-3 programs per SM beat 4 at the split decode shapes).

    ``colmajor`` (W's transpose contiguous): ``_colmajor_tiles``.
    """
    if colmajor:
        return _colmajor_tiles(M, K, N, elem_size, processors)
    block_m = min(MAX_BLOCK_M, next_power_of_2(max(M, 1)))
    min_n = max(16, 64 // elem_size)
    block_n = _MAX_BLOCK_N
    while block_n > min_n and cdiv(N, block_n) < 4 * processors:
        block_n //= 2
    block_n = min(block_n, max(16, next_power_of_2(max(N, 1))))
    tile = _TILE_ELEMS if block_m <= 2 else _TILE_ELEMS // 2
    block_k = max(8, min(tile // block_n, next_power_of_2(max(K, 1))))
    n_prog = cdiv(N, block_n)
    split = 1
    if n_prog < 2 * processors:
        split = max(1, min(cdiv(3 * processors, n_prog), cdiv(K, block_k), MAX_SPLIT_K))
        split = cdiv(K, _k_per_split(K, split, block_k))
    num_warps = max(1, min(4, block_n * block_k // 256))
    return block_m, block_n, block_k, split, num_warps


#: fewest rows of a that take the matrix-unit kernel (``_gemv_dot_kernel``) rather than the per-row GEMV
DOT_MIN_M = 2


def _dot_rows(M: int, dtype: torch.dtype) -> bool:
    """Whether M rows of ``dtype`` take the matrix-unit kernel when no tiles are given: DOT_MIN_M rows or more, fp16
    or bf16 (fp32 keeps the GEMV: the matrix units would round it to tf32)."""
    return M >= DOT_MIN_M and dtype != torch.float32


def pick_dot_tiles(M: int, K: int, N: int, elem_size: int, processors: int, *,
                   colmajor: bool = False) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, num_warps) of the matrix-unit kernel: 16-row tiles of a (64 past 16
    rows), 64 columns (128 where N has 96 or more per SM) by 64 values of K a step, four warps, K split (whole
    steps, at most MAX_SPLIT_K ranges) until there are about four programs per SM. (Row-major or column-major W
    alike.)

    From the in-graph sweep at Qwen2.5-0.5B's and Llama-3.2-1B's decode shapes, 4 rows, column-major fp16 weights,
    on an H200 (``benchmarks/int4_batch.py --fp16``, results/int4_batch.md): 64 x 64 tiles split that way were the
    fastest or within 0.2 us of it but at Llama-3.2-1B's gate+up (N = 16384: 19.7 against 24.5 us with 128
    columns). With 64 columns everywhere, per layer the products took 17.4 against 20.8 us for the 2-row GEMV and
    17.3 against 23.7 for the 4-row one (Qwen2.5-0.5B), 45.8 against 50.2 and 46.2 against 56.1 (Llama-3.2-1B); at
    2 rows the GEMV's qkv and o products stay 0.3-0.6 us faster, its gate+up and down 2-4 us slower."""
    block_m = 16 if M <= 16 else 64
    block_n = 128 if N >= 96 * processors else 64
    block_k = max(16, min(64, next_power_of_2(max(K, 1))))
    n_prog = cdiv(N, block_n) * cdiv(M, block_m)
    split = 1
    if n_prog < 4 * processors:
        split = max(1, min(cdiv(4 * processors, n_prog), cdiv(K, block_k), MAX_SPLIT_K))
        split = cdiv(K, _k_per_split(K, split, block_k))
    return block_m, block_n, block_k, split, 4


#: rows of a whose products of weights of at least MMA_MIN_WEIGHT values take the Gluon kernel
#: (``crossml.kernels.gemv_mma``) where it applies (``mma_eligible``); MMA_MAX_M = 0 keeps them on
#: ``_gemv_dot_kernel`` (and ``crossml.ops.matmul`` then leaves the ones past its batched limit to cuBLAS).
#:
#: In CUDA graphs of like products (``benchmarks/gemv_mma.py``, results/gemv_mma_h200.md) the kernel read Llama-3.2-1B's
#: down projection (2048 x 8192) at 2-16 rows in 11.2-12.6 us against 11.4-11.8 for ``_gemv_dot_kernel`` and 12.9-13.3
#: for cuBLAS on an H200, and with the SiLU gate and the skip-norm in 14.6-15.4 against 17.9-19.0 on
#: ``_gemv_dot_kernel`` (cuBLAS needs the two kernels around it); at the products below the limit it trailed
#: ``_gemv_dot_kernel`` from 4 rows (Llama-3.2-1B's qkv and o by 0.6-1.3 us, Qwen2.5-0.5B's by 0-0.2, its gate+up by
#: 0.8-1.6 and down by 0.6-1.2), and at the wide ones cuBLAS led (Llama-3.2-1B's gate+up 18.8-19.4 us against
#: 20.3-22.6). In the GenAI benchmark that took Llama-3.2-1B's fp16 decode at B = 2 / 4 / 8 / 16 from 1,728 / 3,432 /
#: 6,409 / 11,980 to 1,781 / 3,526 / 6,608 / 12,380 tokens/s on an H100 and from 2,120 / 4,244 / 7,897 / 14,917 to 2,204
#: / 4,375 / 8,189 / 15,337 on an H200 (results/genai_batch_fp16_mma.md).
MMA_MIN_M, MMA_MAX_M = 2, 16
MMA_MIN_WEIGHT = 10_000_000
#: a SiLU-gated product on the Gluon kernel gates its rows in a launch of their own
#: (``crossml.kernels.swiglu.silu_mul_packed``) rather than in its loads (False), where each warp of each of the N /
#: BLOCK_N programs would gate the same rows again: Llama-3.2-1B's down projection with its skip-norm at 2-16 rows took
#: 14.6-15.4 against 15.0-18.8 us on an H200 and 16.9-17.9 against 16.9-21.0 on an H100 (results/gemv_mma_h200.json,
#: gemv_mma.json). (On ``_gemv_dot_kernel``, gating first took Qwen2.5-0.5B's fp16 decode at B = 2-16 from 3,179-3,183 /
#: 6,283 / 12,272-12,277 / 21,365-21,381 to 3,196-3,201 / 6,340-6,341 / 12,211-12,278 / 21,514-21,516 tokens/s on an
#: H200 but from 2,845-2,853 / 5,626-5,655 / 10,243-10,274 / 19,111-19,220 to 2,826-2,832 / 5,607-5,616 / 10,058-10,105
#: / 19,140-19,190 on an H100, so that kernel gates in its loads.)
MMA_GATE_FIRST = True


def _mma_kernels():
    """``crossml.kernels.gemv_mma``, or None without the Gluon of Triton 3.6 (``_launch.gluon_kernels``)."""
    return gluon_kernels("gemv_mma")


def mma_eligible(a: torch.Tensor, w: torch.Tensor, M: int) -> bool:
    """Whether the matrix-unit product of M rows of ``a`` with ``w`` [K, N] runs the Gluon kernel: MMA_MIN_M to
    MMA_MAX_M rows, K * N of at least MMA_MIN_WEIGHT and ``crossml.kernels.gemv_mma.supported`` (fp16 / bf16 on an
    NVIDIA GPU of compute capability 8.0+, W column-major with K a multiple of 128, 16-byte aligned rows)."""
    if not MMA_MIN_M <= M <= MMA_MAX_M or a.device.type != "cuda" or a.dtype not in (torch.float16, torch.bfloat16) \
            or w.dim() != 2 or w.shape[0] * w.shape[1] < MMA_MIN_WEIGHT:
        return False
    kernels = _mma_kernels()
    return kernels is not None and kernels.supported(a, w, M)


def _takes_mma(a2: torch.Tensor, w: torch.Tensor, tiles: tuple[int, int, int, int, int] | None,
               mma: bool | None) -> bool:
    """Whether ``_products`` runs the Gluon kernel: ``mma`` when given, else with no tiles given where
    ``mma_eligible`` holds for a's rows."""
    if mma is not None:
        return mma
    M = a2.shape[0]
    return tiles is None and _dot_rows(M, a2.dtype) and mma_eligible(a2, w, M)


def _mma_tiles(M: int, K: int, N: int, processors: int, norm: bool) -> tuple[int, int, int, int, int]:
    """(16, BLOCK_N, 128, SPLIT_K, warps) of the Gluon kernel (``gemv_mma.pick_tiles``); for a skip-norm's product
    (``norm``) at most as many K splits as ``_norm_dot_tiles`` allows."""
    kernels = _mma_kernels()
    block_n, warps, split = kernels.pick_tiles(M, K, N, processors)
    if norm:
        split = min(split, _norm_split_cap(N))
    return 16, block_n, kernels.BLOCK_K, split, warps


def _colmajor_tiles(M: int, K: int, N: int, elem_size: int, processors: int) -> tuple[int, int, int, int, int]:
    """``pick_tiles`` for a column-major W, whose programs read BLOCK_N contiguous runs of BLOCK_K values.

    - Slices of 16 columns (8 for 3-4 rows) with 1 KB runs (512 fp16 values) and 8 warps, twice the usual tile, so
      a K range of one or two tiles is requested whole before the PDL wait (a qkv or o projection); for 3-4 rows,
      4 warps and 512-byte runs (the register budget of 4 rows).
    - Where 8-column slices would exceed 4 programs per SM (an MLP's gate+up), slices of 8 columns with 256-byte
      runs, of 16 columns with 512-byte runs past 10 programs per SM; with 3-4 rows, 32-column slices of 128-byte
      runs. (Llama-3.2-1B's gate+up, 2048 slices of 8 columns: 512-byte runs instead of 256 took its fp16 decode
      step from 1.042 / 1.060 / 1.060 and 1.059 / 1.063 / 1.058 ms to 1.036 / 1.052 / 1.050 and 1.054 / 1.051 /
      1.050 on an H100, in two runs; at Qwen2.5-0.5B's, 1216 slices, 8- or 16-column slices of 512-byte runs were
      slower, 0.605-0.632 -> 0.649-0.687 ms.) Past 64 programs per SM (a vocabulary product, which one row streams
      instead, ``_stream_kernel``; these tiles serve it with STREAM off or several rows), 16-column slices of 1 KB
      runs at 8 warps: with ``crossml.ops.matmul.GEMV_MAX_WEIGHT`` lifted, Llama-3.2-1B's fp16 decode step
      1.047-1.049 -> 1.043-1.047 ms and Qwen2.5-0.5B's 0.612 / 0.636 / 0.635 -> 0.604 / 0.629 / 0.629 on an H100,
      against 8-column 512-byte runs at 4 warps 1.045-1.046 and 0.606 / 0.632 / 0.630, and 32-column 512-byte runs
      1.049-1.052 and 0.618 / 0.644 / 0.643; on an H200 32- or 64-column slices and 2 KB runs were slower still.
    - Where 8-column slices are fewer than 2 per SM and one would walk more than 4 of its 1 KB tiles (a down
      projection), 512-byte runs with K split in 4 ranges; but where they are fewer than the SMs (Qwen2.5-0.5B's
      down projection, N = 896), with 1-2 rows, 8-column slices of 2 KB runs, 8 warps and K split in 2 ranges: as
      many programs, each asking for twice the bytes a step, and half the partial sums for the skip-norm to add.
      That took the Qwen2.5-0.5B fp16 decode step from 0.629 / 0.652 / 0.652 to 0.607 / 0.632 / 0.631 ms on an H100
      and from 0.545 / 0.570 / 0.568 to 0.522 / 0.547 / 0.547 ms on an H200 (``decode_replay.py --variants`` with
      the tiles forced, three alternated rounds; results/decode_tiles.md). At Llama-3.2-1B's down projection (256
      slices of 8 columns) the same tiles were slower (0.824-0.827 -> 0.850-0.853 ms on an H200), and so was or
      tied every other variant tried (K whole or split in 2, 4 or 8; 4- to 16-column slices; 512-byte to 4 KB runs:
      1.061-1.063 -> 1.073-1.102 ms and 1.040-1.053 -> 1.043-1.096 on an H100, 0.829-0.832 -> 0.825-0.927 on an
      H200); at Qwen2.5-0.5B's qkv and o projections 8- or 4-column slices, and at its gate+up 1-2 KB runs, were
      slower too (0.607-0.632 -> 0.625-0.706 ms on an H100).

    Measured on an H200 in the GenAI benchmark's captured decode steps (benchmarks/decode_replay.py, the module
    docstring) and per product in CUDA graphs (benchmarks/gemv_tiles.py --colmajor, results/gemv_colmajor.md)."""
    block_m = min(MAX_BLOCK_M, next_power_of_2(max(M, 1)))
    tile = _TILE_ELEMS if block_m <= 2 else _TILE_ELEMS // 2
    block_n, run, num_warps, split = 16 if block_m <= 2 else 8, 1024, 4, 1
    n_prog = cdiv(N, 8)
    if n_prog > 4 * processors:
        block_n, run = 8, 256
        if block_m > 2:
            block_n, run = 32, 128
        elif n_prog > 64 * processors:
            block_n, run, num_warps, tile = 16, 1024, 8, 2 * tile
        elif n_prog > 10 * processors:
            block_n, run = 16, 512
    elif n_prog < processors and block_m <= 2 and cdiv(K, run // elem_size) > 4:
        block_n, run, split, num_warps, tile = 8, 2048, 2, 8, 2 * tile
    elif n_prog < 2 * processors and cdiv(K, run // elem_size) > 4:
        run, split = 512, 4
    elif block_m <= 2:
        num_warps, tile = 8, 2 * tile
    block_k = max(16, min(run // elem_size, tile // block_n, next_power_of_2(max(K, 1))))
    if split > 1:
        split = cdiv(K, _k_per_split(K, min(split, cdiv(K, block_k)), block_k))
    return block_m, block_n, block_k, split, num_warps


def _k_per_split(K: int, split: int, block_k: int) -> int:
    """K values per split: a whole number of BLOCK_K steps."""
    return cdiv(cdiv(K, split), block_k) * block_k


def column_major(w: torch.Tensor) -> bool:
    """Whether the GEMV reads 2-D ``w`` [K, N] as column-major: its transpose contiguous, itself not (a plan's packed
    decode weight, ``crossml.ops.matmul.column_major_weight``)."""
    return w.dim() == 2 and not w.is_contiguous() and w.t().is_contiguous()


def _check(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, silu_mul: bool) -> tuple[int, int]:
    """(K, N) of ``a @ w (+ bias)`` (with ``silu_mul``, of ``SiluMul(a) @ w``: a holds 2K values per row), or
    the error naming what the kernel does not take."""
    if a.dtype not in DTYPES or w.dtype != a.dtype:
        raise TypeError(f"GEMV Triton kernel: a and w must share one of float16/bfloat16/float32, got {a.dtype} "
                        f"and {w.dtype}")
    if w.dim() != 2 or not (w.is_contiguous() or w.t().is_contiguous()):
        raise ValueError(f"GEMV Triton kernel: w must be a [K, N] matrix stored contiguous or column-major (its "
                         f"transpose contiguous), got shape {tuple(w.shape)} strides {w.stride()}")
    if a.dim() == 0 or a.shape[-1] != w.shape[0] * (2 if silu_mul else 1):
        what = f"2K={2 * w.shape[0]} ([g | up] for silu_mul)" if silu_mul else f"K={w.shape[0]}"
        raise ValueError(f"GEMV: a's last dimension must be {what}, got shape {tuple(a.shape)}")
    K, N = w.shape
    if bias is not None and (not bias.is_floating_point() or bias.numel() != N):
        raise ValueError(f"GEMV: bias must be N={N} floats, got {bias.dtype} of shape {tuple(bias.shape)}")
    if any(t.device != a.device for t in (w, bias) if t is not None):
        raise ValueError(f"GEMV inputs are on different devices: a on {a.device}, w on {w.device}"
                         + ("" if bias is None else f", bias on {bias.device}"))
    return K, N


def _products(a2: torch.Tensor, w: torch.Tensor, bias1: torch.Tensor, has_bias: bool, y2: torch.Tensor | None,
              tiles: tuple[int, int, int, int, int] | None, const_w: bool, silu_mul: bool,
              interpret: bool, mma: bool | None = None, norm: bool = False,
              gate_out: bool = False) -> torch.Tensor | None:
    """The GEMV launch of ``a2 [M, K] @ w`` (``a2 [M, 2K]`` with ``silu_mul``): into ``y2 [M, N]`` (bias added)
    when K is not split, else the float32 ``[SPLIT_K, M, N]`` workspace of partial sums it returns (no bias; so
    also when ``y2`` is None). From DOT_MIN_M rows the matrix-unit kernel (``_gemv_dot_kernel``, tiles of
    ``pick_dot_tiles``; tiles with BLOCK_M >= 16 ask for it), or where ``mma_eligible`` holds (``mma`` None and no
    tiles given) or ``mma`` is True, the Gluon kernel (``_mma_product``; ``norm``: the skip-norm's product).

    ``gate_out`` (no bias, no ``silu_mul``): w is [K, 2I], [Wg | Wu], and ``y2`` [M, I] receives SiluMul of the two
    products where the tiles of the [K, I] product (``tiles``, or the rule's) split no K and, on the per-row GEMV,
    take one row a program; else the workspace returned holds the [M, 2I] product's partial sums (at its own rule's
    tiles), for the reduction to gate."""
    M = a2.shape[0]
    K, N = w.shape
    if gate_out:
        N //= 2
    elif _takes_mma(a2, w, tiles, mma):
        return _mma_product(a2, w, bias1, has_bias, y2, tiles, const_w, silu_mul, norm)
    colmajor = column_major(w)
    pick = pick_dot_tiles if _dot_rows(M, a2.dtype) else pick_tiles
    if tiles is None:
        tiles = pick(M, K, N, a2.element_size(), rule_processors(a2), colmajor=colmajor)
    if gate_out and (tiles[3] > 1 or 1 < tiles[0] < 16 or y2 is None):
        # the [M, 2I] product's partial sums at its own tiles; the reduction gates them
        N, gate_out, y2 = 2 * N, False, None
        tiles = pick(M, K, N, a2.element_size(), rule_processors(a2), colmajor=colmajor)
    block_m, block_n, block_k, split, num_warps = tiles
    dot = block_m >= 16
    if (block_m not in (1, 2, 4) and not dot) or block_n & (block_n - 1) or block_k & (block_k - 1) \
            or block_m & (block_m - 1) or not 1 <= split <= MAX_SPLIT_K or dot and min(block_n, block_k) < 16:
        raise ValueError(f"tiles {tiles}: BLOCK_M must be 1, 2 or 4 (the GEMV) or a power of two >= 16 (the "
                         f"matrix-unit kernel, with BLOCK_N and BLOCK_K >= 16), BLOCK_N and BLOCK_K powers of two, "
                         f"SPLIT_K in [1, {MAX_SPLIT_K}]")
    k_per_split = _k_per_split(K, split, block_k)
    split = cdiv(K, k_per_split)  # no empty splits
    grid = (cdiv(N, block_n), split, cdiv(M, block_m))
    if grid[2] > GRID_YZ_MAX:
        raise ValueError(f"GEMV Triton kernel: M={M} rows need more than {GRID_YZ_MAX} programs along the grid's "
                         "third dimension; this kernel is for decode sizes, use torch.matmul")
    compiled = {} if interpret else {"num_warps": num_warps, "num_stages": 2, **pdl(a2)}
    meta = {"HAS_BIAS": has_bias, "BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, "CONST_W": const_w,
            "SILU_MUL": silu_mul, "COLMAJOR": colmajor}
    if gate_out:  # the up columns start N columns after the gate's
        meta.update(GATE_OUT=True, w_up=N * (w.stride(1) if colmajor else 1))
    kernel = _gemv_kernel
    if dot:
        kernel = _gemv_dot_kernel
        # float32 products in IEEE float32 (not tf32); Triton 3.6's interpreter computes bf16 dots wrongly
        meta["F32_DOT"] = a2.dtype == torch.float32 or (interpret and a2.dtype == torch.bfloat16)
    up_off = K * a2.stride(1)
    s_wk, s_wn = (1, w.stride(1)) if colmajor else (w.stride(0), 1)
    if split == 1 and y2 is not None:
        kernel[grid](a2, w, bias1, y2, M, N, K, k_per_split, a2.stride(0), a2.stride(1), s_wk, s_wn,
                     y2.stride(0), 0, up_off, PARTIAL=False, **meta, **compiled)
        return None
    ws = torch.empty((split, M, N), dtype=torch.float32, device=a2.device)
    kernel[grid](a2, w, bias1, ws, M, N, K, k_per_split, a2.stride(0), a2.stride(1), s_wk, s_wn,
                 N, M * N, up_off, PARTIAL=True, **meta, **compiled)
    return ws


def _mma_product(a2: torch.Tensor, w: torch.Tensor, bias1: torch.Tensor, has_bias: bool, y2: torch.Tensor | None,
                 tiles: tuple[int, int, int, int, int] | None, const_w: bool, silu_mul: bool,
                 norm: bool) -> torch.Tensor | None:
    """``_products`` on the Gluon kernel (``crossml.kernels.gemv_mma``): tiles (16, BLOCK_N, 128, SPLIT_K, warps),
    ``_mma_tiles`` when None."""
    M = a2.shape[0]
    K, N = w.shape
    kernels = _mma_kernels()
    if kernels is None or not kernels.supported(a2, w, M):
        raise ValueError(f"GEMV mma kernel: takes 1 to 16 rows of float16/bfloat16 a on an NVIDIA GPU of compute "
                         f"capability 8.0+ with Gluon (Triton 3.6), w of a's dtype stored column-major with K a "
                         f"multiple of 128 and 16-byte aligned rows; got M={M}, a {a2.dtype} on {a2.device}, w "
                         f"{w.dtype} of shape {tuple(w.shape)} strides {w.stride()}")
    if tiles is None:
        tiles = _mma_tiles(M, K, N, rule_processors(a2), norm)
    block_m, block_n, block_k, split, warps = tiles
    if block_m != 16 or block_k != kernels.BLOCK_K or not 1 <= split <= MAX_SPLIT_K:
        raise ValueError(f"GEMV mma kernel: tiles {tiles} must be (16, BLOCK_N, {kernels.BLOCK_K}, SPLIT_K in "
                         f"[1, {MAX_SPLIT_K}], warps)")
    k_per_split = _k_per_split(K, min(split, K // block_k), block_k)
    split = cdiv(K, k_per_split)  # no empty splits
    if silu_mul and MMA_GATE_FIRST:  # the rows' SiluMul in one launch
        from crossml.kernels.swiglu import silu_mul_packed

        a2, silu_mul = silu_mul_packed(a2), False
    partial = split > 1 or y2 is None
    out = torch.empty((split, M, N), dtype=torch.float32, device=a2.device) if partial else y2
    kernels.launch(a2, w, bias1, out, k_per_split=k_per_split, split=split, block_n=block_n, warps=warps,
                   has_bias=has_bias, partial=partial, const_w=const_w, silu_mul=silu_mul, pdl=pdl(a2))
    return out if partial else None


#: the streaming kernel (``_stream_kernel``) for one-row products of column-major weights with at least
#: STREAM_MIN_BLOCKS column blocks per program (vocabulary products; ``crossml.ops.matmul.GEMV_STREAM`` routes them
#: here); False: the GEMV's tiles
STREAM = True
#: weight values of one streaming tile (BLOCK_N columns x the whole of K, padded to a power of two)
STREAM_TILE = 8192
#: streaming programs per SM, tiles requested ahead, warps a program
STREAM_PROGRAMS, STREAM_AHEAD, STREAM_WARPS = 4, 2, 4
STREAM_MIN_BLOCKS = 8


def stream_tiles(M: int, K: int, N: int, processors: int) -> tuple[int, int, int] | None:
    """(BLOCK_N, BLOCK_K, programs) of the streaming kernel for one row times a column-major [K, N] weight, or None
    where it does not apply (STREAM off, several rows, K past STREAM_TILE / 2, or too few column blocks)."""
    block_k = next_power_of_2(max(K, 16))
    if not STREAM or M != 1 or 2 * block_k > STREAM_TILE:
        return None
    block_n = STREAM_TILE // block_k
    programs = STREAM_PROGRAMS * processors
    if cdiv(N, block_n) < STREAM_MIN_BLOCKS * programs:
        return None
    return block_n, block_k, programs


def _reduce_tiles(split: int) -> tuple[int, int, int]:
    """(BLOCK_S, BLOCK, num_warps) of the kernels that add ``split`` partial sums: one [BLOCK_S, BLOCK] tile
    of float32 partial sums per step."""
    block_s = next_power_of_2(split)
    block = max(32, min(1024, _TILE_ELEMS // block_s))
    return block_s, block, 4 if block_s * block >= 1024 else 1


def gemv(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, *,
         tiles: tuple[int, int, int, int, int] | None = None, const_w: bool = False,
         silu_mul: bool = False, mma: bool | None = None, silu_out: bool = False) -> torch.Tensor:
    """``a @ w (+ bias)`` for ``a`` [..., K] and a contiguous ``w`` [K, N] -> [..., N] in a's dtype.

    Meant for decode sizes (prod of a's leading dims M of 1 to 16, ``crossml.ops.matmul.GEMV_MAX_M``; from 2 rows
    the matrix-unit kernel, which re-reads W once per 16 rows, or 64 past 16). One launch, or two when K is split (see
    the module docstring). ``tiles``
    (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, num_warps) overrides ``pick_tiles`` / ``pick_dot_tiles`` (tests): BLOCK_M
    one of 1, 2, 4 (the GEMV) or a power of two >= 16 (the matrix-unit kernel, BLOCK_N and BLOCK_K then >= 16),
    BLOCK_N and BLOCK_K powers of two, SPLIT_K in [1, 64]. ``const_w``: ``w`` is a constant of
    the model that no kernel writes (an initializer), so with programmatic dependent launch its first
    tiles are read while the previous kernel finishes. ``silu_mul``: ``a`` is [..., 2K], [g | up] along its last
    axis, and the product is ``SiluMul(a) @ w`` with the activations rounded to a's dtype (the SiluMul op's
    output), computed as the GEMV loads them. ``mma``: True forces the Gluon kernel (``crossml.kernels.gemv_mma``;
    tiles then (16, BLOCK_N, 128, SPLIT_K, warps)), False keeps it off, None takes it where ``mma_eligible`` holds
    and no tiles are given. ``silu_out``: ``w`` is [K, 2I], the merged gate/up weight [Wg | Wu], and the result
    [..., I] is ``SiluMul(a @ w)`` (the products rounded to a's dtype, then gated as the SiluMul kernel gates them),
    stored by the GEMV (or by its split-K reduction) instead of the [..., 2I] product; ``tiles`` are then those of the
    [K, I] product, and neither a bias nor ``silu_mul`` is taken.
    """
    K, N = _check(a, w, bias, silu_mul)
    if silu_out:
        if bias is not None or silu_mul or N % 2:
            raise ValueError(f"GEMV silu_out: w must hold [Wg | Wu], an even number of columns, without a bias or "
                             f"silu_mul; got w of shape {tuple(w.shape)}, bias {bias is not None}, silu_mul {silu_mul}")
        if mma:
            raise ValueError("GEMV silu_out runs the Triton GEMVs, not the Gluon kernel: leave mma unset or False")
        N //= 2
    M = math.prod(a.shape[:-1])
    y, final = product_output(a, N, K, bias)
    if final:
        return y
    a2 = a.reshape(M, a.shape[-1])
    y2 = y.view(M, N)
    bias1 = bias.reshape(N).contiguous() if bias is not None else w

    interpret = use_interpreter(a, "GEMV")
    launch = on_device(a, interpret)
    stream = None
    if tiles is None and not (silu_mul or silu_out or mma) and column_major(w) and a.stride(-1) == 1:
        stream = stream_tiles(M, K, N, rule_processors(a))
    with launch:
        if stream is not None:
            block_n, block_k, programs = stream
            compiled = {} if interpret else {"num_warps": STREAM_WARPS, **pdl(a)}
            _stream_kernel[(programs,)](a2, w, bias1, y2, N, K, w.stride(1), HAS_BIAS=bias is not None,
                                        BLOCK_N=block_n, BLOCK_K=block_k, AHEAD=STREAM_AHEAD, CONST_W=const_w,
                                        **compiled)
            return y
        ws = _products(a2, w, bias1, bias is not None, y2, tiles, const_w, silu_mul, interpret, mma,
                       gate_out=silu_out)
        if ws is None:
            return y
        block_s, block, warps = _reduce_tiles(ws.shape[0])
        reduce_meta = {} if interpret else {"num_warps": warps, **pdl(a)}
        _split_k_reduce_kernel[(cdiv(M * N, block),)](ws, bias1, y2, M * N, N, ws.shape[0], HAS_BIAS=bias is not None,
                                                       BLOCK_S=block_s, BLOCK=block, GATE_OUT=silu_out,
                                                       **reduce_meta)
    return y


def _norm_split_cap(N: int) -> int:
    """Most K splits of a product feeding ``gemv_skip_norm`` that keep a row's partial sums one tile of the norm
    kernel (``_NORM_TILE``): a power of two, as that tile holds next_power_of_2(split) rows."""
    cap = max(1, _NORM_TILE // next_power_of_2(N))
    return 1 << (cap.bit_length() - 1)


def _norm_dot_tiles(M: int, K: int, N: int, elem_size: int, processors: int) -> tuple[int, int, int, int, int]:
    """``pick_dot_tiles`` for ``gemv_skip_norm``: at most as many K splits as keep a row's partial sums one tile of
    the norm kernel (``_NORM_TILE``; past it that kernel walks the row in chunks, two latency-bound passes), with
    32-column tiles where that gives more programs. Uncapped, Qwen2.5-0.5B's down projection at 2 and 4 rows
    (38 splits) took its fp16 decode step from about 0.6 to 2.05 ms on an H200 (``benchmarks/genai_batch.py``)."""
    block_m, block_n, block_k, split, warps = pick_dot_tiles(M, K, N, elem_size, processors)
    cap = _norm_split_cap(N)
    if split <= cap:
        return block_m, block_n, block_k, split, warps
    if cdiv(N, block_n) * cap < 4 * processors:
        block_n = 32
    return block_m, block_n, block_k, cdiv(K, _k_per_split(K, cap, block_k)), warps


def norm_tile_fits(split: int, N: int) -> bool:
    """Whether the skip-norm kernel holds ``split`` partial sums of a row of N values in one tile (its fast path,
    ``_split_k_norm_kernel``'s SINGLE)."""
    return next_power_of_2(split) * next_power_of_2(N) <= _NORM_TILE


def partials_skip_norm(ws: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor, gamma: torch.Tensor,
                       eps: float, *, want_sum: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The skip-norm launch on float32 partial sums ``ws [S, M, N]`` (``gemv_skip_norm``'s GEMV's, or the decode
    attention's ``combine_product``'s): ``SkipSimplifiedLayerNormalization(residual, sum_s ws[s] (+ bias), gamma)``
    with the product rounded to the residual's dtype; returns ``(normed, sum)`` in the residual's shape. Launch it
    just after the kernel that writes ``ws``, which nothing else reads: with NORM_EARLY the next kernel may start
    while that kernel still runs (``crossml.kernels._launch.pdl``)."""
    S, M, N = ws.shape
    shape = residual.shape
    normed = torch.empty(shape, dtype=residual.dtype, device=residual.device)
    total = torch.empty(shape, dtype=residual.dtype, device=residual.device) if want_sum else None
    if M == 0 or N == 0:
        return normed, total
    interpret = use_interpreter(ws, "GEMV skip-norm")
    block_s, block, warps = _reduce_tiles(S)
    single = norm_tile_fits(S, N)
    if single:
        block = next_power_of_2(N)
        warps = max(warps, min(16, block_s * block // 1024))
    rtne = interpret and residual.dtype == torch.bfloat16  # the interpreter truncates float32 -> bfloat16 casts
    meta = {} if interpret else {"num_warps": warps, **pdl(ws, early=NORM_EARLY and M <= NORM_EARLY_MAX_ROWS)}
    bias1 = bias.reshape(N).contiguous() if bias is not None else residual  # a placeholder of the product's dtype
    launch = on_device(ws, interpret)
    with launch:
        _split_k_norm_kernel[(M,)](ws, bias1, residual.reshape(M, N).contiguous(), gamma.reshape(N).contiguous(),
                                   normed, normed if total is None else total, M, N, S, 1.0 / N, float(eps),
                                   HAS_BIAS=bias is not None, STORE_SUM=want_sum, BLOCK_S=block_s, BLOCK=block,
                                   SINGLE=single, RTNE=rtne, **meta)
    return normed, total


def gemv_skip_norm(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor,
                   gamma: torch.Tensor, eps: float, *, want_sum: bool = True, const_w: bool = False,
                   silu_mul: bool = False, tiles: tuple[int, int, int, int, int] | None = None,
                   mma: bool | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``SkipSimplifiedLayerNormalization(residual, a @ w (+ bias), gamma)``: the decode product and the RMSNorm
    of the residual stream that follows it, in two launches instead of three.

    ``residual`` has the product's shape ``a.shape[:-1] + (N,)`` and a's dtype; ``gamma`` holds N values.
    Returns ``(normed, sum)``: ``sum = residual + y`` in a's dtype (None when ``want_sum`` is False) and
    ``normed = sum * rsqrt(mean(sum²) + eps) * gamma`` in a's dtype, computed as ``crossml.kernels.rmsnorm``
    computes them from ``y = a @ w (+ bias)`` rounded to a's dtype (the unfused MatMul's output). The GEMV
    always writes float32 partial sums (K split or not); the one program per row of the second launch adds
    them, rounds y, adds the residual and normalizes, so no [M, N] product is stored in between.
    ``tiles``, ``const_w``, ``silu_mul`` and ``mma`` as for ``gemv``.
    """
    K, N = _check(a, w, bias, silu_mul)
    shape = (*a.shape[:-1], N)
    if tuple(residual.shape) != shape or residual.dtype != a.dtype or residual.device != a.device:
        raise ValueError(f"GEMV skip-norm: the residual must be a {a.dtype} tensor of the product's shape {shape} on "
                         f"{a.device}, got {residual.dtype} {tuple(residual.shape)} on {residual.device}")
    if gamma.numel() != N or gamma.dtype not in DTYPES or gamma.device != a.device:
        raise ValueError(f"GEMV skip-norm: gamma must be N={N} float16/bfloat16/float32 values on {a.device}, got "
                         f"{gamma.dtype} of shape {tuple(gamma.shape)} on {gamma.device}")
    M = math.prod(shape[:-1])
    if M == 0 or N == 0:
        return partials_skip_norm(torch.empty((1, M, N), dtype=torch.float32, device=a.device), bias, residual,
                                  gamma, eps, want_sum=want_sum)
    interpret = use_interpreter(a, "GEMV skip-norm")
    a2 = a.reshape(M, a.shape[-1])
    bias1 = bias.reshape(N).contiguous() if bias is not None else w
    launch = on_device(a, interpret)
    with launch:
        if K == 0:  # the empty sum: a zero workspace of one split (bias added by the skip-norm kernel)
            ws = torch.zeros((1, M, N), dtype=torch.float32, device=a.device)
        else:
            mma = _takes_mma(a2, w, tiles, mma)
            if tiles is None and _dot_rows(M, a.dtype) and not mma:
                tiles = _norm_dot_tiles(M, K, N, a.element_size(), rule_processors(a))
            ws = _products(a2, w, bias1, False, None, tiles, const_w, silu_mul, interpret, mma, norm=True)
    return partials_skip_norm(ws, bias, residual, gamma, eps, want_sum=want_sum)
