"""Shape and layout ops: Reshape, Transpose, Concat, Split, Slice, Pad, Expand, Tile, Shape...

These ops move data without computing on it, so they accept every ONNX element type:

* types torch holds with few kernels (uint16/32/64, float8) run as a same-width signed integer
  view (:func:`movement`), which is exact because only bits move;
* string tensors (numpy object arrays) run on a tensor of positions into the strings, and the
  positions are mapped back to strings at the end (position 0 is the empty string, so padding
  with zeros pads with "").
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from crossml import dtypes
from crossml.ops._util import broadcast_shapes, ints, norm_axes, norm_axis, scalar
from crossml.ops.registry import OpContext, op

#: dtypes with few torch kernels -> a same-width integer dtype with all of them.
BITS: dict[torch.dtype, torch.dtype] = {
    torch.uint16: torch.int16,
    torch.uint32: torch.int32,
    torch.uint64: torch.int64,
    torch.float8_e4m3fn: torch.int8,
    torch.float8_e4m3fnuz: torch.int8,
    torch.float8_e5m2: torch.int8,
    torch.float8_e5m2fnuz: torch.int8,
    torch.float8_e8m0fnu: torch.int8,
}
_FLOAT8 = {k for k in BITS if k.is_floating_point}


def is_strings(x: Any) -> bool:
    return isinstance(x, np.ndarray) and x.dtype == object


def _map_outputs(out: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    if isinstance(out, torch.Tensor):
        return fn(out)
    if isinstance(out, tuple):
        return tuple(_map_outputs(o, fn) for o in out)
    return out


def movement(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Let a data-movement op take any element type (see the module docstring).

    Every input tensor of the data's type is viewed as integers, and every output of that integer
    type is viewed back: so only decorate ops whose outputs all come from the data inputs.
    """

    @functools.wraps(fn)
    def run(*args: Any, **kw: Any) -> Any:
        dt = None
        for a in args:  # (a plain loop: the generators' any() / next() cost about 2 us a call)
            if isinstance(a, torch.Tensor):
                if dt is None and a.dtype in BITS:
                    dt = a.dtype
            elif is_strings(a):
                return _on_strings(fn, args, kw)
        if dt is None:
            return fn(*args, **kw)
        bits = BITS[dt]
        args = tuple(a.view(bits) if isinstance(a, torch.Tensor) and a.dtype == dt else a for a in args)
        return _map_outputs(fn(*args, **kw), lambda t: t.view(dt) if t.dtype == bits else t)

    return run


def _on_strings(fn: Callable[..., Any], args: Sequence[Any], kw: dict[str, Any]) -> Any:
    pool = [np.array([""], dtype=object)]
    offset = 1
    new: list[Any] = []
    for a in args:
        if is_strings(a):
            new.append(torch.arange(offset, offset + a.size, dtype=torch.int64).reshape(a.shape))
            pool.append(a.reshape(-1))
            offset += a.size
        else:
            new.append(a.cpu() if isinstance(a, torch.Tensor) else a)
    flat = np.concatenate(pool)

    def back(t: torch.Tensor) -> Any:
        if t.dtype != torch.int64:
            return t
        out = np.empty(tuple(t.shape), dtype=object)
        out[...] = flat[t.numpy()] if t.dim() else flat[int(t)]
        return out

    return _map_outputs(fn(*new, **kw), back)


def ordered(x: torch.Tensor) -> torch.Tensor:
    """A tensor ordered like ``x`` whose dtype torch can sort and compare (an injective map)."""
    if x.dtype in _FLOAT8:
        return x.float()
    if x.dtype == torch.uint16:
        return x.to(torch.int32)
    if x.dtype == torch.uint32:
        return x.to(torch.int64)
    if x.dtype == torch.uint64:
        return x.view(torch.int64) ^ torch.iinfo(torch.int64).min
    if x.dtype == torch.bool:
        return x.to(torch.uint8)
    return x


