"""Pooling: AveragePool, MaxPool, LpPool, the Global* pools, MaxUnpool, RoiAlign, MaxRoiPool.

The common cases go straight to ``torch.nn.functional`` pooling. What torch's pooling cannot
express (asymmetric or large pads, dilated averaging, Lp norms) is done with an explicit
``F.pad`` and a ones-kernel convolution, which is still one vectorised kernel call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from crossml.ops._util import ints
from crossml.ops.conv import spatial_pads, torch_pad_arg
from crossml.ops.registry import op

_MAX = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}
_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


@dataclass
class _Window:
    """Resolved geometry of one pooling node on one input shape."""

    kernel: list[int]
    strides: list[int]
    dilations: list[int]
    begin: list[int]
    end: list[int]  # ONNX end padding
    extra: list[int]  # end padding ceil_mode adds beyond ``end``
    out: list[int]

    @property
    def symmetric(self) -> bool:
        """torch's own padding applies: same both sides, at most half the kernel, no ceil extra."""
        return (self.begin == self.end and not any(self.extra)
                and all(2 * p <= k for p, k in zip(self.begin, self.kernel)))


def _window(x: torch.Tensor, what: str, kernel_shape: list[int], strides: list[int] | None,
            dilations: list[int] | None, pads: list[int] | None, auto_pad: str, ceil_mode: int) -> _Window:
    n = x.dim() - 2
    if n not in _MAX:
        raise ValueError(f"{what} supports 1 to 3 spatial axes (rank 3 to 5 input), got input shape {tuple(x.shape)}")
    if len(kernel_shape) != n:
        raise ValueError(f"{what} kernel_shape {kernel_shape} does not match input shape {tuple(x.shape)}")
    strides = list(strides) if strides else [1] * n
    dilations = list(dilations) if dilations else [1] * n
    in_sizes = list(x.shape[2:])
    begin, end = spatial_pads(in_sizes, kernel_shape, strides, dilations, pads, auto_pad)
    out, extra = [], []
    for i in range(n):
        eff = (kernel_shape[i] - 1) * dilations[i] + 1
        span = in_sizes[i] + begin[i] + end[i] - eff
        if ceil_mode:
            o = -(-span // strides[i]) + 1
            if (o - 1) * strides[i] >= in_sizes[i] + begin[i]:
                o -= 1
        else:
            o = span // strides[i] + 1
        out.append(o)
        extra.append(max(0, (o - 1) * strides[i] + eff - (in_sizes[i] + begin[i] + end[i])))
    return _Window(list(kernel_shape), strides, dilations, begin, end, extra, out)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    if not x.dtype.is_floating_point:
        return torch.float32 if x.dtype.itemsize <= 2 else torch.float64
    return torch.float32 if x.device.type == "cpu" and x.dtype == torch.float16 else x.dtype


def _window_sums(x: torch.Tensor, w: _Window) -> torch.Tensor:
    """Sum over each window of ``x`` (N, C, *spatial), zero padded: a ones-kernel convolution."""
    n = len(w.kernel)
    xp = F.pad(x, torch_pad_arg(w.begin, [e + x_ for e, x_ in zip(w.end, w.extra)]))
    nb, c = xp.shape[:2]
    ones = torch.ones((1, 1, *w.kernel), dtype=x.dtype, device=x.device)
    y = _CONV[n](xp.reshape(nb * c, 1, *xp.shape[2:]), ones, stride=w.strides, dilation=w.dilations)
    return y.reshape(nb, c, *y.shape[2:])


def _window_counts(x: torch.Tensor, w: _Window, include_pad: bool) -> torch.Tensor:
    """How many elements each window averages: inside the input, or the ONNX-padded input."""
    sizes = list(x.shape[2:])
    if include_pad:
        mask = torch.ones([1, 1] + [s + b + e for s, b, e in zip(sizes, w.begin, w.end)], dtype=x.dtype,
                          device=x.device)
        inner = _Window(w.kernel, w.strides, w.dilations, [0] * len(sizes), w.extra, [0] * len(sizes), w.out)
    else:
        mask = torch.ones([1, 1, *sizes], dtype=x.dtype, device=x.device)
        inner = w
    return _window_sums(mask, inner)


@op("AveragePool", since=1)
def average_pool(x: torch.Tensor, *, auto_pad: str = "NOTSET", ceil_mode: int = 0, count_include_pad: int = 0,
                 dilations: list[int] | None = None, kernel_shape: list[int], pads: list[int] | None = None,
                 strides: list[int] | None = None) -> torch.Tensor:
    w = _window(x, "AveragePool", kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    dt = _compute_dtype(x)
    xc = x.to(dt)
    n = len(w.kernel)
    torch_ok = (w.begin == w.end and all(2 * p <= k for p, k in zip(w.begin, w.kernel))
                and all(d == 1 for d in w.dilations))
    if torch_ok:
        y = _AVG[n](xc, w.kernel, w.strides, w.begin, ceil_mode=bool(ceil_mode),
                    count_include_pad=bool(count_include_pad))
        if list(y.shape[2:]) == w.out:
            return y.to(x.dtype)
    y = _window_sums(xc, w) / _window_counts(xc, w, bool(count_include_pad))
    return y.to(x.dtype)


@op("LpPool", since=1)
def lp_pool(x: torch.Tensor, *, auto_pad: str = "NOTSET", ceil_mode: int = 0, dilations: list[int] | None = None,
            kernel_shape: list[int], p: int = 2, pads: list[int] | None = None,
            strides: list[int] | None = None) -> torch.Tensor:
    w = _window(x, "LpPool", kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    xc = x.to(_compute_dtype(x))
    sums = _window_sums(xc.abs().pow(p), w)
    y = sums.sqrt() if p == 2 else sums.pow(1.0 / p)
    return y.to(x.dtype)


@op("MaxPool", since=1, ctx=True)
def max_pool(x: torch.Tensor, *, auto_pad: str = "NOTSET", ceil_mode: int = 0, dilations: list[int] | None = None,
             kernel_shape: list[int], pads: list[int] | None = None, storage_order: int = 0,
             strides: list[int] | None = None, ctx) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    w = _window(x, "MaxPool", kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    want_idx = ctx.num_outputs > 1 and ctx.outputs_wanted[1]
    dt = _compute_dtype(x)
    xc = x.to(dt)
    n = len(w.kernel)
    if w.symmetric:
        res = _MAX[n](xc, w.kernel, w.strides, w.begin, w.dilations, return_indices=want_idx)
        shift = None
    else:
        end = [e + x_ for e, x_ in zip(w.end, w.extra)]
        xp = F.pad(xc, torch_pad_arg(w.begin, end), value=-math.inf)
        res = _MAX[n](xp, w.kernel, w.strides, 0, w.dilations, return_indices=want_idx)
        shift = list(xp.shape[2:])
    if not want_idx:
        y = res
        return y.to(x.dtype) if ctx.num_outputs == 1 else (y.to(x.dtype), None)
    y, idx = res
    return y.to(x.dtype), _onnx_indices(idx, list(x.shape), w.begin if shift else None, shift, storage_order)


def _onnx_indices(idx: torch.Tensor, shape: list[int], begin: list[int] | None, padded: list[int] | None,
                  storage_order: int) -> torch.Tensor:
    """torch's per-plane flat indices -> ONNX indices flattened over the whole input tensor."""
    sizes = shape[2:]
    if padded is not None or storage_order:
        grid = padded if padded is not None else sizes
        coords = []
        rest = idx
        for s in reversed(grid):
            coords.append(rest % s)
            rest = rest // s
        coords.reverse()
        if padded is not None and begin is not None:
            coords = [c - b for c, b in zip(coords, begin)]
        order = range(len(sizes) - 1, -1, -1) if storage_order else range(len(sizes))
        idx = torch.zeros_like(idx)
        for i in order:
            idx = idx * sizes[i] + coords[i]
    plane = math.prod(sizes)
    nb, c = shape[:2]
    base = torch.arange(nb * c, device=idx.device, dtype=torch.int64).reshape(nb, c, *([1] * len(sizes)))
    return idx + base * plane


@op("GlobalAveragePool", since=1)
def global_average_pool(x: torch.Tensor) -> torch.Tensor:
    dims = tuple(range(2, x.dim()))
    if x.dtype == torch.float16 and x.device.type == "cpu":
        return x.float().mean(dim=dims, keepdim=True).to(x.dtype)
    return x.mean(dim=dims, keepdim=True)


@op("GlobalMaxPool", since=1)
def global_max_pool(x: torch.Tensor) -> torch.Tensor:
    return x.amax(dim=tuple(range(2, x.dim())), keepdim=True)


@op("GlobalLpPool", since=1)
def global_lp_pool(x: torch.Tensor, *, p: int = 2) -> torch.Tensor:
    xc = x.to(_compute_dtype(x))
    y = torch.linalg.vector_norm(xc, ord=p, dim=tuple(range(2, x.dim())), keepdim=True)
    return y.to(x.dtype)


@op("MaxUnpool", since=9, host_inputs=(2,))
def max_unpool(x: torch.Tensor, indices: torch.Tensor, output_shape: torch.Tensor | None = None, *,
               kernel_shape: list[int], pads: list[int] | None = None,
               strides: list[int] | None = None) -> torch.Tensor:
    n = x.dim() - 2
    strides = list(strides) if strides else [1] * n
    pads = list(pads) if pads else [0] * (2 * n)
    shape = list(x.shape[:2]) + [(x.shape[2 + i] - 1) * strides[i] + kernel_shape[i] - pads[i] - pads[n + i]
                                 for i in range(n)]
    out = torch.zeros(math.prod(shape), dtype=x.dtype, device=x.device)
    out.scatter_(0, indices.reshape(-1).long(), x.reshape(-1))
    out = out.reshape(shape)
    if output_shape is not None:
        # indices address the inferred shape; a larger output_shape extends it with zeros at the end
        target = ints(output_shape)
        if len(target) != len(shape) or any(t < s for t, s in zip(target, shape)):
            raise ValueError(f"MaxUnpool output_shape {target} is smaller than the unpooled shape {shape}")
        out = F.pad(out, torch_pad_arg([0] * n, [t - s for t, s in zip(target[2:], shape[2:])]))
    return out


def _axis_samples(start: torch.Tensor, bins: torch.Tensor, grid: torch.Tensor, pooled: int, gmax: int,
                  size: int) -> tuple[torch.Tensor, ...]:
    """Per roi, the bilinear taps of every sample along one axis: (R, pooled, gmax) each."""
    dev, dt = start.device, start.dtype
    p = torch.arange(pooled, device=dev, dtype=dt).reshape(1, -1, 1)
    g = torch.arange(gmax, device=dev, dtype=dt).reshape(1, 1, -1)
    gf = grid.to(dt).reshape(-1, 1, 1).clamp(min=1)
    pos = start.reshape(-1, 1, 1) + p * bins.reshape(-1, 1, 1) + (g + 0.5) * bins.reshape(-1, 1, 1) / gf
    inside = (pos >= -1.0) & (pos <= size)
    pos = pos.clamp(min=0)
    low = pos.floor().clamp(max=size - 1)
    top = low >= size - 1
    pos = torch.where(top, low, pos)
    high = torch.where(top, low, low + 1)
    frac = pos - low
    used = (g < grid.reshape(-1, 1, 1)).expand(pos.shape)
    return low.long(), high.long(), 1 - frac, frac, inside, used


@op("RoiAlign", since=10)
def roi_align_10(x: torch.Tensor, rois: torch.Tensor, batch_indices: torch.Tensor, *, mode: str = "avg",
                 output_height: int = 1, output_width: int = 1, sampling_ratio: int = 0,
                 spatial_scale: float = 1.0) -> torch.Tensor:
    return _roi_align(x, rois, batch_indices, mode, output_height, output_width, sampling_ratio, spatial_scale,
                      half_pixel=False)


@op("RoiAlign", since=16)
def roi_align(x: torch.Tensor, rois: torch.Tensor, batch_indices: torch.Tensor, *,
              coordinate_transformation_mode: str = "half_pixel", mode: str = "avg", output_height: int = 1,
              output_width: int = 1, sampling_ratio: int = 0, spatial_scale: float = 1.0) -> torch.Tensor:
    if coordinate_transformation_mode not in ("half_pixel", "output_half_pixel"):
        raise ValueError(f"RoiAlign coordinate_transformation_mode must be half_pixel or output_half_pixel, "
                         f"got {coordinate_transformation_mode!r}")
    return _roi_align(x, rois, batch_indices, mode, output_height, output_width, sampling_ratio, spatial_scale,
                      half_pixel=coordinate_transformation_mode == "half_pixel")


def _roi_align(x: torch.Tensor, rois: torch.Tensor, batch_indices: torch.Tensor, mode: str, oh: int, ow: int,
               sampling_ratio: int, spatial_scale: float, half_pixel: bool) -> torch.Tensor:
    if mode not in ("avg", "max"):
        raise ValueError(f"RoiAlign mode must be 'avg' or 'max', got {mode!r}")
    nb, c, h, wd = x.shape
    r = rois.shape[0]
    if r == 0:
        return torch.zeros((0, c, oh, ow), dtype=x.dtype, device=x.device)
    dt = torch.float64 if x.dtype == torch.float64 else torch.float32
    boxes = rois.to(dt) * spatial_scale - (0.5 if half_pixel else 0.0)
    x1, y1, x2, y2 = boxes.unbind(1)
    rw, rh = x2 - x1, y2 - y1
    if not half_pixel:
        rw, rh = rw.clamp(min=1.0), rh.clamp(min=1.0)
    bin_h, bin_w = rh / oh, rw / ow
    if sampling_ratio > 0:
        gh = gw = torch.full((r,), sampling_ratio, dtype=torch.int64, device=x.device)
        gh_max = gw_max = sampling_ratio
    else:
        gh, gw = torch.ceil(rh / oh).long(), torch.ceil(rw / ow).long()
        gh_max, gw_max = max(int(gh.max()), 1), max(int(gw.max()), 1)  # one host sync for the sample grid
    yl, yh, wyl, wyh, yin, yused = _axis_samples(y1, bin_h, gh, oh, gh_max, h)
    xl, xh, wxl, wxh, xin, xused = _axis_samples(x1, bin_w, gw, ow, gw_max, wd)
    # shapes: y terms (R, oh, Gh, 1, 1), x terms (R, 1, 1, ow, Gw)
    def ys(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(r, oh, gh_max, 1, 1)

    def xs(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(r, 1, 1, ow, gw_max)

    valid = (ys(yin) & xs(xin)).to(dt)
    used = ys(yused) & xs(xused)
    rows = x.permute(0, 2, 3, 1).reshape(nb * h * wd, c).to(dt)
    base = batch_indices.long().reshape(r, 1, 1, 1, 1) * (h * wd)
    corners = []
    for yi, wy in ((yl, wyl), (yh, wyh)):
        for xi, wx in ((xl, wxl), (xh, wxh)):
            flat = base + ys(yi) * wd + xs(xi)
            wgt = ys(wy) * xs(wx) * valid
            corners.append(rows[flat.reshape(-1)].reshape(*flat.shape, c) * wgt.unsqueeze(-1))
    if mode == "avg":
        vals = (corners[0] + corners[1] + corners[2] + corners[3]) * used.unsqueeze(-1)
        count = (gh * gw).clamp(min=1).to(dt).reshape(r, 1, 1, 1)
        y = vals.sum(dim=(2, 4)) / count
    else:
        vals = torch.stack(corners).amax(dim=0)
        vals = vals.masked_fill(~used.unsqueeze(-1), -math.inf).amax(dim=(2, 4))
        y = torch.where(torch.isinf(vals), torch.zeros_like(vals), vals)
    return y.permute(0, 3, 1, 2).to(x.dtype).contiguous()


@op("MaxRoiPool", since=1)
def max_roi_pool(x: torch.Tensor, rois: torch.Tensor, *, pooled_shape: list[int],
                 spatial_scale: float = 1.0) -> torch.Tensor:
    ph, pw = pooled_shape
    nb, c, h, wd = x.shape
    r = rois.shape[0]
    dev = x.device
    dt = torch.float64 if x.dtype == torch.float64 else torch.float32
    roi = rois.to(dt)
    bidx = roi[:, 0].long()
    def round_away(t: torch.Tensor) -> torch.Tensor:  # C's round(): halves away from zero
        return torch.sign(t) * torch.floor(t.abs() + 0.5)

    sx, sy, ex, ey = (round_away(roi[:, i] * spatial_scale) for i in (1, 2, 3, 4))
    rw = (ex - sx + 1).clamp(min=1)
    rh = (ey - sy + 1).clamp(min=1)

    def axis_mask(start: torch.Tensor, length: torch.Tensor, pooled: int, size: int) -> torch.Tensor:
        p = torch.arange(pooled, device=dev, dtype=dt).reshape(1, -1, 1)
        bins = (length / pooled).reshape(-1, 1, 1)
        lo = (torch.floor(p * bins) + start.reshape(-1, 1, 1)).clamp(0, size)
        hi = (torch.ceil((p + 1) * bins) + start.reshape(-1, 1, 1)).clamp(0, size)
        pos = torch.arange(size, device=dev, dtype=dt).reshape(1, 1, -1)
        return (pos >= lo) & (pos < hi)  # (R, pooled, size)

    mh = axis_mask(sy, rh, ph, h)
    mw = axis_mask(sx, rw, pw, wd)
    feat = x.to(dt)[bidx]  # (R, C, H, W)
    neg = torch.tensor(-math.inf, dtype=dt, device=dev)
    cols = torch.where(mw.reshape(r, 1, 1, pw, wd), feat.unsqueeze(3), neg).amax(dim=-1)  # (R, C, H, pw)
    y = torch.where(mh.reshape(r, 1, ph, h, 1), cols.unsqueeze(2), neg).amax(dim=3)  # (R, C, ph, pw)
    y = torch.where(torch.isinf(y), torch.zeros_like(y), y)
    return y.to(x.dtype)
