"""Convolutions: Conv, ConvTranspose, DeformConv, Col2Im.

Conv and ConvTranspose map onto ``torch.nn.functional.conv{1,2,3}d`` / ``conv_transpose{1,2,3}d``
(cuDNN / oneDNN underneath). ONNX padding (auto_pad, asymmetric pads) is resolved here once;
``spatial_pads`` is shared with the pooling module.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from crossml.kernels import TRITON_DEVICES, load_compiled
from crossml.ops._util import ints
from crossml.ops.registry import op

#: ops whose input 1 (a 4-D constant weight) is pre-packed channels-last when the session prefers NHWC:
#: cuDNN then runs them on channels-last activations without transposing (graph/plan.py, device/operator.py)
CHANNELS_LAST_OPS = ("Conv", "FusedConv")
_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
#: dtypes the CPU convolution kernels do not cover well; computed in float32 and cast back.
_UPCAST_CPU = {torch.float16}


def spatial_pads(in_sizes: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
                 dilations: Sequence[int], pads: Sequence[int] | None, auto_pad: str) -> tuple[list[int], list[int]]:
    """(begin, end) padding of each spatial axis for Conv / pooling, from ``pads`` or ``auto_pad``."""
    n = len(in_sizes)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for i in range(n):
            out = -(-in_sizes[i] // strides[i])
            total = max(0, (out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - in_sizes[i])
            small = total // 2
            begin.append(small if auto_pad == "SAME_UPPER" else total - small)
            end.append(total - small if auto_pad == "SAME_UPPER" else small)
        return begin, end
    if auto_pad == "VALID" or not pads:
        return [0] * n, [0] * n
    if auto_pad not in ("NOTSET", ""):
        raise ValueError(f"auto_pad must be NOTSET, SAME_UPPER, SAME_LOWER or VALID, got {auto_pad!r}")
    if len(pads) != 2 * n:
        raise ValueError(f"pads has {len(pads)} values, expected {2 * n} for {n} spatial axes")
    return list(pads[:n]), list(pads[n:])


def torch_pad_arg(begin: Sequence[int], end: Sequence[int]) -> list[int]:
    """ONNX (begin..., end...) as F.pad's (last_begin, last_end, ..., first_begin, first_end)."""
    out: list[int] = []
    for b, e in zip(reversed(begin), reversed(end)):
        out += [b, e]
    return out


def _spatial_rank(x: torch.Tensor, what: str, fns: dict) -> int:
    n = x.dim() - 2
    if n not in fns:
        raise ValueError(f"{what} supports 1 to 3 spatial axes (rank 3 to 5 input), got input shape {tuple(x.shape)}")
    return n


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float32 if x.device.type == "cpu" and x.dtype in _UPCAST_CPU else x.dtype


def _defaults(n: int, strides: list[int] | None, dilations: list[int] | None) -> tuple[list[int], list[int]]:
    return list(strides) if strides else [1] * n, list(dilations) if dilations else [1] * n


@op("Conv", since=1)
def conv(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, *, auto_pad: str = "NOTSET",
         dilations: list[int] | None = None, group: int = 1, kernel_shape: list[int] | None = None,
         pads: list[int] | None = None, strides: list[int] | None = None) -> torch.Tensor:
    n = _spatial_rank(x, "Conv", _CONV)
    kernel = list(w.shape[2:])
    if kernel_shape and list(kernel_shape) != kernel:
        raise ValueError(f"Conv kernel_shape {kernel_shape} does not match the weight shape {tuple(w.shape)}")
    strides, dilations = _defaults(n, strides, dilations)
    begin, end = spatial_pads(list(x.shape[2:]), kernel, strides, dilations, pads, auto_pad)
    dt = _compute_dtype(x)
    xc, wc = x.to(dt), w.to(dt)
    bc = None if b is None else b.to(dt)
    if begin != end:
        xc = F.pad(xc, torch_pad_arg(begin, end))
        begin = [0] * n
    y = gpu_conv2d(xc, wc, bc, strides, begin, dilations, group)
    if y is not None:
        return y.to(x.dtype)
    y = _CONV[n](xc, wc, bc, stride=strides, padding=begin, dilation=dilations, groups=group)
    return y.to(x.dtype)


