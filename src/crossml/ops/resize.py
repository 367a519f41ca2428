"""Resampling: Resize, Upsample, GridSample, AffineGrid.

Resize is separable: every resized axis gets a small (out, taps) table of source indices and
weights, built once per shape from the ONNX coordinate mapping (cached, on the host) and applied
with one ``index_select`` and a weighted sum. That reproduces every ONNX mode exactly (nearest
rounding modes, cubic_coeff_a, exclude_outside, antialias, tf_crop_and_resize). The common cases
take faster exact routes: integer nearest upsampling is a broadcast-repeat, and linear / cubic
with torch-compatible coordinates go to ``F.interpolate``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from crossml.ops._util import ints, norm_axes
from crossml.ops.registry import op

_COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
                "tf_crop_and_resize")
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple")
_TORCH_LINEAR = {1: "linear", 2: "bilinear", 3: "trilinear"}


@dataclass(frozen=True)
class _Mode:
    mode: str = "nearest"
    coord: str = "half_pixel"
    nearest: str = "round_prefer_floor"
    cubic_a: float = -0.75
    exclude_outside: bool = False
    antialias: bool = False
    extrapolation: float = 0.0


def _floats(t: object) -> list[float]:
    if t is None:
        return []
    if isinstance(t, torch.Tensor):
        return [float(v) for v in t.reshape(-1).tolist()]
    return [float(v) for v in t]  # type: ignore[union-attr]


def _cubic(d: torch.Tensor, a: float) -> torch.Tensor:
    """Keys' cubic convolution kernel at distances ``d``."""
    d = d.abs()
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return torch.where(d <= 1, near, torch.where(d < 2, far, torch.zeros_like(d)))


@functools.lru_cache(maxsize=256)
def _axis_table(in_size: int, out_size: int, scale: float, roi: tuple[float, float] | None,
                m: _Mode) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(indices (out, taps) int64, weights (out, taps) float64, extrapolated (out,) bool or None), on the CPU."""
    y = torch.arange(out_size, dtype=torch.float64)
    out_f = scale * in_size  # the (fractional) output length the coordinate modes use
    extrap = None
    if m.coord == "align_corners":
        x = torch.zeros_like(y) if out_f == 1 else y * (in_size - 1) / (out_f - 1)
    elif m.coord == "asymmetric":
        x = y / scale
    elif m.coord == "tf_crop_and_resize":
        lo, hi = roi if roi is not None else (0.0, 1.0)
        if out_f == 1:
            x = torch.full_like(y, (hi - lo) * (in_size - 1) / 2)
        else:
            x = y * (hi - lo) * (in_size - 1) / (out_f - 1)
        x = x + lo * (in_size - 1)
        extrap = (x < 0) | (x > in_size - 1)
    elif m.coord == "pytorch_half_pixel":
        x = torch.full_like(y, -0.5) if out_f == 1 else (y + 0.5) / scale - 0.5
    elif m.coord == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif m.coord == "half_pixel_symmetric":
        offset = in_size / 2 * (1 - out_size / out_f)
        x = offset + (y + 0.5) / scale - 0.5
    else:
        raise ValueError(f"Resize coordinate_transformation_mode must be one of {_COORD_MODES}, got {m.coord!r}")
    fl = torch.floor(x)
    exact = x == fl
    ratio = torch.where(exact, torch.ones_like(x), x - fl)  # in (0, 1]: the left neighbour is ``base``
    base = torch.where(exact, fl - 1, fl).long()
    if m.mode == "nearest":
        if m.nearest == "round_prefer_floor":
            up = ratio > 0.5
        elif m.nearest == "round_prefer_ceil":
            up = ratio >= 0.5
        elif m.nearest == "floor":
            up = exact
        elif m.nearest == "ceil":
            up = torch.ones_like(exact)
        elif m.nearest == "simple":  # Resize-10 / Upsample: floor when upsampling, ceil when downsampling
            up = exact if scale >= 1 else torch.ones_like(exact)
        else:
            raise ValueError(f"Resize nearest_mode must be one of {_NEAREST_MODES}, got {m.nearest!r}")
        idx = (base + up.long()).unsqueeze(1)
        weights = torch.ones((out_size, 1), dtype=torch.float64)
    else:
        s = min(scale, 1.0) if m.antialias else 1.0
        if m.mode == "linear":
            start = math.floor(-1 / s) + 1
        elif m.mode == "cubic":
            start = math.floor(-2 / s) + 1
        else:
            raise ValueError(f"Resize mode must be nearest, linear or cubic, got {m.mode!r}")
        taps = torch.arange(start, 2 - start, dtype=torch.float64)  # offsets from the left neighbour's right
        dist = (taps.unsqueeze(0) - ratio.unsqueeze(1)) * s
        weights = (1 - dist.abs()).clamp(0, 1) if m.mode == "linear" else _cubic(dist, m.cubic_a)
        if m.antialias:
            weights = weights / weights.sum(dim=1, keepdim=True)
        idx = base.unsqueeze(1) + taps.long().unsqueeze(0)
        if m.exclude_outside:
            weights = torch.where((idx < 0) | (idx >= in_size), torch.zeros_like(weights), weights)
            total = weights.sum(dim=1, keepdim=True)
            weights = weights / torch.where(total == 0, torch.ones_like(total), total)
    return idx.clamp(0, in_size - 1), weights, extrap


@functools.lru_cache(maxsize=256)
def _device_table(in_size: int, out_size: int, scale: float, roi: tuple[float, float] | None, m: _Mode,
                  device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``_axis_table`` resident on ``device``: no host-to-device copy on later runs (or inside a captured graph)."""
    idx, w, extrap = _axis_table(in_size, out_size, scale, roi, m)
    mask = None if extrap is None or not bool(extrap.any()) else extrap.to(device)
    return idx.to(device), w.to(device=device, dtype=dtype), mask


