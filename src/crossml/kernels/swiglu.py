"""Triton SiLU-gated product (SwiGLU): ``y = (g · σ(g)) · up`` in one elementwise pass, beside its
torch reference.

LLM MLPs compute this as Sigmoid, Mul, Mul (three kernels and two intermediate tensors per layer);
here each element is read once from ``g`` and ``up``, computed in fp32, and written once in the
input dtype. ``g`` and ``up`` have equal shapes (no broadcasting) and one of float16 / bfloat16 /
float32. A fixed block size (no autotuning) and no host syncs: safe inside CUDA graph capture.
Under TRITON_INTERPRET=1 the kernel runs in Triton's interpreter (see ``_launch``).
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from crossml.kernels._launch import cdiv, use_interpreter

__all__ = ["DTYPES", "silu_mul", "silu_mul_reference"]

#: dtypes the kernel takes (it computes in fp32)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_BLOCK = 1024
_WARPS = 4


@triton.jit
def _silu_mul_kernel(g_ptr, up_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """Elements [pid · BLOCK, (pid + 1) · BLOCK) of the flat, contiguous tensors."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(up_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = (g * tl.sigmoid(g)) * up
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


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
        _silu_mul_kernel[(cdiv(n, _BLOCK),)](g, up, y, n, BLOCK=_BLOCK, num_warps=_WARPS)
    return y
