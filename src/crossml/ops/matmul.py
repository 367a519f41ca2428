"""Matrix products: Gemm, MatMul, Einsum, MatMulInteger, Det.

Floating-point products go straight to ``torch.matmul`` / ``torch.addmm`` (cuBLAS, oneDNN...)
without copies. A Triton GEMV for decode-sized fp16/bf16 products (``crossml.kernels.gemv``, imported
on first use; see ``gemv_eligible``) takes MatMuls of at most 16 activation rows on the devices listed
in ``GEMV_DEVICES``; with a constant weight (``OpContext.constant``) it reads its first tiles while the
previous kernel finishes.
Integer products keep ONNX's wrap-around semantics and dtype: on the CPU torch multiplies integers
natively; accelerators have no integer GEMM in torch, so narrow integers go through float64 (exact
for them) and wide ones through an exact broadcast-multiply-sum.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

from crossml.kernels import load
from crossml.ops.registry import OpContext, op

log = logging.getLogger("crossml")

#: unsigned types torch cannot multiply: compute in a signed type with the same wrap-around.
_SIGNED_FOR = {torch.uint16: torch.int32, torch.uint32: torch.int64}
#: integer types whose products a float64 GEMM computes exactly (|a*b| * K < 2**53).
_EXACT_IN_F64 = {torch.int8, torch.uint8, torch.int16, torch.uint16, torch.bool}


def _check_float_or_int(name: str, *ts: torch.Tensor) -> None:
    for t in ts:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} takes numeric tensors, got {type(t).__name__}")
    if len({t.dtype for t in ts}) > 1:
        raise TypeError(f"{name} inputs must share one element type, got {', '.join(str(t.dtype) for t in ts)}")


def int_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` for integer tensors of one dtype, wrapping like C integers, in that dtype."""
    dtype = a.dtype
    if dtype == torch.uint64:
        return int_matmul(a.view(torch.int64), b.view(torch.int64)).view(torch.uint64)
    if dtype in _SIGNED_FOR:
        return int_matmul(a.to(_SIGNED_FOR[dtype]), b.to(_SIGNED_FOR[dtype])).to(dtype)
    if a.device.type == "cpu":
        return torch.matmul(a, b)
    if dtype in _EXACT_IN_F64:
        return torch.matmul(a.to(torch.float64), b.to(torch.float64)).to(dtype)
    # exact for int32/int64 on accelerators without integer GEMM: (.., M, K, 1) * (.., 1, K, N)
    a2 = a.unsqueeze(0) if a.dim() == 1 else a
    b2 = b.unsqueeze(-1) if b.dim() == 1 else b
    y = (a2.unsqueeze(-1) * b2.unsqueeze(-3)).sum(-2, dtype=dtype)
    if a.dim() == 1:
        y = y.squeeze(-2)
    if b.dim() == 1:
        y = y.squeeze(-1)
    return y


