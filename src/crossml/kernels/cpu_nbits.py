"""4-bit MatMulNBits products on the CPU, compiled by numba: decode-sized activations (a few rows) read the packed
weight as it is (``matmul``); prompts dequantize it in cache-sized chunks for torch's BLAS (``product``). On x86 CPUs
with AVX2, decode products on the int8 path take ``crossml.kernels.cpu_int8`` instead (integer dot products, which
numba cannot express); this module's decode kernel serves the float path and other CPUs.

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

A prompt's rows would unpack every weight again per row here, so ``product`` dequantizes CHUNK_BYTES of rows of N
at a time into one float32 buffer that stays in the cache (``_dequantize``: the values of ``dequantize_nbits`` bit
for bit, straight from MatMulNBits' B, no layout first) and multiplies each chunk with torch's BLAS.

Numba's threads run the rows of N in chunks; the kernels use at most ``torch.get_num_threads()`` of them. Under
numba's ``workqueue`` threading layer (which aborts on launches from two threads at once), calls are serialized.
"""

from __future__ import annotations

import contextlib
import threading
import types
from typing import NamedTuple

import numba
import numpy as np
import torch
from numba import njit, prange

from crossml.ops.contrib.matmul_nbits import unpack_bits

__all__ = ["CHUNK_BYTES", "Packed", "matmul", "prepare", "product", "warm"]

#: parallel chunks per numba thread (rows of N are split into this many times the thread count)
CHUNKS_PER_THREAD = 4


class Packed(NamedTuple):
    """A 4-bit weight laid out for ``matmul`` (``prepare``): numpy arrays, which the kernel takes as they are."""

    weight: np.ndarray  # uint8 [N, block_size // 2, n_blocks_padded]
    scales: np.ndarray  # float32 [N, n_blocks_padded], zero past the last block
    zero_points: np.ndarray  # uint8 or float32 [N, n_blocks_padded]
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
    return Packed(w.numpy(), s.numpy(), z.numpy(), block_size, K, N)


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
def _int8_scale(a, m, k0, k1):  # pragma: no cover - compiled by numba
    """onnxruntime's int8 block scale of a[m, k0:k1] and its inverse: max|a| / 127 and 127 / max|a| (0 for a zero
    block; NaN where the block has one)."""
    amax = np.float32(0.0)
    for k in range(k0, k1):
        v = abs(a[m, k])
        if v > amax or np.isnan(v):
            amax = v
    return amax / np.float32(127.0), (np.float32(127.0) / amax if amax > 0 else np.float32(0.0))