def arith(x: torch.Tensor) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    """``x`` in a dtype with sum/prod/max kernels, and the function casting results back."""
    dt = x.dtype
    if dt in _FLOAT8:
        return x.float(), lambda t: t.to(dt)
    if dt in (torch.uint16, torch.uint32):
        return x.to(torch.int64), lambda t: t.to(dt)
    if dt == torch.uint64:  # wrapping sums and products are exact in int64 bit patterns
        return x.view(torch.int64), lambda t: t.view(dt)
    return x, lambda t: t


# --------------------------------------------------------------------------------------------
# reshaping


def _reshape(x: torch.Tensor, shape: list[int], allowzero: int) -> torch.Tensor:
    dims = list(shape)
    if not allowzero:
        for i, d in enumerate(dims):
            if d == 0:
                if i >= x.dim():
                    raise ValueError(f"shape {shape} copies dimension {i} but the input has rank {x.dim()}")
                dims[i] = x.shape[i]
    if dims.count(-1) > 1:
        raise ValueError(f"shape {shape} has more than one -1")
    try:
        return x.reshape(dims)
    except RuntimeError as exc:
        raise ValueError(f"cannot reshape a tensor of shape {tuple(x.shape)} to {shape}") from exc


@op("Reshape", since=1)
@movement
def reshape_1(x: torch.Tensor, *, shape: list[int], consumed_inputs: list[int] | None = None) -> torch.Tensor:
    return _reshape(x, shape, 0)


@op("Reshape", since=5, host_inputs=(1,))
@op("Reshape", since=14, host_inputs=(1,))
@movement
def reshape(x: torch.Tensor, shape: Any, *, allowzero: int = 0) -> torch.Tensor:
    return _reshape(x, ints(shape), allowzero)


@op("Transpose", since=1)
@movement
def transpose(x: torch.Tensor, *, perm: list[int] | None = None) -> torch.Tensor:
    perm = list(range(x.dim()))[::-1] if perm is None else norm_axes(perm, x.dim())
    if sorted(perm) != list(range(x.dim())):
        raise ValueError(f"perm {perm} is not a permutation of the {x.dim()} axes")
    return x.permute(perm)


@op("Flatten", since=1)
@movement
def flatten(x: torch.Tensor, *, axis: int = 1) -> torch.Tensor:
    r = x.dim()
    if not -r <= axis <= r:
        raise ValueError(f"axis {axis} is out of range for a tensor of rank {r}")
    axis = axis + r if axis < 0 else axis
    return x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))


def _squeeze(x: torch.Tensor, axes: list[int] | None) -> torch.Tensor:
    if not axes:
        return x.reshape([d for d in x.shape if d != 1])
    axes = norm_axes(axes, x.dim())
    for a in axes:
        if x.shape[a] != 1:
            raise ValueError(f"cannot squeeze axis {a} of size {x.shape[a]} (shape {tuple(x.shape)})")
    return x.reshape([d for i, d in enumerate(x.shape) if i not in axes])


def _unsqueeze(x: torch.Tensor, axes: list[int]) -> torch.Tensor:
    rank = x.dim() + len(axes)
    axes = sorted(norm_axes(axes, rank))
    if len(set(axes)) != len(axes):
        raise ValueError(f"Unsqueeze axes {axes} repeat an axis")
    dims = list(x.shape)
    for a in axes:
        dims.insert(a, 1)
    return x.reshape(dims)


@op("Squeeze", since=1)
@movement
def squeeze_1(x: torch.Tensor, *, axes: list[int] | None = None) -> torch.Tensor:
    return _squeeze(x, axes)


@op("Squeeze", since=13, host_inputs=(1,))
@movement
def squeeze(x: torch.Tensor, axes: Any = None) -> torch.Tensor:
    return _squeeze(x, ints(axes) if axes is not None else None)