#: devices, dtypes and limits of the Triton GEMV path (see ``gemv_eligible``). CUDA (NVIDIA; ROCm builds of torch
#: take it too, untested): in CUDA graphs on an H200, runs of same-shape products of distinct constant weights
#: (benchmarks/gemv_tiles.py), it measured 2.8 / 2.6 / 7.2 / 5.3 us per product against cuBLAS's 4.2 / 3.7 / 7.1
#: / 7.0 us at the Qwen2.5-0.5B decode shapes (K x N 896x1152, 896x896, 896x9728, 4864x896) and 6.2 / 5.1 / 19.1
#: / 12.3 us against 6.3 / 5.9 / 18.3 / 13.0 us at Llama-3.2-1B's (2048x3072, 2048x2048, 2048x16384, 8192x2048);
#: whole decode steps: Qwen 0.78 against 0.83-0.93 ms, Llama 0.99 against 1.05 ms. The vocabulary
#: products (K x N >= 2**26: 896x151936, 2048x128256) take the GEMV's streaming kernel (GEMV_STREAM, below). On
#: row-major weights cuBLAS read them 8-23% faster than the GEMV (benchmarks/results/gemv_tiles.md); on column-major
#: ones the GEMV's tiles (no launch gap or memset before it, its first tiles read under the previous kernel) made the
#: captured fp16 decode steps faster on an H100 (Qwen2.5-0.5B 0.610 / 0.634 / 0.634 -> 0.604 / 0.629 / 0.629 ms,
#: Llama-3.2-1B 1.051-1.059 -> 1.043-1.047) but slower on an H200 (0.522 / 0.545 -> 0.530 / 0.554, 0.828-0.837 ->
#: 0.836-0.840; no other tiles did better there) (benchmarks/results/decode_tiles.md).
#: XPU is not listed: not measured.
#:
#: Batched decode (2 to GEMV_MAX_M rows) runs the GEMV's matrix-unit kernel (``crossml.kernels.gemv``,
#: ``_gemv_dot_kernel``, with the skip-norm and SiLU gate fused), whose 16-row tiles of ``a`` cost about the same
#: for 2 to 16 rows. Weights of more than GEMV_BATCHED_MAX_WEIGHT values are left to cuBLAS from 2 rows. Past 16
#: rows, cuBLAS is faster at the wide products. Measurements (benchmarks/results/int4_batch_fp16_rows.md, H200,
#: CUDA graphs of like products):
#:
#: * the kernel led at 8 and 16 rows at the narrow products (Qwen2.5-0.5B's qkv 2.9 / 3.0 against 4.2 / 4.4 us);
#: * it was level at Qwen2.5-0.5B's gate+up (896 x 9728);
#: * it trailed at Llama-3.2-1B's gate+up (2048 x 16384: 23.3 against 18.9 us at 8 rows).
#:
#: In the GenAI benchmark's fp16 decode steps (benchmarks/results/genai_batch_fp16_rows.md; the limits before and
#: after alternated, one call per GPU), 5 to 16 rows on the kernel took Qwen2.5-0.5B from 8,767-8,785 to
#: 11,316-11,347 tokens/s at B = 8 (H200; H100 8,138-8,188 -> 10,299-10,313). Llama-3.2-1B took them only below the
#: limit, that is its qkv and o products: with every product on the kernel it was slower (7,861 -> 7,452 at B = 8).
#: Its gate+up and down on cuBLAS from 2 rows took B = 2 / 4 / 8 from 1,980 / 3,903-3,920 / 7,538-7,555 to
#: 2,122-2,123 / 4,254-4,261 / 7,900-7,903 (H200; H100 +2-5 %). A 20M limit, with the down projection (16.8M) on the
#: kernel, was slower.
#:
#: Past GEMV_BATCHED_MAX_WEIGHT, a product whose N is at most its K (a down projection) takes the GEMV's Gluon
#: kernel where it applies (``crossml.kernels.gemv.mma_eligible``: NVIDIA sm80+, column-major W, K a multiple of
#: 128), with the SiLU gate and the skip-norm fused; GEMV_MMA_TALL = False leaves those to cuBLAS too. Wide ones
#: (an MLP's gate+up) stay on cuBLAS, which read them faster than either kernel (benchmarks/results/gemv_mma.md).
GEMV_DEVICES: tuple[str, ...] = ("cuda",)
GEMV_DTYPES = (torch.float16, torch.bfloat16)
GEMV_MAX_M = 16
GEMV_BATCHED_MAX_WEIGHT = 10_000_000
GEMV_MIN_KN = 256
GEMV_MAX_WEIGHT = 1 << 26
GEMV_MMA_TALL = True
#: One-row products past GEMV_MAX_WEIGHT (vocabulary products: an LLM's lm_head) with K <= GEMV_STREAM_MAX_K run the
#: GEMV too, on its weight stored column-major, which streams them (``crossml.kernels.gemv``'s ``_stream_kernel``:
#: persistent programs, each walking its column blocks with the next block's tile in flight): in CUDA graphs after
#: the RMSNorm kernel (benchmarks/vocab_gemv.py, results/vocab_gemv*.md) Qwen2.5-0.5B's lm_head (896 x 151936) took
#: 90.5 us on an H100 and 66.4 on an H200 against cuBLAS's 93.4 and 65.8, Llama-3.2-1B's (2048 x 128256) 170.2 and
#: 121.1 against 182.9 and 124.7 (3.1 and 4.3 TB/s). The GEMV's own tiles had been faster than cuBLAS on the H100
#: only (88.9 / 170.9 us there, 73.9 / 134.1 on the H200). Several rows, and prompts, stay on the vendor GEMM, on the
#: transposed weight. False keeps every product past the cap on the vendor GEMM.
GEMV_STREAM = True
GEMV_STREAM_MAX_K = 4096
#: the ops whose weights past GEMV_MAX_WEIGHT are stored column-major for it: the plain products (the fused ones,
#: an MLP's gated or normed products past the cap, keep their row-major weights and the vendor GEMM: unmeasured)
STREAM_OPS = {("", "MatMul"), ("com.crossml", "Linear")}


#: ops whose input 1 is a constant [K, N] weight that a GPU plan may store column-major (see column_major_weight)
COLUMN_MAJOR_OPS = {("", "MatMul"), ("com.crossml", "Linear"), ("", "Gemm")}
#: ops whose weight (input 1; AttentionSkipNorm's ``ops.layout.weight_input``) a GPU plan stores column-major when it is
#: a half-precision decode weight (column_major_weight)
GEMV_WEIGHT_OPS = {("", "MatMul"), ("com.crossml", "Linear"), ("com.crossml", "MatMulSkipNorm"),
                   ("com.crossml", "MatMulSiluMul"), ("com.crossml", "AttentionSkipNorm")}