@njit(cache=True, nogil=True, boundscheck=False)
def _int8_value(v, inv):  # pragma: no cover - compiled by numba
    """One activation quantized as onnxruntime does: round(v * inv) to the nearest, ties to even, in [-128, 127]."""
    return min(max(np.rint(v * inv), np.float32(-128.0)), np.float32(127.0))


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
                scale, inv = _int8_scale(a, m, k0, k1)
            total = np.float32(0.0)
            for k in range(k0, k1):
                v = a[m, k]
                if int8:
                    v = _int8_value(v, inv)
                af[m, (k - k0) % 2, (k - k0) // 2, b] = v
                total += v
            sa[m, b] = scale
            asum[m, b] = scale * total


@njit(cache=True, nogil=True, boundscheck=False)
def quantize_int8(a, block_size, q, sa, asum):  # pragma: no cover - compiled by numba
    """a: float32 [M, K] quantized to int8 per block as ``_activations`` does, in order: q int8 [M, n_blocks *
    block_size] (zero past K), sa [M, n_blocks] the block scales, asum [M, n_blocks] each scale times its block's
    sum (``crossml.kernels.cpu_int8``'s activations)."""
    M, K = a.shape
    nb = sa.shape[1]
    q[:] = 0
    for m in range(M):
        for b in range(nb):
            k0 = b * block_size
            k1 = min(K, k0 + block_size)
            scale, inv = _int8_scale(a, m, k0, k1)
            total = np.float32(0.0)
            for k in range(k0, k1):
                v = _int8_value(a[m, k], inv)
                q[m, k] = np.int8(v)
                total += v
            sa[m, b] = scale
            asum[m, b] = scale * total


_lock = threading.Lock()
_serial: bool | None = None  # whether numba's threading layer needs calls serialized (known after the first call)
_set = threading.local()  # the count this thread last set: numba.set_num_threads is per thread, and costs as
# much as a small product


def _parallel(kernel, *args):
    """Call a parallel kernel on at most ``torch.get_num_threads()`` numba threads, set for the calling thread;
    serialized under numba's ``workqueue`` layer. Returns what the kernel returns."""
    global _serial
    threads = _threads()
    lock = _lock if _serial is not False else _NO_LOCK
    with lock:
        if getattr(_set, "n", None) != threads:
            numba.set_num_threads(threads)
            _set.n = threads
        out = kernel(*args)
        if _serial is None:
            _serial = numba.threading_layer() == "workqueue"
    return out


def threaded_build(fn, **flags):
    """``njit(parallel=True, **flags)`` of a copy of ``fn`` named ``<name>_threaded``, for a kernel also compiled
    serially: numba's on-disk cache names its files after the function's qualified name and first line, and keys
    their entries by signature alone, so the two builds of one function shared an entry, and whichever compiled
    first was loaded for both (a "threaded" build that ran on one thread, or a serial one that did not)."""
    copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__ + "_threaded", fn.__defaults__, fn.__closure__)
    copy.__qualname__ = fn.__qualname__ + "_threaded"
    copy.__module__ = fn.__module__
    copy.__doc__ = fn.__doc__
    return numba.njit(parallel=True, **flags)(copy)


def _threads() -> int:
    """numba threads a kernel call uses: ``torch.get_num_threads()``, at most numba's pool."""
    return max(1, min(torch.get_num_threads(), _MAX_THREADS))


_MAX_THREADS = numba.config.NUMBA_NUM_THREADS
_NO_LOCK = contextlib.nullcontext()