def gpu_conv2d(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, strides: Sequence[int],
               pads: Sequence[int], dilations: Sequence[int], group: int, relu: bool = False,
               clip_max: float | None = None) -> torch.Tensor | None:
    """crossml's own forms of a 2-D convolution of a channels-last GPU tensor, then ReLU and a clamp to
    ``clip_max`` when asked: a pointwise one as one GEMM (``pointwise_gemm``, then the clamp), a depthwise one
    as one Triton launch (``depthwise``). ``pads``: the begin pads (symmetric). None where neither applies
    (then cuDNN runs it)."""
    if pointwise(w, strides, pads, dilations, group):
        y = pointwise_gemm(x, w, b, relu=relu)
        if y is not None:
            return y if clip_max is None else y.clamp_max_(clip_max)
    return depthwise(x, w, b, strides, pads, dilations, group, relu=relu, clip_max=clip_max)


#: run 1x1 convolutions of channels-last GPU activations as one GEMM (see pointwise_gemm)
POINTWISE_GEMM = True


def pointwise(w: torch.Tensor, strides: Sequence[int], pads: Sequence[int], dilations: Sequence[int],
              group: int) -> bool:
    """Whether a 2-D convolution is pointwise: 1x1 kernel, stride 1, no padding, one group."""
    return (w.dim() == 4 and w.shape[2] == 1 and w.shape[3] == 1 and group == 1 and all(s == 1 for s in strides)
            and not any(pads) and all(d == 1 for d in dilations))


#: run depthwise convolutions of channels-last GPU activations with crossml's Triton kernel (see depthwise)
DEPTHWISE_TRITON = True


def depthwise(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, strides: Sequence[int],
              pads: Sequence[int], dilations: Sequence[int], group: int, relu: bool = False,
              clip_max: float | None = None) -> torch.Tensor | None:
    """A depthwise 2-D convolution (one input channel per group) of a channels-last GPU tensor with crossml's
    Triton kernel, bias, ReLU and a clamp to ``clip_max`` (ReLU6) in its epilogue: one launch where cuDNN
    takes two (its plain convolution adds the bias in a second kernel, and its fused conv+bias+ReLU runs
    grouped convolutions with a slow direct kernel). ``pads``: the begin pads (symmetric). None where it does
    not apply (then cuDNN runs it)."""
    if not (DEPTHWISE_TRITON and x.device.type in TRITON_DEVICES and x.dim() == 4 and w.dim() == 4
            and w.shape[1] == 1 and group == x.shape[1] > 1 and x.dtype == w.dtype
            and x.dtype in (torch.float16, torch.bfloat16, torch.float32) and (b is None or b.dtype == x.dtype)
            and x.is_contiguous(memory_format=torch.channels_last)):
        return None
    kernels = load_compiled("conv")
    if kernels is None:
        return None
    return kernels.conv(x, w, b, strides=strides, pads=list(pads) * 2, dilations=dilations, group=group,
                        relu=relu, clip_max=clip_max)


def pointwise_gemm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, relu: bool = False) -> torch.Tensor | None:
    """A pointwise convolution (see ``pointwise``) of a channels-last GPU tensor as one GEMM: [N·H·W, C] x
    [C, K], with the bias (and the ReLU) in the BLAS library's epilogue. cuDNN runs a separate kernel for
    the bias of a plain convolution. The result is channels-last. None where it does not apply."""
    if not (POINTWISE_GEMM and x.device.type != "cpu" and x.dim() == 4 and x.dtype == w.dtype
            and x.dtype in (torch.float16, torch.bfloat16, torch.float32)
            and x.is_contiguous(memory_format=torch.channels_last) and (b is None or b.dtype == x.dtype)):
        return None
    n, c, h, wd = x.shape
    k = w.shape[0]
    a = x.permute(0, 2, 3, 1).reshape(n * h * wd, c)
    wt = w.reshape(k, c).t()
    if b is None:
        y = a @ wt
        y = torch.relu_(y) if relu else y
    elif relu:
        y = torch._addmm_activation(b, a, wt)
    else:
        y = torch.addmm(b, a, wt)
    return y.view(n, h, wd, k).permute(0, 3, 1, 2)


