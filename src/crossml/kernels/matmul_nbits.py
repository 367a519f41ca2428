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
rounded to A's dtype, as the op's dequantization in A's dtype does. The grid has no host syncs and
the output is allocated with ``torch.empty``, so a call is safe inside CUDA graph capture; tiles
are picked by a fixed rule (no autotuning, which would time kernels during capture).
"""

from __future__ import annotations

import contextlib
import math

import torch
import triton
import triton.language as tl

from crossml.kernels._launch import GRID_YZ_MAX, cdiv, pdl, pdl_wait, processors, product_output, use_interpreter

__all__ = ["dequantize", "gather_rows", "matmul_nbits", "pick_tiles"]

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
    out_ty = y_ptr.dtype.element_ty
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
    words = tl.load(w_ptr + n2 * ROW_WORDS + w_idx, mask=w_idx < ROW_WORDS, other=0)
    scale, zp = _scales_zero_points(s_ptr, z_ptr, y_ptr, n2, g2, g2 < N_BLOCKS, N_BLOCKS, s_zn, ZP)
    if CONST_W:
        pdl_wait(PDL)
    for k0 in range(0, K, BLOCK_K):
        words_k, scale_k, zp_k = words, scale, zp
        word1 = (k0 + BLOCK_K) // 8
        words = tl.load(w_ptr + n2 * ROW_WORDS + word1 + w_idx, mask=word1 + w_idx < ROW_WORDS, other=0)
        blk1 = (k0 + BLOCK_K) // BS + g2
        scale, zp = _scales_zero_points(s_ptr, z_ptr, y_ptr, n2, blk1, blk1 < N_BLOCKS, N_BLOCKS, s_zn, ZP)
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

    n_ok = offs_n < N
    if NORM > 0:
        acc = acc * tl.math.rsqrt(squares * inv_k + eps)[:, None]
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(out_ty).to(tl.float32)
        acc += bias[None, :]
    rows = m0 + m_idx
    y_ptrs = y_ptr + rows[:, None] * s_ym + offs_n[None, :]
    tl.store(y_ptrs, acc.to(out_ty), mask=(rows[:, None] < M) & n_ok[None, :])


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
    L2, constant-weight launches): one warp per program, BLOCK_K the whole of K up to 2048 (K rounded up
    to a power of two), two weight rows per program, or one when K spans more than two such steps (more
    programs for the long products, e.g. down: each still takes three or more K steps); for wide
    products, where two-row programs would exceed 16 per SM (merged gate+up, lm_head), four rows by 512
    (many short programs cost more than they hide). BLOCK_K is at least one quantization block.
    """
    block_m = min(MAX_BLOCK_M, triton.next_power_of_2(max(M, 1)))
    block_k = min(2048, triton.next_power_of_2(max(K, 1)))
    if cdiv(N, 2) > 16 * processors:
        block_n, block_k = 4, min(block_k, 512)
    else:
        block_n = 1 if K > 2 * block_k else 2
    return block_m, block_n, max(block_size, block_k), 1


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
                 sum_out: torch.Tensor | None = None, const_w: bool = False) -> torch.Tensor:
    """MatMulNBits (bits=4, no g_idx) of ``a`` [..., K] -> [..., N] in ``a``'s dtype, one Triton launch.

    ``tiles`` (BLOCK_M, BLOCK_N, BLOCK_K, num_warps) overrides ``pick_tiles`` (tests); BLOCK_K must be
    a multiple of block_size, all powers of two.

    ``norm`` = (skip or None, gamma [K], epsilon): the product of RMSNorm(a (+ skip)) * gamma instead of
    ``a`` (SimplifiedLayerNormalization / SkipSimplifiedLayerNormalization feeding the product), the
    statistics in float32; the normalized activations are not rounded to a's dtype, as the two ops in a
    row would round them. ``sum_out`` (with a skip): receives a + skip in its dtype, as the skip norm's
    fourth output. ``const_w``: ``b``, ``scales`` and ``zero_points`` are constants of the model that no kernel
    writes (initializers), so with programmatic dependent launch the first K step's are read while the
    previous kernel finishes.
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
    interpret = use_interpreter(a, "MatMulNBits")
    if tiles is None:
        dev = a.device
        sms = 1 if interpret or dev.type == "cpu" else processors(a)
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
    with torch.cuda.device(a.device) if a.device.type == "cuda" else contextlib.nullcontext():
        _matmul_nbits_kernel[grid](*args, **meta, num_warps=num_warps, num_stages=2, **pdl(a))
    return y


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
                    zp_mode=zp_mode, block_n=min(_DQ_BLOCK_N, triton.next_power_of_2(rows)))
    return y
