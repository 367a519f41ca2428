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