def column_major_weight(domain: str, op_type: str, w: Any, device: torch.device, attrs: dict[str, Any],
                        tf32: bool) -> bool:
    """Whether a plan stores the constant weight of this node (``ops.layout.weight_input``) column-major on
    ``device`` (same values and shape, transposed strides):

    - float32 2-D weights of MatMul, Linear and Gemm (without transB) multiplied with TF32 (``tf32``: the
      provider's use_tf32; strict fp32 runs as fast or faster row-major) where the device layer says its BLAS
      prefers it (``device.vendor.column_major_fp32_weights``);
    - float16 / bfloat16 weights of GEMV_WEIGHT_OPS (MatMul, Linear, MatMulSkipNorm, MatMulSiluMul and
      AttentionSkipNorm's output projection) that the Triton kernels take at decode sizes (GEMV_DEVICES,
      GEMV_MIN_KN <= K, N and K * N < GEMV_MAX_WEIGHT, or past it MatMul's and Linear's with K <= GEMV_STREAM_MAX_K
      while GEMV_STREAM holds: a vocabulary product, streamed): the GEMV reads a column-major weight faster, as
      contiguous runs along K (``crossml.kernels.gemv``; the GenAI benchmark's captured decode step on an H200:
      Qwen2.5-0.5B fp16 0.577-0.590 against 0.647-0.648 ms, Llama-3.2-1B 0.862-0.870 against 0.892-0.903).
      Prompts' products run on the vendor GEMM, which takes the transposed operand as it is: at 512 rows cuBLAS
      took 0-10% longer on it (benchmarks/results/gemv_colmajor.md).
    """
    if (domain, op_type) in GEMV_WEIGHT_OPS and isinstance(w, torch.Tensor) and w.dtype in GEMV_DTYPES:
        return (device.type in GEMV_DEVICES and w.dim() == 2 and min(w.shape) >= GEMV_MIN_KN
                and (w.numel() < GEMV_MAX_WEIGHT or (domain, op_type) in STREAM_OPS and _streamed(*w.shape)))
    if not tf32 or (domain, op_type) not in COLUMN_MAJOR_OPS or not isinstance(w, torch.Tensor):
        return False
    if w.dtype != torch.float32 or w.dim() != 2 or min(w.shape) < 2 or attrs.get("transB"):
        return False
    from crossml.device.vendor import column_major_fp32_weights

    return column_major_fp32_weights(device)


