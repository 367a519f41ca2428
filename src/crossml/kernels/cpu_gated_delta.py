"""The small ops around Qwen3.5's layers on the CPU for float32, compiled by numba: one call each where the torch
paths take five to twenty (casts, reductions, gathers, concatenations), 50-300 µs a decode call of Qwen3.5-0.8B
against a few µs here. The GPU's counterparts are ``crossml.kernels.gated_delta`` and ``crossml.kernels.mrope``.

``lp_normalize``
    LpNormalization with p = 2 over the last axis: ``x / ||x||``, an all-zero row left zero.
``gated_rms_norm``
    com.microsoft GatedRMSNorm: each group of C channels RMS-normalized and scaled, times SiLU or sigmoid of the gate.
``linear_attention_gate``
    com.microsoft LinearAttentionGate: ``decay_scale * softplus(a + dt_bias)`` (torch's softplus: ``x`` above 20,
    else ``log1p(exp(x))``) and ``sigmoid(b)``.
``m_rotary``
    com.microsoft MRotaryEmbedding of a [B, S, hidden] input: each rotary frequency's stream picked as the op's torch
    path picks it, the rotation's products rounded separately, its values bit for bit.

float32 throughout; the norms' sums run in order, so they agree with torch's within a rounding (all are checked
against the torch paths in ``tests/kernels/test_cpu_gated_delta.py``, and the ops against onnxruntime in
``tests/ops``).
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

__all__ = ["gated_rms_norm", "linear_attention_gate", "lp_normalize", "m_rotary", "warm"]


@njit(cache=True, nogil=True, boundscheck=False)
def _lp_norm(x, y):  # pragma: no cover - compiled by numba
    rows, n = x.shape
    for r in range(rows):
        acc = np.float32(0.0)
        for i in range(n):
            acc += x[r, i] * x[r, i]
        norm = np.float32(np.sqrt(acc))
        if norm == 0:
            norm = np.float32(1.0)
        for i in range(n):
            y[r, i] = x[r, i] / norm


@njit(cache=True, nogil=True, boundscheck=False)
def _gated_rms(x, g, w, eps, sigmoid, y):  # pragma: no cover - compiled by numba
    rows, c = x.shape
    for r in range(rows):
        acc = np.float32(0.0)
        for i in range(c):
            acc += x[r, i] * x[r, i]
        inv = np.float32(1.0) / np.float32(np.sqrt(acc / np.float32(c) + eps))
        for i in range(c):
            z = g[r, i]
            s = np.float32(1.0) / (np.float32(1.0) + np.float32(np.exp(-z)))
            y[r, i] = (x[r, i] * inv * w[i]) * (s if sigmoid else z * s)


@njit(cache=True, nogil=True, boundscheck=False)
def _gate(a, dt, scale, b, has_b, decay, beta):  # pragma: no cover - compiled by numba
    rows, h = a.shape
    for r in range(rows):
        for i in range(h):
            x = a[r, i] + dt[i]
            sp = x if x > 20.0 else np.float32(np.log1p(np.exp(x)))
            decay[r, i] = scale[i] * sp
            if has_b:
                beta[r, i] = np.float32(1.0) / (np.float32(1.0) + np.float32(np.exp(-b[r, i])))


@njit(cache=True, nogil=True, boundscheck=False)
def _mrope(x, pos, cos, sin, s0, s1, s2, interleaved_layout, pairs, rot, y):  # pragma: no cover - compiled by numba
    """x, y [B, S, N, H]; pos [3, B, S]; cos, sin [max_pos, >= rot / 2]."""
    B, S, N, H = x.shape
    half = rot // 2
    last = cos.shape[0] - 1
    for b in range(B):
        for s in range(S):
            for j in range(half):
                if interleaved_layout:
                    stream = 1 if (j % 3 == 1 and j < 3 * s1) else (2 if (j % 3 == 2 and j < 3 * s2) else 0)
                else:
                    stream = 0 if j < s0 else (1 if j < s0 + s1 else 2)
                p = min(max(pos[stream, b, s], 0), last)
                c = cos[p, j]
                sn = sin[p, j]
                i1, i2 = (2 * j, 2 * j + 1) if pairs else (j, j + half)
                for n in range(N):
                    x1 = x[b, s, n, i1]
                    x2 = x[b, s, n, i2]
                    a1 = x1 * c
                    a2 = x2 * sn
                    y[b, s, n, i1] = a1 - a2
                    b1 = x1 * sn
                    b2 = x2 * c
                    y[b, s, n, i2] = b1 + b2
            for n in range(N):
                for i in range(rot, H):
                    y[b, s, n, i] = x[b, s, n, i]


def _array(t: torch.Tensor) -> np.ndarray:
    return (t if t.is_contiguous() else t.contiguous()).numpy()


def lp_normalize(x: torch.Tensor) -> torch.Tensor:
    """LpNormalization (p = 2) of float32 x over its last axis."""
    xa = _array(x).reshape(-1, x.shape[-1])
    y = np.empty_like(xa)
    _lp_norm(xa, y)
    return torch.from_numpy(y).reshape(x.shape)


def gated_rms_norm(x: torch.Tensor, scale: torch.Tensor, gate: torch.Tensor, epsilon: float,
                   sigmoid: bool) -> torch.Tensor:
    """GatedRMSNorm of float32 x (..., groups * C) with scale [C] and gate (x's shape); the caller checks shapes."""
    c = scale.shape[0]
    xa = _array(x).reshape(-1, c)
    y = np.empty_like(xa)
    _gated_rms(xa, _array(gate).reshape(-1, c), _array(scale), np.float32(epsilon), sigmoid, y)
    return torch.from_numpy(y).reshape(x.shape)


def linear_attention_gate(a: torch.Tensor, dt_bias: torch.Tensor, decay_scale: torch.Tensor,
                          b: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """LinearAttentionGate's (decay, beta) of float32 a (..., H), dt_bias and decay_scale [H], b or None."""
    h = a.shape[-1]
    aa = _array(a).reshape(-1, h)
    decay = np.empty_like(aa)
    ba = _array(b).reshape(-1, h) if b is not None else aa
    beta = np.empty_like(aa) if b is not None else decay
    _gate(aa, _array(dt_bias), _array(decay_scale), ba, b is not None, decay, beta)
    return (torch.from_numpy(decay).reshape(a.shape),
            torch.from_numpy(beta).reshape(a.shape) if b is not None else None)


def m_rotary(x: torch.Tensor, heads: int, position_ids: torch.Tensor, cos_cache: torch.Tensor,
             sin_cache: torch.Tensor, section: list[int], layout: int, interleaved: bool, rot: int) -> torch.Tensor:
    """MRotaryEmbedding of float32 x [B, S, heads * H] with position_ids [3, B, S] and float32 caches; the caller
    checks the shapes."""
    B, S, hidden = x.shape
    xa = _array(x).reshape(B, S, heads, hidden // heads)
    y = np.empty_like(xa)
    _mrope(xa, _array(position_ids.long()), _array(cos_cache), _array(sin_cache), section[0], section[1], section[2],
           layout == 1, interleaved, rot, y)
    return torch.from_numpy(y).reshape(B, S, hidden)


def warm() -> None:
    """Load the kernels for the argument types the ops pass (``crossml.kernels.warm_cpu``), on tiny inputs."""
    z = torch.zeros(1, 1, 4)
    lp_normalize(z)
    gated_rms_norm(z, torch.ones(4), z, 1e-6, False)
    linear_attention_gate(z, torch.zeros(4), torch.ones(4), z)
    linear_attention_gate(z, torch.zeros(4), torch.ones(4), None)
    m_rotary(z, 1, torch.zeros(3, 1, 1, dtype=torch.long), torch.ones(2, 2), torch.zeros(2, 2), [1, 1, 0], 1, False,
             4)
