"""GroupQueryAttention's decode step on the CPU, compiled by numba: one call for what the op's torch path does in
some thirty torch calls (split the packed heads, rotate q and k, write the new key and value rows into the shared
cache, build the mask, attend).

The torch reference is ``crossml.ops.contrib.attention.group_query_attention``'s path for one new token a row over
a shared max-length cache: the new row goes to ``seqlens_k[b]`` (clamped to the buffer), q and k are rotated at
``position_ids`` or else ``seqlens_k`` (positions clamped to the cos / sin caches), and the query attends keys
``max(0, seqlens_k[b] - window + 1) .. seqlens_k[b]``, each query head the key head of its group. The rotation is
that path's arithmetic (``apply_rotary``: float32 products, then one subtraction or addition), so the cache rows
are the same bit for bit; the attention is a float32 softmax over the attended rows, equal to SDPA's up to float32
summation order.

A decode step's attention is small (Qwen2.5-0.5B: 14 heads of 64 over a few hundred rows); the torch path's calls
cost more than its arithmetic. Long rows (more than PARALLEL_MIN_WORK multiply-adds) run the heads on numba's
threads (``cpu_nbits._parallel``), shorter ones on the calling thread.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

from crossml.kernels.cpu_nbits import _parallel, threaded_build

__all__ = ["PARALLEL_MIN_WORK", "decode", "decode_packed", "warm"]

#: multiply-adds (rows x heads x attended keys x head size) from which the heads run on numba's threads
PARALLEL_MIN_WORK = 1 << 20


@njit(cache=True, nogil=True, boundscheck=False)
def _rotate(x, out, cos, sin, p, interleaved):  # pragma: no cover - compiled by numba
    """out = x rotated at position row p of the cos / sin caches (its first 2 * cos.shape[1] channels; the others
    as they are), with ``apply_rotary``'s arithmetic: float32 products, then one subtraction or addition (compiled
    without fast-math, so the products are not fused)."""
    half = cos.shape[1]
    for d in range(x.shape[0]):
        out[d] = x[d]
    for i in range(half):
        c = cos[p, i]
        s = sin[p, i]
        if interleaved:
            x1 = x[2 * i]
            x2 = x[2 * i + 1]
            out[2 * i] = x1 * c - x2 * s
            out[2 * i + 1] = x1 * s + x2 * c
        else:
            x1 = x[i]
            x2 = x[i + half]
            out[i] = x1 * c - x2 * s
            out[i + half] = x1 * s + x2 * c


@njit(cache=True, nogil=True, boundscheck=False)
def _write(q, k, v, kc, vc, rows, pos, cos, sin, do_rotary, interleaved, qr):  # pragma: no cover - numba
    """The new key and value rows into the caches (row ``min(rows[b], L - 1)``), the key rotated, and the rotated
    queries into qr [B, N, H]: q [B, N * H], k / v [B, Nk * H] float32 (rows may be strided: views of a packed
    projection); kc / vc [B, Nk, L, H]; rows and pos [B] integers (``seqlens_k``, rotary positions, clamped to the
    cos / sin caches [P, R / 2]). Without fast-math: the rotation's products stay unfused, as in torch."""
    B, Nk, L, H = kc.shape
    N = qr.shape[1]
    P = cos.shape[0]
    for b in range(B):
        row = min(rows[b], L - 1)
        p = min(max(pos[b], 0), P - 1)
        for g in range(Nk):
            if do_rotary:
                _rotate(k[b, g * H:(g + 1) * H], kc[b, g, row], cos, sin, p, interleaved)
            else:
                kc[b, g, row, :] = k[b, g * H:(g + 1) * H]
            vc[b, g, row, :] = v[b, g * H:(g + 1) * H]
        for h in range(N):
            if do_rotary:
                _rotate(q[b, h * H:(h + 1) * H], qr[b, h], cos, sin, p, interleaved)
            else:
                qr[b, h, :] = q[b, h * H:(h + 1) * H]


def _attend(qr, kc, vc, rows, scale, window, softcap, out):  # pragma: no cover - compiled by numba
    """out [B, N * H]: each query head of qr [B, N, H] over its group's key rows ``first .. min(rows[b], L - 1)`` of
    kc / vc [B, Nk, L, H] (``first = rows[b] - window + 1`` where window > 0, else 0), softmax in float32; with
    ``softcap > 0`` the scores are ``softcap * tanh(scale * q . k / softcap)`` (Gemma 2).

    One program per (row, key head): the G query heads of the group scored together against each key row (read
    once for the G heads), a softmax per head, and the weighted sum of the value rows (each read once for the G
    heads)."""
    B, Nk, L, H = kc.shape
    N = qr.shape[1]
    G = N // Nk
    for bh in prange(B * Nk):
        b = bh // Nk
        g = bh % Nk
        row = min(rows[b], L - 1)
        first = max(0, rows[b] - window + 1) if window > 0 else 0
        T = row - first + 1
        scores = np.empty((G, max(T, 1)), np.float32)
        for j in range(T):
            kr = kc[b, g, first + j]
            for i in range(G):
                qi = qr[b, g * G + i]
                t = np.float32(0.0)
                for d in range(H):
                    t += qi[d] * kr[d]
                t = t * scale
                if softcap > 0:
                    t = softcap * np.tanh(t / softcap)
                scores[i, j] = t
        acc = np.zeros((G, H), np.float32)
        for i in range(G):
            m = np.float32(-np.inf)
            for j in range(T):
                m = max(m, scores[i, j])
            total = np.float32(0.0)
            for j in range(T):
                e = np.exp(scores[i, j] - m)
                scores[i, j] = e
                total += e
            scores[i, :T] *= np.float32(1.0) / total
        for j in range(T):
            vr = vc[b, g, first + j]
            for i in range(G):
                w = scores[i, j]
                for d in range(H):
                    acc[i, d] += w * vr[d]
        for i in range(G):
            out[b, (g * G + i) * H:(g * G + i + 1) * H] = acc[i]


