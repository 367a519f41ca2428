"""Reductions: ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd, ReduceL1, ReduceL2,
ReduceLogSum, ReduceLogSumExp, ReduceSumSquare.

Every reduction is ``post(core(pre(x), dims))``: an elementwise step before (square, abs), the
reduction proper, and an elementwise step after (sqrt, log). One helper, :func:`_reduce`, reads
the axes (attribute before opset 13/18, host input after), applies ``keepdims`` and
``noop_with_empty_axes`` (reducing over no axis is then the elementwise steps alone, as in the
ONNX reference), handles reductions over an empty set, and casts back to the input dtype:
ONNX keeps the element type (an int8 sum stays int8, torch would give int64).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from crossml.ops._util import ints, norm_axes
from crossml.ops.registry import op

Reducer = Callable[[torch.Tensor, tuple[int, ...], bool], torch.Tensor]
Elementwise = Callable[[torch.Tensor], torch.Tensor]

#: unsigned types torch reduces poorly: sums/products run in a wider signed type.
_WIDE = {torch.uint16: torch.int32, torch.uint32: torch.int64}


def _ident(x: torch.Tensor) -> torch.Tensor:
    return x


def _square(x: torch.Tensor) -> torch.Tensor:
    return x * x


def _abs(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype in (torch.uint8, torch.bool) or not x.dtype.is_signed else x.abs()


def _float(x: torch.Tensor) -> torch.Tensor:
    """Floating (or complex) values for sqrt/log/exp; integers go through float64."""
    return x if x.is_floating_point() or x.is_complex() else x.to(torch.float64)


def _sum(x: torch.Tensor, dims: tuple[int, ...], keep: bool) -> torch.Tensor:
    if x.dtype == torch.uint64:
        return torch.sum(x.view(torch.int64), dim=dims, keepdim=keep).view(torch.uint64)
    if x.dtype in _WIDE:
        x = x.to(_WIDE[x.dtype])
    return torch.sum(x, dim=dims, keepdim=keep)


def _prod(x: torch.Tensor, dims: tuple[int, ...], keep: bool) -> torch.Tensor:
    if x.dtype == torch.uint64:
        x = x.view(torch.int64)
    elif x.dtype in _WIDE:
        x = x.to(_WIDE[x.dtype])
    elif x.dtype == torch.bool:
        x = x.to(torch.int64)
    for d in sorted(dims, reverse=True):
        x = torch.prod(x, dim=d, keepdim=keep)
    return x


def _mean(x: torch.Tensor, dims: tuple[int, ...], keep: bool) -> torch.Tensor:
    if x.is_floating_point() or x.is_complex():
        return torch.mean(x, dim=dims, keepdim=keep)
    count = 1
    for d in dims:
        count *= x.shape[d]
    return _sum(x, dims, keep).to(torch.float64) / count


def _extreme(largest: bool) -> Reducer:
    def reduce(x: torch.Tensor, dims: tuple[int, ...], keep: bool) -> torch.Tensor:
        if x.dtype == torch.uint64:  # order-preserving map onto int64: flip the sign bit
            flip = torch.iinfo(torch.int64).min
            y = reduce(x.view(torch.int64) ^ flip, dims, keep)
            return (y ^ flip).view(torch.uint64)
        if x.dtype in _WIDE:
            x = x.to(_WIDE[x.dtype])
        return torch.amax(x, dim=dims, keepdim=keep) if largest else torch.amin(x, dim=dims, keepdim=keep)

    return reduce


def _log_sum_exp(x: torch.Tensor, dims: tuple[int, ...], keep: bool) -> torch.Tensor:
    return torch.logsumexp(_float(x), dim=dims, keepdim=keep)


def _empty_fill(largest: bool) -> Callable[[torch.dtype], Any]:
    """What ReduceMax / ReduceMin of an empty set give: the identity of max / min."""

    def fill(dt: torch.dtype) -> Any:
        if dt == torch.bool:
            return not largest
        if dt.is_floating_point:
            return float("-inf") if largest else float("inf")
        info = torch.iinfo(dt)
        return info.min if largest else info.max

    return fill


def _reduce(x: torch.Tensor, axes: list[int] | None, keepdims: int, noop_with_empty_axes: int,
            core: Reducer, pre: Elementwise = _ident, post: Elementwise = _ident,
            empty: Callable[[torch.dtype], Any] | None = None) -> torch.Tensor:
    """The shared reduction driver (see the module docstring)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"reductions take a numeric tensor, got {type(x).__name__}")
    rank = x.dim()
    dtype = x.dtype
    if not axes:
        if noop_with_empty_axes:
            return _restore(post(pre(x)), dtype)
        dims = tuple(range(rank))
    else:
        dims = tuple(sorted(set(norm_axes(axes, max(rank, 1)))))
    keep = bool(keepdims)
    if rank == 0:
        return _restore(post(pre(x)), dtype)
    if empty is not None and any(x.shape[d] == 0 for d in dims):
        shape = [1 if i in dims else n for i, n in enumerate(x.shape) if keep or i not in dims]
        return torch.full(shape, empty(dtype), dtype=dtype, device=x.device)
    return _restore(post(core(pre(x), dims, keep)), dtype)


