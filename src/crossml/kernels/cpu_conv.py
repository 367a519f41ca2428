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


@njit(cache=True, nogil=True, boundscheck=False)
def _conv(x, past, w, bias, has_bias, dilation, out, present):  # pragma: no cover - compiled by numba
    """x [B, C, L], past [B, C, S], w [C, k], bias [C] float32; out [B, C, L] and present [B, C, S] outputs."""
    B, C, L = x.shape
    S = past.shape[2]
    k = w.shape[1]
    for b in range(B):
        for c in range(C):
            for t in range(L):
                acc = np.float32(0.0)
                for j in range(k):
                    p = t + j * dilation
                    acc += w[c, j] * (past[b, c, p] if p < S else x[b, c, p - S])
                if has_bias:
                    acc += bias[c]
                out[b, c, t] = acc
            for i in range(S):
                p = L + i
                present[b, c, i] = past[b, c, p] if p < S else x[b, c, p - S]


@njit(cache=True, nogil=True, boundscheck=False)
def _short_conv(h, past, w, bias, has_bias, dilation, y, present):  # pragma: no cover - compiled by numba
    """LFM2's block (``crossml.graph.passes.short_conv``) on h [B, L, 3C] (b | c | x along the channels), past
    [B, C, S], w [C, k], bias [C] float32: the convolution of b * x (as ``_conv``), times c, into y [B, L, C];
    present [B, C, S] the last S positions of past followed by b * x."""
    B, L, C3 = h.shape
    C = C3 // 3
    S = past.shape[2]
    k = w.shape[1]
    for b in range(B):
        for c in range(C):
            for t in range(L):
                acc = np.float32(0.0)
                for j in range(k):
                    p = t + j * dilation
                    if p < S:
                        v = past[b, c, p]
                    else:
                        q = p - S
                        v = h[b, q, c] * h[b, q, 2 * C + c]
                    acc += w[c, j] * v
                if has_bias:
                    acc += bias[c]
                y[b, t, c] = h[b, t, C + c] * acc
            for i in range(S):
                p = L + i
                if p < S:
                    present[b, c, i] = past[b, c, p]
                else:
                    q = p - S
                    present[b, c, i] = h[b, q, c] * h[b, q, 2 * C + c]


_NONE = np.zeros(1, np.float32)  # the kernel's input for an absent bias


def causal_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, past: torch.Tensor,
                dilation: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, present state) of float32 CPU tensors: x [B, C, L], weight [C, 1, k], bias [C] or None, past
    [B, C, (k - 1) * dilation] (the caller checks shapes and dtypes)."""
    B, C, L = x.shape
    out = np.empty((B, C, L), np.float32)
    present = np.empty(tuple(past.shape), np.float32)
    _conv(_array(x), _array(past), _array(weight).reshape(C, -1), _NONE if bias is None else _array(bias), bias is not None,
          dilation, out, present)
    return torch.from_numpy(out), torch.from_numpy(present)


def short_conv(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, past: torch.Tensor,
               dilation: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(y [B, L, C], present state) of LFM2's block on float32 CPU tensors: h [B, L, 3C], weight [C, 1, k], bias [C]
    or None, past [B, C, (k - 1) * dilation] (the caller checks shapes and dtypes)."""
    B, L, C3 = h.shape
    C = C3 // 3
    y = np.empty((B, L, C), np.float32)
    present = np.empty(tuple(past.shape), np.float32)
    _short_conv(_array(h), _array(past), _array(weight).reshape(C, -1), _NONE if bias is None else _array(bias),
                bias is not None, dilation, y, present)
    return torch.from_numpy(y), torch.from_numpy(present)


def _array(t: torch.Tensor) -> np.ndarray:
    return (t if t.is_contiguous() else t.contiguous()).numpy()


def warm() -> None:
    """Load the kernel for the argument types the op passes (``crossml.kernels.warm_cpu``), on tiny inputs."""
    causal_conv(torch.zeros(1, 2, 1), torch.zeros(2, 1, 3), None, torch.zeros(1, 2, 2), 1)
    short_conv(torch.zeros(1, 1, 6), torch.zeros(2, 1, 3), None, torch.zeros(1, 2, 2), 1)
