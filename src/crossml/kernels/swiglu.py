"""Triton SiLU-gated product (SwiGLU): ``y = (g · σ(g)) · up`` in one elementwise pass, beside its
torch reference; with ``activation="gelu_tanh"`` the GELU-gated one (GeGLU, Gemma's MLPs:
``y = gelu_tanh(g) · up``, as Gelu(approximate="tanh") and Mul compute it).

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

__all__ = ["ACTIVATIONS", "DTYPES", "gate", "silu_mul", "silu_mul_packed", "silu_mul_reference"]

#: dtypes the kernel takes (it computes in fp32)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: the gates the kernels compute: SiLU (``g · σ(g)``), and GELU's tanh form (``gelu_tanh``)
ACTIVATIONS = ("silu", "gelu_tanh")
_BLOCK = 1024
_WARPS = 4
#: √(2/π), GELU's tanh form: gelu_tanh(g) = 0.5 g (1 + tanh(√(2/π) (g + 0.044715 g³)))
_GELU_BETA = tl.constexpr(0.7978845608028654)
_GELU_KAPPA = tl.constexpr(0.044715)


@triton.jit
def gate(g, GELU_TANH: tl.constexpr):
    """The float32 gate of ``g``: SiLU, ``g · σ(g)``; with GELU_TANH, GELU's tanh form, computed as
    ``g · σ(2u)`` (= 0.5 g (1 + tanh(u)), u = √(2/π) (g + 0.044715 g³)): torch's formula within float32 rounding,
    without 1 + tanh(u)'s cancellation for negative g."""
    if GELU_TANH:
        u = _GELU_BETA * (g + _GELU_KAPPA * g * g * g)
        return g * tl.sigmoid(2.0 * u)
    return g * tl.sigmoid(g)


@triton.jit
def _silu_mul_kernel(g_ptr, up_ptr, y_ptr, n, BLOCK: tl.constexpr, PDL: tl.constexpr = False,
                     GELU_TANH: tl.constexpr = False):
    """Elements [pid · BLOCK, (pid + 1) · BLOCK) of the flat, contiguous tensors."""
    pdl_wait(PDL)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(up_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = gate(g, GELU_TANH) * up
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _silu_mul_packed_kernel(gu_ptr, y_ptr, n, stride_row, stride_col, BLOCK: tl.constexpr, PDL: tl.constexpr = False,
                            GELU_TANH: tl.constexpr = False):
    """Columns [pid₁ · BLOCK, (pid₁ + 1) · BLOCK) of row pid₀: g at column j of ``gu``'s row, up at
    column n + j; ``y`` is contiguous [rows, n]."""
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    base = gu_ptr + row * stride_row
    g = tl.load(base + cols * stride_col, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(base + (cols + n) * stride_col, mask=mask, other=0.0).to(tl.float32)
    y = gate(g, GELU_TANH) * up
    tl.store(y_ptr + row * n + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def silu_mul_reference(g: torch.Tensor, up: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    """The torch definition: what Sigmoid, Mul(g, σ), Mul(·, up) compute node by node (``gelu_tanh``:
    Gelu(approximate="tanh"), Mul)."""
    if activation == "gelu_tanh":
        return torch.mul(torch.nn.functional.gelu(g, approximate="tanh"), up)
    return torch.mul(torch.mul(g, torch.sigmoid(g)), up)


def _activation(activation: str) -> bool:
    """GELU_TANH for ``activation``; a ValueError naming the accepted ones for another."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"SiluMul activation '{activation}' is not one of {', '.join(ACTIVATIONS)}")
    return activation == "gelu_tanh"


def silu_mul(g: torch.Tensor, up: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    """``(g · σ(g)) · up`` with the Triton kernel; ``g`` and ``up`` of one shape, dtype and device
    (``activation="gelu_tanh"``: ``gelu_tanh(g) · up``)."""
    gelu_tanh = _activation(activation)
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
        _silu_mul_kernel[(cdiv(n, _BLOCK),)](g, up, y, n, BLOCK=_BLOCK, num_warps=_WARPS, GELU_TANH=gelu_tanh,
                                             **pdl(g))
    return y


def silu_mul_packed(gu: torch.Tensor, *, early: bool = False, activation: str = "silu") -> torch.Tensor:
    """``(g · σ(g)) · up`` with ``g = gu[..., :n]``, ``up = gu[..., n:]``, ``n = gu.shape[-1] // 2``: one
    launch reading both halves of each row in place. Returns a new contiguous tensor of shape
    ``gu.shape[:-1] + (n,)``. ``activation="gelu_tanh"``: ``gelu_tanh(g) · up``.

    ``early``: the kernel lets the next kernel launch before its own PDL wait (``crossml.kernels._launch.pdl``).
    Only for a caller that launches, just after it, a kernel that reads nothing but constants before its wait (the
    down projection of ``crossml.ops.fused``'s SiluMulMatMulNBits)."""
    if gu.dtype not in DTYPES:
        raise TypeError(f"SiluMul Triton kernel takes a float16/bfloat16/float32 tensor, got {gu.dtype}; "
                        "use the registered op for other types")
    if gu.dim() == 0 or gu.shape[-1] % 2:
        raise ValueError(f"SiluMul with one input takes [g | up] along an even last dimension, got shape "
                         f"{tuple(gu.shape)}")
    gelu_tanh = _activation(activation)
    interpret = use_interpreter(gu, "SiluMul")
    n = gu.shape[-1] // 2
    y = torch.empty((*gu.shape[:-1], n), dtype=gu.dtype, device=gu.device)
    if y.numel() == 0:
        return y
    rows = gu.reshape(-1, 2 * n)  # a view for the matmul outputs this reads (no copy of the halves)
    on_cuda = gu.device.type == "cuda" and not interpret
    with torch.cuda.device(gu.device) if on_cuda else contextlib.nullcontext():
        _silu_mul_packed_kernel[(rows.shape[0], cdiv(n, _BLOCK))](rows, y, n, rows.stride(0), rows.stride(1),
                                                                  BLOCK=_BLOCK, num_warps=_WARPS, GELU_TANH=gelu_tanh,
                                                                  **pdl(gu, early=early))
    return y
