"""Block-quantized weights: MatMulNBits and GatherBlockQuantized (com.microsoft).

Weights are quantized per block of ``block_size`` consecutive values along one axis, with one scale
(and optionally one zero point) per block: ``w = (q - zero_point) * scale``. Sub-byte values are
packed low bits first into uint8 (two 4-bit values per byte, four 2-bit values...).

MatMulNBits with ``accuracy_level=4`` reproduces onnxruntime's CPU int8 path: the activations A are
quantized symmetrically to int8 per block of ``block_size`` along K (scale = max|a| / 127, round to
nearest even) before the dot product with the integer weights. The block dot product is exact in
float32, so computing ``dequant(quant(A)) @ dequant(B)`` gives the same result up to the order of
float32 accumulation.

On a GPU, 4-bit MatMulNBits without g_idx takes the Triton kernels of ``crossml.kernels.matmul_nbits``:
decode sizes (at most ``KERNEL_MAX_M`` rows of A) the GEMV, which reads the packed weight once
instead of dequantizing it to a dense matrix per call (the int8 path above quantizes A first, as
here), and for fp16 / bf16 rows of a batched decode or beam search (4 to 64 rows, ``_kernel_rows``) the
matrix-unit kernel, which dequantizes each weight tile in registers for a ``tl.dot``; larger products (prompts) a
one-pass dequantization, then a dense matmul. On the CPU, a 4-bit
product of a model constant with at most ``CPU_PACKED_MAX_M`` rows of A (an LLM's decode step) takes, on the int8
path with blocks of 32-256 values on an x86 CPU with AVX2, the int8 kernel (``crossml.kernels.cpu_int8``: integer
dot products on B as it is, ``_cpu_int8``; with blocks of 32 values any number of rows, ``CPU_INT8_ANY_ROWS``); otherwise crossml's numba kernel (``crossml.kernels.cpu_nbits``, where
numba is installed: the packed weight read as it is, laid out once and kept on B; a Qwen2.5-0.5B-shaped builder int4
CPU model's decode 716.5 -> 86.3 ms a token on a 2-core AVX2 host, results/cpu_genai.md). Without numba it takes
torch's packed int4 kernel
(``torch._weight_int4pack_mm_for_cpu``) on a copy of the weight packed once and kept with it (as much memory again as
the 4-bit weight: prompts still dequantize the original),
``(q - 8) * scale + (8 - zero_point) * scale`` per block, float32 products (A quantized first on the int8 path,
as above): within float32 rounding of the dequantized product, without writing a dense float32 matrix per call.
On a 2-core x86 host (AVX2), a Qwen2.5-0.5B-shaped builder int4 CPU model's decode went from 4,318 to 662-695 ms a
token, against 26.5-29.3 for onnxruntime-genai in the same runs (``benchmarks/cpu_genai.py`` before and after,
results/cpu_genai.md); its lm_head product alone from about 3.2 s to 0.16 s. Prompts (more rows) and everything else
dequantize with torch ops and multiply as below.
"""

from __future__ import annotations

import math

import torch

from crossml.kernels import TRITON_DEVICES, load
from crossml.ops._util import norm_axis
from crossml.ops.registry import MS_DOMAIN, OpContext, op

_FLOAT8 = (torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2, torch.float8_e5m2fnuz)


