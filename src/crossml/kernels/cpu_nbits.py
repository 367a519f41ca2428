"""4-bit MatMulNBits products on the CPU for decode-sized activations (a few rows), compiled by numba.

The torch reference is the dequantizing product in ``crossml.ops.contrib.matmul_nbits``: ``A @ dequant(B).T``, A
first quantized to int8 per block on the int8 path (accuracy level 4). Here the packed weight is read as it is,
four bits a value, and unpacked in registers, so a decode step reads an eighth of the float32 weight's bytes.

The weight is laid out once (``prepare``) as ``[N, block_size / 2, n_blocks]``: for one output row, the bytes of
byte position j of every block are contiguous, so the inner loop runs over the blocks with the vector lanes,
accumulating each block's dot product in its own lane, and the scales are applied once per block at the end of the
row. The low nibble of a byte is the block's even value, the high nibble its odd value (ONNX packs low bits first).
Nibbles are unpacked in float32 (``hi = floor(byte / 16)``, ``lo = byte - 16 * hi``): numba computes integer
arithmetic in 64 bits, which keeps four lanes to a vector instead of eight.

On the int8 path the activations are the int8 values, so each block's dot product is an integer computed exactly in
float32 (at most 2 * 128 * 15 * 128 in magnitude), then scaled by the activation's and the weight's block scales as
onnxruntime does; the sum over blocks differs from onnxruntime's only in float32 summation order.

Numba's threads run the rows of N in chunks; ``matmul`` uses at most ``torch.get_num_threads()`` of them. Under
numba's ``workqueue`` threading layer (which aborts on launches from two threads at once), calls are serialized.
"""

from __future__ import annotations

import contextlib
import threading
from typing import NamedTuple

import numba
import numpy as np
import torch
from numba import njit, prange

from crossml.ops.contrib.matmul_nbits import unpack_bits

__all__ = ["Packed", "matmul", "prepare"]

#: parallel chunks per numba thread (rows of N are split into this many times the thread count)
CHUNKS_PER_THREAD = 4


class Packed(NamedTuple):
    """A 4-bit weight laid out for ``matmul`` (``prepare``)."""

    weight: torch.Tensor  # uint8 [N, block_size // 2, n_blocks_padded]
    scales: torch.Tensor  # float32 [N, n_blocks_padded], zero past the last block
    zero_points: torch.Tensor  # uint8 or float32 [N, n_blocks_padded]
    block_size: int
    K: int
    N: int


