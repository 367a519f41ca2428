"""Sequences and optionals. A sequence is a Python list of tensors; an empty optional is ``None``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from crossml.ops._util import ints, norm_axis, scalar
from crossml.ops.registry import OpContext, op


def _seq(value: Any, what: str = "input_sequence") -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"{what} must be a sequence (list of tensors), got {type(value).__name__}")
    return value


def _position(position: Any, length: int, inclusive_end: bool = False) -> int:
    """A position in ``[-length, length - 1]`` (``[-length, length]`` for an insert) made non-negative."""
    p = int(scalar(position))
    hi = length if inclusive_end else length - 1
    if not -length <= p <= hi:
        raise ValueError(f"position {p} is out of range for a sequence of length {length}; "
                         f"expected a value in [{-length}, {hi}]")
    return p + length if p < 0 else p


def _device(ctx: OpContext) -> torch.device:
    return ctx.device if ctx.device is not None else torch.device("cpu")


@op("SequenceEmpty", since=11)
def sequence_empty(*, dtype: int = 1) -> list[Any]:
    return []


@op("SequenceConstruct", since=11)
def sequence_construct(*inputs: Any) -> list[Any]:
    if inputs:
        first = inputs[0]
        for x in inputs[1:]:
            if getattr(x, "dtype", None) != getattr(first, "dtype", None):
                raise TypeError(f"SequenceConstruct inputs must share one element type; got {first.dtype} and {x.dtype}")
    return list(inputs)


@op("SequenceInsert", since=11, host_inputs=(2,))
def sequence_insert(seq: Any, tensor: Any, position: Any = None) -> list[Any]:
    seq = _seq(seq)
    if seq and getattr(seq[0], "dtype", None) != getattr(tensor, "dtype", None):
        raise TypeError(f"cannot insert a {tensor.dtype} tensor into a sequence of {seq[0].dtype}")
    out = list(seq)
    if position is None:
        out.append(tensor)
    else:
        out.insert(_position(position, len(seq), inclusive_end=True), tensor)
    return out


@op("SequenceAt", since=11, host_inputs=(1,))
def sequence_at(seq: Any, position: Any) -> Any:
    seq = _seq(seq)
    return seq[_position(position, len(seq))]


@op("SequenceErase", since=11, host_inputs=(1,))
def sequence_erase(seq: Any, position: Any = None) -> list[Any]:
    seq = _seq(seq)
    if not seq:
        raise ValueError("cannot erase from an empty sequence")
    out = list(seq)
    del out[-1 if position is None else _position(position, len(seq))]
    return out


@op("SequenceLength", since=11, ctx=True)
def sequence_length(seq: Any, *, ctx: OpContext) -> torch.Tensor:
    return torch.full((), len(_seq(seq)), dtype=torch.int64, device=_device(ctx))


@op("SplitToSequence", since=11, host_inputs=(1,))
def split_to_sequence(x: torch.Tensor, split: Any = None, *, axis: int = 0, keepdims: int = 1) -> list[Any]:
    axis = norm_axis(axis, x.dim())
    dim = int(x.shape[axis])
    if split is None:
        parts = list(torch.split(x, 1, dim=axis))
        return [p.squeeze(axis) for p in parts] if not keepdims else parts
    sizes = ints(split)
    if isinstance(split, torch.Tensor) and split.dim() == 0:
        if sizes[0] <= 0:
            raise ValueError(f"split must be positive, got {sizes[0]}")
        return list(torch.split(x, sizes[0], dim=axis))
    if sum(sizes) != dim or any(s < 0 for s in sizes):
        raise ValueError(f"split sizes {sizes} must be non-negative and sum to {dim} (axis {axis} of shape "
                         f"{tuple(x.shape)})")
    return list(torch.split(x, sizes, dim=axis))


@op("ConcatFromSequence", since=11)
def concat_from_sequence(seq: Any, *, axis: int, new_axis: int = 0) -> torch.Tensor:
    seq = _seq(seq)
    if not seq:
        raise ValueError("ConcatFromSequence needs a non-empty sequence")
    rank = seq[0].dim()
    if new_axis:
        return torch.stack(seq, dim=norm_axis(axis, rank + 1))
    return torch.cat(seq, dim=norm_axis(axis, rank))


@op("SequenceMap", since=17)
def sequence_map(input_sequence: Any, *additional: Any, body: Callable[..., list[Any]]) -> tuple[list[Any], ...]:
    seqs = [_seq(input_sequence)] + [a for a in additional if isinstance(a, list)]
    n = len(seqs[0])
    if any(len(s) != n for s in seqs):
        raise ValueError(f"SequenceMap sequences have different lengths: {[len(s) for s in seqs]}")
    results: list[list[Any]] | None = None
    for i in range(n):
        args = [input_sequence[i]] + [a[i] if isinstance(a, list) else a for a in additional]
        outs = body(*args)
        if results is None:
            results = [[] for _ in outs]
        for k, v in enumerate(outs):
            results[k].append(v)
    if results is None:
        results = [[] for _ in body.output_names]  # type: ignore[attr-defined]
    return tuple(results)


# --------------------------------------------------------------------------------------------
# optionals


@op("Optional", since=15)
def optional(x: Any = None, *, type: Any = None) -> Any:  # noqa: A002 - the ONNX attribute name
    return x


@op("OptionalGetElement", since=15)
def optional_get_element(x: Any) -> Any:
    if x is None:
        raise ValueError("OptionalGetElement got an empty optional; check OptionalHasElement first")
    return x


@op("OptionalHasElement", since=15, ctx=True)
def optional_has_element(x: Any = None, *, ctx: OpContext) -> torch.Tensor:
    return torch.full((), x is not None, dtype=torch.bool, device=_device(ctx))