@op("Unsqueeze", since=1)
@movement
def unsqueeze_1(x: torch.Tensor, *, axes: list[int]) -> torch.Tensor:
    return _unsqueeze(x, axes)


@op("Unsqueeze", since=13, host_inputs=(1,))
@movement
def unsqueeze(x: torch.Tensor, axes: Any) -> torch.Tensor:
    return _unsqueeze(x, ints(axes))


@op("Shape", since=1)
@op("Shape", since=15)
def shape(x: Any, *, start: int = 0, end: int | None = None) -> torch.Tensor:
    dims = list(x.shape)
    r = len(dims)
    end = r if end is None else end
    start = min(max(start + r if start < 0 else start, 0), r)
    end = min(max(end + r if end < 0 else end, 0), r)
    dev = x.device if isinstance(x, torch.Tensor) else None
    return torch.tensor(dims[start:end], dtype=torch.int64, device=dev)


@op("Size", since=1)
def size(x: Any) -> torch.Tensor:
    dev = x.device if isinstance(x, torch.Tensor) else None
    return torch.tensor(math.prod(x.shape), dtype=torch.int64, device=dev)


# --------------------------------------------------------------------------------------------
# joining and splitting


@op("Concat", since=1)
@movement
def concat_1(*xs: torch.Tensor, axis: int = 1) -> torch.Tensor:
    return concat(*xs, axis=axis)


@op("Concat", since=4)
@movement
def concat(*xs: torch.Tensor, axis: int) -> torch.Tensor:
    xs = tuple(x for x in xs if x is not None)
    if not xs:
        raise ValueError("Concat needs at least one input")
    rank = xs[0].dim()
    if any(x.dim() != rank for x in xs):
        raise ValueError(f"Concat inputs have different ranks: {[tuple(x.shape) for x in xs]}")
    return torch.cat(xs, dim=norm_axis(axis, rank))


def _split(x: torch.Tensor, split: list[int] | None, axis: int, n: int) -> tuple[torch.Tensor, ...]:
    axis = norm_axis(axis, x.dim())
    d = x.shape[axis]
    if not split:
        if n <= 0:
            raise ValueError("Split needs 'split' or 'num_outputs' or at least one output")
        part = d // n if d % n == 0 else d // n + 1
        split = [part] * (n - 1) + [d - part * (n - 1)]
        if split[-1] < 0:
            raise ValueError(f"cannot split a dimension of {d} into {n} outputs")
    if sum(split) != d or any(s < 0 for s in split):
        raise ValueError(f"split {split} does not add up to dimension {axis} of size {d}")
    return tuple(torch.split(x, split, dim=axis))


@op("Split", since=1, ctx=True, host_inputs=(1,))
@op("Split", since=2, ctx=True)
@movement
def split_2(x: torch.Tensor, split_in: Any = None, *, axis: int = 0, split: list[int] | None = None,
            ctx: OpContext) -> tuple[torch.Tensor, ...]:
    return _split(x, split or (ints(split_in) if split_in is not None else None), axis, ctx.num_outputs)


@op("Split", since=13, ctx=True, host_inputs=(1,))
@op("Split", since=18, ctx=True, host_inputs=(1,))
@movement
def split(x: torch.Tensor, split: Any = None, *, axis: int = 0, num_outputs: int | None = None,
          ctx: OpContext) -> tuple[torch.Tensor, ...]:
    sizes = ints(split) if split is not None else None
    return _split(x, sizes, axis, num_outputs or ctx.num_outputs)


# --------------------------------------------------------------------------------------------
# slicing and padding