def _resize_axis(x: torch.Tensor, axis: int, idx: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    out, taps = idx.shape
    if taps == 1:
        return x.index_select(axis, idx.reshape(-1))
    g = x.index_select(axis, idx.reshape(-1))
    g = g.reshape(*x.shape[:axis], out, taps, *x.shape[axis + 1:])
    w = weights.reshape(out, taps, *([1] * (x.dim() - axis - 1)))
    return (g * w).sum(dim=axis + 1)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    if not x.dtype.is_floating_point:
        return torch.float32
    return torch.float32 if x.device.type == "cpu" and x.dtype == torch.float16 else x.dtype


def _restore(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype.is_floating_point or y.dtype == dtype:
        return y.to(dtype)
    info = torch.iinfo(dtype)
    return torch.round(y).clamp(info.min, info.max).to(dtype)


def _output_geometry(shape: list[int], scales: list[float], sizes: list[int], axes: list[int],
                     policy: str) -> tuple[list[int], list[float]]:
    r = len(shape)
    if sizes:
        if len(sizes) != len(axes):
            raise ValueError(f"Resize sizes has {len(sizes)} values, expected {len(axes)} (one per resized axis)")
        out = list(shape)
        for a, s in zip(axes, sizes):
            out[a] = s
        sc = [out[i] / shape[i] if shape[i] else 1.0 for i in range(r)]
        if policy != "stretch":
            if policy not in ("not_larger", "not_smaller"):
                raise ValueError(f"keep_aspect_ratio_policy must be stretch, not_larger or not_smaller, got {policy!r}")
            pick = min if policy == "not_larger" else max
            k = pick(sc[a] for a in axes)
            sc = [k if i in axes else 1.0 for i in range(r)]
            out = [int(k * shape[i] + 0.5) if i in axes else shape[i] for i in range(r)]
        return out, sc
    if len(scales) != len(axes):
        raise ValueError(f"Resize scales has {len(scales)} values, expected {len(axes)} (one per resized axis)")
    sc = [1.0] * r
    for a, s in zip(axes, scales):
        if s <= 0:
            raise ValueError(f"Resize scales must be positive, got {scales}")
        sc[a] = s
    return [int(shape[i] * sc[i]) for i in range(r)], sc


def _fast(x: torch.Tensor, out: list[int], sc: list[float], m: _Mode) -> torch.Tensor | None:
    """An exact shortcut for the common cases, or None."""
    r = x.dim()
    changed = [i for i in range(r) if out[i] != x.shape[i] or sc[i] != 1.0]
    if not changed:
        return x
    if m.mode == "nearest":
        # integer upsampling repeats each element when the source coordinate lands strictly inside
        # (k - 0.5, k + 0.5) and rounds to k (half-pixel modes), or floors to k (asymmetric)
        centred = (m.coord in ("half_pixel", "half_pixel_symmetric")
                   or (m.coord == "pytorch_half_pixel" and all(out[i] > 1 for i in changed)))
        rounding = m.nearest in ("round_prefer_floor", "round_prefer_ceil")
        if not ((centred and rounding) or (m.coord == "asymmetric" and m.nearest in ("floor", "simple"))):
            return None
        if not all(float(sc[i]).is_integer() and out[i] == x.shape[i] * int(sc[i]) for i in changed):
            return None
        y = x
        for i in changed:
            s = int(sc[i])
            y = y.unsqueeze(i + 1).expand(*y.shape[:i + 1], s, *y.shape[i + 1:]).reshape(
                *y.shape[:i], y.shape[i] * s, *y.shape[i + 1:])
        return y
    spatial = r - 2
    if m.antialias or m.coord not in ("half_pixel", "pytorch_half_pixel", "align_corners") or min(changed) < 2:
        return None
    if m.coord == "pytorch_half_pixel" and any(out[i] <= 1 for i in changed):
        return None
    if m.mode == "linear" and spatial in _TORCH_LINEAR:
        tmode = _TORCH_LINEAR[spatial]
    elif m.mode == "cubic" and spatial == 2 and m.cubic_a == -0.75 and not m.exclude_outside:
        tmode = "bicubic"
    else:
        return None
    align = m.coord == "align_corners"
    if align and not all(out[i] == sc[i] * x.shape[i] for i in changed):
        return None  # ONNX aligns corners on the fractional output length scale * in
    if align or all(sc[i] == out[i] / x.shape[i] for i in changed):
        return F.interpolate(x, size=out[2:], mode=tmode, align_corners=align)
    if any(int(x.shape[i] * sc[i]) != out[i] for i in changed):
        return None  # keep_aspect_ratio_policy rounded the sizes: the scale is not out / in
    return F.interpolate(x, scale_factor=sc[2:], mode=tmode, align_corners=False, recompute_scale_factor=False)


def _resize(x: torch.Tensor, scales: list[float], sizes: list[int], roi: list[float], axes: list[int] | None,
            policy: str, m: _Mode) -> torch.Tensor:
    r = x.dim()
    axes = norm_axes(axes, r) if axes else list(range(r))
    shape = list(x.shape)
    out, sc = _output_geometry(shape, scales, sizes, axes, policy)
    full_roi: list[tuple[float, float] | None] = [None] * r
    if m.coord == "tf_crop_and_resize":
        if len(roi) != 2 * len(axes):
            raise ValueError(f"Resize roi has {len(roi)} values, expected {2 * len(axes)} for tf_crop_and_resize")
        for i, a in enumerate(axes):
            full_roi[a] = (roi[i], roi[len(axes) + i])
    dt = _compute_dtype(x)
    if m.coord != "tf_crop_and_resize":
        y = _fast(x.to(dt), out, sc, m)
        if y is not None:
            return _restore(y, x.dtype)
    y = x.to(dt)
    mask = None
    for a in range(r):
        a_roi = full_roi[a]
        if out[a] == shape[a] and sc[a] == 1.0 and (a_roi is None or a_roi == (0.0, 1.0)):
            continue
        idx, w, extrap = _device_table(shape[a], out[a], sc[a], a_roi, m, y.device, y.dtype)
        y = _resize_axis(y, a, idx, w)
        if extrap is not None:
            e = extrap.reshape(*([1] * a), -1, *([1] * (r - a - 1)))
            mask = e if mask is None else mask | e
    if mask is not None:
        y = torch.where(mask, torch.tensor(m.extrapolation, dtype=y.dtype, device=y.device), y)
    return _restore(y, x.dtype)


@op("Resize", since=10, host_inputs=(1,))
def resize_10(x: torch.Tensor, scales: torch.Tensor, *, mode: str = "nearest") -> torch.Tensor:
    return _resize(x, _floats(scales), [], [], None, "stretch",
                   _Mode(mode=mode, coord="asymmetric", nearest="simple"))


@op("Resize", since=11, host_inputs=(1, 2, 3))
def resize(x: torch.Tensor, roi: torch.Tensor | None = None, scales: torch.Tensor | None = None,
           sizes: torch.Tensor | None = None, *, antialias: int = 0, axes: list[int] | None = None,
           coordinate_transformation_mode: str = "half_pixel", cubic_coeff_a: float = -0.75,
           exclude_outside: int = 0, extrapolation_value: float = 0.0, keep_aspect_ratio_policy: str = "stretch",
           mode: str = "nearest", nearest_mode: str = "round_prefer_floor") -> torch.Tensor:
    sz = ints(sizes)
    sc = [] if sz else _floats(scales)
    if not sz and not sc:
        raise ValueError("Resize needs one of the 'scales' or 'sizes' inputs (non-empty)")
    m = _Mode(mode=mode, coord=coordinate_transformation_mode, nearest=nearest_mode, cubic_a=cubic_coeff_a,
              exclude_outside=bool(exclude_outside), antialias=bool(antialias) and mode != "nearest",
              extrapolation=extrapolation_value)
    return _resize(x, sc, sz, _floats(roi), axes, keep_aspect_ratio_policy, m)


def _upsample_mode(mode: str) -> _Mode:
    mode = {"bilinear": "linear", "trilinear": "linear"}.get(mode, mode)
    if mode not in ("nearest", "linear"):
        raise ValueError(f"Upsample mode must be nearest or linear, got {mode!r}")
    return _Mode(mode=mode, coord="asymmetric", nearest="simple")


@op("Upsample", since=1)
def upsample_1(x: torch.Tensor, *, height_scale: float, width_scale: float, mode: str = "nearest") -> torch.Tensor:
    return _resize(x, [1.0, 1.0, height_scale, width_scale], [], [], None, "stretch", _upsample_mode(mode))


@op("Upsample", since=7)
def upsample_7(x: torch.Tensor, *, scales: list[float], mode: str = "nearest") -> torch.Tensor:
    return _resize(x, list(scales), [], [], None, "stretch", _upsample_mode(mode))


@op("Upsample", since=9, host_inputs=(1,))
def upsample_9(x: torch.Tensor, scales: torch.Tensor, *, mode: str = "nearest") -> torch.Tensor:
    return _resize(x, _floats(scales), [], [], None, "stretch", _upsample_mode(mode))


_GRID_MODES = {"bilinear": "bilinear", "linear": "bilinear", "nearest": "nearest", "bicubic": "bicubic",
               "cubic": "bicubic"}


def _grid_sample(x: torch.Tensor, grid: torch.Tensor, mode: str, padding_mode: str, align_corners: int) -> torch.Tensor:
    if mode not in _GRID_MODES:
        raise ValueError(f"GridSample mode must be one of {sorted(_GRID_MODES)}, got {mode!r}")
    if padding_mode not in ("zeros", "border", "reflection"):
        raise ValueError(f"GridSample padding_mode must be zeros, border or reflection, got {padding_mode!r}")
    spatial = x.dim() - 2
    if spatial not in (1, 2, 3) or grid.dim() != x.dim() or grid.shape[-1] != spatial:
        raise ValueError(f"GridSample expects X (N, C, D1..Dn) and grid (N, d1..dn, n) with n in 1..3, got "
                         f"shapes {tuple(x.shape)} and {tuple(grid.shape)}")
    tmode = _GRID_MODES[mode]
    if tmode == "bicubic" and spatial == 3:
        raise ValueError("GridSample cubic mode supports 1 or 2 spatial axes, got a volumetric input")
    dt = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) and x.device.type == "cpu" else x.dtype
    if not dt.is_floating_point:
        dt = torch.float32
    xc, g = x.to(dt), grid.to(dt)
    if spatial == 1:  # a height-1 image sampled on its row: exact for every mode
        xc = xc.unsqueeze(2)
        g = torch.stack([g[..., 0], torch.zeros_like(g[..., 0])], dim=-1).unsqueeze(1)
    y = F.grid_sample(xc, g, mode=tmode, padding_mode=padding_mode, align_corners=bool(align_corners))
    if spatial == 1:
        y = y.squeeze(2)
    return _restore(y, x.dtype)


@op("GridSample", since=16)
def grid_sample(x: torch.Tensor, grid: torch.Tensor, *, align_corners: int = 0, mode: str = "bilinear",
                padding_mode: str = "zeros") -> torch.Tensor:
    return _grid_sample(x, grid, mode, padding_mode, align_corners)


@op("GridSample", since=20)
def grid_sample_20(x: torch.Tensor, grid: torch.Tensor, *, align_corners: int = 0, mode: str = "linear",
                   padding_mode: str = "zeros") -> torch.Tensor:
    return _grid_sample(x, grid, mode, padding_mode, align_corners)


@op("AffineGrid", since=20, host_inputs=(1,))
def affine_grid(theta: torch.Tensor, size: torch.Tensor, *, align_corners: int = 0) -> torch.Tensor:
    shape = ints(size)
    if len(shape) not in (4, 5):
        raise ValueError(f"AffineGrid size must be (N, C, H, W) or (N, C, D, H, W), got {shape}")
    dt = torch.float32 if theta.dtype in (torch.float16, torch.bfloat16) and theta.device.type == "cpu" else theta.dtype
    return F.affine_grid(theta.to(dt), shape, align_corners=bool(align_corners)).to(theta.dtype)