def unpack_bits(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 [..., n] -> uint8 [..., n * 8 // bits], low-order bits first."""
    if bits == 8:
        return packed
    if bits not in (2, 4):
        raise ValueError(f"bits must be 2, 4 or 8, got {bits}")
    per = 8 // bits
    mask = (1 << bits) - 1
    parts = [(packed >> (bits * i)) & mask for i in range(per)]
    return torch.stack(parts, dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * per)


def _check_block_size(block_size: int, allow_zero: bool = False) -> None:
    if allow_zero and block_size == 0:
        return
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of 2 and >= 16, got {block_size}")


def dequantize_nbits(
    B: torch.Tensor,
    scales: torch.Tensor,
    zero_points: torch.Tensor | None,
    g_idx: torch.Tensor | None,
    *,
    K: int,
    N: int,
    bits: int,
    block_size: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """MatMulNBits' B as a dense [N, K] matrix of ``dtype``."""
    n_blocks = (K + block_size - 1) // block_size
    blob = block_size * bits // 8
    if B.dtype != torch.uint8 or B.numel() != N * n_blocks * blob:
        raise ValueError(
            f"B must be uint8 of shape [N={N}, k_blocks={n_blocks}, blob_size={blob}], got {B.dtype} {tuple(B.shape)}"
        )
    full = unpack_bits(B.reshape(N, n_blocks, blob), bits).reshape(N, n_blocks, block_size)
    s, zp = _scales_zero_points(scales, zero_points, N, n_blocks, bits, dtype)
    if g_idx is not None:
        g = g_idx.reshape(K).long()
        q = full.reshape(N, n_blocks * block_size)[:, :K]
        return (q.to(dtype) - zp[:, g]) * s[:, g]
    # (q - zero point) * scale over the block-padded values: q converted to dtype (exact: small integers), then the
    # zero point subtracted and the scale applied in place (a subtraction that promotes uint8 as it goes took 4x as
    # long on the CPU); the padding past K is cut after
    w = full.to(dtype).sub_(zp.reshape(N, n_blocks, 1)).mul_(s.reshape(N, n_blocks, 1))
    return w.reshape(N, n_blocks * block_size)[:, :K]


def _scales_zero_points(scales: torch.Tensor, zero_points: torch.Tensor | None, N: int, n_blocks: int, bits: int,
                        dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """MatMulNBits' scales and zero points as [N, n_blocks] of ``dtype``: packed uint8 zero points unpacked (low bits
    first), float ones as given, absent ones the midpoint 2 ** (bits - 1)."""
    s = scales.reshape(N, n_blocks).to(dtype)
    if zero_points is None:
        zp = torch.full((N, n_blocks), float(1 << (bits - 1)), dtype=dtype, device=scales.device)
    elif zero_points.dtype == torch.uint8:
        zp = unpack_bits(zero_points.reshape(N, -1), bits)[:, :n_blocks].to(dtype)
    else:
        zp = zero_points.reshape(N, n_blocks).to(dtype)
    return s, zp


def quantize_int8_blocks(a: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """onnxruntime's accuracy_level-4 quantization of A: symmetric int8 per block along the last axis (zero padded
    to whole blocks). Returns the int8 values (in a's float dtype) [..., n_blocks, block_size] and the block scales
    [..., n_blocks, 1]."""
    K = a.shape[-1]
    n_blocks = (K + block_size - 1) // block_size
    pad = n_blocks * block_size - K
    w = torch.nn.functional.pad(a, (0, pad)) if pad else a
    w = w.reshape(*a.shape[:-1], n_blocks, block_size)
    amax = w.abs().amax(dim=-1, keepdim=True)
    scale = amax / 127.0
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    return torch.round(w * inv).clamp_(-128, 127), scale


def quantize_dequantize_int8_blocks(a: torch.Tensor, block_size: int) -> torch.Tensor:
    """A after onnxruntime's accuracy_level-4 quantization: symmetric int8 per block along the last axis."""
    q, scale = quantize_int8_blocks(a, block_size)
    return (q * scale).reshape(*a.shape[:-1], -1)[..., :a.shape[-1]]


#: largest number of A rows (prod of its leading dims) that takes the Triton GEMVs: decode sizes (fp16 / bf16
#: activations take the matrix-unit kernel from 4 or 8 rows up to 64: ``_kernel_rows``)
KERNEL_MAX_M = 16
_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _use_kernel(A: torch.Tensor, B: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None,
                g_idx: torch.Tensor | None, bias: torch.Tensor | None, bits: int) -> bool:
    """The Triton kernels (``crossml.kernels.matmul_nbits``) take the product on a GPU: A of fp16/bf16/fp32 on
    a CUDA/ROCm/XPU device, bits 4, no g_idx, uint8 B, float scales, uint8 or float zero points, every input on
    A's device (the GEMV when A has at most KERNEL_MAX_M rows, the dequantization otherwise)."""
    if A.device.type not in TRITON_DEVICES or bits != 4 or g_idx is not None or A.dtype not in _KERNEL_DTYPES:
        return False
    if A.dim() == 0 or B.dtype != torch.uint8 or not scales.is_floating_point():
        return False
    if zero_points is not None and zero_points.dtype != torch.uint8 and not zero_points.is_floating_point():
        return False
    if bias is not None and not bias.is_floating_point():
        return False
    if any(t is not None and t.device != A.device for t in (B, scales, zero_points, bias)):
        return False
    return load("matmul_nbits") is not None  # imported on the first eligible call only


def _kernel_rows(A: torch.Tensor, N: int) -> bool:
    """Whether the rows of A take ``crossml.kernels.matmul_nbits.matmul_nbits`` (after ``_use_kernel``): at most
    KERNEL_MAX_M, or up to its DOT_MAX_M where its matrix-unit kernel takes them (``dot_eligible``: fp16 / bf16, 4
    rows or more); more rows dequantize the weight and multiply."""
    M = math.prod(A.shape[:-1])
    if M <= KERNEL_MAX_M:
        return True
    kernels = load("matmul_nbits")
    return M <= kernels.DOT_MAX_M and kernels.dot_eligible(A, M, N)


def constant_weight(ctx: OpContext | None, first: int, zero_points: torch.Tensor | None) -> bool:
    """Whether a 4-bit weight whose B, scales and zero points are inputs ``first``, ``first + 1`` and ``first + 2``
    is a model constant (B and scales constant, zero points absent or constant): its kernels may then read it
    before the previous kernel has finished (``OpContext.constant``)."""
    return ctx is not None and ctx.constant(first, first + 1) and (zero_points is None or ctx.constant(first + 2))


def int8_activations(accuracy_level: int, g_idx: torch.Tensor | None, zero_points: torch.Tensor | None) -> bool:
    """Whether MatMulNBits quantizes its activations to int8 per block first, as onnxruntime does at accuracy level 4
    (no g_idx; zero points absent or packed uint8)."""
    return accuracy_level == 4 and g_idx is None and (zero_points is None or zero_points.dtype == torch.uint8)


@op("MatMulNBits", domain=MS_DOMAIN, ctx=True)
def matmul_nbits(
    A: torch.Tensor,
    B: torch.Tensor,
    scales: torch.Tensor,
    zero_points: torch.Tensor | None = None,
    g_idx: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    *,
    K: int,
    N: int,
    block_size: int,
    bits: int = 4,
    accuracy_level: int = 0,
    weight_prepacked: int = 0,
    ctx: OpContext | None = None,
) -> torch.Tensor:
    if (kept := cpu_int8_kept(A, K, B, scales, zero_points, g_idx, bias, K, N, block_size, bits,
                              accuracy_level)) is not None:
        return kept[0].matmul(A, B, kept[1], kept[2], K=K, N=N, block_size=block_size)
    _check_block_size(block_size)
    if weight_prepacked:
        raise ValueError("MatMulNBits: weight_prepacked (EP-specific CUDA layouts) is not supported; use the plain layout")
    if A.shape[-1] != K:
        raise ValueError(f"MatMulNBits: A's last dimension {A.shape[-1]} != K={K}")
    int8_path = int8_activations(accuracy_level, g_idx, zero_points)
    kernels = _use_kernel(A, B, scales, zero_points, g_idx, bias, bits)
    if kernels and _kernel_rows(A, N):
        a = quantize_dequantize_int8_blocks(A.float(), block_size).to(A.dtype) if int8_path else A
        return load("matmul_nbits").matmul_nbits(a, B, scales, zero_points, bias, K=K, N=N, block_size=block_size,
                                                 const_w=constant_weight(ctx, 1, zero_points))
    compute = torch.float32 if A.device.type == "cpu" else A.dtype
    if _cpu_decode(A, B, scales, zero_points, g_idx, bits, constant_weight(ctx, 1, zero_points),
                   any_rows=int8_path and block_size in CPU_INT8_ANY_ROWS):
        a = A.reshape(-1, K).to(compute)
        y = None
        few = a.shape[0] <= CPU_PACKED_MAX_M
        if int8_path and (kept := _cpu_int8(B, scales, zero_points, K, N, block_size)) is not None:
            y = kept[0].matmul(a, B, kept[1], kept[2], K=K, N=N, block_size=block_size)
        elif few and (laid_out := _cpu_laid_out(B, scales, zero_points, K, N, block_size)) is not None:
            y = load("cpu_nbits").matmul(a, laid_out, int8=int8_path)
        elif few and (packed := _cpu_packed(B, scales, zero_points, K, N, block_size)) is not None:
            if int8_path:
                a = quantize_dequantize_int8_blocks(a, block_size)
            y = torch._weight_int4pack_mm_for_cpu(a.contiguous(), packed[0], block_size, packed[1])[:, :N]
        if y is not None:
            if bias is not None:
                y = y + bias.to(compute)
            return y.reshape(*A.shape[:-1], N).to(A.dtype)
    a = A.to(compute)
    if int8_path:
        a = quantize_dequantize_int8_blocks(a.float(), block_size).to(compute)
    if kernels:
        w = load("matmul_nbits").dequantize(B, scales, zero_points, K=K, N=N, block_size=block_size, dtype=compute)
        y = a @ w.T
    elif A.device.type == "cpu" and g_idx is None:
        y = _dequantized_product_cpu(a, B, scales, zero_points, K=K, N=N, bits=bits, block_size=block_size)
    else:
        w = dequantize_nbits(B, scales, zero_points, g_idx, K=K, N=N, bits=bits, block_size=block_size,
                             dtype=compute)
        y = a @ w.T
    if bias is not None:
        y = y + bias.to(compute)
    return y.to(A.dtype)


#: bytes of dequantized weight the CPU path holds at once (below glibc's largest heap-served allocation, 32 MB, so
#: chunks reuse heap memory instead of each call mapping fresh pages and faulting them in)
CPU_DEQUANT_CHUNK_BYTES = 8 << 20


def _dequantized_product_cpu(a: torch.Tensor, B: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None,
                             *, K: int, N: int, bits: int, block_size: int) -> torch.Tensor:
    """``a @ dequantize_nbits(B).T`` on the CPU for float32 ``a`` [..., K] (the same products up to float32 summation
    order: the BLAS may add a narrow chunk's in another order). 4-bit weights take numba's dequantization
    (``crossml.kernels.cpu_nbits.product``) where numba is installed: chunks of rows small enough to stay in the cache,
    the same values as ``dequantize_nbits``. A 128-token prompt of the Qwen2.5-0.5B-shaped builder int4 model on a
    2-core host (a process's later prompts) went from 3.2-3.3 s to 1.9-2.1 s; torch's dequantization had taken about
    1.3 s of it. Otherwise the weight is dequantized with torch ops and multiplied in chunks of rows of at most
    CPU_DEQUANT_CHUNK_BYTES. With that dequantization, the prompt took 2.6-3.1 s against 3.1-4.6 s before (three
    prompts a process, the trees' processes alternated twice); the lm_head's product alone (128 rows), whole against
    in chunks, 1,058 -> 524 ms: the chunks avoid mapping and faulting in a fresh float32 copy of the whole weight on
    every call."""
    n_blocks = (K + block_size - 1) // block_size
    blob = block_size * bits // 8
    if B.numel() != N * n_blocks * blob or scales.numel() != N * n_blocks:  # dequantize_nbits names what is wrong
        dequantize_nbits(B, scales, zero_points, None, K=K, N=N, bits=bits, block_size=block_size, dtype=torch.float32)
    a2 = a.reshape(-1, K)
    if (bits == 4 and B.dtype == torch.uint8 and scales.is_floating_point()
            and _zero_points_fit(zero_points, N, n_blocks) and (kernels := load("cpu_nbits")) is not None):
        y = kernels.product(a2, B, scales, zero_points, K=K, N=N, block_size=block_size)
        return y.reshape(*a.shape[:-1], N)
    rows = max(1, CPU_DEQUANT_CHUNK_BYTES // (n_blocks * block_size * 4))
    if rows >= N:
        w = dequantize_nbits(B, scales, zero_points, None, K=K, N=N, bits=bits, block_size=block_size,
                             dtype=torch.float32)
        return a @ w.T
    b2, s2 = B.reshape(N, n_blocks * blob), scales.reshape(N, n_blocks)
    z2 = None if zero_points is None else zero_points.reshape(N, -1)
    y = torch.empty((a2.shape[0], N), dtype=torch.float32)
    for n0 in range(0, N, rows):
        n1 = min(N, n0 + rows)
        w = dequantize_nbits(b2[n0:n1], s2[n0:n1], None if z2 is None else z2[n0:n1], None, K=K, N=n1 - n0,
                             bits=bits, block_size=block_size, dtype=torch.float32)
        y[:, n0:n1] = a2 @ w.T
    return y.reshape(*a.shape[:-1], N)


def _zero_points_fit(zero_points: torch.Tensor | None, N: int, n_blocks: int) -> bool:
    """Whether 4-bit zero points are absent, packed uint8 of N * ceil(n_blocks / 2) values or float of N * n_blocks
    (otherwise the torch path names what is wrong)."""
    if zero_points is None:
        return True
    if zero_points.dtype == torch.uint8:
        return zero_points.numel() == N * ((n_blocks + 1) // 2)
    return zero_points.is_floating_point() and zero_points.numel() == N * n_blocks


_CPU_NBITS = "_crossml_cpu_nbits"  # attribute of B holding (``cpu_nbits.Packed``, scales, zero points)


def _cpu_decode(A: torch.Tensor, B: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None,
                g_idx: torch.Tensor | None, bits: int, constant: bool, any_rows: bool = False) -> bool:
    """Whether a product may take one of the CPU's decode kernels (``_cpu_int8``, ``_cpu_laid_out``, else
    ``_cpu_packed``): on the CPU, a model constant's 4-bit uint8 B with float scales, uint8 / float / no zero points
    and no g_idx, at most CPU_PACKED_MAX_M rows of A (``any_rows``: any number, for the int8 kernel only)."""
    if (A.device.type != "cpu" or not constant or bits != 4 or g_idx is not None or B.dtype != torch.uint8
            or not scales.is_floating_point() or (not any_rows and math.prod(A.shape[:-1]) > CPU_PACKED_MAX_M)):
        return False
    return zero_points is None or zero_points.dtype == torch.uint8 or zero_points.is_floating_point()


def _kept(B: torch.Tensor, attr: str, scales: torch.Tensor, zero_points: torch.Tensor | None, K: int, N: int,
          block_size: int, make):
    """What a CPU decode kernel keeps per weight on B under ``attr``: ``make(n_blocks)``'s value (None: the kernel does
    not take this weight), made on the first call with these scales and zero points, or None where B, scales or zero
    points have other sizes (the dequantizing path names what is wrong)."""
    kept = getattr(B, attr, None)
    if kept is not None and kept[1] is scales and kept[2] is zero_points:
        return kept[0]
    n_blocks = (K + block_size - 1) // block_size
    if (B.numel() != N * n_blocks * block_size // 2 or scales.numel() != N * n_blocks
            or not _zero_points_fit(zero_points, N, n_blocks)):
        return None
    made = make(n_blocks)
    if made is not None:
        setattr(B, attr, (made, scales, zero_points))
    return made


_CPU_INT8 = "_crossml_cpu_int8"  # attribute of B holding (the int8 kernel's scale arrays, scales, zero points)


def _cpu_int8(B: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None, K: int, N: int,
              block_size: int):
    """For a product ``_cpu_decode`` admits on the int8 path: (the module ``crossml.kernels.cpu_int8``, its scale
    arrays (views of float32 scales and packed zero points), K, N, block_size), kept on B (x86 integer dot products on
    B, scales and zero points as they are), or None where that kernel does not take the product: no AVX2, numba
    or llvmlite, blocks not of 32-256 values, float zero points, other sizes."""
    def make(n_blocks: int):
        kernels = load("cpu_int8")
        if kernels is None or not kernels.eligible(block_size) or (zero_points is not None
                                                                    and zero_points.dtype != torch.uint8):
            return None
        return (kernels, *kernels.scales_zero_points(scales, zero_points, N, n_blocks), K, N, block_size)

    return _kept(B, _CPU_INT8, scales, zero_points, K, N, block_size, make)


def cpu_int8_kept(A: torch.Tensor, width: int, B: torch.Tensor, scales: torch.Tensor,
                  zero_points: torch.Tensor | None, g_idx: torch.Tensor | None, bias: torch.Tensor | None, K: int,
                  N: int, block_size: int, bits: int, accuracy_level: int) -> tuple | None:
    """For a product whose weight already took the int8 kernel (``_cpu_int8`` kept its arrays on B, which only a model
    constant's B gets, after the op's checks), with the same scales, zero points and attributes, no bias or g_idx, and
    float32 CPU activations A of ``width`` values a row (K; 2K for a fused node's ``[g | up]``) in rows the kernel
    takes (``_int8_rows``): (the module ``crossml.kernels.cpu_int8``, its two arrays), so the call goes straight to
    the kernel; None otherwise (the op's full route then runs). A decode step of the Qwen2.5-0.5B-shaped builder int4
    model runs about a hundred of these; the checks of the full route had cost about 15 us a call."""
    kept = getattr(B, _CPU_INT8, None)
    if (kept is None or kept[1] is not scales or kept[2] is not zero_points or g_idx is not None or bias is not None
            or accuracy_level != 4 or bits != 4):
        return None
    if (A.device.type != "cpu" or A.dtype != torch.float32 or not A.dim() or A.shape[-1] != width
            or not _int8_rows(A.numel() // width, block_size)):
        return None
    kernels, s, zp, k, n, bs = kept[0]
    return (kernels, s, zp) if k == K and n == N and bs == block_size else None


def _cpu_laid_out(B: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None, K: int, N: int,
                  block_size: int):
    """For a product ``_cpu_decode`` admits: the weight laid out for ``crossml.kernels.cpu_nbits`` (numba), kept on
    B, or None where numba is not installed or the sizes are wrong."""
    def make(n_blocks: int):
        kernels = load("cpu_nbits")
        return None if kernels is None else kernels.prepare(B, scales, zero_points, K=K, N=N, block_size=block_size)

    return _kept(B, _CPU_NBITS, scales, zero_points, K, N, block_size, make)


#: block sizes whose products on the int8 path take ``crossml.kernels.cpu_int8`` at any number of rows: its
#: ``tile32`` kernel multiplies two rows of A by two of B a step, which for a 128-token prompt is level with or ahead
#: of dequantizing the weight for torch's float32 BLAS (Qwen2.5-0.5B's shapes on a 2-core AVX2 host: gate+up 19.2
#: against 20.4 ms, down 9.7 against 11.1, the lm_head 319 against 344), with onnxruntime's integer arithmetic and
#: each row's values those of a one-row product
CPU_INT8_ANY_ROWS = (32,)


def _int8_rows(rows: int, block_size: int) -> bool:
    """Whether this many rows of A may take the int8 kernel: at most CPU_PACKED_MAX_M, or any number for
    CPU_INT8_ANY_ROWS' block sizes."""
    return rows <= CPU_PACKED_MAX_M or block_size in CPU_INT8_ANY_ROWS


#: most rows of A (prod of its leading dims) that take the CPU's packed int4 kernel: its time grows with the rows
#: (1 row: 14x faster than dequantizing at Qwen2.5-0.5B's gate+up; 128 rows: 16x slower), so decode steps take it
CPU_PACKED_MAX_M = 8
_CPU_PACKED_GROUPS = (32, 64, 128, 256)
_CPU_PACKED = "_crossml_cpu_int4pack"  # attribute of B holding (packed weight, scales and zeros, scales, zero points)


def _cpu_packed(B: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None, K: int, N: int,
                block_size: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """For a product ``_cpu_decode`` admits: (packed weight, scales and zeros) for torch's CPU int4 kernel, packed on
    the first call and kept on B, or None where that kernel does not take the product: K not a multiple of
    block_size, block_size outside 32-256. The kernel takes N in
    multiples of 16: the packed weight has zero rows past N (the caller keeps the first N columns), so a product's
    columns come out the same whatever N is (a merged gate+up product equals its two halves exactly).
    Float32 throughout: with bfloat16 activations and scales the kernel is about 10x faster, but a product then
    differs from onnxruntime's by up to 0.05 where the float32 one stays within 2e-3 (tests/ops/contrib)."""
    if (K % block_size or block_size not in _CPU_PACKED_GROUPS or not hasattr(torch, "_weight_int4pack_mm_for_cpu")
            or not hasattr(torch, "_convert_weight_to_int4pack_for_cpu")):
        return None
    kept = getattr(B, _CPU_PACKED, None)
    if kept is not None and kept[2] is scales and kept[3] is zero_points:
        return kept[0], kept[1]
    n_blocks = K // block_size
    if B.numel() != N * K // 2 or scales.numel() != N * n_blocks:
        return None  # the dequantizing path names what is wrong
    q = unpack_bits(B.reshape(N, K // 2), 4).to(torch.int32)
    s, zp = _scales_zero_points(scales, zero_points, N, n_blocks, 4, torch.float32)
    pad = -N % 16
    if pad:  # zero rows: scale 0 and zero term 0
        q, s, zp = (torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (q, s, zp))
    try:
        packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
    except RuntimeError:  # a torch build whose kernel takes other shapes: the dequantizing path runs instead
        return None
    scales_zeros = torch.stack([s.t(), ((8.0 - zp) * s).t()], dim=-1).contiguous()  # [n_blocks, N, 2]
    setattr(B, _CPU_PACKED, (packed, scales_zeros, scales, zero_points))
    return packed, scales_zeros


def _packed_uint8(data: torch.Tensor, scales: torch.Tensor, bits: int, quantize_axis: int, block_size: int) -> bool:
    """Whether uint8 ``data`` holds packed sub-byte values (ONNX uint8) rather than one uint4 per element.

    crossml holds uint4 unpacked in uint8 (OpContext carries no input types), so the shapes decide.
    """
    if bits == 8 or data.dtype != torch.uint8:
        return False
    per = 8 // bits
    last = data.dim() - 1
    if quantize_axis != last:
        return scales.shape[last] == data.shape[last] * per
    n_packed = -(-data.shape[last] * per // block_size)
    return n_packed == scales.shape[last]


def _gather_kernel(data: torch.Tensor, indices: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None,
                   block_size: int) -> bool:
    """The Triton gather (``crossml.kernels.matmul_nbits.gather_rows``) takes 4-bit rows on a GPU: every input on
    one CUDA/ROCm/XPU device, int32/int64 indices, fp16/bf16/fp32 scales of [V, n_blocks], packed uint8 zero
    points or none, block_size a power of two >= 16."""
    if data.device.type not in TRITON_DEVICES or scales.dtype not in _KERNEL_DTYPES or scales.dim() != 2:
        return False
    if indices.dtype not in (torch.int32, torch.int64) or block_size < 16 or block_size & (block_size - 1):
        return False
    if zero_points is not None and zero_points.dtype != torch.uint8:
        return False
    if any(t.device != data.device for t in (indices, scales, zero_points) if t is not None):
        return False
    return load("matmul_nbits") is not None  # imported on the first eligible call only


def _cpu_gather(data: torch.Tensor, indices: torch.Tensor, scales: torch.Tensor,
                zero_points: torch.Tensor | None) -> bool:
    """numba's CPU gather (``crossml.kernels.cpu_gather``) takes 4-bit rows: CPU tensors, integer indices, float32
    scales of [V, n_blocks], packed uint8 zero points of [V, ceil(n_blocks / 2)] or none, numba installed."""
    if data.device.type != "cpu" or scales.dtype != torch.float32 or scales.dim() != 2 or indices.is_floating_point():
        return False
    if scales.shape[0] != data.shape[0] or indices.device.type != "cpu" or scales.device.type != "cpu":
        return False
    if zero_points is not None and (zero_points.dtype != torch.uint8 or zero_points.device.type != "cpu"
                                    or tuple(zero_points.shape) != (data.shape[0], (scales.shape[1] + 1) // 2)):
        return False
    return load("cpu_gather") is not None


@op("GatherBlockQuantized", domain=MS_DOMAIN)
def gather_block_quantized(
    data: torch.Tensor,
    indices: torch.Tensor,
    scales: torch.Tensor,
    zero_points: torch.Tensor | None = None,
    *,
    bits: int = 4,
    block_size: int = 128,
    gather_axis: int = 0,
    quantize_axis: int = 1,
) -> torch.Tensor:
    rank = data.dim()
    ga = norm_axis(gather_axis, rank)
    qa = norm_axis(quantize_axis, rank)
    is_fp8 = data.dtype in _FLOAT8
    _check_block_size(block_size, allow_zero=is_fp8)
    packed = _packed_uint8(data, scales, bits, qa, block_size) if not is_fp8 else False
    if packed and ga == rank - 1:
        raise ValueError("GatherBlockQuantized: packed uint8 data cannot be gathered along its last (packed) axis")
    if packed and bits == 4 and rank == 2 and ga == 0 and qa == 1 and _gather_kernel(data, indices, scales,
                                                                                      zero_points, block_size):
        return load("matmul_nbits").gather_rows(data, indices, scales, zero_points, block_size=block_size)
    if packed and bits == 4 and rank == 2 and ga == 0 and qa == 1 and _cpu_gather(data, indices, scales, zero_points):
        return load("cpu_gather").gather_rows(data, indices, scales, zero_points, block_size)
    per = 8 // bits if packed else 1
    logical = list(data.shape)
    logical[-1] *= per
    size = logical[ga]

    idx = indices.long()
    idx = torch.where(idx < 0, idx + size, idx)
    valid = (idx >= 0) & (idx < size)
    flat = torch.where(valid, idx, torch.zeros_like(idx)).reshape(-1)

    q = data.index_select(ga, flat)
    if packed:
        q = unpack_bits(q, bits)
    bs = logical[qa] if block_size == 0 else block_size

    def expand(t: torch.Tensor) -> torch.Tensor:
        """Per-block tensor gathered along the gather axis and repeated to one value per element."""
        if ga == qa:
            t = t.index_select(ga, flat // bs)
        else:
            t = t.index_select(ga, flat) if t.shape[ga] != 1 else t
            t = t.repeat_interleave(bs, dim=qa).narrow(qa, 0, logical[qa]) if t.shape[qa] != 1 else t
        return t

    out_dtype = scales.dtype
    s = expand(scales)
    if is_fp8:
        y = q.to(torch.float32) * s.to(torch.float32)
    else:
        if zero_points is not None:
            zp = zero_points
            if packed:
                zp = unpack_bits(zp, bits)
                zp = zp.narrow(-1, 0, scales.shape[-1])
            zp = expand(zp).to(torch.float32)
        else:
            zp = float(1 << (bits - 1)) if data.dtype == torch.uint8 and packed or bits == 8 else 0.0
        y = (q.to(torch.float32) - zp) * s.to(torch.float32)
    out_shape = logical[:ga] + list(indices.shape) + logical[ga + 1 :]
    mask_shape = [1] * ga + list(indices.shape) + [1] * (rank - ga - 1)
    y = torch.where(valid.reshape(mask_shape), y.reshape(out_shape), torch.zeros((), dtype=y.dtype, device=y.device))
    return y.to(out_dtype)