def _slice(x: torch.Tensor, starts: list[int], ends: list[int], axes: list[int] | None,
           steps: list[int] | None) -> torch.Tensor:
    axes = norm_axes(axes, x.dim()) if axes else list(range(len(starts)))
    steps = steps or [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ValueError(f"starts {starts}, ends {ends}, axes {axes} and steps {steps} differ in length")
    if len(set(axes)) != len(axes):
        raise ValueError(f"Slice axes {axes} repeat an axis")
    index: list[slice] = [slice(None)] * x.dim()
    flips = []
    for s, e, a, st in zip(starts, ends, axes, steps):
        d = x.shape[a]
        if st == 0:
            raise ValueError("Slice step cannot be 0")
        s = s + d if s < 0 else s
        e = e + d if e < 0 else e
        if st > 0:
            s, e = min(max(s, 0), d), min(max(e, 0), d)
            index[a] = slice(s, max(s, e), st)
        else:
            s, e = min(max(s, 0), d - 1), min(max(e, -1), d - 1)
            n = -((e - s) // -st) if s > e else 0  # ceil((s - e) / |step|)
            lo = s - (n - 1) * -st if n else 0
            index[a] = slice(lo, s + 1 if n else 0, -st)
            flips.append(a)
    y = x[tuple(index)]
    return y.flip(flips) if flips else y


@op("Slice", since=1)
@movement
def slice_1(x: torch.Tensor, *, starts: list[int], ends: list[int], axes: list[int] | None = None) -> torch.Tensor:
    return _slice(x, starts, ends, axes, None)


@op("Slice", since=10, host_inputs=(1, 2, 3, 4))
@movement
def slice_(x: torch.Tensor, starts: Any, ends: Any, axes: Any = None, steps: Any = None) -> torch.Tensor:
    return _slice(x, ints(starts), ints(ends), ints(axes) if axes is not None else None,
                  ints(steps) if steps is not None else None)


def _source_index(n_out: int, before: int, d: int, mode: str, device: torch.device) -> torch.Tensor:
    i = torch.arange(n_out, device=device) - before
    if mode == "edge":
        return i.clamp(0, d - 1)
    if mode == "wrap":
        return i.remainder(d)
    if mode == "reflect":
        if d == 1:
            return torch.zeros_like(i)
        period = 2 * (d - 1)
        i = i.remainder(period)
        return torch.where(i >= d, period - i, i)
    raise ValueError(f"Pad mode '{mode}' is not one of constant, reflect, edge, wrap")


def _pad(x: torch.Tensor, pads: list[int], mode: str, value: torch.Tensor | None,
         axes: list[int] | None = None) -> torch.Tensor:
    r = x.dim()
    axes = norm_axes(axes, r) if axes is not None else list(range(r))
    if len(pads) != 2 * len(axes):
        raise ValueError(f"pads {pads} should have 2 values for each of the {len(axes)} padded axes")
    width = [(0, 0)] * r
    for i, a in enumerate(axes):
        width[a] = (pads[i], pads[len(axes) + i])
    # negative pads crop first; the other modes then reflect / wrap what is left, as onnxruntime does
    x = x[tuple(slice(max(-b, 0), max(x.shape[a] - max(-e, 0), max(-b, 0))) for a, (b, e) in enumerate(width))]
    width = [(max(b, 0), max(e, 0)) for b, e in width]
    if mode == "constant":
        out_shape = [d + b + e for d, (b, e) in zip(x.shape, width)]
        if value is None:
            value = torch.zeros((), dtype=x.dtype, device=x.device)
        out = value.reshape(()).to(x.device).expand(out_shape).clone()
        out[tuple(slice(b, b + d) for d, (b, _) in zip(x.shape, width))] = x
        return out
    for a, (b, e) in enumerate(width):
        if b == 0 and e == 0:
            continue
        d = x.shape[a]
        if d == 0:
            raise ValueError(f"cannot pad an empty axis {a} in '{mode}' mode")
        x = x.index_select(a, _source_index(d + b + e, b, d, mode, x.device))
    return x


@op("Pad", since=1)
@movement
def pad_1(x: torch.Tensor, *, paddings: list[int], mode: str = "constant", value: float = 0.0) -> torch.Tensor:
    return _pad(x, paddings, mode, _value_tensor(value, x))


@op("Pad", since=2)
@movement
def pad_2(x: torch.Tensor, *, pads: list[int], mode: str = "constant", value: float = 0.0) -> torch.Tensor:
    return _pad(x, pads, mode, _value_tensor(value, x))


def _value_tensor(value: float, x: torch.Tensor) -> torch.Tensor:
    return torch.tensor(value, device=x.device).to(x.dtype)


@op("Pad", since=11, host_inputs=(1, 3))
@op("Pad", since=18, host_inputs=(1, 3))
@movement
def pad(x: torch.Tensor, pads: Any, constant_value: torch.Tensor | None = None, axes: Any = None, *,
        mode: str = "constant") -> torch.Tensor:
    if constant_value is not None and constant_value.numel() == 0:
        constant_value = None
    return _pad(x, ints(pads), mode, constant_value, ints(axes) if axes is not None else None)


@op("CenterCropPad", since=18, host_inputs=(1,))
@movement
def center_crop_pad(x: torch.Tensor, shape: Any, *, axes: list[int] | None = None) -> torch.Tensor:
    target = ints(shape)
    axes = norm_axes(axes, x.dim()) if axes else list(range(x.dim()))
    if len(target) != len(axes):
        raise ValueError(f"shape {target} should have one size for each of the axes {axes}")
    pads = [0] * (2 * x.dim())
    for a, t in zip(axes, target):
        diff = t - x.shape[a]  # > 0 pads, < 0 crops; the extra element goes to the end
        begin = diff // 2 if diff >= 0 else -((-diff) // 2)
        pads[a], pads[x.dim() + a] = begin, diff - begin
    return _pad(x, pads, "constant", None)


# --------------------------------------------------------------------------------------------
# repeating


@op("Expand", since=8, host_inputs=(1,))
@movement
def expand(x: torch.Tensor, shape: Any) -> torch.Tensor:
    dims = ints(shape)
    try:
        out = broadcast_shapes(tuple(x.shape), tuple(dims))
    except RuntimeError as exc:
        raise ValueError(f"shape {dims} does not broadcast with the input shape {tuple(x.shape)}") from exc
    return x.expand(out).contiguous()


@op("Tile", since=1, host_inputs=(1, 2))
@movement
def tile_1(x: torch.Tensor, tiles: Any, axis: Any) -> torch.Tensor:
    reps = [1] * x.dim()
    reps[norm_axis(int(scalar(axis)), x.dim())] = int(scalar(tiles))
    return x.repeat(reps)


@op("Tile", since=6, host_inputs=(1,))
@movement
def tile(x: torch.Tensor, repeats: Any) -> torch.Tensor:
    reps = ints(repeats)
    if len(reps) != x.dim() or any(r < 0 for r in reps):
        raise ValueError(f"repeats {reps} should have {x.dim()} non-negative values")
    return x.repeat(reps) if reps else x.clone()


def _blocks(x: torch.Tensor, blocksize: int) -> tuple[int, int, int, int]:
    if x.dim() != 4:
        raise ValueError(f"expects a 4-D input (N, C, H, W), got shape {tuple(x.shape)}")
    if blocksize <= 0:
        raise ValueError(f"blocksize must be positive, got {blocksize}")
    return tuple(x.shape)  # type: ignore[return-value]


@op("DepthToSpace", since=1)
@movement
def depth_to_space(x: torch.Tensor, *, blocksize: int, mode: str = "DCR") -> torch.Tensor:
    b, c, h, w = _blocks(x, blocksize)
    s = blocksize
    if c % (s * s):
        raise ValueError(f"channels {c} are not divisible by blocksize**2 = {s * s}")
    if mode == "DCR":
        y = x.reshape(b, s, s, c // (s * s), h, w).permute(0, 3, 4, 1, 5, 2)
    elif mode == "CRD":
        y = x.reshape(b, c // (s * s), s, s, h, w).permute(0, 1, 4, 2, 5, 3)
    else:
        raise ValueError(f"mode '{mode}' is not DCR or CRD")
    return y.reshape(b, c // (s * s), h * s, w * s)


@op("SpaceToDepth", since=1)
@movement
def space_to_depth(x: torch.Tensor, *, blocksize: int, mode: str = "DCR") -> torch.Tensor:
    b, c, h, w = _blocks(x, blocksize)
    s = blocksize
    if h % s or w % s:
        raise ValueError(f"spatial size {h}x{w} is not divisible by blocksize {s}")
    y = x.reshape(b, c, h // s, s, w // s, s)
    if mode == "DCR":
        y = y.permute(0, 3, 5, 1, 2, 4)
    elif mode == "CRD":
        y = y.permute(0, 1, 3, 5, 2, 4)
    else:
        raise ValueError(f"mode '{mode}' is not DCR or CRD")
    return y.reshape(b, c * s * s, h // s, w // s)


# --------------------------------------------------------------------------------------------
# generated tensors


@op("Range", since=11, host_inputs=(0, 1, 2), ctx=True)
def range_(start: torch.Tensor, limit: torch.Tensor, delta: torch.Tensor, *, stash_type: int = 1,
           ctx: OpContext) -> torch.Tensor:
    dt = start.dtype
    s, lim, d = scalar(start), scalar(limit), scalar(delta)
    if d == 0:
        raise ValueError("Range delta cannot be 0")
    n = max(math.ceil((lim - s) / d), 0)
    if dt.is_floating_point:
        wide = torch.float32 if dt in (torch.float16, torch.bfloat16) and stash_type == 1 else dt
        return (torch.arange(n, dtype=wide, device=ctx.device) * d + s).to(dt)
    return torch.arange(n, dtype=torch.int64, device=ctx.device).mul(d).add(s).to(dt)


@op("EyeLike", since=9)
def eye_like(x: torch.Tensor, *, dtype: int | None = None, k: int = 0) -> torch.Tensor:
    if x.dim() != 2:
        raise ValueError(f"EyeLike expects a 2-D input, got shape {tuple(x.shape)}")
    dt = dtypes.torch_dtype(dtype) if dtype is not None else x.dtype
    rows = torch.arange(x.shape[0], device=x.device)[:, None]
    cols = torch.arange(x.shape[1], device=x.device)[None, :]
    return (cols - rows == k).to(dt)


@op("Trilu", since=14, host_inputs=(1,))
@movement
def trilu(x: torch.Tensor, k: Any = None, *, upper: int = 1) -> torch.Tensor:
    if x.dim() < 2:
        raise ValueError(f"Trilu expects rank >= 2, got shape {tuple(x.shape)}")
    k = int(scalar(k)) if k is not None else 0
    rows = torch.arange(x.shape[-2], device=x.device)[:, None]
    cols = torch.arange(x.shape[-1], device=x.device)[None, :]
    keep = cols - rows >= k if upper else cols - rows <= k
    return torch.where(keep, x, torch.zeros((), dtype=x.dtype, device=x.device))


@op("OneHot", since=9, host_inputs=(1,))
@op("OneHot", since=11, host_inputs=(1,))
@movement
def one_hot(indices: torch.Tensor, depth: Any, values: torch.Tensor, *, axis: int = -1) -> torch.Tensor:
    d = int(scalar(depth))
    if d <= 0:
        raise ValueError(f"OneHot depth must be positive, got {d}")
    if values.numel() != 2:
        raise ValueError(f"OneHot values must hold [off_value, on_value], got {values.numel()} values")
    idx = indices.to(torch.int64)
    idx = torch.where(idx < 0, idx + d, idx)
    hot = idx.unsqueeze(-1) == torch.arange(d, device=idx.device)
    v = values.reshape(2).to(idx.device)
    out = torch.where(hot, v[1], v[0])
    return out.movedim(-1, norm_axis(axis, out.dim()))