def _transpose_pads(in_sizes: list[int], kernel: list[int], strides: list[int], dilations: list[int],
                    out_pad: list[int], pads: list[int] | None, auto_pad: str,
                    output_shape: list[int] | None) -> tuple[list[int], list[int]]:
    n = len(in_sizes)
    full = [strides[i] * (in_sizes[i] - 1) + out_pad[i] + (kernel[i] - 1) * dilations[i] + 1 for i in range(n)]
    if output_shape or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        if output_shape:
            target = list(output_shape[-n:])
        else:
            target = [in_sizes[i] * strides[i] for i in range(n)]
        total = [full[i] - target[i] for i in range(n)]
        upper = auto_pad == "SAME_UPPER"
        begin = [t // 2 if upper else t - t // 2 for t in total]
        end = [t - t // 2 if upper else t // 2 for t in total]
        return begin, end
    if auto_pad == "VALID" or not pads:
        return [0] * n, [0] * n
    return list(pads[:n]), list(pads[n:])


@op("ConvTranspose", since=1)
def conv_transpose(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, *, auto_pad: str = "NOTSET",
                   dilations: list[int] | None = None, group: int = 1, kernel_shape: list[int] | None = None,
                   output_padding: list[int] | None = None, output_shape: list[int] | None = None,
                   pads: list[int] | None = None, strides: list[int] | None = None) -> torch.Tensor:
    n = _spatial_rank(x, "ConvTranspose", _CONV_T)
    kernel = list(w.shape[2:])
    strides, dilations = _defaults(n, strides, dilations)
    out_pad = list(output_padding) if output_padding else [0] * n
    begin, end = _transpose_pads(list(x.shape[2:]), kernel, strides, dilations, out_pad, pads, auto_pad, output_shape)
    dt = _compute_dtype(x)
    xc, wc = x.to(dt), w.to(dt)
    bc = None if b is None else b.to(dt)
    fast = (begin == end and all(p >= 0 for p in begin)
            and all(op_ < max(s, d) for op_, s, d in zip(out_pad, strides, dilations)))
    if fast:
        y = _CONV_T[n](xc, wc, bc, stride=strides, padding=begin, output_padding=out_pad, groups=group,
                       dilation=dilations)
        return y.to(x.dtype)
    # General case: full transposed convolution, then crop (negative pad) / extend with zeros.
    y = _CONV_T[n](xc, wc, None, stride=strides, padding=0, groups=group, dilation=dilations)
    y = F.pad(y, torch_pad_arg([-p for p in begin], [op_ - p for op_, p in zip(out_pad, end)]))
    if bc is not None:
        y = y + bc.reshape(1, -1, *([1] * n))
    return y.to(x.dtype)


def _bilinear_zero(img: torch.Tensor, ys: torch.Tensor, xs: torch.Tensor) -> torch.Tensor:
    """Sample ``img`` (B, G, C, H, W) at (B, G, P) points; corners outside the image count as 0."""
    bsz, g, c, h, w = img.shape
    flat = img.reshape(bsz, g, c, h * w)
    y0 = torch.floor(ys)
    x0 = torch.floor(xs)
    out = torch.zeros((bsz, g, c, ys.shape[-1]), dtype=img.dtype, device=img.device)
    for dy in (0, 1):
        for dx in (0, 1):
            yi = y0 + dy
            xi = x0 + dx
            wgt = (1 - (ys - yi).abs()) * (1 - (xs - xi).abs())
            valid = (yi >= 0) & (yi <= h - 1) & (xi >= 0) & (xi <= w - 1)
            idx = (yi.clamp(0, h - 1) * w + xi.clamp(0, w - 1)).long()
            vals = torch.gather(flat, 3, idx.unsqueeze(2).expand(bsz, g, c, idx.shape[-1]))
            out = out + vals * (wgt * valid).unsqueeze(2)
    return out


@op("DeformConv", since=19)
def deform_conv(x: torch.Tensor, w: torch.Tensor, offset: torch.Tensor, b: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, *, dilations: list[int] | None = None, group: int = 1,
                kernel_shape: list[int] | None = None, offset_group: int = 1, pads: list[int] | None = None,
                strides: list[int] | None = None) -> torch.Tensor:
    if x.dim() != 4:
        raise ValueError(f"DeformConv supports 2 spatial axes (rank 4 input), got input shape {tuple(x.shape)}")
    dt = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    xc, wc, off = x.to(dt), w.to(dt), offset.to(dt)
    nb, c, h, wd = xc.shape
    oc, _, kh, kw = wc.shape
    (sh, sw), (dh, dw) = _defaults(2, strides, dilations)
    pads = list(pads) if pads else [0, 0, 0, 0]
    oh, ow = off.shape[2], off.shape[3]
    k = kh * kw
    ky = torch.arange(kh, device=x.device, dtype=dt).repeat_interleave(kw) * dh
    kx = torch.arange(kw, device=x.device, dtype=dt).repeat(kh) * dw
    base_y = torch.arange(oh, device=x.device, dtype=dt) * sh - pads[0]
    base_x = torch.arange(ow, device=x.device, dtype=dt) * sw - pads[1]
    off = off.reshape(nb, offset_group, k, 2, oh, ow)
    ys = ky.reshape(1, 1, k, 1, 1) + base_y.reshape(1, 1, 1, oh, 1) + off[:, :, :, 0]
    xs = kx.reshape(1, 1, k, 1, 1) + base_x.reshape(1, 1, 1, 1, ow) + off[:, :, :, 1]
    img = xc.reshape(nb, offset_group, c // offset_group, h, wd)
    cols = _bilinear_zero(img, ys.reshape(nb, offset_group, -1), xs.reshape(nb, offset_group, -1))
    cols = cols.reshape(nb, offset_group, c // offset_group, k, oh * ow)
    if mask is not None:
        cols = cols * mask.to(dt).reshape(nb, offset_group, 1, k, oh * ow)
    cols = cols.reshape(nb, group, (c // group) * k, oh * ow)
    wg = wc.reshape(group, oc // group, (c // group) * k)
    y = torch.einsum("gok,ngkl->ngol", wg, cols).reshape(nb, oc, oh, ow)
    if b is not None:
        y = y + b.to(dt).reshape(1, -1, 1, 1)
    return y.to(x.dtype)


@op("Col2Im", since=18, host_inputs=(1, 2))
def col2im(x: torch.Tensor, image_shape: torch.Tensor, block_shape: torch.Tensor, *,
           dilations: list[int] | None = None, pads: list[int] | None = None,
           strides: list[int] | None = None) -> torch.Tensor:
    image, block = ints(image_shape), ints(block_shape)
    n = len(image)
    strides, dilations = _defaults(n, strides, dilations)
    pads = list(pads) if pads else [0] * (2 * n)
    nb, ck, length = x.shape
    c = ck // math.prod(block)
    if n == 2 and pads[:2] == pads[2:]:
        return F.fold(x, image, block, dilation=dilations, padding=pads[:2], stride=strides)
    # N-D: scatter-add every (block offset, sliding position) into the padded image.
    padded = [image[i] + pads[i] + pads[n + i] for i in range(n)]
    counts = [(padded[i] - (block[i] - 1) * dilations[i] - 1) // strides[i] + 1 for i in range(n)]
    if math.prod(counts) != length:
        raise ValueError(f"Col2Im input has {length} blocks, expected {math.prod(counts)} for image {image}")
    dev = x.device
    idx = torch.zeros((1, 1), dtype=torch.int64, device=dev)  # (blocks, positions)
    for i in range(n):
        kpos = torch.arange(block[i], device=dev) * dilations[i]
        spos = torch.arange(counts[i], device=dev) * strides[i]
        coord = kpos.reshape(-1, 1) + spos.reshape(1, -1)  # (k_i, L_i)
        idx = (idx.reshape(idx.shape[0], 1, idx.shape[1], 1) * padded[i]
               + coord.reshape(1, block[i], 1, counts[i])).reshape(idx.shape[0] * block[i], -1)
    flat = x.reshape(nb, c, -1)
    out = torch.zeros((nb, c, math.prod(padded)), dtype=x.dtype, device=dev)
    out.index_add_(2, idx.reshape(-1), flat)
    out = out.reshape(nb, c, *padded)
    crop = tuple(slice(pads[i], pads[i] + image[i]) for i in range(n))
    return out[(slice(None), slice(None), *crop)]