def gemv_eligible(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether ``a @ w (+ bias)`` runs the Triton GEMV: ``a`` on a device of GEMV_DEVICES, fp16 or bf16,
    ``w`` a 2-D [K, N] matrix of the same dtype and device stored contiguous or column-major (its transpose
    contiguous, ``column_major_weight``), at most GEMV_MAX_M rows of ``a``
    (the product of its leading dims), K and N >= GEMV_MIN_KN, K * N < GEMV_MAX_WEIGHT (or past it one row of a
    column-major weight with K <= GEMV_STREAM_MAX_K, while GEMV_STREAM holds: a vocabulary product) (and at most
    GEMV_BATCHED_MAX_WEIGHT for 2 rows or more, unless N <= K and the Gluon kernel takes it), a bias (if any) of
    N values of the same dtype and device, and triton importable. Anything else (CPU tensors included)
    keeps torch."""
    if a.device.type not in GEMV_DEVICES or a.dtype not in GEMV_DTYPES or w.dtype != a.dtype:
        return False
    if w.dim() != 2 or a.dim() == 0 or w.device != a.device or not (w.is_contiguous() or w.t().is_contiguous()):
        return False
    K, N = w.shape
    M = math.prod(a.shape[:-1])
    if a.shape[-1] != K or K < GEMV_MIN_KN or N < GEMV_MIN_KN or not 1 <= M <= GEMV_MAX_M:
        return False
    if K * N >= GEMV_MAX_WEIGHT and not (M == 1 and _streamed(K, N) and not w.is_contiguous()):
        return False
    if M > 1 and K * N > GEMV_BATCHED_MAX_WEIGHT and not (GEMV_MMA_TALL and N <= K and _mma_takes(a, w, M)):
        return False
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != N or bias.dtype != a.dtype
                             or bias.device != a.device):
        return False
    return load("gemv") is not None  # imported on the first eligible call only


def _streamed(K: int, N: int) -> bool:
    """Whether a [K, N] weight past GEMV_MAX_WEIGHT runs the GEMV at one row (GEMV_STREAM, K <= GEMV_STREAM_MAX_K)."""
    return GEMV_STREAM and K * N >= GEMV_MAX_WEIGHT and K <= GEMV_STREAM_MAX_K


def _mma_takes(a: torch.Tensor, w: torch.Tensor, M: int) -> bool:
    """Whether the GEMV's Gluon kernel takes M rows of ``a`` with ``w`` (``crossml.kernels.gemv.mma_eligible``)."""
    kernels = load("gemv")
    return kernels is not None and kernels.mma_eligible(a, w, M)


def matmul_any(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """numpy.matmul semantics (1-D promotion, batch broadcasting) in the inputs' dtype."""
    if a.is_floating_point() or a.is_complex():
        return torch.matmul(a, b)
    return int_matmul(a, b)


@op("MatMul", since=1, ctx=True)
@op("MatMul", since=9, ctx=True)
@op("MatMul", since=13, ctx=True)
def matmul(a: torch.Tensor, b: torch.Tensor, *, ctx: OpContext | None = None) -> torch.Tensor:
    _check_float_or_int("MatMul", a, b)
    if a.dim() == 0 or b.dim() == 0:
        raise ValueError(f"MatMul needs inputs of rank >= 1, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    if gemv_eligible(a, b):
        from crossml.kernels.gemv import gemv

        return gemv(a, b, const_w=ctx is not None and ctx.constant(1))
    return matmul_any(a, b)


@op("Gemm", since=1)
@op("Gemm", since=6)
@op("Gemm", since=7)
@op("Gemm", since=9)
@op("Gemm", since=11)
@op("Gemm", since=13)
def gemm(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None, *, alpha: float = 1.0,
         beta: float = 1.0, transA: int = 0, transB: int = 0, broadcast: int = 0) -> torch.Tensor:
    _check_float_or_int("Gemm", a, b)
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"Gemm needs 2-D A and B, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    a = a.mT if transA else a
    b = b.mT if transB else b
    if c is not None and beta == 0.0:
        c = None
    if a.is_floating_point():
        if c is not None and c.dim() <= 2:
            return torch.addmm(c.to(a.dtype), a, b, beta=beta, alpha=alpha)
        y = torch.mm(a, b)
        if alpha != 1.0:
            y = y * alpha
        return y if c is None else y + (c if beta == 1.0 else beta * c)
    # integers: exact product, float scaling only when alpha/beta are not 1
    y = int_matmul(a, b)
    if alpha == 1.0 and beta == 1.0:
        return y if c is None else (y + c).to(a.dtype)
    out = y.to(torch.float64) * alpha
    if c is not None:
        out = out + c.to(torch.float64) * beta
    return out.to(a.dtype)


@op("Einsum", since=12)
def einsum(*inputs: torch.Tensor, equation: str) -> torch.Tensor:
    if not inputs:
        raise ValueError("Einsum needs at least one input")
    eq = equation.replace(" ", "")
    dtype = inputs[0].dtype
    if dtype == torch.uint64:
        return torch.einsum(eq, *[t.view(torch.int64) for t in inputs]).view(dtype)
    if dtype in _SIGNED_FOR:
        return torch.einsum(eq, *[t.to(torch.int64) for t in inputs]).to(dtype)
    if not (dtype.is_floating_point or dtype.is_complex) and inputs[0].device.type != "cpu":
        return torch.einsum(eq, *[t.to(torch.float64) for t in inputs]).to(dtype)
    y = torch.einsum(eq, *inputs)
    return y if y.dtype == dtype else y.to(dtype)


@op("MatMulInteger", since=10)
def matmul_integer(a: torch.Tensor, b: torch.Tensor, a_zero_point: torch.Tensor | None = None,
                   b_zero_point: torch.Tensor | None = None) -> torch.Tensor:
    for name, t in (("A", a), ("B", b)):
        if t.dtype not in (torch.int8, torch.uint8):
            raise TypeError(f"MatMulInteger input {name} must be int8 or uint8, got {t.dtype}")
    a32 = _minus_zero_point(a, a_zero_point, row=True)
    b32 = _minus_zero_point(b, b_zero_point, row=False)
    return int_matmul(a32, b32)


def _minus_zero_point(x: torch.Tensor, zp: torch.Tensor | None, *, row: bool) -> torch.Tensor:
    """``x - zp`` in int32; a 1-D zero point of A is per row (one per M), of B per column (one per N)."""
    x32 = x.to(torch.int32)
    if zp is None:
        return x32
    zp32 = zp.to(torch.int32)
    if zp32.dim() == 1 and zp32.numel() > 1 and row:
        zp32 = zp32.unsqueeze(-1)
    return x32 - zp32


@op("Det", since=11)
def det(x: torch.Tensor) -> torch.Tensor:
    if x.dim() < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError(f"Det needs square matrices in the last two dimensions, got shape {tuple(x.shape)}")
    if x.dtype in (torch.float16, torch.bfloat16):
        return torch.linalg.det(x.to(torch.float32)).to(x.dtype)
    return torch.linalg.det(x)