def _restore(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if y.dtype == dtype:
        return y
    if dtype in (torch.uint16, torch.uint32, torch.uint64) and y.dtype.is_floating_point:
        y = y.to(torch.int64)
    return y.to(dtype)


def _register(name: str, new_since: int, core: Reducer, pre: Elementwise = _ident, post: Elementwise = _ident,
              empty: Callable[[torch.dtype], Any] | None = None, attr_since: tuple[int, ...] = (1, 11)) -> None:
    """Register ``name`` with axes as an attribute (opsets ``attr_since``) and as input 1 (``new_since``)."""

    def with_attr(data: torch.Tensor, *, axes: list[int] | None = None, keepdims: int = 1) -> torch.Tensor:
        return _reduce(data, axes, keepdims, 0, core, pre, post, empty)

    def with_input(data: torch.Tensor, axes: Any = None, *, keepdims: int = 1,
                   noop_with_empty_axes: int = 0) -> torch.Tensor:
        return _reduce(data, ints(axes) if axes is not None else None, keepdims, noop_with_empty_axes,
                       core, pre, post, empty)

    with_attr.__name__ = f"{name}_attr"
    with_input.__name__ = name
    for since in attr_since:
        op(name, since=since)(with_attr)
    op(name, since=new_since, host_inputs=(1,))(with_input)


def _sqrt(y: torch.Tensor) -> torch.Tensor:
    return torch.sqrt(_float(y))


def _log(y: torch.Tensor) -> torch.Tensor:
    return torch.log(_float(y))


_register("ReduceSum", 13, _sum)
_register("ReduceMean", 18, _mean, attr_since=(1, 11, 13))
_register("ReduceProd", 18, _prod, attr_since=(1, 11, 13))
_register("ReduceSumSquare", 18, _sum, pre=_square, attr_since=(1, 11, 13))
_register("ReduceL1", 18, _sum, pre=_abs, attr_since=(1, 11, 13))
_register("ReduceL2", 18, _sum, pre=_square, post=_sqrt, attr_since=(1, 11, 13))
_register("ReduceLogSum", 18, _sum, post=_log, attr_since=(1, 11, 13))
_register("ReduceLogSumExp", 18, _log_sum_exp, empty=lambda dt: float("-inf"), attr_since=(1, 11, 13))
_register("ReduceMax", 18, _extreme(True), empty=_empty_fill(True), attr_since=(1, 11, 12, 13))
_register("ReduceMin", 18, _extreme(False), empty=_empty_fill(False), attr_since=(1, 11, 12, 13))
# opset 20 only widens ReduceMax / ReduceMin to bool, which the same code handles