def matmul(a: torch.Tensor, packed: Packed, *, int8: bool) -> torch.Tensor:
    """``a @ dequant(weight).T`` for float32 ``a`` [M, K] on the CPU, a quantized to int8 per block first where
    ``int8`` (onnxruntime's accuracy level 4): float32 [M, N]."""
    M = a.shape[0]
    bs = packed.block_size
    nbp = packed.scales.shape[1]
    af = np.empty((M, 2, bs // 2, nbp), np.float32)
    sa = np.empty((M, nbp), np.float32)
    asum = np.empty((M, nbp), np.float32)
    _activations(a.contiguous().numpy(), bs, int8, af, sa, asum)
    out = np.empty((M, packed.N), np.float32)
    chunks = _threads() * CHUNKS_PER_THREAD
    _parallel(_rows, af, sa, asum, packed.weight, packed.scales, packed.zero_points, out, chunks)
    return torch.from_numpy(out)


@njit(parallel=True, cache=True, nogil=True, boundscheck=False)
def _dequantize(w, s, zq, zf, zmode, K, out):  # pragma: no cover - compiled by numba
    """out[n, k] = (q[n, k] - z[n, b]) * s[n, b] for the values k < K of block b = k // block_size, in float32 as
    ``dequantize_nbits`` computes it (q - z exact, then one rounding).

    w: uint8 [R, n_blocks, block_size / 2] (MatMulNBits' B, low nibble first); s: float32 [R, n_blocks]; zero points
    by zmode: 0 none (8), 1 zq uint8 [R, ceil(n_blocks / 2)] packed two a byte (low nibble first), 2 zf float32
    [R, n_blocks]; out: float32 [R, K]."""
    R, nb, h = w.shape
    bs = 2 * h
    for n in prange(R):
        for b in range(nb):
            if zmode == 1:
                z = np.float32((zq[n, b >> 1] >> (4 * (b & 1))) & 15)
            elif zmode == 2:
                z = zf[n, b]
            else:
                z = np.float32(8.0)
            sc = s[n, b]
            k0 = b * bs
            if k0 + bs <= K:
                for j in range(h):
                    f = np.float32(w[n, b, j])
                    hi = np.floor(f * np.float32(0.0625))
                    lo = f - np.float32(16.0) * hi
                    out[n, k0 + 2 * j] = (lo - z) * sc
                    out[n, k0 + 2 * j + 1] = (hi - z) * sc
            else:  # the last block, past K
                for j in range(h):
                    f = np.float32(w[n, b, j])
                    hi = np.floor(f * np.float32(0.0625))
                    lo = f - np.float32(16.0) * hi
                    if k0 + 2 * j < K:
                        out[n, k0 + 2 * j] = (lo - z) * sc
                    if k0 + 2 * j + 1 < K:
                        out[n, k0 + 2 * j + 1] = (hi - z) * sc


#: bytes of float32 weight ``product`` dequantizes at once (rows of N): a chunk stays in the cache for the BLAS to
#: read. Qwen2.5-0.5B's lm_head (896 x 151936) times 128 rows on a 2-core host: 425-435 ms at 1-2 MB chunks, 485
#: at 8 MB, 520 at 256 KB
CHUNK_BYTES = 2 << 20


def product(a: torch.Tensor, B: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None, *, K: int,
            N: int, block_size: int) -> torch.Tensor:
    """``a @ dequantize_nbits(B).T`` for float32 ``a`` [M, K] and MatMulNBits' 4-bit B ([N, n_blocks, block_size /
    2] uint8, any values: not laid out first), scales ([N * n_blocks] float) and zero points (packed uint8 [N,
    ceil(n_blocks / 2)], float [N * n_blocks] or None; sizes checked by the caller): the weight dequantized here in
    chunks of CHUNK_BYTES rows, each multiplied by torch's BLAS. Float32 [M, N]."""
    nb = -(-K // block_size)
    w = B.reshape(N, nb, block_size // 2).contiguous().numpy()
    s = scales.reshape(N, nb).to(torch.float32).contiguous().numpy()
    zq, zf, zmode = np.zeros((1, 1), np.uint8), np.zeros((1, 1), np.float32), 0  # the kernel's unused inputs
    if zero_points is not None and zero_points.dtype == torch.uint8:
        zq, zmode = zero_points.reshape(N, -1).contiguous().numpy(), 1
    elif zero_points is not None:
        zf, zmode = zero_points.reshape(N, nb).to(torch.float32).contiguous().numpy(), 2
    rows = max(1, min(N, CHUNK_BYTES // (K * 4)))
    chunk = torch.empty(rows, K)
    y = torch.empty(a.shape[0], N)
    for n0 in range(0, N, rows):
        n1 = min(N, n0 + rows)
        wc = chunk[:n1 - n0]
        _parallel(_dequantize, w[n0:n1], s[n0:n1], zq[n0:n1] if zmode == 1 else zq, zf[n0:n1] if zmode == 2 else zf,
                  zmode, K, wc.numpy())
        y[:, n0:n1] = a @ wc.T
    return y


def warm() -> None:
    """Load the kernels for the argument types MatMulNBits passes (``crossml.kernels.warm_cpu``), on tiny inputs."""
    K, N, bs = 32, 2, 32
    B = torch.zeros(N, 1, bs // 2, dtype=torch.uint8)
    for zp in (torch.zeros(N, 1, dtype=torch.uint8), torch.zeros(N), None):
        packed = prepare(B, torch.ones(N), zp, K=K, N=N, block_size=bs)
        for int8 in (False, True):
            matmul(torch.zeros(1, K), packed, int8=int8)
    product(torch.zeros(2, K), B, torch.ones(N), None, K=K, N=N, block_size=bs)