def padded_blocks(n_blocks: int) -> int:
    """Blocks per row in the laid-out weight: a multiple of 8 (one AVX2 vector of float32 lanes) past 4 blocks,
    so the block loop has no scalar remainder; padding blocks have zero weights, scales and activations."""
    return n_blocks if n_blocks <= 4 else -(-n_blocks // 8) * 8


def prepare(B: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None, *, K: int, N: int,
            block_size: int) -> Packed:
    """MatMulNBits' 4-bit B ([N, n_blocks, block_size / 2] uint8), scales ([N * n_blocks]) and zero points (packed
    uint8 [N, ceil(n_blocks / 2)], float [N * n_blocks], or None for 8) laid out for ``matmul``."""
    nb = -(-K // block_size)
    h = block_size // 2
    nbp = padded_blocks(nb)
    pad = nbp - nb
    w = B.reshape(N, nb, h).permute(0, 2, 1)
    w = torch.nn.functional.pad(w, (0, pad)).contiguous()
    s = torch.nn.functional.pad(scales.reshape(N, nb).float(), (0, pad)).contiguous()
    if zero_points is None:
        z = torch.full((N, nbp), 8, dtype=torch.uint8)
    elif zero_points.dtype == torch.uint8:
        z = unpack_bits(zero_points.reshape(N, -1), 4)[:, :nb]
        z = torch.nn.functional.pad(z, (0, pad)).contiguous()
    else:
        z = torch.nn.functional.pad(zero_points.reshape(N, nb).float(), (0, pad)).contiguous()
    return Packed(w, s, z, block_size, K, N)


@njit(parallel=True, cache=True, nogil=True, boundscheck=False, fastmath={"reassoc", "contract"})
def _rows(af, sa, asum, w, sw, zp, out, chunks):  # pragma: no cover - compiled by numba
    """out[m, n] = sum_b sw[n, b] * (sa[m, b] * dot_b(a[m], q[n]) - zp[n, b] * asum[m, b]).

    af: float32 [M, 2, h, nbp], the activations by block (lanes) and byte position (even values, then odd);
    sa: float32 [M, nbp], their block scales (1 on the float path); asum: float32 [M, nbp], sa times each block's sum;
    w: uint8 [N, h, nbp]; sw: float32 [N, nbp]; zp: uint8 or float32 [N, nbp]; out: float32 [M, N]."""
    M, _, h, nbp = af.shape
    N = w.shape[0]
    per = (N + chunks - 1) // chunks
    for t in prange(chunks):
        acc = np.empty(nbp, np.float32)
        for n in range(t * per, min(N, (t + 1) * per)):
            for m in range(M):
                acc[:] = 0
                for j in range(h):
                    for b in range(nbp):
                        f = np.float32(w[n, j, b])
                        hi = np.floor(f * np.float32(0.0625))
                        lo = f - np.float32(16.0) * hi
                        acc[b] += af[m, 0, j, b] * lo + af[m, 1, j, b] * hi
                y = np.float32(0.0)
                for b in range(nbp):
                    y += sw[n, b] * (acc[b] * sa[m, b] - np.float32(zp[n, b]) * asum[m, b])
                out[m, n] = y


@njit(cache=True, nogil=True, boundscheck=False)
def _activations(a, block_size, int8, af, sa, asum):  # pragma: no cover - compiled by numba
    """a: float32 [M, K] into ``_rows``' af [M, 2, h, nbp], sa and asum [M, nbp] (zeroed here past the last block):
    on the int8 path each block quantized as onnxruntime does (scale = max|a| / 127; round(a * (127 / max|a|)) to
    the nearest, ties to even, clamped to [-128, 127]), as ``quantize_int8_blocks`` does in torch."""
    M, K = a.shape
    nbp = sa.shape[1]
    af[:] = 0
    sa[:] = 0
    asum[:] = 0
    for m in range(M):
        for b in range(nbp):
            k0 = b * block_size
            if k0 >= K:
                break
            k1 = min(K, k0 + block_size)
            scale = np.float32(1.0)
            inv = np.float32(1.0)
            if int8:
                amax = np.float32(0.0)
                for k in range(k0, k1):
                    v = abs(a[m, k])
                    if v > amax or np.isnan(v):
                        amax = v
                scale = amax / np.float32(127.0)
                inv = np.float32(127.0) / amax if amax > 0 else np.float32(0.0)
            total = np.float32(0.0)
            for k in range(k0, k1):
                v = a[m, k]
                if int8:
                    v = min(max(np.rint(v * inv), np.float32(-128.0)), np.float32(127.0))
                af[m, (k - k0) % 2, (k - k0) // 2, b] = v
                total += v
            sa[m, b] = scale
            asum[m, b] = scale * total


_lock = threading.Lock()
_serial: bool | None = None  # whether numba's threading layer needs calls serialized (known after the first call)
_threads = threading.local()  # the count this thread last set: numba.set_num_threads is per thread, and costs as
# much as a small product


def matmul(a: torch.Tensor, packed: Packed, *, int8: bool) -> torch.Tensor:
    """``a @ dequant(weight).T`` for float32 ``a`` [M, K] on the CPU, a quantized to int8 per block first where
    ``int8`` (onnxruntime's accuracy level 4): float32 [M, N]."""
    global _serial
    M, K = a.shape
    bs, N = packed.block_size, packed.N
    nbp = packed.scales.shape[1]
    a = a.contiguous().numpy()
    af = np.empty((M, 2, bs // 2, nbp), np.float32)
    sa = np.empty((M, nbp), np.float32)
    asum = np.empty((M, nbp), np.float32)
    _activations(a, bs, int8, af, sa, asum)
    out = torch.empty(M, N)
    threads = max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS))
    with _lock if _serial is not False else contextlib.nullcontext():
        if getattr(_threads, "n", None) != threads:
            numba.set_num_threads(threads)
            _threads.n = threads
        _rows(af, sa, asum, packed.weight.numpy(), packed.scales.numpy(), packed.zero_points.numpy(), out.numpy(),
              threads * CHUNKS_PER_THREAD)
        if _serial is None:
            _serial = numba.threading_layer() == "workqueue"
    return out
