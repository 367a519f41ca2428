"""Triton SiLU-gated product (SwiGLU): ``y = (g · σ(g)) · up`` in one elementwise pass, beside its
torch reference.

LLM MLPs compute this as Sigmoid, Mul, Mul (three kernels and two intermediate tensors per layer);
here each element is read once from ``g`` and ``up``, computed in fp32, and written once in the
input dtype. ``g`` and ``up`` have equal shapes (no broadcasting) and one of float16 / bfloat16 /
float32. ``silu_mul_packed`` takes both in one tensor ``gu = [g | up]`` along the last axis (what one
matrix product with the gate and up weights concatenated writes, see graph/passes/gate_up.py) and
reads the two halves of each row where they lie. A fixed block size (no autotuning) and no host
syncs: safe inside CUDA graph capture. Under TRITON_INTERPRET=1 the kernels run in Triton's
interpreter (see ``_launch``).
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from crossml.kernels._launch import cdiv, pdl, pdl_wait, use_interpreter

__all__ = ["DTYPES", "silu_mul", "silu_mul_packed", "silu_mul_reference"]

#: dtypes the kernel takes (it computes in fp32)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_BLOCK = 1024
_WARPS = 4


@triton.jit
def _silu_mul_kernel(g_ptr, up_ptr, y_ptr, n, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """Elements [pid · BLOCK, (pid + 1) · BLOCK) of the flat, contiguous tensors."""
    pdl_wait(PDL)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(up_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = (g * tl.sigmoid(g)) * up
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _silu_mul_packed_kernel(gu_ptr, y_ptr, n, stride_row, stride_col, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """Columns [pid₁ · BLOCK, (pid₁ + 1) · BLOCK) of row pid₀: g at column j of ``gu``'s row, up at
    column n + j; ``y`` is contiguous [rows, n]."""
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    base = gu_ptr + row * stride_row
    g = tl.load(base + cols * stride_col, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(base + (cols + n) * stride_col, mask=mask, other=0.0).to(tl.float32)
    y = (g * tl.sigmoid(g)) * up
    tl.store(y_ptr + row * n + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def silu_mul_reference(g: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The torch definition: what Sigmoid, Mul(g, σ), Mul(·, up) compute node by node."""
    return torch.mul(torch.mul(g, torch.sigmoid(g)), up)


def silu_mul(g: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``(g · σ(g)) · up`` with the Triton kernel; ``g`` and ``up`` of one shape, dtype and device."""
    if g.dtype not in DTYPES or up.dtype != g.dtype:
        raise TypeError(f"SiluMul Triton kernel takes two float16/bfloat16/float32 tensors of one type, got "
                        f"{g.dtype} and {up.dtype}; use the registered op for other types")
    if g.shape != up.shape:
        raise ValueError(f"SiluMul Triton kernel takes inputs of one shape (no broadcasting), got "
                         f"{tuple(g.shape)} and {tuple(up.shape)}; use the registered op to broadcast")
    if g.device != up.device:
        raise ValueError(f"SiluMul inputs are on different devices: {g.device} and {up.device}")
    interpret = use_interpreter(g, "SiluMul")
    g, up = g.contiguous(), up.contiguous()  # no-ops for the matmul outputs this fuses
    y = torch.empty_like(g)
    n = g.numel()
    if n == 0:
        return y
    on_cuda = g.device.type == "cuda" and not interpret
    with torch.cuda.device(g.device) if on_cuda else contextlib.nullcontext():
        _silu_mul_kernel[(cdiv(n, _BLOCK),)](g, up, y, n, BLOCK=_BLOCK, num_warps=_WARPS,
                                                   **pdl(g))
    return y


def silu_mul_packed(gu: torch.Tensor, *, early: bool = False) -> torch.Tensor:
    """``(g · σ(g)) · up`` with ``g = gu[..., :n]``, ``up = gu[..., n:]``, ``n = gu.shape[-1] // 2``: one
    launch reading both halves of each row in place. Returns a new contiguous tensor of shape
    ``gu.shape[:-1] + (n,)``.

    ``early``: the kernel lets the next kernel launch before its own PDL wait (``crossml.kernels._launch.pdl``).
    Only for a caller that launches, just after it, a kernel that reads nothing but constants before its wait (the
    down projection of ``crossml.ops.fused``'s SiluMulMatMulNBits)."""
    if gu.dtype not in DTYPES:
        raise TypeError(f"SiluMul Triton kernel takes a float16/bfloat16/float32 tensor, got {gu.dtype}; "
                        "use the registered op for other types")
    if gu.dim() == 0 or gu.shape[-1] % 2:
        raise ValueError(f"SiluMul with one input takes [g | up] along an even last dimension, got shape "
                         f"{tuple(gu.shape)}")
    interpret = use_interpreter(gu, "SiluMul")
    n = gu.shape[-1] // 2
    y = torch.empty((*gu.shape[:-1], n), dtype=gu.dtype, device=gu.device)
    if y.numel() == 0:
        return y
    rows = gu.reshape(-1, 2 * n)  # a view for the matmul outputs this reads (no copy of the halves)
    on_cuda = gu.device.type == "cuda" and not interpret
    with torch.cuda.device(gu.device) if on_cuda else contextlib.nullcontext():
        _silu_mul_packed_kernel[(rows.shape[0], cdiv(n, _BLOCK))](rows, y, n, rows.stride(0), rows.stride(1),
                                                                  BLOCK=_BLOCK, num_warps=_WARPS, **pdl(gu, early=early))
    return y
