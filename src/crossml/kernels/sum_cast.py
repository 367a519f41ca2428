"""Triton row sum of an integer tensor, offset and cast, in one launch: ``y[r] = (sum_c x[r, c] + offset)`` in
y's type.

The GenAI builder's models turn the attention mask into GroupQueryAttention's ``seqlens_k`` with ReduceSum (last
axis), Sub 1 and Cast to int32: three torch kernels at the start of every decode step (about 6 us of a step on an
H200, torch's reduction alone about 3.6 for a few hundred int64 values). Graph rule MaskLengths makes them one
com.crossml SumCast node, which runs this kernel on GPUs. The sum accumulates in x's type, as ReduceSum does,
then the offset is added and the value converted, as Sub and Cast do. Under
TRITON_INTERPRET=1 the kernel runs in Triton's interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from crossml.kernels._launch import next_power_of_2, on_device, pdl, pdl_wait, use_interpreter

__all__ = ["DTYPES", "sum_cast"]

#: integer types the kernel sums and writes
DTYPES = (torch.int32, torch.int64)
#: columns one step of the program's loop loads
_BLOCK = 1024


@triton.jit
def _sum_cast_kernel(x_ptr, y_ptr, COLS, s_x, offset, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl_wait(PDL)
    r = tl.program_id(0).to(tl.int64)
    acc = tl.zeros([BLOCK], dtype=x_ptr.dtype.element_ty)
    for c in range(0, COLS, BLOCK):
        cols = c + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + r * s_x + cols, mask=cols < COLS, other=0)
    total = tl.sum(acc, axis=0) + offset  # an int32 offset keeps an int32 sum int32, as Sub does
    tl.store(y_ptr + r, total.to(y_ptr.dtype.element_ty))


def sum_cast(x: torch.Tensor, offset: int, dtype: torch.dtype, keepdim: bool = True) -> torch.Tensor:
    """``(x.sum(-1, keepdim=keepdim) + offset).to(dtype)`` of an int32 / int64 ``x`` (rank >= 1), summed in x's
    type: shape ``x.shape[:-1] + (1,)``, or ``x.shape[:-1]`` without ``keepdim``."""
    if x.dtype not in DTYPES or dtype not in DTYPES or x.dim() == 0:
        raise ValueError(f"SumCast Triton kernel: int32/int64 tensors of rank >= 1, got {x.dtype} "
                         f"{tuple(x.shape)} -> {dtype}")
    out = torch.empty((*x.shape[:-1], 1) if keepdim else x.shape[:-1], dtype=dtype, device=x.device)
    rows = out.numel()
    if rows == 0:
        return out
    interpret = use_interpreter(x, "SumCast")
    x2 = x.reshape(rows, x.shape[-1])
    if x2.shape[1] and x2.stride(1) != 1:
        x2 = x2.contiguous()
    block = min(_BLOCK, max(16, next_power_of_2(x2.shape[1])))
    launch = on_device(x, interpret)
    with launch:
        _sum_cast_kernel[(rows,)](x2, out, x2.shape[1], x2.stride(0), int(offset), BLOCK=block,
                                  **({} if interpret else {"num_warps": 4, **pdl(x)}))
    return out
