"""LinearAttention's recurrence on the CPU for float32, compiled by numba: two passes over each head's state a token
where the torch path (``crossml.ops.attention.linear_recurrence``) makes about six (the decay, the retrieval, the
update, the read-out, each over the whole [d_k, d_v] state, plus the casts and the stack): a decode step of a
Qwen3.5-0.8B layer's 16 heads of 128 x 128 float32 states is 1 MB a pass.

Per token and state head, as the torch path: the state times ``exp(decay)`` (per head, or per key row) while the
retrieval ``S^T k`` is summed (first pass); with the delta rules ``u = beta (v - S^T k)``, else ``u = v``; then
``S += k u^T`` while each query head's ``scale * q^T S`` is summed (second pass). Query heads share a state head in
groups (GQA) or one serves several (inverse GQA), and a key head may serve several state heads. float32 throughout,
sums in another order than torch's einsums, so the two agree within a rounding (both are checked against onnxruntime:
``tests/ops/contrib/test_linear_attention.py``, ``tests/kernels/test_cpu_linear_attention.py``).
"""

from __future__ import annotations

import itertools

import numpy as np
import torch
from numba import njit, prange

from crossml.kernels.cpu_nbits import _parallel, threaded_build

__all__ = ["linear_attention", "warm"]


def _recurrence(q, k, v, state, g, beta, out, G, INV, KDIV, scale, gated, per_key, delta,
                beta_per_head):  # pragma: no cover - compiled by numba
    """q [B, T, Hq, dk], k [B, T, Hk, dk], v [B, T, Hkv, dv], state [B, Hkv, dk, dv] (advanced in place), g [B, T, n]
    (log-space decay, n = Hkv or Hkv * dk), beta [B, T, Hkv or 1], out [B, T, Hout, dv]. One iteration per (row,
    state head), each with its own state and output heads: the threaded build runs them on numba's threads."""
    B, T = q.shape[0], q.shape[1]
    Hkv, dk, dv = state.shape[1], state.shape[2], state.shape[3]
    for bh in prange(B * Hkv):
        b = bh // Hkv
        h = bh % Hkv
        r = np.empty(dv, np.float32)
        u = np.empty(dv, np.float32)
        o = np.empty(dv, np.float32)
        S = state[b, h]
        kh = h // KDIV
        qh = (h * G) // INV
        for t in range(T):
            kt = k[b, t, kh]
            r[:] = 0.0
            for i in range(dk):
                if gated:
                    d = np.float32(np.exp(g[b, t, h * dk + i] if per_key else g[b, t, h]))
                    for j in range(dv):
                        S[i, j] = S[i, j] * d
                ki = kt[i]
                for j in range(dv):
                    r[j] += S[i, j] * ki
            if delta:
                bt = beta[b, t, h if beta_per_head else 0]
                for j in range(dv):
                    u[j] = bt * (v[b, t, h, j] - r[j])
            else:
                for j in range(dv):
                    u[j] = v[b, t, h, j]
            for gi in range(G):
                qt = q[b, t, qh + gi]
                o[:] = 0.0
                for i in range(dk):
                    ki = kt[i]
                    qi = qt[i]
                    for j in range(dv):
                        if gi == 0:
                            S[i, j] += ki * u[j]
                        o[j] += qi * S[i, j]
                for j in range(dv):
                    out[b, t, h * G + gi, j] = scale * o[j]


def _recurrence_v_major(q, k, v, state, g, beta, out, G, INV, KDIV, scale, gated, per_key, delta,
                        beta_per_head):  # pragma: no cover - compiled by numba
    """``_recurrence`` over V-major states [B, Hkv, dv, dk] (com.microsoft GatedDeltaNet's layout): each value
    column's key row is contiguous and evolves alone, so one pass a token does all of it, row by row (decay, the
    retrieval ``S^T k``, the update, each query head's read-out), while the row is in the cache."""
    B, T = q.shape[0], q.shape[1]
    Hkv, dv, dk = state.shape[1], state.shape[2], state.shape[3]
    for bh in prange(B * Hkv):
        b = bh // Hkv
        h = bh % Hkv
        dec = np.ones(dk, np.float32)
        S = state[b, h]
        kh = h // KDIV
        qh = (h * G) // INV
        for t in range(T):
            kt = k[b, t, kh]
            if gated:
                for i in range(dk):
                    dec[i] = np.float32(np.exp(g[b, t, h * dk + i] if per_key else g[b, t, h]))
            bt = beta[b, t, h if beta_per_head else 0] if delta else np.float32(1.0)
            for j in range(dv):
                row = S[j]
                r = np.float32(0.0)
                if gated:
                    for i in range(dk):
                        row[i] = row[i] * dec[i]
                for i in range(dk):
                    r += row[i] * kt[i]
                u = bt * (v[b, t, h, j] - r) if delta else v[b, t, h, j]
                for i in range(dk):
                    row[i] += kt[i] * u
                for gi in range(G):
                    qt = q[b, t, qh + gi]
                    o = np.float32(0.0)
                    for i in range(dk):
                        o += qt[i] * row[i]
                    out[b, t, h * G + gi, j] = scale * o


