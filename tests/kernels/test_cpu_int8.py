"""The int8 kernel for 4-bit decode products on x86 CPUs (crossml.kernels.cpu_int8) against MatMulNBits' torch
reference at accuracy level 4 (A quantized to int8 per block, the weight dequantized, multiplied in float64), and
the exactness of its block dot products."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("numba", reason="the int8 kernel is called from numba (the test extra installs it)")

from crossml.kernels import cpu_int8  # noqa: E402
from tests.kernels.test_cpu_nbits import _reference, _weight, threads_agree  # noqa: E402

pytestmark = pytest.mark.skipif(not cpu_int8.AVAILABLE, reason="the int8 kernel needs an x86-64 CPU with AVX2")

CASES = [  # block_size, K, N, zero points (packed uint8 or none: the int8 path's)
    (32, 96, 40, "packed"),
    (32, 80, 16, "packed"),  # K past the last whole block
    (32, 896, 64, "packed"),
    (64, 256, 48, None),
    (128, 384, 32, None),
    (128, 200, 9, "packed"),
    (256, 512, 16, None),
    (256, 1280, 8, "packed"),
    (64, 1024, 24, "packed"),  # 16 blocks: the zero points' eight-block steps
    (128, 1152, 8, "packed"),  # 9 blocks: a step and one more
    (32, 1248, 8, None),  # 39 blocks: pairs, the zero points' steps and their remainder, a lone last block
]


@pytest.mark.parametrize("M", [1, 3, 8])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"bs{c[0]}_K{c[1]}_N{c[2]}_{c[3]}")
def test_int8_kernel_matches_the_dequantized_product(case, M):
    block_size, K, N, zp_kind = case
    B, scales, zp = _weight(N, K, block_size, zp_kind)
    A = torch.randn(M, K, generator=torch.Generator().manual_seed(1))
    s, zs = cpu_int8.scales_zero_points(scales, zp, N, -(-K // block_size))
    got = cpu_int8.matmul(A, B, s, zs, K=K, N=N, block_size=block_size)
    ref = _reference(A, B, scales, zp, K=K, N=N, block_size=block_size, int8=True)
    assert got.dtype == torch.float32 and got.shape == (M, N)
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("blocks", [1, 2, 3])
@pytest.mark.parametrize("block_size", [32, 64, 128, 256])
def test_int8_block_dot_products_are_exact(block_size, blocks):
    """Each block's dot product is an exact integer (pmaddubsw pairs at most 2 * 15 * 128, no saturation, the two
    nibble halves' pairs added in int16): with weight and activation scales of 1 (A's block maxima 127) and zero
    points 0, the result is the integer dot product itself at the largest magnitudes (A at -127 / 127, weights at 0
    and 15). One, two and three blocks: with 32-value blocks, a lone last block, a pair in one step, both."""
    K, N = blocks * block_size, block_size
    q = torch.full((N, K), 15, dtype=torch.uint8)
    q[:, 1::3] = 0
    B = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(N, blocks, block_size // 2)
    a = torch.full((1, K), 127.0)
    a[0, 2::5] = -127.0
    s, zs = cpu_int8.scales_zero_points(torch.ones(N * blocks), torch.zeros(N, (blocks + 1) // 2, dtype=torch.uint8),
                                        N, blocks)
    got = cpu_int8.matmul(a, B, s, zs, K=K, N=N, block_size=block_size)
    assert torch.equal(got.double(), a.double() @ q.double().T)


def test_threads_agree(monkeypatch):
    """Rows of N split over numba's threads in any number of parts give the same result bit for bit."""
    B, scales, zp = _weight(37, 256, 32, "packed")
    A = torch.randn(2, 256, generator=torch.Generator().manual_seed(2))
    s, zs = cpu_int8.scales_zero_points(scales, zp, 37, 8)
    one = cpu_int8.matmul(A, B, s, zs, K=256, N=37, block_size=32)
    monkeypatch.setattr(cpu_int8, "CHUNKS_PER_THREAD", 16)
    assert torch.equal(cpu_int8.matmul(A, B, s, zs, K=256, N=37, block_size=32), one)


def test_concurrent_calls_from_threads_agree():
    """Calls from several Python threads at once (sessions run concurrently) give each thread its own exact result."""
    B, scales, zp = _weight(256, 512, 32, "packed")
    s, zs = cpu_int8.scales_zero_points(scales, zp, 256, 16)
    inputs = [torch.randn(2, 512, generator=torch.Generator().manual_seed(i)) for i in range(6)]
    errors = threads_agree(lambda a: cpu_int8.matmul(a, B, s, zs, K=512, N=256, block_size=32), inputs)
    assert not errors, errors


def test_eligible_block_sizes():
    assert [cpu_int8.eligible(bs) for bs in (16, 32, 64, 128, 256, 512)] == [False, True, True, True, True, False]


def _built_product(built, A, B, s, zp, N):
    """``cpu_int8._product`` of float32 A [M, K] through the kernels of one ``_build``'s result."""
    import numpy as np

    addresses, tile, _ = built
    return cpu_int8._product(addresses[32], tile, B.numpy(), A.numpy().astype(np.float32), 32, s, zp, N, 4)


def test_machine_code_is_kept_and_read_back(tmp_path):
    """The kernels' machine code is written to the cache directory on the first build and read back by the next
    (no LLVM passes or code generation); both give the module's results bit for bit, for one row and for tiles."""
    B, scales, zp = _weight(37, 896, 32, "packed")
    s, z = cpu_int8.scales_zero_points(scales, zp, 37, 28)
    A = torch.randn(3, 896, generator=torch.Generator().manual_seed(5))
    want = [cpu_int8.matmul(A[:m], B, s, z, K=896, N=37, block_size=32).numpy() for m in (1, 3)]
    fresh = cpu_int8._build(str(tmp_path))
    (kept,) = tmp_path.glob("cpu_int8.*.o")
    again = cpu_int8._build(str(tmp_path))
    assert list(tmp_path.glob("cpu_int8.*")) == [kept]
    for built in (fresh, again):
        for m, w in zip((1, 3), want):
            assert (_built_product(built, A[:m], B, s, z, 37) == w).all()


@pytest.mark.parametrize("damage", ["truncated", "flipped", "empty"])
def test_damaged_machine_code_is_built_again(tmp_path, damage):
    """A kept file that does not check out (a torn write, a flipped byte) is ignored: the kernels are built again
    and the file rewritten whole."""
    cpu_int8._build(str(tmp_path))
    (kept,) = tmp_path.glob("cpu_int8.*.o")
    good = kept.read_bytes()
    bad = {"truncated": good[:len(good) // 2], "flipped": good[:-1] + bytes([good[-1] ^ 1]), "empty": b""}[damage]
    kept.write_bytes(bad)
    assert cpu_int8._read_object(str(kept)) is None
    built = cpu_int8._build(str(tmp_path))
    assert kept.read_bytes() == good
    B, scales, zp = _weight(16, 64, 32, None)
    s, z = cpu_int8.scales_zero_points(scales, zp, 16, 2)
    A = torch.randn(2, 64, generator=torch.Generator().manual_seed(6))
    assert (_built_product(built, A, B, s, z, 16) == cpu_int8.matmul(A, B, s, z, K=64, N=16, block_size=32).numpy()).all()


def test_unwritable_cache_builds_without_keeping(tmp_path, monkeypatch):
    """Where no cache directory is writable the kernels are built in memory each time."""
    monkeypatch.setattr(cpu_int8.os, "access", lambda *a: False)
    assert cpu_int8._build(str(tmp_path)) is not None
    assert not list(tmp_path.glob("cpu_int8.*"))
