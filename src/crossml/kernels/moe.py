"""Triton expert GEMV for the decode step of com.microsoft MoE / QMoE: each chosen expert's weights read once,
in place.

``y[r] = W[experts[r]] @ x[r // rows_per_token] (+ bias[experts[r]])`` for the ``R = tokens * k`` (token, slot)
rows of a decode step (see ``crossml.ops.contrib.moe``): fc1 (and fc3) with ``rows_per_token = k`` (the k slots of
a token read the token's activations), fc2 with ``rows_per_token = 1`` (each slot its own activated row). The
torch path gathers the chosen experts' weights into a new ``[R, N, K]`` tensor first (dequantized to the compute
type for QMoE) and multiplies that: it reads the weights, writes the copy and reads it again. Here each program
reads its expert's rows where they lie.

Weights: dense ``[E, N, K]`` (float16 / bfloat16 / float32), or QMoE's ``quant_type='int'`` layout, uint8
``[E, N, K * bits / 8]`` with ``bits`` 4 or 8, low bits first (4 bits: value j of a row is in byte j // 2, the
low nibble for even j), per-block scales ``[E, N, K / block_size]`` or, with ``block_size`` 0, one scale per row
``[E, N]``; zero points optional, packed the same way: ``[E, N, ceil(blocks * bits / 8)]`` per block, or
``[E, ceil(N * bits / 8)]`` per row (packed along N); absent, ``2^(bits-1)``. ``w = (q - zero_point) * scale``.

The kernel: grid ``(R, cdiv(N, BLOCK_N))``; program (r, j) loads ``experts[r]`` (a device tensor: no host sync, so
a call can be captured in a CUDA graph), then walks K in BLOCK_K steps over weight rows ``[j * BLOCK_N, +BLOCK_N)``
of that expert, accumulating in float32.

* dense: a ``[BLOCK_N, BLOCK_K]`` tile times the step's activations, summed element-wise into a float32 tile of
  the same shape and reduced over K once at the end (no cross-thread reduction per step);
* 4 bits: ``[BLOCK_N, BLOCK_K / 2]`` packed bytes (a contiguous run per weight row), their low nibbles multiplied
  by the step's even activations and their high nibbles by its odd ones (the activations are loaded as the two
  strided halves, so the nibbles are never interleaved back into K order); 8 bits: the bytes as they are. The
  products are summed per quantization block (``[BLOCK_N, BLOCK_K / block_size]``, BLOCK_K a multiple of the block
  size) and each block adds ``scale * (sum q * x - zero_point * sum x)``: the scale and zero point are applied once
  per block, not per weight. Per-row scales are one block spanning K.

Tiles follow a fixed rule (``pick_tiles``; no autotuning, which would time kernels during capture), from a sweep on
an H200 for fp16 and int4 (``benchmarks/moe_decode.py`` measures the layer). ``expert_gemv_reference`` is the torch definition the tests
compare against. Under TRITON_INTERPRET=1 the kernel runs in Triton's interpreter (see ``_launch``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from crossml.kernels._launch import GRID_YZ_MAX, cdiv, next_power_of_2, on_device, pdl, pdl_wait, use_interpreter

__all__ = ["SUPPORTED_DTYPES", "expert_gemv", "expert_gemv_reference", "pick_tiles"]

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_INDEX_DTYPES = (torch.int32, torch.int64)
#: most weight values one program holds per K step (larger quantization blocks shrink BLOCK_N)
_MAX_TILE = 16384


@triton.jit
def _quant_params(s_ptr, z_ptr, e, n, blk, N_BLOCKS, s_se, s_sn, s_sb, s_ze, s_zn, BITS: tl.constexpr,
                  PER_ROW: tl.constexpr, HAS_ZP: tl.constexpr):
    """float32 scales and zero points of weight rows ``n`` [BLOCK_N] of expert ``e``: [BLOCK_N, G] for the
    quantization blocks ``blk`` [G] (0 past the last block), or [BLOCK_N, 1] with PER_ROW."""
    MASK: tl.constexpr = (1 << BITS) - 1
    if PER_ROW:
        scale = tl.load(s_ptr + e * s_se + n * s_sn).to(tl.float32)[:, None]
        if HAS_ZP:  # packed along N: row n's zero point is bits (n * BITS) % 8 of byte n * BITS // 8
            zb = tl.load(z_ptr + e * s_ze + (n * BITS) // 8).to(tl.int32)
            zp = ((zb >> ((n * BITS) % 8)) & MASK).to(tl.float32)[:, None]
        else:
            zp = tl.full(scale.shape, 1 << (BITS - 1), tl.float32)
    else:
        ok = (blk < N_BLOCKS)[None, :]
        scale = tl.load(s_ptr + e * s_se + n[:, None] * s_sn + blk[None, :] * s_sb, mask=ok, other=0.0)
        scale = scale.to(tl.float32)
        if HAS_ZP:  # block b's zero point: bits (b * BITS) % 8 of byte b * BITS // 8 of the row's zero points
            zb = tl.load(z_ptr + e * s_ze + n[:, None] * s_zn + ((blk * BITS) // 8)[None, :], mask=ok, other=0)
            zp = ((zb.to(tl.int32) >> ((blk * BITS) % 8)[None, :]) & MASK).to(tl.float32)
        else:
            zp = tl.full(scale.shape, 1 << (BITS - 1), tl.float32)
    return scale, zp


@triton.jit
def _expert_gemv_kernel(x_ptr, e_ptr, w_ptr, s_ptr, z_ptr, b_ptr, y_ptr,
                        N, K, E, ROWS_PER_TOKEN, N_BLOCKS,
                        s_xm, s_xk, s_we, s_wn, s_wk, s_se, s_sn, s_sb, s_ze, s_zn, s_be, s_bn, s_ym, s_yn,
                        BITS: tl.constexpr, BS: tl.constexpr, PER_ROW: tl.constexpr, HAS_ZP: tl.constexpr,
                        HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        PDL: tl.constexpr = False):
    """y[r, j * BLOCK_N + (0 .. BLOCK_N)] for program (r, j). BS: the quantization block (BLOCK_K with PER_ROW)."""
    r = tl.program_id(0).to(tl.int64)
    pid_n = tl.program_id(1)
    pdl_wait(PDL)
    e = tl.load(e_ptr + r).to(tl.int64)
    e = tl.minimum(tl.maximum(e, 0), E - 1)  # an index out of range reads a real expert, never outside the weights
    x_row = x_ptr + (r // ROWS_PER_TOKEN) * s_xm
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n = tl.minimum(offs_n, N - 1).to(tl.int64)  # rows past N re-read the last one (never stored): no load mask
    w_rows = w_ptr + e * s_we + n[:, None] * s_wn  # [BLOCK_N, 1]

    if BITS == 0:
        kk = tl.arange(0, BLOCK_K)
        acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + kk
            ok = k < K
            xv = tl.load(x_row + k * s_xk, mask=ok, other=0.0).to(tl.float32)
            w = tl.load(w_rows + k[None, :] * s_wk, mask=ok[None, :], other=0.0).to(tl.float32)
            acc2 += w * xv[None, :]
        acc = tl.sum(acc2, axis=1)
    else:
        G: tl.constexpr = BLOCK_K // BS  # quantization blocks per K step
        PER: tl.constexpr = 8 // BITS  # values per byte
        BYTES: tl.constexpr = BLOCK_K // PER  # packed bytes of a weight row per K step
        jj = tl.arange(0, BYTES)
        gg = tl.arange(0, G)
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        if PER_ROW:  # one scale and zero point per row, for all of K
            scale, zp = _quant_params(s_ptr, z_ptr, e, n, gg, N_BLOCKS, s_se, s_sn, s_sb, s_ze, s_zn, BITS, True,
                                      HAS_ZP)
        for k0 in range(0, K, BLOCK_K):
            j = k0 // PER + jj  # byte index in the row
            ok = j * PER < K
            byte = tl.load(w_rows + j[None, :] * s_wk, mask=ok[None, :], other=0).to(tl.int32)
            if BITS == 4:  # value 2j is the low nibble of byte j, 2j + 1 the high one
                x_even = tl.load(x_row + (2 * j) * s_xk, mask=ok, other=0.0).to(tl.float32)
                x_odd = tl.load(x_row + (2 * j + 1) * s_xk, mask=ok, other=0.0).to(tl.float32)
                prod = (byte & 0xF).to(tl.float32) * x_even[None, :] + (byte >> 4).to(tl.float32) * x_odd[None, :]
                x_sum = x_even + x_odd
            else:
                xv = tl.load(x_row + j * s_xk, mask=ok, other=0.0).to(tl.float32)
                prod = byte.to(tl.float32) * xv[None, :]
                x_sum = xv
            dot = tl.sum(tl.reshape(prod, (BLOCK_N, G, BS // PER)), axis=2)  # [BLOCK_N, G]
            xs = tl.sum(tl.reshape(x_sum, (1, G, BS // PER)), axis=2)  # [1, G]
            if not PER_ROW:
                scale, zp = _quant_params(s_ptr, z_ptr, e, n, k0 // BS + gg, N_BLOCKS, s_se, s_sn, s_sb, s_ze,
                                          s_zn, BITS, False, HAS_ZP)
            acc += tl.sum(scale * (dot - zp * xs), axis=1)

    n_ok = offs_n < N
    if HAS_BIAS:
        acc += tl.load(b_ptr + e * s_be + offs_n * s_bn, mask=n_ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + r * s_ym + offs_n * s_yn, acc.to(y_ptr.dtype.element_ty), mask=n_ok)


def pick_tiles(bits: int, dtype: torch.dtype, block_size: int, K: int, interp: bool = False) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps), BLOCK_K a multiple of the quantization block; smaller in the interpreter,
    and for short K. The fp16 and int4 tiles are the best of a sweep (BLOCK_N 8-64, BLOCK_K 256-1024, 4 or 8
    warps) on an H200 over gpt-oss-20b's fc1 (5760 x 2880) and fc2 (2880 x 2880), 4 experts a call: fp16 32 x 512
    (fc1 36.6 µs, 0.85 of the weight-read floor, was 53.3 at 16 x 256; fc2 22.0), int4 16 x 1024 (fc1 54.4 µs, was
    68.7 at 32 x 512; fc2 31.5): the int4 kernel is bound by its float32 nibble arithmetic, about 6x its floor.
    int8 and float32 keep about 8 KiB of weights a program and K step (untuned)."""
    if interp:
        block_n, block_k, warps = 16, 32, 1
    elif bits == 0:
        block_n, block_k, warps = (32, 512, 4) if dtype != torch.float32 else (16, 128, 4)
    elif bits == 8:
        block_n, block_k, warps = 32, 256, 4
    else:
        block_n, block_k, warps = 16, 1024, 4
    block_k = max(min(block_k, next_power_of_2(max(K, 1))), 16, block_size)
    while block_n > 1 and block_n * block_k > _MAX_TILE:
        block_n //= 2
    return block_n, block_k, warps


