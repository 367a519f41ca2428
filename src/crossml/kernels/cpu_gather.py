"""GatherBlockQuantized (com.microsoft) of 4-bit rows on the CPU, compiled by numba: an int4 embedding lookup (a
builder model with tied embeddings reads its lm_head's packed weight this way) in one call, where the op's torch path
takes about fifteen (a decode step's one-token lookup: about 400 us after the step's weight products have streamed
through the caches).

Row i's value d is ``(q - z) * s``: q its 4-bit code (packed two a byte, low nibble first), z its block's zero point
(4-bit, packed alike) or 8 without zero points, s its block's float32 scale; a float32 subtraction, then a product,
as the torch path computes them, so the values are the same bit for bit. An index outside [-V, V) gives a row of
zeros, as there.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

__all__ = ["gather_rows", "warm"]


@njit(cache=True, nogil=True, boundscheck=False)
def _gather(data, idx, scales, zp, has_zp, block, out):  # pragma: no cover - compiled by numba
    """data [V, K / 2] uint8, idx [R] int64, scales [V, n_blocks] float32, zp [V, ceil(n_blocks / 2)] uint8; out
    [R, K] float32."""
    V = data.shape[0]
    K = out.shape[1]
    eight = np.float32(8.0)
    for r in range(idx.shape[0]):
        i = idx[r]
        if i < 0:
            i += V
        if i < 0 or i >= V:
            for d in range(K):
                out[r, d] = np.float32(0.0)
            continue
        for d in range(K):
            byte = data[i, d >> 1]
            q = (byte >> 4) if d & 1 else (byte & 15)
            b = d // block
            z = eight
            if has_zp:
                zb = zp[i, b >> 1]
                z = np.float32((zb >> 4) if b & 1 else (zb & 15))
            out[r, d] = (np.float32(q) - z) * scales[i, b]


_NO_ZP = np.zeros((1, 1), np.uint8)  # the kernel's input without zero points


def gather_rows(data: torch.Tensor, indices: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None,
                block_size: int) -> torch.Tensor:
    """Rows ``indices`` of the 4-bit table ``data`` [V, K / 2] (uint8, two codes a byte) with float32 ``scales``
    [V, n_blocks] and packed uint8 ``zero_points`` or None: float32 [*indices.shape, K] (the caller checks types and
    shapes)."""
    K = data.shape[1] * 2
    idx = indices.reshape(-1).to(torch.int64).numpy()
    out = np.empty((idx.shape[0], K), np.float32)
    zp = _NO_ZP if zero_points is None else _array(zero_points)
    _gather(_array(data), idx, _array(scales), zp, zero_points is not None, block_size, out)
    return torch.from_numpy(out).reshape(*indices.shape, K)


def _array(t: torch.Tensor) -> np.ndarray:
    return (t if t.is_contiguous() else t.contiguous()).numpy()


def warm() -> None:
    """Load the kernel for the argument types the op passes (``crossml.kernels.warm_cpu``), on tiny inputs."""
    gather_rows(torch.zeros(2, 16, dtype=torch.uint8), torch.zeros(1, 1, dtype=torch.int64), torch.ones(2, 1), None, 32)
