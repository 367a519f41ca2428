"""Signal processing: DFT, STFT, HannWindow, HammingWindow, BlackmanWindow, MelWeightMatrix.

ONNX carries complex numbers as a trailing dimension of 2 (real, imaginary); a trailing
dimension of 1 is a real signal. The transforms run on torch complex tensors (``torch.fft``),
in float32 for float16 / bfloat16 inputs, and cast back to the input's dtype. Window sizes,
DFT lengths and axes are host inputs.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from crossml import dtypes
from crossml.ops._util import norm_axis, scalar
from crossml.ops.registry import OpContext, op


def _as_complex(x: torch.Tensor) -> torch.Tensor:
    """[..., 1] real or [..., 2] (re, im) -> complex tensor [...]."""
    if x.dim() < 2 or x.shape[-1] not in (1, 2):
        raise ValueError(f"signal input must end in a dimension of 1 (real) or 2 (complex), got shape {tuple(x.shape)}")
    f = x if x.dtype in (torch.float32, torch.float64) else x.to(torch.float32)
    if f.shape[-1] == 1:
        return f.squeeze(-1).to(torch.complex128 if f.dtype == torch.float64 else torch.complex64)
    return torch.view_as_complex(f.contiguous())


def dft(x: torch.Tensor, length: int | None, axis: int, inverse: bool, onesided: bool) -> torch.Tensor:
    """The ONNX DFT of ``x`` along ``axis`` (an axis of ``x``, which includes the (re, im) dimension)."""
    rank = x.dim()
    axis = norm_axis(axis, rank)
    if axis == rank - 1:
        raise ValueError(f"DFT axis {axis} is the (real, imaginary) dimension; pick a signal axis")
    sig = _as_complex(x)
    n = length if length is not None else (2 * (x.shape[axis] - 1) if inverse and onesided else x.shape[axis])
    if n <= 0:
        raise ValueError(f"dft_length must be positive, got {n}")
    if inverse and onesided:
        y = torch.fft.irfft(sig, n=n, dim=axis).unsqueeze(-1)
        return y.to(x.dtype)
    y = torch.fft.ifft(sig, n=n, dim=axis) if inverse else torch.fft.fft(sig, n=n, dim=axis)
    if onesided and not inverse:
        y = y.narrow(axis, 0, n // 2 + 1)
    return torch.view_as_real(y).to(x.dtype)


@op("DFT", since=17, host_inputs=(1,))
def dft_17(x: torch.Tensor, dft_length: Any = None, *, axis: int = 1, inverse: int = 0,
           onesided: int = 0) -> torch.Tensor:
    n = int(scalar(dft_length)) if dft_length is not None else None
    return dft(x, n, axis, bool(inverse), bool(onesided))


@op("DFT", since=20, host_inputs=(1, 2))
def dft_20(x: torch.Tensor, dft_length: Any = None, axis: Any = None, *, inverse: int = 0,
           onesided: int = 0) -> torch.Tensor:
    n = int(scalar(dft_length)) if dft_length is not None else None
    ax = int(scalar(axis)) if axis is not None else -2
    return dft(x, n, ax, bool(inverse), bool(onesided))


@op("STFT", since=17, host_inputs=(1, 3))
def stft(signal: torch.Tensor, frame_step: Any, window: torch.Tensor | None = None, frame_length: Any = None, *,
         onesided: int = 1) -> torch.Tensor:
    if signal.dim() != 3:
        raise ValueError(f"STFT signal must be [batch, length, 1 or 2], got shape {tuple(signal.shape)}")
    step = int(scalar(frame_step))
    if frame_length is not None:
        size = int(scalar(frame_length))
    elif window is not None:
        size = window.shape[0]
    else:
        size = signal.shape[1]
    if window is not None and window.shape[0] != size:
        raise ValueError(f"STFT window has {window.shape[0]} elements but frame_length is {size}")
    if step <= 0 or size <= 0 or size > signal.shape[1]:
        raise ValueError(f"STFT needs 0 < frame_length <= signal length and frame_step > 0, got frame_length "
                         f"{size}, frame_step {step}, signal length {signal.shape[1]}")
    frames = signal.unfold(1, size, step)  # [batch, n_frames, C, size]
    frames = frames.transpose(-1, -2)  # [batch, n_frames, size, C]
    if window is not None:
        frames = frames * window.to(frames.dtype).reshape(1, 1, size, 1)
    return dft(frames, size, 2, False, bool(onesided))


# --- windows ---------------------------------------------------------------------------------


def _window(size: Any, periodic: int, output_datatype: int, terms: tuple[float, ...],
            ctx: OpContext | None) -> torch.Tensor:
    """sum_k terms[k] * cos(2 pi k n / N) with alternating signs (the generalized cosine window)."""
    n_size = int(scalar(size))
    device = ctx.device if ctx is not None and ctx.device is not None else None
    n = torch.arange(n_size, dtype=torch.float64, device=device)
    denom = n_size if periodic else n_size - 1
    y = torch.zeros_like(n)
    for k, a in enumerate(terms):
        y = y + ((-1) ** k) * a * torch.cos(2 * math.pi * k * n / denom) if denom else y + ((-1) ** k) * a
    return y.to(dtypes.torch_dtype(output_datatype))


@op("HannWindow", since=17, host_inputs=(0,), ctx=True)
def hann_window(size: Any, *, output_datatype: int = 1, periodic: int = 1, ctx: OpContext | None = None) -> torch.Tensor:
    return _window(size, periodic, output_datatype, (0.5, 0.5), ctx)


@op("HammingWindow", since=17, host_inputs=(0,), ctx=True)
def hamming_window(size: Any, *, output_datatype: int = 1, periodic: int = 1,
                   ctx: OpContext | None = None) -> torch.Tensor:
    return _window(size, periodic, output_datatype, (25.0 / 46.0, 21.0 / 46.0), ctx)


@op("BlackmanWindow", since=17, host_inputs=(0,), ctx=True)
def blackman_window(size: Any, *, output_datatype: int = 1, periodic: int = 1,
                    ctx: OpContext | None = None) -> torch.Tensor:
    return _window(size, periodic, output_datatype, (0.42, 0.5, 0.08), ctx)


@op("MelWeightMatrix", since=17, host_inputs=(0, 1, 2, 3, 4), ctx=True)
def mel_weight_matrix(num_mel_bins: Any, dft_length: Any, sample_rate: Any, lower_edge_hertz: Any,
                      upper_edge_hertz: Any, *, output_datatype: int = 1,
                      ctx: OpContext | None = None) -> torch.Tensor:
    """Triangular mel filters, [dft_length // 2 + 1, num_mel_bins], as the ONNX reference computes them."""
    bins, n_fft, rate = int(scalar(num_mel_bins)), int(scalar(dft_length)), int(scalar(sample_rate))
    low, high = float(scalar(lower_edge_hertz)), float(scalar(upper_edge_hertz))
    n_spec = n_fft // 2 + 1
    low_mel = 2595 * np.log1p(low / 700) / np.log(10)
    high_mel = 2595 * np.log1p(high / 700) / np.log(10)
    points = np.arange(0, bins + 2) * ((high_mel - low_mel) / (bins + 2)) + low_mel
    hz = 700 * np.expm1(points / 2595 * np.log(10))
    edges = (((n_fft + 1) * hz) // rate).astype(int)
    out = np.zeros((n_spec, bins))
    for i in range(bins):
        lo, center, hi = edges[i], edges[i + 1], edges[i + 2]
        if center == lo:
            out[center, i] = 1
        else:
            for j in range(lo, center + 1):
                out[j, i] = (j - lo) / (center - lo)
        for j in range(center, hi):
            out[j, i] = (hi - j) / (hi - center)
    device = ctx.device if ctx is not None and ctx.device is not None else None
    return torch.from_numpy(out).to(device=device, dtype=dtypes.torch_dtype(output_datatype))