def _quant_shapes(E: int, N: int, K: int, bits: int, block_size: int) -> tuple[tuple, tuple, tuple]:
    """Expected (weight, scales, zero points) shapes of a quantized projection."""
    blocks = K // block_size if block_size else 1
    scales = (E, N, blocks) if block_size else (E, N)
    zps = (E, N, (blocks * bits + 7) // 8) if block_size else (E, (N * bits + 7) // 8)
    return (E, N, K * bits // 8), scales, zps


def _check(x: torch.Tensor, experts: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           scales: torch.Tensor | None, zero_points: torch.Tensor | None, bits: int, block_size: int, N: int, K: int,
           rows_per_token: int) -> None:
    what = "expert_gemv"
    if x.dim() != 2 or x.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"{what}: x {x.dtype} {tuple(x.shape)} must be a 2-D float16/bfloat16/float32 tensor "
                         "[tokens, K]")
    if experts.dim() != 1 or experts.dtype not in _INDEX_DTYPES:
        raise ValueError(f"{what}: experts {experts.dtype} {tuple(experts.shape)} must be a 1-D int32/int64 tensor "
                         "[rows] (one expert index per row)")
    R = experts.shape[0]
    if rows_per_token < 1 or R % rows_per_token:
        raise ValueError(f"{what}: rows_per_token {rows_per_token} must be >= 1 and divide the {R} rows of experts")
    if tuple(x.shape) != (R // rows_per_token, K):
        raise ValueError(f"{what}: x {tuple(x.shape)} must be [{R // rows_per_token}, {K}] ({R} rows of experts / "
                         f"rows_per_token {rows_per_token}, K={K})")
    if weight.dim() != 3 or weight.shape[0] < 1:
        raise ValueError(f"{what}: weight {tuple(weight.shape)} must be 3-D [num_experts, N, K(*bits/8)]")
    E = weight.shape[0]
    if bits == 0:
        if weight.dtype not in SUPPORTED_DTYPES or tuple(weight.shape[1:]) != (N, K):
            raise ValueError(f"{what}: dense weight {weight.dtype} {tuple(weight.shape)} must be float16/bfloat16/"
                             f"float32 [{E}, {N}, {K}]")
        if scales is not None or zero_points is not None:
            raise ValueError(f"{what}: scales and zero_points go with quantized weights (bits 4 or 8), not bits=0")
    elif bits in (4, 8):
        if K * bits % 8:
            raise ValueError(f"{what}: K={K} values of {bits} bits do not fill whole bytes")
        if block_size and (block_size < 16 or block_size & (block_size - 1) or K % block_size):
            raise ValueError(f"{what}: block_size {block_size} must be a power of two >= 16 dividing K={K} "
                             "(or 0: one scale per row)")
        wshape, sshape, zshape = _quant_shapes(E, N, K, bits, block_size)
        if weight.dtype != torch.uint8 or tuple(weight.shape) != wshape:
            raise ValueError(f"{what}: quantized weight {weight.dtype} {tuple(weight.shape)} must be uint8 "
                             f"{list(wshape)} ({K} values of {bits} bits per row)")
        if scales is None or scales.dtype not in SUPPORTED_DTYPES or tuple(scales.shape) != sshape:
            got = "none" if scales is None else f"{scales.dtype} {tuple(scales.shape)}"
            raise ValueError(f"{what}: scales ({got}) must be float16/bfloat16/float32 {list(sshape)}"
                             + (f" (K / block_size {block_size})" if block_size else " (one per row)"))
        if zero_points is not None and (zero_points.dtype != torch.uint8 or tuple(zero_points.shape) != zshape):
            raise ValueError(f"{what}: zero_points {zero_points.dtype} {tuple(zero_points.shape)} must be uint8 "
                             f"{list(zshape)} ({bits}-bit values packed low bits first)")
    else:
        raise ValueError(f"{what}: bits {bits} must be 0 (dense float weights), 4 or 8")
    if bias is not None and (bias.dtype not in SUPPORTED_DTYPES or tuple(bias.shape) != (E, N)):
        raise ValueError(f"{what}: bias {bias.dtype} {tuple(bias.shape)} must be float16/bfloat16/float32 [{E}, {N}]")
    for name, t in (("experts", experts), ("weight", weight), ("bias", bias), ("scales", scales),
                    ("zero_points", zero_points)):
        if t is not None and t.device != x.device:
            raise ValueError(f"{what}: {name} is on {t.device}, x on {x.device}; all inputs must share one device")



def expert_gemv(x: torch.Tensor, experts: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                scales: torch.Tensor | None = None, zero_points: torch.Tensor | None = None, bits: int = 0,
                block_size: int = 0, N: int, K: int, rows_per_token: int,
                tiles: tuple[int, int, int] | None = None) -> torch.Tensor:
    """``y [R, N]`` (x's dtype): ``y[r] = W[experts[r]] @ x[r // rows_per_token] (+ bias[experts[r]])``, float32
    accumulation, the weights read in place (see the module docstring for the layouts). ``tiles``: (BLOCK_N,
    BLOCK_K, num_warps) instead of ``pick_tiles``' (BLOCK_K a power of two and a multiple of block_size)."""
    bits, block_size, N, K = int(bits), int(block_size), int(N), int(K)
    _check(x, experts, weight, bias, scales, zero_points, bits, block_size, N, K, int(rows_per_token))
    R = experts.shape[0]
    y = torch.empty((R, N), dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        return y
    if K == 0:  # the empty sum: zeros, plus the rows' biases
        y.zero_()
        if bias is not None:
            y.add_(bias[experts.long()].to(x.dtype))
        return y
    interp = use_interpreter(x, "expert_gemv")
    block_n, block_k, warps = tiles or pick_tiles(bits, x.dtype, block_size, K, interp)
    if block_k & (block_k - 1) or block_n & (block_n - 1) or (block_size and block_k % block_size):
        raise ValueError(f"expert_gemv: tiles {(block_n, block_k)} must be powers of two, BLOCK_K a multiple of "
                         f"block_size {block_size}")
    if bits == 4 and block_k < 2:
        raise ValueError("expert_gemv: 4-bit weights need BLOCK_K >= 2")
    if cdiv(N, block_n) > GRID_YZ_MAX:
        raise ValueError(f"expert_gemv: N={N} needs more than {GRID_YZ_MAX} tiles of {block_n} rows")
    per_row = bits != 0 and block_size == 0
    bs = block_k if per_row or bits == 0 else block_size
    s = scales if scales is not None else y
    s_s = (0, 0, 0) if scales is None else (*scales.stride()[:2], scales.stride(2) if scales.dim() == 3 else 0)
    z = zero_points if zero_points is not None else y
    s_z = (0, 0) if zero_points is None else (zero_points.stride(0), zero_points.stride(1) if block_size else 0)
    b = bias if bias is not None else y
    s_b = (0, 0) if bias is None else bias.stride()
    n_blocks = K // block_size if block_size else 1
    grid = (R, cdiv(N, block_n))
    with on_device(x, interp):
        _expert_gemv_kernel[grid](x, experts, weight, s, z, b, y, N, K, weight.shape[0], int(rows_per_token),
                                  n_blocks, *x.stride(), *weight.stride(), *s_s, *s_z, *s_b, *y.stride(),
                                  BITS=bits, BS=bs, PER_ROW=per_row, HAS_ZP=zero_points is not None,
                                  HAS_BIAS=bias is not None, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps,
                                  **pdl(x))
    return y


def _unpack(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 [..., n] -> int [..., n * 8 / bits], low bits first."""
    if bits == 8:
        return packed.long()
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(*packed.shape[:-1], -1).long()


def expert_gemv_reference(x: torch.Tensor, experts: torch.Tensor, weight: torch.Tensor,
                          bias: torch.Tensor | None = None, *, scales: torch.Tensor | None = None,
                          zero_points: torch.Tensor | None = None, bits: int = 0, block_size: int = 0, N: int, K: int,
                          rows_per_token: int) -> torch.Tensor:
    """The torch definition of ``expert_gemv``: the chosen experts' weights gathered (and dequantized) to float32
    ``[R, N, K]``, multiplied by the rows' activations in float32, in x's dtype."""
    idx = experts.long()
    xr = x.float().repeat_interleave(rows_per_token, dim=0)  # [R, K]
    if bits == 0:
        w = weight[idx].float()
    else:
        q = _unpack(weight[idx], bits).float()  # [R, N, K]
        s = scales[idx].float()
        s = s if block_size else s.unsqueeze(-1)  # [R, N, blocks]
        blocks = s.shape[-1]
        if zero_points is None:
            zp = torch.full_like(s, float(1 << (bits - 1)))
        elif block_size:
            zp = _unpack(zero_points[idx], bits)[..., :blocks].float()
        else:
            zp = _unpack(zero_points[idx], bits)[..., :N].float().unsqueeze(-1)
        w = ((q.reshape(*q.shape[:-1], blocks, K // blocks) - zp.unsqueeze(-1)) * s.unsqueeze(-1)).reshape(q.shape)
    y = torch.einsum("rnk,rk->rn", w, xr)
    if bias is not None:
        y = y + bias[idx].float()
    return y.to(x.dtype)
