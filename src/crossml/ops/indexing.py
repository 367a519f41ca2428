"""Indexing ops: Gather*, Scatter*, TensorScatter, NonZero, TopK, ArgMax/ArgMin, CumSum/CumProd,
Compress, ReverseSequence, Unique.

Indices may be negative (counted from the end of their axis). Ops that only move data take every
element type through :func:`crossml.ops.tensor.movement`; ops that compare or accumulate compute on
:func:`~crossml.ops.tensor.ordered` / :func:`~crossml.ops.tensor.arith` views of the data.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from crossml.kernels import TRITON_DEVICES, load
from crossml.ops._util import norm_axis, scalar
from crossml.ops.registry import op
from crossml.ops.tensor import arith, is_strings, movement, ordered


def _wrap(indices: torch.Tensor, size: int | torch.Tensor) -> torch.Tensor:
    """int64 indices with negative values counted from the end of an axis of ``size``."""
    idx = indices.to(torch.int64)
    return torch.where(idx < 0, idx + size, idx)


# --------------------------------------------------------------------------------------------
# gather


@op("Gather", since=1)
@movement
def gather(data: torch.Tensor, indices: torch.Tensor, *, axis: int = 0) -> torch.Tensor:
    axis = norm_axis(axis, data.dim())
    if data.device.type in TRITON_DEVICES and indices.device == data.device:
        # one launch instead of four (crossml.kernels.gather); out-of-range indices give zeros there, as in
        # onnxruntime's CUDA Gather
        kernel = load("gather")
        if kernel is not None and kernel.supported(data, indices, axis):
            return kernel.gather(data, indices, axis)
    idx = _wrap(indices, data.shape[axis]).to(data.device)
    out = data.index_select(axis, idx.reshape(-1))
    return out.reshape(data.shape[:axis] + idx.shape + data.shape[axis + 1:])


@op("GatherElements", since=11)
@movement
def gather_elements(data: torch.Tensor, indices: torch.Tensor, *, axis: int = 0) -> torch.Tensor:
    axis = norm_axis(axis, data.dim())
    if indices.dim() != data.dim():
        raise ValueError(f"indices rank {indices.dim()} differs from data rank {data.dim()}")
    return torch.gather(data, axis, _wrap(indices, data.shape[axis]).to(data.device))


def _linear(shape: torch.Size, indices: torch.Tensor) -> torch.Tensor:
    """Row-major positions in ``shape[:k]`` of the k-tuples on the last axis of ``indices``."""
    k = indices.shape[-1]
    if k > len(shape):
        raise ValueError(f"index tuples of length {k} exceed the data rank {len(shape)}")
    dims = torch.tensor(list(shape[:k]), dtype=torch.int64, device=indices.device)
    strides = torch.tensor([math.prod(shape[j + 1:k]) for j in range(k)], dtype=torch.int64,
                           device=indices.device)
    return (_wrap(indices, dims) * strides).sum(-1)


@op("GatherND", since=11)
@op("GatherND", since=12)
@movement
def gather_nd(data: torch.Tensor, indices: torch.Tensor, *, batch_dims: int = 0) -> torch.Tensor:
    b = batch_dims
    if data.shape[:b] != indices.shape[:b]:
        raise ValueError(f"batch dims of data {tuple(data.shape)} and indices {tuple(indices.shape)} differ")
    k = indices.shape[-1]
    nb = math.prod(data.shape[:b])
    tail = data.shape[b + k:]
    idx = indices.to(data.device).reshape(nb, math.prod(indices.shape[b:-1]), k)
    lin = _linear(data.shape[b:], idx)
    flat = data.reshape(nb, math.prod(data.shape[b:b + k]), *tail)
    out = flat[torch.arange(nb, device=data.device)[:, None], lin]
    return out.reshape(indices.shape[:-1] + tail)


# --------------------------------------------------------------------------------------------
# scatter

_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


def _reduce_views(data: torch.Tensor, updates: torch.Tensor, reduction: str) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """Data and updates in a dtype torch can reduce in, and the function casting the result back."""
    if reduction not in _REDUCE:
        raise ValueError(f"reduction '{reduction}' is not one of none, add, mul, max, min")
    dt = data.dtype
    if dt == torch.bool:  # add is "or", mul is "and"
        return data.long(), updates.long(), lambda t: t != 0
    if reduction in ("max", "min"):
        if dt == torch.uint64:
            return ordered(data), ordered(updates), lambda t: (t ^ torch.iinfo(torch.int64).min).view(dt)
        return ordered(data), ordered(updates), lambda t: t.to(dt)
    x, back = arith(data)
    return x, arith(updates)[0], back


def _scatter_reduce(data: torch.Tensor, axis: int, idx: torch.Tensor, updates: torch.Tensor,
                    reduction: str) -> torch.Tensor:
    x, u, back = _reduce_views(data, updates, reduction)
    return back(x.scatter_reduce(axis, idx, u, _REDUCE[reduction], include_self=True))


@movement
def _scatter_copy(data: torch.Tensor, axis: int, idx: torch.Tensor, updates: torch.Tensor) -> torch.Tensor:
    return data.scatter(axis, idx, updates)


def _scatter_elements(data: Any, indices: torch.Tensor, updates: Any, axis: int, reduction: str) -> Any:
    axis = norm_axis(axis, len(data.shape))
    if indices.shape != updates.shape or indices.dim() != len(data.shape):
        raise ValueError(f"indices {tuple(indices.shape)} and updates {tuple(updates.shape)} must have one shape "
                         f"of the data's rank {len(data.shape)}")
    dev = data.device if isinstance(data, torch.Tensor) else torch.device("cpu")
    idx = _wrap(indices, data.shape[axis]).to(dev)
    if reduction == "none":
        return _scatter_copy(data, axis, idx, updates)
    return _scatter_reduce(data, axis, idx, updates, reduction)


@op("Scatter", since=9)
def scatter(data: Any, indices: torch.Tensor, updates: Any, *, axis: int = 0) -> Any:
    return _scatter_elements(data, indices, updates, axis, "none")


@op("ScatterElements", since=11)
@op("ScatterElements", since=16)
def scatter_elements(data: Any, indices: torch.Tensor, updates: Any, *, axis: int = 0,
                     reduction: str = "none") -> Any:
    return _scatter_elements(data, indices, updates, axis, reduction)


@op("ScatterND", since=11)
@op("ScatterND", since=16)
def scatter_nd(data: Any, indices: torch.Tensor, updates: Any, *, reduction: str = "none") -> Any:
    k = indices.shape[-1]
    shape = tuple(data.shape)
    if tuple(updates.shape) != tuple(indices.shape[:-1]) + shape[k:]:
        raise ValueError(f"updates shape {tuple(updates.shape)} should be indices.shape[:-1] + data.shape[{k}:] = "
                         f"{tuple(indices.shape[:-1]) + shape[k:]}")
    dev = data.device if isinstance(data, torch.Tensor) else torch.device("cpu")
    lin = _linear(torch.Size(shape), indices.to(dev)).reshape(-1)
    tail = shape[k:]
    flat = data.reshape(math.prod(shape[:k]), *tail)
    upd = updates.reshape(lin.numel(), *tail)
    idx = lin.reshape(-1, *([1] * len(tail))).expand(lin.numel(), *tail)
    if reduction == "none":
        return _scatter_copy(flat, 0, idx, upd).reshape(shape)
    return _scatter_reduce(flat, 0, idx, upd, reduction).reshape(shape)


@op("TensorScatter", since=24)
@movement
def tensor_scatter(past: torch.Tensor, update: torch.Tensor, write_indices: torch.Tensor | None = None, *,
                   axis: int = -2, mode: str = "linear") -> torch.Tensor:
    r = past.dim()
    axis = norm_axis(axis, r)
    if axis == 0:
        raise ValueError("TensorScatter axis cannot be the batch axis 0")
    if mode not in ("linear", "circular"):
        raise ValueError(f"mode '{mode}' is not linear or circular")
    b, s, max_s = past.shape[0], update.shape[axis], past.shape[axis]
    if write_indices is None:
        start = torch.zeros(b, dtype=torch.int64, device=past.device)
    else:
        start = write_indices.to(device=past.device, dtype=torch.int64).reshape(b)
    pos = start[:, None] + torch.arange(s, device=past.device)
    if mode == "circular":
        pos = pos.remainder(max_s)
    view = [b] + [1] * (r - 1)
    view[axis] = s
    return past.scatter(axis, pos.reshape(view).expand(update.shape), update)


# --------------------------------------------------------------------------------------------
# selecting


@op("NonZero", since=9)
def non_zero(x: Any) -> torch.Tensor:
    if is_strings(x):
        return torch.from_numpy(np.array(np.nonzero(np.atleast_1d(x != "")), dtype=np.int64))
    mask = x if x.dtype == torch.bool else x != 0
    return torch.nonzero(mask.reshape(1) if mask.dim() == 0 else mask).T.contiguous()


@op("Compress", since=9)
@movement
def compress(x: torch.Tensor, condition: torch.Tensor, *, axis: int | None = None) -> torch.Tensor:
    if axis is None:
        x, axis = x.reshape(-1), 0
    axis = norm_axis(axis, x.dim())
    cond = condition.reshape(-1).to(torch.bool)
    n = x.shape[axis]
    if cond.numel() > n and bool(cond[n:].any()):
        raise ValueError(f"condition has {cond.numel()} entries, more than axis {axis}'s size {n}")
    idx = torch.nonzero(cond[:n]).reshape(-1)
    return x.index_select(axis, idx.to(x.device))


@op("ReverseSequence", since=10)
@movement
def reverse_sequence(x: torch.Tensor, sequence_lens: torch.Tensor, *, batch_axis: int = 1,
                     time_axis: int = 0) -> torch.Tensor:
    if {batch_axis, time_axis} != {0, 1}:
        raise ValueError(f"batch_axis {batch_axis} and time_axis {time_axis} should be 0 and 1")
    t = x.shape[time_axis]
    lens = sequence_lens.to(device=x.device, dtype=torch.int64).reshape(-1, 1)  # [batch, 1]
    pos = torch.arange(t, device=x.device)[None, :]
    src = torch.where(pos < lens, lens - 1 - pos, pos)  # [batch, time]
    if time_axis == 0:
        src = src.T
    src = src.reshape(src.shape + (1,) * (x.dim() - 2)).expand(x.shape)
    return torch.gather(x, time_axis, src)


# --------------------------------------------------------------------------------------------
# ordering


@movement
def _take_along(x: torch.Tensor, idx: torch.Tensor, axis: int) -> torch.Tensor:
    return torch.gather(x, axis, idx)


def _topk(x: torch.Tensor, k: int, axis: int, largest: int) -> tuple[torch.Tensor, torch.Tensor]:
    axis = norm_axis(axis, x.dim())
    if not 0 <= k <= x.shape[axis]:
        raise ValueError(f"k = {k} is out of range for axis {axis} of size {x.shape[axis]}")
    # a stable sort keeps the lower index first among equal values, as onnxruntime does
    _, idx = torch.sort(ordered(x), dim=axis, descending=bool(largest), stable=True)
    idx = idx.narrow(axis, 0, k)
    return _take_along(x, idx, axis), idx


@op("TopK", since=1)
def topk_1(x: torch.Tensor, *, k: int, axis: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    return _topk(x, k, axis, 1)


@op("TopK", since=10, host_inputs=(1,))
@op("TopK", since=11, host_inputs=(1,))
def topk(x: torch.Tensor, k: Any, *, axis: int = -1, largest: int = 1,
         sorted: int = 1) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: A002 - the ONNX attribute
    return _topk(x, int(scalar(k)), axis, largest)


def _arg(x: torch.Tensor, axis: int, keepdims: int, last: int, fn: Any) -> torch.Tensor:
    axis = norm_axis(axis, x.dim())
    if x.shape[axis] == 0:
        raise ValueError(f"cannot take the arg max/min of an empty axis {axis}")
    key = ordered(x)
    if last:
        key = key.flip(axis)
    i = fn(key, dim=axis, keepdim=bool(keepdims))
    return x.shape[axis] - 1 - i if last else i


@op("ArgMax", since=1)
def arg_max(x: torch.Tensor, *, axis: int = 0, keepdims: int = 1, select_last_index: int = 0) -> torch.Tensor:
    return _arg(x, axis, keepdims, select_last_index, torch.argmax)


@op("ArgMin", since=1)
def arg_min(x: torch.Tensor, *, axis: int = 0, keepdims: int = 1, select_last_index: int = 0) -> torch.Tensor:
    return _arg(x, axis, keepdims, select_last_index, torch.argmin)


def _cumulate(x: torch.Tensor, axis: Any, exclusive: int, reverse: int, fn: Any, identity: int) -> torch.Tensor:
    a = norm_axis(int(scalar(axis)), x.dim())
    if x.shape[a] == 0:
        return x.clone()
    y, back = arith(x)
    if reverse:
        y = y.flip(a)
    out = fn(y, dim=a, dtype=y.dtype)
    if exclusive:
        first = torch.full_like(out.narrow(a, 0, 1), identity)
        out = torch.cat([first, out.narrow(a, 0, out.shape[a] - 1)], dim=a)
    if reverse:
        out = out.flip(a)
    return back(out)


@op("CumSum", since=11, host_inputs=(1,))
def cum_sum(x: torch.Tensor, axis: Any, *, exclusive: int = 0, reverse: int = 0) -> torch.Tensor:
    return _cumulate(x, axis, exclusive, reverse, torch.cumsum, 0)


@op("CumProd", since=26, host_inputs=(1,))
def cum_prod(x: torch.Tensor, axis: Any, *, exclusive: int = 0, reverse: int = 0) -> torch.Tensor:
    return _cumulate(x, axis, exclusive, reverse, torch.cumprod, 1)


@op("Unique", since=11)
def unique(x: Any, *, axis: int | None = None,
           sorted: int = 1) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:  # noqa: A002 - the ONNX attribute
    strings = is_strings(x)
    if strings:  # unique on the strings' ranks, which sort like the strings
        _, ranks = np.unique(x.reshape(-1), return_inverse=True)
        key = torch.from_numpy(ranks.astype(np.int64).reshape(x.shape))
    else:
        key = ordered(x)
    if axis is None:
        key, a = key.reshape(-1), 0
        n = key.numel()
        _, inverse, counts = torch.unique(key, sorted=True, return_inverse=True, return_counts=True)
    else:
        a = norm_axis(axis, key.dim())
        n = key.shape[a]
        _, inverse, counts = torch.unique(key, sorted=True, return_inverse=True, return_counts=True, dim=a)
    m = counts.numel()
    first = torch.full((m,), n, dtype=torch.int64, device=key.device)
    first = first.scatter_reduce(0, inverse, torch.arange(n, device=key.device), "amin")
    if not sorted:
        perm = torch.argsort(first)
        rank = torch.empty_like(perm)
        rank[perm] = torch.arange(m, device=perm.device)
        first, counts, inverse = first[perm], counts[perm], rank[inverse]
    if strings:
        flat = x.reshape(-1) if axis is None else x
        y = np.take(flat, first.numpy(), axis=a)
    else:
        y = _take_rows(x.reshape(-1) if axis is None else x, first, a)
    return y, first, inverse, counts


@movement
def _take_rows(x: torch.Tensor, idx: torch.Tensor, axis: int) -> torch.Tensor:
    return x.index_select(axis, idx)
