"""Triton GEMM: ONNX MatMul and Gemm without a vendor math library, beside their torch references.

One kernel serves both ops: ``Y = alpha * (A @ B) + beta * C`` over a batch grid dimension,
tiled (grouped tile order for L2 reuse), autotuned over a few block configurations, fp16 /
bf16 / fp32 inputs accumulating in fp32 (fp64 in fp64), TF32 for fp32 inputs when allowed.
Every operand is read through its strides, so transposed or broadcast (stride-0) operands need
no copy; C is any tensor broadcastable to the output (bias rows, columns, scalars).

``matmul(a, b)`` has ONNX MatMul (numpy.matmul) semantics: 1-D operands, broadcast batch dims.
``gemm(a, b, c)`` has ONNX Gemm semantics. ``*_reference`` are the torch definitions the tests
compare against. Under TRITON_INTERPRET=1 the kernel runs in Triton's interpreter (see ``_launch``).
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from crossml.kernels._launch import batch_grid, cdiv, check_float, grouped_tile, prune_tiles, use_interpreter, want_tf32
from crossml.ops._util import broadcast_shapes

__all__ = ["gemm", "gemm_reference", "matmul", "matmul_reference"]


def _gemm_kernel(a_ptr, b_ptr, c_ptr, y_ptr, M, N, K, B, B1,
                 s_a0, s_a1, s_am, s_ak, s_b0, s_b1, s_bk, s_bn, s_c0, s_c1, s_cm, s_cn, s_y0, s_y1, s_ym, s_yn,
                 alpha, beta,
                 HAS_C: tl.constexpr, SCALE: tl.constexpr, PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr,
                 ACC_DTYPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 GROUP_M: tl.constexpr):
    """One (BLOCK_M, BLOCK_N) tile of batch entry ``program_id(1) + 65535 * program_id(2)``.

    The batch index splits into two dims (B // B1, B1), each with its own stride per operand, so
    a broadcast operand (stride 0) is read in place.
    """
    pid = tl.program_id(0)
    batch = tl.program_id(1) + tl.program_id(2) * 65535  # _launch.GRID_YZ_MAX
    in_batch = batch < B
    batch = tl.minimum(batch, B - 1)
    i0 = (batch // B1).to(tl.int64)
    i1 = (batch % B1).to(tl.int64)
    # grouped order: GROUP_M row-tiles share each column-tile of B while it is in L2
    pid_m, pid_n = grouped_tile(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # rows/columns past the edge re-read valid ones (never stored): only K needs a load mask
    rows = offs_m % M
    cols = offs_n % N
    a_ptrs = a_ptr + i0 * s_a0 + i1 * s_a1 + rows[:, None] * s_am + offs_k[None, :] * s_ak
    b_ptrs = b_ptr + i0 * s_b0 + i1 * s_b1 + offs_k[:, None] * s_bk + cols[None, :] * s_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC_DTYPE)
    for k0 in range(0, K, BLOCK_K):
        k_ok = offs_k < K - k0
        a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None], other=0.0)
        if DOT_IN_FP32:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PRECISION, out_dtype=ACC_DTYPE)
        a_ptrs += BLOCK_K * s_ak
        b_ptrs += BLOCK_K * s_bk

    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N) & in_batch
    if SCALE:
        acc = acc * alpha
    if HAS_C:
        c_ptrs = c_ptr + i0 * s_c0 + i1 * s_c1 + offs_m[:, None] * s_cm + offs_n[None, :] * s_cn
        acc += beta * tl.load(c_ptrs, mask=mask, other=0.0).to(ACC_DTYPE)
    y_ptrs = y_ptr + i0 * s_y0 + i1 * s_y1 + offs_m[:, None] * s_ym + offs_n[None, :] * s_yn
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)


def _configs() -> list[triton.Config]:
    shapes = [  # (BLOCK_M, BLOCK_N, BLOCK_K, stages, warps): the Triton tutorial's set, trimmed
        (128, 256, 64, 3, 8), (128, 128, 64, 4, 4), (128, 128, 32, 4, 4), (64, 256, 32, 4, 4),
        (128, 64, 32, 4, 4), (64, 128, 32, 4, 4), (64, 64, 32, 4, 4), (32, 64, 32, 5, 2), (64, 32, 32, 5, 2),
    ]
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8}, num_stages=s, num_warps=w)
            for m, n, k, s, w in shapes]


_gemm_jit = triton.jit(_gemm_kernel)
_gemm_tuned = triton.autotune(configs=_configs(), key=["M", "N", "K", "HAS_C", "PRECISION"],
                              prune_configs_by={"early_config_prune": prune_tiles("M", "N")})(_gemm_jit)
#: the interpreter's tile: small, so tests on odd sizes cover partial tiles cheaply
_INTERP_TILE = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 2}


def _merge_batch(shape: list[int], strides: list[list[int]]) -> tuple[list[int], list[list[int]]]:
    """Drop size-1 batch dims and merge neighbours that are contiguous for every operand."""
    keep = [i for i, s in enumerate(shape) if s != 1]
    shape = [shape[i] for i in keep]
    strides = [[st[i] for i in keep] for st in strides]
    i = len(shape) - 1
    while i > 0:
        if all(st[i - 1] == st[i] * shape[i] for st in strides):
            shape[i - 1:i + 1] = [shape[i - 1] * shape[i]]
            for st in strides:
                st[i - 1:i + 1] = [st[i]]
        i -= 1
    return shape, strides


def _launch(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None, y: torch.Tensor, alpha: float, beta: float,
            allow_tf32: bool | None) -> None:
    """y[..., M, N] = alpha * a[..., M, K] @ b[..., K, N] + beta * c; a, b, c, y share batch dims (c may be None)."""
    M, K = a.shape[-2:]
    N = b.shape[-1]
    batch = list(y.shape[:-2])
    ops = [a, b, y] + ([c] if c is not None else [])
    shape, strides = _merge_batch(batch, [list(t.stride()[:-2]) for t in ops])
    if len(shape) > 2:  # batch dims no single pair of strides describes: copy the operands once
        a, b = a.contiguous(), b.contiguous()
        c = None if c is None else c.contiguous()
        ops = [a, b, y] + ([c] if c is not None else [])
        shape, strides = _merge_batch(batch, [list(t.stride()[:-2]) for t in ops])
    while len(shape) < 2:
        shape.insert(0, 1)
        for st in strides:
            st.insert(0, 0)
    nb, b1 = shape[0] * shape[1], shape[1]
    sa, sb, sy = strides[0], strides[1], strides[2]
    sc = strides[3] if c is not None else [0, 0]
    cm, cn = (c.stride(-2), c.stride(-1)) if c is not None else (0, 0)
    tf32 = want_tf32(a, allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    args = (a, b, c if c is not None else y, y, M, N, K, nb, b1,
            sa[0], sa[1], a.stride(-2), a.stride(-1), sb[0], sb[1], b.stride(-2), b.stride(-1),
            sc[0], sc[1], cm, cn, sy[0], sy[1], y.stride(-2), y.stride(-1), float(alpha), float(beta))
    flags = {"HAS_C": c is not None, "SCALE": alpha != 1.0, "PRECISION": "tf32" if tf32 else "ieee",
             "ACC_DTYPE": tl.float64 if a.dtype == torch.float64 else tl.float32}
    gy, gz = batch_grid(nb)
    if use_interpreter(a, "MatMul/Gemm"):
        # numpy has no bfloat16 matmul: the interpreter multiplies bf16 tiles in fp32 (exact products)
        t = _INTERP_TILE
        grid = (cdiv(M, t["BLOCK_M"]) * cdiv(N, t["BLOCK_N"]), gy, gz)
        _gemm_jit[grid](*args, **flags, DOT_IN_FP32=a.dtype == torch.bfloat16, **t)
        return

    def grid(meta: dict) -> tuple[int, int, int]:
        return (cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"]), gy, gz)

    with torch.cuda.device(a.device) if a.device.type == "cuda" else contextlib.nullcontext():
        _gemm_tuned[grid](*args, **flags, DOT_IN_FP32=False)


def _product(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None, alpha: float, beta: float,
             allow_tf32: bool | None) -> torch.Tensor:
    """alpha * a @ b + beta * c for a (..., M, K), b (..., K, N) with broadcast batch dims; c broadcasts."""
    M, K = a.shape[-2:]
    N = b.shape[-1]
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    y = torch.empty((*batch, M, N), dtype=a.dtype, device=a.device)
    if y.numel() == 0:
        return y
    if c is not None:
        c = c.expand(y.shape)
    if K == 0:  # empty sum: only the C term is left
        return y.zero_() if c is None else y.copy_(beta * c)
    # B shared by the whole batch and A's (batch, M) rows one strided run: a single 2-D GEMM
    b_shared = all(s == 1 for s in b.shape[:-2]) and tuple(a.shape[:-2]) == tuple(batch)
    if b_shared and len(batch) > 0:
        try:
            a2 = a.view(-1, K)
        except RuntimeError:
            a2 = None
        c2 = None
        if a2 is not None and c is not None:
            try:
                c2 = c.view(-1, N)
            except RuntimeError:
                a2 = None
        if a2 is not None:
            _launch(a2, b.reshape(K, N), c2, y.view(-1, N), alpha, beta, allow_tf32)
            return y
    _launch(a.expand(*batch, M, K), b.expand(*batch, K, N), c, y, alpha, beta, allow_tf32)
    return y


def matmul(a: torch.Tensor, b: torch.Tensor, *, allow_tf32: bool | None = None) -> torch.Tensor:
    """ONNX MatMul (numpy.matmul semantics) with the Triton GEMM; ``allow_tf32`` None follows torch's
    ``torch.backends.cuda.matmul.allow_tf32`` (what the session sets from the provider's use_tf32)."""
    check_float("MatMul", a, b)
    if a.dim() == 0 or b.dim() == 0:
        raise ValueError(f"MatMul needs inputs of rank >= 1, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    if a.shape[-1] != b.shape[-2 if b.dim() > 1 else 0]:
        raise ValueError(f"MatMul inner dimensions differ: shapes {tuple(a.shape)} and {tuple(b.shape)}")
    a2 = a.unsqueeze(0) if a.dim() == 1 else a
    b2 = b.unsqueeze(-1) if b.dim() == 1 else b
    y = _product(a2, b2, None, 1.0, 0.0, allow_tf32)
    if a.dim() == 1:
        y = y.squeeze(-2)
    if b.dim() == 1:
        y = y.squeeze(-1)
    return y


def gemm(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None, *, alpha: float = 1.0, beta: float = 1.0,
         transA: int = 0, transB: int = 0, allow_tf32: bool | None = None) -> torch.Tensor:
    """ONNX Gemm: ``alpha * A' @ B' + beta * C`` with alpha, beta and C fused into the GEMM's epilogue."""
    check_float("Gemm", a, b)
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"Gemm needs 2-D A and B, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    a = a.mT if transA else a
    b = b.mT if transB else b
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"Gemm inner dimensions differ: A' {tuple(a.shape)}, B' {tuple(b.shape)} "
                         f"(transA={transA}, transB={transB})")
    if c is not None and beta == 0.0:
        c = None
    if c is not None:
        if c.device != a.device:
            raise ValueError(f"Gemm input C is on {c.device}, A and B on {a.device}")
        try:
            broadcast_shapes(c.shape, (a.shape[0], b.shape[1]))
        except RuntimeError:
            raise ValueError(f"Gemm C of shape {tuple(c.shape)} does not broadcast to the output "
                             f"{(a.shape[0], b.shape[1])}") from None
        if c.dim() > 2:
            raise ValueError(f"Gemm C must have rank <= 2, got shape {tuple(c.shape)}")
    return _product(a, b, c, alpha, beta, allow_tf32)


def matmul_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """What ``matmul`` computes, in torch (fp64 on the CPU, so it is a tight reference)."""
    return torch.matmul(a.double().cpu(), b.double().cpu())


def gemm_reference(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None, *, alpha: float = 1.0,
                   beta: float = 1.0, transA: int = 0, transB: int = 0) -> torch.Tensor:
    """What ``gemm`` computes, in torch (fp64 on the CPU)."""
    a = a.double().cpu()
    b = b.double().cpu()
    a = a.mT if transA else a
    b = b.mT if transB else b
    y = alpha * (a @ b)
    return y if c is None else y + beta * c.double().cpu()
