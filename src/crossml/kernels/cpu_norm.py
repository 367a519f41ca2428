"""SkipSimplifiedLayerNormalization (com.microsoft) on the CPU for float32, compiled by numba: one call for the ten
or so torch calls of the op's torch path, with onnxruntime's CPU arithmetic.

onnxruntime's CPU kernel (``contrib_ops/cpu/skip_layer_norm.cc``) adds each row's input, skip and bias in float32,
sums the squares of the row in order, takes ``rms = sqrt(sum_sq / H + epsilon)`` and writes ``s / rms * gamma``.
This kernel does the same operations in the same order (no fast-math: no fused products, no reordered sums), and
its outputs equal onnxruntime 1.32's bit for bit (``tests/ops/contrib/test_activation_norm.py``). The skip may be
broadcast over leading dims: row r reads skip row ``r % skip_rows``, as onnxruntime does. (SkipLayerNormalization,
with its mean, keeps the torch path: onnxruntime 1.32's CPU results for it are not the textbook formula's in
order, so a kernel would not match them any better.)
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

__all__ = ["normalize", "skip_rms_norm", "warm"]


@njit(cache=True, nogil=True, boundscheck=False)
def _skip_rms_norm(x, skip, gamma, bias, has_bias, eps, y, s):  # pragma: no cover - compiled by numba
    """x [R, H], skip [S, H] (row r reads row r % S), gamma / bias [H] float32; y and s [R, H] outputs: the
    normalized rows and the sums x + skip (+ bias)."""
    R, H = x.shape
    S = skip.shape[0]
    h = np.float32(H)
    for r in range(R):
        sr = r % S
        mean_sq = np.float32(0.0)
        for d in range(H):
            val = x[r, d] + skip[sr, d]
            if has_bias:
                val += bias[d]
            s[r, d] = val
            mean_sq += val * val
        rms = np.sqrt(mean_sq / h + eps)
        for d in range(H):
            y[r, d] = s[r, d] / rms * gamma[d]


_NONE = np.zeros(1, np.float32)  # the kernel's input for an absent bias


def skip_rms_norm(x: torch.Tensor, skip: torch.Tensor, gamma: torch.Tensor, bias: torch.Tensor | None,
                  epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(normalized, sum) of float32 x [..., H] and skip broadcast to it over leading dims; gamma and bias of H
    values (the caller checks shapes and dtypes)."""
    y, s = normalize(x, skip, gamma, bias, epsilon)
    return torch.from_numpy(y), torch.from_numpy(s)


def normalize(x: torch.Tensor, skip: torch.Tensor, gamma: torch.Tensor, bias: torch.Tensor | None,
              epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """``skip_rms_norm``'s results as numpy arrays of x's shape (``crossml.kernels.cpu_int8.norm_matmul`` multiplies
    the normalized rows next)."""
    H = x.shape[-1]
    xn = _array(x)
    y = np.empty(xn.shape, np.float32)
    s = np.empty(xn.shape, np.float32)
    _skip_rms_norm(xn.reshape(-1, H), _array(skip).reshape(-1, H), _array(gamma).reshape(H),
                   _NONE if bias is None else _array(bias).reshape(H), bias is not None, np.float32(epsilon),
                   y.reshape(-1, H), s.reshape(-1, H))
    return y, s


def _array(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor's values as a C-contiguous numpy array (a view where the tensor is contiguous)."""
    return (t if t.is_contiguous() else t.contiguous()).numpy()


def warm() -> None:
    """Load the kernel for the argument types the op passes (``crossml.kernels.warm_cpu``), on tiny inputs."""
    x = torch.zeros(1, 4)
    skip_rms_norm(x, x, torch.ones(4), None, 1e-6)
