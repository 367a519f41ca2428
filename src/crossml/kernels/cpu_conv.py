"""CausalConvWithState's depthwise causal convolution on the CPU for float32, compiled by numba: one call where the
torch path takes about ten (a decode step of LFM2-350M's 1024 channels: about 80 us warm and 400 us after a weight
product has streamed through the caches, against a few us here).

Output position t of channel c is ``sum_j w[c, j] * padded[c, t + j * dilation]`` (the taps in order, float32, no
fused products), then the bias; ``padded`` is the carried state followed by the input, and the present state its last
``(k - 1) * dilation`` positions. The op's torch path computes the same products and sums (within a rounding of
it: torch may add the k products in another order); both are checked against onnxruntime
(``tests/ops/contrib/test_conv.py``).
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

__all__ = ["causal_conv", "short_conv", "warm"]


#: the widest plain input (positions) that takes ``_across_channels`` (each tap a loop over all channels, which the
#: compiler vectorizes); wider ones take ``_channel_at_a_time`` (each tap a loop over a channel's positions), and
#: LFM2's gated block, whose channels are the last axis, always the first. On this project's 2-core CPU host, one call
#: on Qwen3.5-0.8B's 6144 channels (4 taps): a decode step 0.03 ms against 0.10 with the channel loop of before, 8
#: positions 0.36 against 0.53 for the channel loop below, 128 positions (a prompt) 2.0 ms against 10.2 before; LFM2's
#: block (1024 channels, 3 taps) at 128 positions 0.8 against 2.7. Every order gives the same bits
ACROSS_CHANNELS = 8


@njit(cache=True, nogil=True, boundscheck=False)
def _across_channels(h, past, w, bias, has_bias, dilation, gated, y, present):  # pragma: no cover - numba
    """``_conv`` for a few positions: for each output position, each tap is one loop over the channels (the same
    products, added in the same order: zero, the taps in order, then the bias)."""
    B = h.shape[0]
    C = past.shape[1]
    L = h.shape[1] if gated else h.shape[2]
    S = past.shape[2]
    k = w.shape[1]
    for b in range(B):
        for t in range(L):
            yt = y[b, t] if gated else y[b, :, t]
            for c in range(C):
                yt[c] = np.float32(0.0)
            for j in range(k):
                p = t + j * dilation
                wj = w[:, j]
                if p < S:
                    src = past[b, :, p]
                    for c in range(C):
                        yt[c] += wj[c] * src[c]
                elif gated:
                    hb = h[b, p - S]
                    for c in range(C):
                        yt[c] += wj[c] * (hb[c] * hb[2 * C + c])
                else:
                    src = h[b, :, p - S]
                    for c in range(C):
                        yt[c] += wj[c] * src[c]
            if has_bias:
                for c in range(C):
                    yt[c] += bias[c]
            if gated:
                ht = h[b, t]
                for c in range(C):
                    yt[c] = ht[C + c] * yt[c]
        for t in range(S):
            p = L + t
            out = present[b, :, t]
            if p < S:
                src = past[b, :, p]
                for c in range(C):
                    out[c] = src[c]
            elif gated:
                hb = h[b, p - S]
                for c in range(C):
                    out[c] = hb[c] * hb[2 * C + c]
            else:
                src = h[b, :, p - S]
                for c in range(C):
                    out[c] = src[c]


@njit(cache=True, nogil=True, boundscheck=False)
def _conv(h, past, w, bias, has_bias, dilation, gated, y, present):  # pragma: no cover - compiled by numba
    """The convolution of channel c after its carried positions past [B, C, S] with w [C, k] (bias [C]), float32.
    Plain: the input is h [B, C, L] and y [B, C, L] the output. ``gated`` (LFM2's block,
    ``crossml.graph.passes.short_conv``): h is [B, L, 3C] (b | c | x along the channels), the input b * x, and y
    [B, L, C] the output times c. present [B, C, S]: the last S positions of past followed by the input."""
    L = h.shape[1] if gated else h.shape[2]
    if gated or L <= ACROSS_CHANNELS:
        _across_channels(h, past, w, bias, has_bias, dilation, gated, y, present)
    else:
        _channel_at_a_time(h, past, w, bias, has_bias, dilation, y, present)


@njit(cache=True, nogil=True, boundscheck=False)
def _channel_at_a_time(h, past, w, bias, has_bias, dilation, y, present):  # pragma: no cover - numba
    """``_conv`` of the plain layout one channel at a time: the channel's carried and new positions in one row, then
    each tap a loop over the output positions, which the compiler vectorizes (the same products, added in the same
    order as ``_across_channels``: zero, the taps in order, then the bias)."""
    B = h.shape[0]
    C = past.shape[1]
    L = h.shape[2]
    S = past.shape[2]
    k = w.shape[1]
    row = np.empty(S + L, np.float32)
    for b in range(B):
        for c in range(C):
            pc = past[b, c]
            hc = h[b, c]
            yc = y[b, c]
            for i in range(S):
                row[i] = pc[i]
            for i in range(L):
                row[S + i] = hc[i]
            for t in range(L):
                yc[t] = np.float32(0.0)
            for j in range(k):
                wj = w[c, j]
                off = j * dilation
                for t in range(L):
                    yc[t] += wj * row[t + off]
            if has_bias:
                bc = bias[c]
                for t in range(L):
                    yc[t] += bc
            for t in range(S):
                present[b, c, t] = row[L + t]


_NONE = np.zeros(1, np.float32)  # the kernel's input for an absent bias


def causal_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, past: torch.Tensor,
                dilation: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, present state) of float32 CPU tensors: x [B, C, L], weight [C, 1, k], bias [C] or None, past
    [B, C, (k - 1) * dilation] (the caller checks shapes and dtypes)."""
    B, C, L = x.shape
    out = np.empty((B, C, L), np.float32)
    present = np.empty(tuple(past.shape), np.float32)
    _conv(_array(x), _array(past), _array(weight).reshape(C, -1), _NONE if bias is None else _array(bias),
          bias is not None, dilation, False, out, present)
    return torch.from_numpy(out), torch.from_numpy(present)


def short_conv(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, past: torch.Tensor,
               dilation: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(y [B, L, C], present state) of LFM2's block on float32 CPU tensors: h [B, L, 3C], weight [C, 1, k], bias [C]
    or None, past [B, C, (k - 1) * dilation] (the caller checks shapes and dtypes)."""
    B, L, C3 = h.shape
    C = C3 // 3
    y = np.empty((B, L, C), np.float32)
    present = np.empty(tuple(past.shape), np.float32)
    _conv(_array(h), _array(past), _array(weight).reshape(C, -1), _NONE if bias is None else _array(bias),
          bias is not None, dilation, True, y, present)
    return torch.from_numpy(y), torch.from_numpy(present)


def _array(t: torch.Tensor) -> np.ndarray:
    return (t if t.is_contiguous() else t.contiguous()).numpy()


def warm() -> None:
    """Load the kernel for the argument types the op passes (``crossml.kernels.warm_cpu``), on tiny inputs."""
    for length in (1, ACROSS_CHANNELS + 1):  # both loop orders
        causal_conv(torch.zeros(1, 2, length), torch.zeros(2, 1, 3), None, torch.zeros(1, 2, 2), 1)
        short_conv(torch.zeros(1, length, 6), torch.zeros(2, 1, 3), None, torch.zeros(1, 2, 2), 1)