_FLAGS = {"cache": True, "nogil": True, "boundscheck": False}
_serial = njit(**_FLAGS)(_recurrence)
_threaded = threaded_build(_recurrence, **_FLAGS)  # (its own cache entry: threaded_build)
# the V-major rows' sums (the retrieval, the read-out) are reductions: reassociation lets the compiler vectorize them
_V_FLAGS = {**_FLAGS, "fastmath": {"reassoc"}}
_serial_v = njit(**_V_FLAGS)(_recurrence_v_major)
_threaded_v = threaded_build(_recurrence_v_major, **_V_FLAGS)
#: state elements times tokens from which a call runs its heads on numba's threads (``cpu_nbits._parallel``): a
#: Qwen3.5-0.8B decode step (16 heads of 128 x 128, one token) is 262,144
PARALLEL_MIN_WORK = 1 << 16


_NONE = np.zeros((1, 1, 1), np.float32)  # the kernel's input for an absent decay or beta


def linear_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, past: torch.Tensor | None,
                     decay: torch.Tensor | None, beta: torch.Tensor | None, q_heads: int, kv_heads: int,
                     key_heads: int, scale: float, threads: bool | None = None, *,
                     v_major: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(output [B, T, max(q_heads, kv_heads) * d_v], state [B, kv_heads, d_k, d_v]) of float32 CPU tensors, laid out
    as ``crossml.kernels.linear_attention.linear_attention`` takes them (the caller checks shapes and dtypes).
    ``threads``: run the state heads on numba's threads (None: from PARALLEL_MIN_WORK state elements times tokens, with
    more than one head). ``v_major``: past and returned states [B, kv_heads, d_v, d_k] (com.microsoft GatedDeltaNet)."""
    B, T, _ = query.shape
    dk = query.shape[2] // q_heads
    dv = value.shape[2] // kv_heads
    G = max(q_heads // kv_heads, 1)
    inv = max(kv_heads // q_heads, 1)
    q = _array(query).reshape(B, T, q_heads, dk)
    k = _array(key).reshape(B, T, key_heads, dk)
    v = _array(value).reshape(B, T, kv_heads, dv)
    if past is not None:
        state = _array(past).copy()
    else:
        state = np.zeros((B, kv_heads, dv, dk) if v_major else (B, kv_heads, dk, dv), np.float32)
    out = np.empty((B, T, kv_heads * G, dv), np.float32)
    args = (q, k, v, state, _array(decay) if decay is not None else _NONE,
            _array(beta) if beta is not None else _NONE, out, G, inv, kv_heads // key_heads, np.float32(scale),
            decay is not None, decay is not None and decay.shape[2] == kv_heads * dk, beta is not None,
            beta is not None and beta.shape[2] == kv_heads)
    if threads is None:
        threads = state.size * T >= PARALLEL_MIN_WORK and B * kv_heads > 1
    if threads:
        _parallel(_threaded_v if v_major else _threaded, *args)
    else:
        (_serial_v if v_major else _serial)(*args)
    return torch.from_numpy(out.reshape(B, T, -1)), torch.from_numpy(state)


def _array(t: torch.Tensor) -> np.ndarray:
    return (t if t.is_contiguous() else t.contiguous()).numpy()


def warm() -> None:
    """Load the kernel for the argument types the op passes (``crossml.kernels.warm_cpu``), on tiny inputs."""
    z = torch.zeros(1, 1, 2)
    for threads, v_major in itertools.product((False, True), (False, True)):  # all four builds
        linear_attention(z, z, z, torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 1), torch.zeros(1, 1, 1), 1, 1, 1, 1.0,
                         threads=threads, v_major=v_major)
        linear_attention(z, z, z, None, None, None, 1, 1, 1, 1.0, threads=threads, v_major=v_major)