_FLAGS = {"cache": True, "nogil": True, "boundscheck": False, "fastmath": {"reassoc", "contract"}}
_serial = njit(**_FLAGS)(_attend)
_threaded = threaded_build(_attend, **_FLAGS)  # (its own cache entry: threaded_build)


@njit(cache=True, nogil=True)
def _rows_inside(rows, L):  # pragma: no cover - compiled by numba
    """Whether every row index is in [0, L)."""
    for b in range(rows.shape[0]):
        if rows[b] < 0 or rows[b] >= L:
            return False
    return True


def decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, rows: torch.Tensor,
           pos: torch.Tensor | None, cos: torch.Tensor | None, sin: torch.Tensor | None, *, interleaved: bool,
           scale: float, window: int, keys: int, softcap: float = 0.0) -> torch.Tensor | None:
    """One decode step of GroupQueryAttention on the CPU: float32 q [B, N * H], k / v [B, Nk * H] (views of a packed
    projection are read in place); contiguous float32 caches kc / vc [B, Nk, L, H] (written in place); integer rows
    [B] (``seqlens_k``); integer rotary positions ``pos`` [B] and float32 ``cos`` / ``sin`` [P, R / 2] caches, or
    None for no rotation; ``window`` <= 0 for none; ``keys``: about how many keys a row attends (picks the threads).
    Returns the attention output [B, 1, N * H], or None, with nothing written, where a row of ``rows`` is outside
    [0, L) (the op's torch path then runs)."""
    return _decode(q.numpy(), k.numpy(), v.numpy(), kc, vc, rows, pos, cos, sin, interleaved, scale, window, keys,
                   softcap)


def decode_packed(qkv: torch.Tensor, heads: int, kv_heads: int, kc: torch.Tensor, vc: torch.Tensor, rows: torch.Tensor,
                  pos: torch.Tensor | None, cos: torch.Tensor | None, sin: torch.Tensor | None, *, interleaved: bool,
                  scale: float, window: int, keys: int, softcap: float = 0.0) -> torch.Tensor | None:
    """``decode`` for a packed projection ``qkv`` [B, 1, (heads + 2 * kv_heads) * H]: q, k and v are its slices, read
    in place."""
    H = kc.shape[3]
    a = qkv.numpy().reshape(qkv.shape[0], -1)
    n, nk = heads * H, kv_heads * H
    return _decode(a[:, :n], a[:, n:n + nk], a[:, n + nk:n + 2 * nk], kc, vc, rows, pos, cos, sin, interleaved, scale,
                   window, keys, softcap)


def _decode(q: np.ndarray, k: np.ndarray, v: np.ndarray, kc: torch.Tensor, vc: torch.Tensor, rows: torch.Tensor,
            pos: torch.Tensor | None, cos: torch.Tensor | None, sin: torch.Tensor | None, interleaved: bool,
            scale: float, window: int, keys: int, softcap: float = 0.0) -> torch.Tensor | None:
    B, Nk, L, H = kc.shape
    N = q.shape[1] // H
    rows = rows.numpy().reshape(B)
    if not _rows_inside(rows, L):
        return None
    kc, vc = kc.numpy(), vc.numpy()
    qr = np.empty((B, N, H), np.float32)
    if pos is None:
        _write(q, k, v, kc, vc, rows, rows, _NO_TABLE, _NO_TABLE, False, False, qr)
    else:
        _write(q, k, v, kc, vc, rows, pos.numpy().reshape(B), cos.numpy(), sin.numpy(), True, interleaved, qr)
    out = np.empty((B, 1, N * H), np.float32)
    args = (qr, kc, vc, rows, np.float32(scale), window, np.float32(softcap), out.reshape(B, N * H))
    if q.size * (min(keys, window) if window > 0 else keys) >= PARALLEL_MIN_WORK:
        _parallel(_threaded, *args)
    else:
        _serial(*args)
    return torch.from_numpy(out)


_NO_TABLE = np.zeros((1, 1), np.float32)  # the cos / sin inputs of a step without rotation


def warm() -> None:
    """Load the kernels for the argument types GroupQueryAttention passes (``crossml.kernels.warm_cpu``), on tiny
    inputs: q, k and v as views of a packed projection and as tensors of their own, int32 lengths and positions."""
    B, N, H, L = 1, 2, 4, 4
    packed = torch.zeros(B, 3 * N * H)
    cache = torch.zeros(B, N, L, H), torch.zeros(B, N, L, H)
    rows = torch.zeros(B, dtype=torch.int32)
    table = torch.zeros(L, H // 2)
    decode_packed(packed.reshape(B, 1, -1), N, N, *cache, rows, rows, table, table, interleaved=False, scale=1.0,
                  window=-1, keys=1)
    zeros = torch.zeros(B, N * H)
    for keys in (1, PARALLEL_MIN_WORK):  # the serial build, then the threaded one (a work estimate past the bar)
        decode(zeros, zeros, zeros, *cache, rows, rows, table, table, interleaved=False, scale=1.0, window=-1,
               keys=keys)
