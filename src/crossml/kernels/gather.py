"""Triton Gather: ``out[o, i, :] = data[o, indices[i], :]`` in one launch.

ONNX Gather takes negative indices (counted from the end of the axis). In torch that is three small
kernels before ``index_select`` (compare, add, where); at an LLM's decode step the embedding lookup of
one token was those four launches, about 7 us of a step on an H200. Here one program per (index,
outer slice, chunk of the inner elements) wraps the index and copies the chunk.

``gather_rows`` is com.crossml GatherRows' kernel: one position per batch row, ``out[b, 0, :] = data[b, rows[b], :]``
(torch spent about ten launches on the wrap, the bounds and the gather).

An index outside ``[-size, size)`` gives a row of zeros, as onnxruntime's CUDA Gather writes (the device
cannot raise; torch's ``index_select`` would stop the whole process with a device-side assert). The data
is copied bit for bit: callers pass any element type viewed as same-width integers (see
``crossml.ops.tensor.movement``). Under TRITON_INTERPRET=1 the kernel runs in Triton's interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from crossml.kernels._launch import GRID_YZ_MAX, cdiv, next_power_of_2, on_device, pdl, pdl_wait, use_interpreter

__all__ = ["DTYPES", "gather", "gather_rows", "supported"]

#: element types the kernel copies (others are viewed as one of these by the caller)
DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
          torch.float32, torch.float64)
#: inner elements one program copies
_BLOCK = 1024


@triton.jit
def _gather_kernel(x_ptr, idx_ptr, y_ptr, SIZE, INNER, M, s_o, s_a, s_i, IDX_PER_OUTER, BLOCK: tl.constexpr,
                   PDL: tl.constexpr = False):
    """out[o, i, :] = x[o, idx[i + o * IDX_PER_OUTER], :]: one index list for every outer slice (Gather,
    IDX_PER_OUTER 0), or one index per outer slice (GatherRows: M 1, IDX_PER_OUTER 1)."""
    pdl_wait(PDL)
    i = tl.program_id(0)
    o = tl.program_id(1).to(tl.int64)
    cols = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < INNER
    idx = tl.load(idx_ptr + i + o * IDX_PER_OUTER).to(tl.int64)
    idx = tl.where(idx < 0, idx + SIZE, idx)
    inside = (idx >= 0) & (idx < SIZE)
    src = x_ptr + o * s_o + tl.where(inside, idx, 0) * s_a + cols.to(tl.int64) * s_i
    v = tl.load(src, mask=ok & inside, other=0)
    tl.store(y_ptr + (o * M + i) * INNER + cols, v, mask=ok)


def _view3(data: torch.Tensor, axis: int) -> torch.Tensor | None:
    """``data`` as [outer, size, inner] without a copy (a weight may be a strided view, such as an embedding
    table that is the transpose of a tied output projection), or None where its strides do not allow it."""
    try:
        return data.view(data.shape[:axis].numel(), data.shape[axis], data.shape[axis + 1:].numel())
    except RuntimeError:
        return None


def supported(data: torch.Tensor, indices: torch.Tensor, axis: int) -> bool:
    """Whether ``gather`` takes these inputs: one device, a kernel dtype, int32/int64 indices, data viewable as
    [outer, size, inner] whatever its strides, and an outer size (the product of the dimensions before ``axis``)
    and chunk count within the grid's 65535 limit."""
    if data.dtype not in DTYPES or indices.dtype not in (torch.int32, torch.int64) or indices.device != data.device:
        return False
    x = _view3(data, axis)
    return x is not None and x.shape[0] <= GRID_YZ_MAX and cdiv(max(x.shape[2], 1), _BLOCK) <= GRID_YZ_MAX


def gather(data: torch.Tensor, indices: torch.Tensor, axis: int) -> torch.Tensor:
    """ONNX Gather of ``data`` along ``axis`` (already normalized to 0..rank-1) at ``indices`` (any shape):
    ``data.shape[:axis] + indices.shape + data.shape[axis + 1:]``, zeros for out-of-range indices."""
    if not supported(data, indices, axis):
        raise ValueError(f"Gather Triton kernel: data {data.dtype} {tuple(data.shape)} along axis {axis} with "
                         f"{indices.dtype} indices on {indices.device} is not supported; use the registered op")
    shape = (*data.shape[:axis], *indices.shape, *data.shape[axis + 1:])
    out = torch.empty(shape, dtype=data.dtype, device=data.device)
    x = _view3(data, axis)
    outer, size, inner = x.shape
    m = indices.numel()
    if out.numel() == 0:
        return out
    interpret = use_interpreter(data, "Gather")
    idx = indices.reshape(-1).contiguous()
    if size == 0:  # every index is out of range
        return out.zero_()
    launch = on_device(data, interpret)
    block = min(_BLOCK, max(16, next_power_of_2(inner)))
    with launch:
        _gather_kernel[(m, outer, cdiv(inner, block))](x, idx, out, size, inner, m, *x.stride(), 0, BLOCK=block,
                                                       **({} if interpret else {"num_warps": 4, **pdl(x)}))
    return out


def gather_rows(data: torch.Tensor, rows: torch.Tensor) -> torch.Tensor | None:
    """``data`` [batch, positions, ...] at one position per batch row (``rows`` [batch], int32 / int64; negative from
    the end, zeros outside ``[-positions, positions)``): [batch, 1, ...]. None where the kernel does not take the
    inputs (another element type, rows on another device, data not viewable as [batch, positions, inner], or more
    chunks than the grid holds)."""
    if data.dtype not in DTYPES or rows.dtype not in (torch.int32, torch.int64) or rows.device != data.device \
            or data.dim() < 2:
        return None
    x = _view3(data, 1)
    if x is None:
        return None
    batch, size, inner = x.shape
    if batch > GRID_YZ_MAX or cdiv(max(inner, 1), _BLOCK) > GRID_YZ_MAX:
        return None
    out = torch.empty((batch, 1, *data.shape[2:]), dtype=data.dtype, device=data.device)
    if out.numel() == 0:
        return out
    if size == 0:
        return out.zero_()
    interpret = use_interpreter(data, "GatherRows")
    idx = rows.contiguous()
    block = min(_BLOCK, max(16, next_power_of_2(inner)))
    with on_device(data, interpret):
        _gather_kernel[(1, batch, cdiv(inner, block))](x, idx, out, size, inner, 1, *x.stride(), 1, BLOCK=block,
                                                       **({} if interpret else {"num_warps": 4, **pdl(x)}))
    return out
