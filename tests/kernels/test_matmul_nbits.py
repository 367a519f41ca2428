"""The Triton 4-bit GEMV (crossml.kernels.matmul_nbits) against MatMulNBits' dequantize + matmul.
CPU cases run in Triton's interpreter; ``gpu`` cases compile (and go through the op's fast path)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

if not torch.cuda.is_available():  # before triton's first import: interpret the kernels on the CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import crossml.kernels.matmul_nbits as kernel_module  # noqa: E402
from crossml.kernels._launch import INTERPRET  # noqa: E402
from crossml.kernels.matmul_nbits import (  # noqa: E402
    dequantize,
    gather_rows,
    matmul_nbits,
    pick_dot_tiles,
    pick_pair_tiles,
    pick_tiles,
)
from crossml.ops.contrib.matmul_nbits import dequantize_nbits  # noqa: E402
from crossml.ops.contrib.matmul_nbits import gather_block_quantized as gather_op  # noqa: E402
from crossml.ops.contrib.matmul_nbits import matmul_nbits as matmul_nbits_op  # noqa: E402
from tests.kernels._common import DEVICES, TOL, assert_close, rand, record_calls  # noqa: E402


def _weight(N: int, K: int, block_size: int, zp_kind: str | None, dtype: torch.dtype, device: str, seed: int = 0):
    """Random packed B [N, n_blocks, block_size / 2], scales [N * n_blocks], zero points of ``zp_kind``."""
    g = torch.Generator().manual_seed(seed)
    nb = -(-K // block_size)
    B = torch.randint(0, 256, (N, nb, block_size // 2), generator=g, dtype=torch.uint8)
    scales = (torch.rand(N * nb, generator=g) * 0.05 + 0.01).to(dtype)
    zp = None
    if zp_kind == "packed":
        zp = torch.randint(0, 256, (N, -(-nb // 2)), generator=g, dtype=torch.uint8)
    elif zp_kind == "float":
        zp = (torch.rand(N, nb, generator=g) * 16).to(dtype)
    return B.to(device), scales.to(device), None if zp is None else zp.to(device)


def _reference(a, B, scales, zp, bias, *, K: int, N: int, block_size: int) -> torch.Tensor:
    """The op's GPU definition (dequantize in A's dtype, then matmul), in fp64 on the CPU."""
    w = dequantize_nbits(B.cpu(), scales.cpu(), None if zp is None else zp.cpu(), None, K=K, N=N, bits=4,
                         block_size=block_size, dtype=a.dtype)
    y = a.double().cpu() @ w.double().T
    return y if bias is None else y + bias.cpu().to(a.dtype).double()


CASES = [  # block_size, K, N, M, zero points, bias: every value of each axis, not the full product
    (16, 64, 24, 1, None, False),
    (16, 96, 130, 3, "packed", True),
    (32, 96, 130, 1, "float", False),  # K = 3 blocks
    (32, 256, 24, 3, None, True),
    (128, 96, 24, 1, "packed", False),  # K < block_size: one partial block
    (128, 256, 130, 3, "float", True),
    (32, 64, 130, 1, "packed", False),
    (128, 64, 24, 3, None, False),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "bs{}_K{}_N{}_M{}_{}_{}".format(*c[:5], "bias" if c[5] else ""))
def test_matches_dequantize_matmul(device: str, dtype: torch.dtype, case: tuple) -> None:
    bs, K, N, M, zp_kind, with_bias = case
    B, scales, zp = _weight(N, K, bs, zp_kind, dtype, device)
    a = rand(M, K, dtype=dtype, device=device, seed=1)
    bias = rand(N, dtype=dtype, device=device, seed=2) if with_bias else None
    # interpreter tiles: several K steps, partial quantization blocks and a partial N tile, few programs
    tiles = (1 if M == 1 else 4, 64, max(bs, 64), 4) if device == "cpu" else None
    y = matmul_nbits(a, B, scales, zp, bias, K=K, N=N, block_size=bs, tiles=tiles)
    assert y.device.type == device and y.shape == (M, N)
    assert_close(y, _reference(a, B, scales, zp, bias, K=K, N=N, block_size=bs), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES[:4], ids=lambda c: "bs{}_K{}_N{}_M{}_{}".format(*c[:5]))
def test_constant_weight_launch_gives_the_same_result(device: str, case: tuple) -> None:
    """const_w (the first K step's weights read before the wait for the previous kernel) changes when
    they are read, not what is computed: bit-identical to the ordinary launch."""
    bs, K, N, M, zp_kind, with_bias = case
    B, scales, zp = _weight(N, K, bs, zp_kind, torch.float16, device)
    a = rand(M, K, dtype=torch.float16, device=device, seed=1)
    bias = rand(N, dtype=torch.float16, device=device, seed=2) if with_bias else None
    tiles = (1 if M == 1 else 4, 64, max(bs, 64), 4) if device == "cpu" else None
    kw = {"K": K, "N": N, "block_size": bs, "tiles": tiles}
    assert torch.equal(matmul_nbits(a, B, scales, zp, bias, const_w=True, **kw),
                       matmul_nbits(a, B, scales, zp, bias, **kw))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tiles", [(1, 4, 128, 1), (2, 32, 32, 4)])
def test_other_tiles_and_layouts(device: str, tiles: tuple[int, int, int, int]) -> None:
    """Leading batch dims of A, 2-D scales, M split over programs, a K step past the last block."""
    K, N, bs = 96, 8, 32
    B, scales, zp = _weight(N, K, bs, "packed", torch.float32, device, seed=3)
    a = rand(3, 1, K, dtype=torch.float32, device=device, seed=4)
    y = matmul_nbits(a, B.reshape(N, -1), scales.reshape(N, -1), zp, K=K, N=N, block_size=bs, tiles=tiles)
    assert y.shape == (3, 1, N)
    ref = _reference(a.reshape(3, K), B, scales, zp, None, K=K, N=N, block_size=bs).reshape(3, 1, N)
    assert_close(y, ref, torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_and_fp32_scales_with_fp16_activations(device: str) -> None:
    K, N, bs = 64, 24, 16
    B, scales, zp = _weight(N, K, bs, "float", torch.float32, device, seed=5)
    for dtype in (torch.bfloat16, torch.float16):
        a = rand(2, K, dtype=dtype, device=device, seed=6)
        y = matmul_nbits(a, B, scales, zp, K=K, N=N, block_size=bs, tiles=(2, 32, 32, 4) if device == "cpu" else None)
        assert_close(y, _reference(a, B, scales, zp, None, K=K, N=N, block_size=bs), dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_errors_name_the_problem(device: str) -> None:
    B, scales, zp = _weight(8, 64, 32, None, torch.float32, device)
    a = rand(1, 64, device=device)
    with pytest.raises(ValueError, match="bits must be 4"):
        matmul_nbits(a, B, scales, K=64, N=8, block_size=32, bits=8)
    with pytest.raises(ValueError, match="B must be uint8"):
        matmul_nbits(a, B[:4], scales, K=64, N=8, block_size=32)
    with pytest.raises(ValueError, match="last dimension"):
        matmul_nbits(a[:, :32], B, scales, K=64, N=8, block_size=32)
    with pytest.raises(TypeError, match="float16/bfloat16/float32"):
        matmul_nbits(a.double(), B, scales, K=64, N=8, block_size=32)


def test_tiles_for_decode_shapes() -> None:
    """The tile rule on a 132-SM GPU for Qwen2-0.5B's and Llama-3.2-1B's decode GEMVs: legal tiles, enough
    programs; the measured best tiles of the wide and the long products."""
    for K, N in [(896, 4864), (4864, 896), (896, 151936), (2048, 16384), (8192, 2048)]:
        for bs in (16, 32, 128, 256):
            bm, bn, bk, warps = pick_tiles(1, N, K, bs, 132)
            assert bm == 1 and bk % bs == 0 and bk & (bk - 1) == 0 and 1 <= warps <= 4
            assert bn * bk <= 8192 or bk == bs
            assert -(-N // bn) >= 4 * 132
    assert pick_tiles(1, 16384, 2048, 32, 132) == (1, 4, 512, 1)  # wide: 4 x 512
    assert pick_tiles(1, 2048, 8192, 32, 132) == (1, 1, 2048, 2)  # long K: one row per program, two warps
    assert pick_tiles(1, 3072, 2048, 32, 132) == (1, 2, 2048, 2)
    assert pick_tiles(1, 1152, 896, 32, 132) == (1, 2, 1024, 2)  # all of K in one step
    assert pick_tiles(3, 4864, 896, 32, 132)[0] == 4
    assert pick_tiles(40, 4864, 896, 32, 132)[0] == 16


def test_op_on_cpu_does_not_use_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU tensors keep the dequantize + matmul path (bit-identical to before)."""
    import crossml.kernels.matmul_nbits as kernel

    def fail(*args, **kwargs):
        raise AssertionError("the Triton kernel ran for CPU tensors")

    monkeypatch.setattr(kernel, "matmul_nbits", fail)
    B, scales, zp = _weight(8, 64, 32, "packed", torch.float32, "cpu")
    a = rand(1, 64)
    y = matmul_nbits_op(a, B, scales, zp, K=64, N=8, block_size=32)
    w = dequantize_nbits(B, scales, zp, None, K=64, N=8, bits=4, block_size=32, dtype=torch.float32)
    assert torch.equal(y, a @ w.T)


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter-only: routes CPU tensors to the kernel")
@pytest.mark.parametrize("level", [0, 4])
def test_op_routes_to_the_kernel(monkeypatch: pytest.MonkeyPatch, level: int) -> None:
    """The op's fast path (forced on for CPU tensors, interpreted): int8 activations for level 4, bias."""
    import crossml.kernels.matmul_nbits as kernel
    import crossml.ops.contrib.matmul_nbits as op_module

    calls = []
    original = kernel.matmul_nbits

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return original(*args, **kwargs, tiles=(2, 32, 64, 4))

    K, N, bs = 96, 24, 32
    B, scales, zp = _weight(N, K, bs, "packed", torch.float32, "cpu")
    a, bias = rand(2, K, seed=1), rand(N, seed=2)
    kw = {"K": K, "N": N, "block_size": bs, "accuracy_level": level}
    ref = matmul_nbits_op(a, B, scales, zp, None, bias, **kw)
    monkeypatch.setattr(kernel, "matmul_nbits", spy)
    monkeypatch.setattr(op_module, "_use_kernel", lambda *args: True)
    y = matmul_nbits_op(a, B, scales, zp, None, bias, **kw)
    assert len(calls) == 1
    assert_close(y, ref.double(), torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", CASES[:6], ids=lambda c: f"bs{c[0]}_K{c[1]}_N{c[2]}_{c[4]}")
def test_dequantize_equals_the_ops_dequantization(device: str, dtype: torch.dtype, case: tuple) -> None:
    """The one-pass dequantization gives dequantize_nbits' matrix bit for bit (partial blocks and tiles,
    every zero-point kind, 2-D scales)."""
    bs, K, N, _, zp_kind, _ = case
    B, scales, zp = _weight(N, K, bs, zp_kind, dtype, device)
    w = dequantize(B, scales.reshape(N, -1), zp, K=K, N=N, block_size=bs, dtype=dtype)
    ref = dequantize_nbits(B.cpu(), scales.cpu(), None if zp is None else zp.cpu(), None, K=K, N=N, bits=4,
                           block_size=bs, dtype=dtype)
    assert w.shape == (N, K) and w.dtype == dtype and w.device.type == device
    if device == "cpu" and dtype == torch.bfloat16:
        # Triton's interpreter converts float32 to bfloat16 by truncation (GPUs round to nearest even): q - zp
        # and the product are each rounded, so two ulps
        torch.testing.assert_close(w, ref, rtol=2.0 ** -6, atol=0)
    else:
        assert torch.equal(w.cpu(), ref)


@pytest.mark.parametrize("device", DEVICES)
def test_dequantize_errors(device: str) -> None:
    B, scales, _ = _weight(8, 64, 32, None, torch.float32, device)
    with pytest.raises(ValueError, match="B must be uint8"):
        dequantize(B[:4], scales, K=64, N=8, block_size=32, dtype=torch.float16)
    with pytest.raises(ValueError, match="scales must be floats"):
        dequantize(B, scales[:3], K=64, N=8, block_size=32, dtype=torch.float16)
    with pytest.raises(TypeError, match="dtype must be"):
        dequantize(B, scales, K=64, N=8, block_size=32, dtype=torch.int32)
    assert dequantize(B[:0], scales[:0], K=64, N=0, block_size=32, dtype=torch.float16).shape == (0, 64)


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter-only: routes CPU tensors to the kernel")
def test_op_dequantizes_prompt_sizes_with_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """More than KERNEL_MAX_M rows: the op multiplies the kernel's dequantized matrix (forced on, interpreted)."""
    import crossml.kernels.matmul_nbits as kernel
    import crossml.ops.contrib.matmul_nbits as op_module

    calls = []
    original = kernel.dequantize

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return original(*args, **kwargs)

    K, N, bs = 96, 24, 32
    B, scales, zp = _weight(N, K, bs, "packed", torch.float32, "cpu")
    a, bias = rand(op_module.KERNEL_MAX_M + 4, K, seed=1), rand(N, seed=2)
    kw = {"K": K, "N": N, "block_size": bs}
    ref = matmul_nbits_op(a, B, scales, zp, None, bias, **kw)
    monkeypatch.setattr(kernel, "dequantize", spy)
    monkeypatch.setattr(op_module, "_use_kernel", lambda *args: True)
    y = matmul_nbits_op(a, B, scales, zp, None, bias, **kw)
    assert len(calls) == 1
    assert torch.equal(y, ref)


# --- the matrix-unit kernel (batched decode: 4 to 64 rows of fp16 / bf16 activations) ---

DOT_CASES = [  # block_size, K, N, M, zero points, bias, SPLIT_K (interpreter tiles)
    (16, 64, 24, 4, None, False, 1),
    (32, 96, 130, 5, "packed", True, 1),  # K = 3 blocks, a partial N tile
    (32, 300, 40, 17, "float", True, 3),  # K not a multiple of the block, two M tiles, K split
    (128, 96, 24, 4, "packed", False, 1),  # K < block_size: one partial block
    (64, 256, 48, 20, None, True, 2),
]


#: ``DOT_OPTIONS`` variants of the matrix-unit kernel (``ptx_dq`` applies to fp16 on NVIDIA GPUs only)
DOT_VARIANTS = [{"fast_dq": f, "ptx_dq": p, "halves": h, "a_ahead": ahead}
                for h in (0, 64) for f, p in ((True, False), (False, False), (True, True)) for ahead in (0, 64)
                if f or not h]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", DOT_CASES, ids=lambda c: "bs{}_K{}_N{}_M{}_{}_{}_split{}".format(
    *c[:5], "bias" if c[5] else "", c[6]))
@pytest.mark.parametrize("halves", [0, 64], ids=["one_dot", "halves"])
def test_dot_kernel_matches_dequantize_matmul(device: str, dtype: torch.dtype, case: tuple, halves: int,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The matrix-unit kernel is the dequantize-then-matmul product: against it in fp64, on the interpreter's tiles
    (16 weight rows, 64-value K steps past the block size) or the GPU's rule; with one dot per K step, or two
    (``halves``: even K positions with the low nibbles, odd with the high)."""
    monkeypatch.setattr(kernel_module, "DOT_OPTIONS", {**kernel_module.DOT_OPTIONS, "halves": halves})
    bs, K, N, M, zp_kind, with_bias, split = case
    B, scales, zp = _weight(N, K, bs, zp_kind, dtype, device)
    a = rand(M, K, dtype=dtype, device=device, seed=1)
    bias = rand(N, dtype=dtype, device=device, seed=2) if with_bias else None
    tiles = (16, 16, max(bs, 64), split, 4) if device == "cpu" else None
    y = matmul_nbits(a, B, scales, zp, bias, K=K, N=N, block_size=bs, tiles=tiles, dot=True)
    assert y.shape == (M, N) and y.dtype == dtype
    assert_close(y, _reference(a, B, scales, zp, bias, K=K, N=N, block_size=bs), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_dot_kernel_dequantizes_as_the_dequantize_kernel(device: str, dtype: torch.dtype,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """With one-hot activation rows the product is the dequantized weight itself: every weight, every kind of zero
    point, bit for bit equal to ``dequantize``, with each of the kernel's variants (the exponent-trick dequantization,
    the float32 one, the PTX one on NVIDIA GPUs with fp16)."""
    K, N, bs = 64, 32, 32
    eye = torch.eye(K, dtype=dtype, device=device)
    tiles = (16, 16, 64, 1, 4) if device == "cpu" else None
    for zp_kind in (None, "packed", "float"):
        B, scales, zp = _weight(N, K, bs, zp_kind, dtype, device, seed=3)
        want = dequantize(B, scales, zp, K=K, N=N, block_size=bs, dtype=dtype).T
        for options in DOT_VARIANTS:
            monkeypatch.setattr(kernel_module, "DOT_OPTIONS", {**kernel_module.DOT_OPTIONS, **options})
            y = matmul_nbits(eye, B, scales, zp, K=K, N=N, block_size=bs, tiles=tiles, dot=True)
            assert torch.equal(y, want), (zp_kind, options)


@pytest.mark.parametrize("device", DEVICES)
def test_dot_kernel_const_w_split_and_replays(device: str) -> None:
    """const_w changes when the first weights are read, not the result; a K split adds its partial sums in a fixed
    order (the same call twice is bit-identical) and stays within rounding of the unsplit product."""
    K, N, M, bs = 256, 40, 6, 32
    B, scales, zp = _weight(N, K, bs, "packed", torch.float16, device, seed=4)
    a = rand(M, K, dtype=torch.float16, device=device, seed=5)
    bias = rand(N, dtype=torch.float16, device=device, seed=6)
    kw = {"K": K, "N": N, "block_size": bs, "dot": True}
    one = (16, 16, 64, 1, 4) if device == "cpu" else (16, 64, 128, 1, 4)
    split = (16, 16, 64, 4, 4) if device == "cpu" else (16, 64, 64, 4, 4)
    y1 = matmul_nbits(a, B, scales, zp, bias, tiles=one, **kw)
    assert torch.equal(matmul_nbits(a, B, scales, zp, bias, tiles=one, const_w=True, **kw), y1)
    y4 = matmul_nbits(a, B, scales, zp, bias, tiles=split, **kw)
    assert torch.equal(matmul_nbits(a, B, scales, zp, bias, tiles=split, **kw), y4)
    ref = _reference(a, B, scales, zp, bias, K=K, N=N, block_size=bs)
    assert_close(y1, ref, torch.float16)
    assert_close(y4, ref, torch.float16)


@pytest.mark.parametrize("device", DEVICES)
def test_dot_kernel_routing(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``matmul_nbits`` takes the matrix-unit kernel from DOT_MIN_M fp16 / bf16 rows (vocabulary-wide products too),
    never for fp32 activations or with a fused norm."""
    calls = record_calls(monkeypatch, kernel_module, "_dot_product")
    sms = kernel_module.rule_processors(torch.empty(0, device=device))
    K, bs = 64, 32
    B, scales, zp = _weight(24, K, bs, None, torch.float16, device)
    tiles_for = {True: (16, 16, 64, 1, 4), False: (4, 8, 64, 4)} if device == "cpu" else {True: None, False: None}

    def run(M: int, dtype: torch.dtype, *, N: int = 24, norm: bool = False) -> bool:
        calls.clear()
        w = (B, scales) if N == 24 else _weight(N, K, bs, None, dtype, device)[:2]
        a = rand(M, K, dtype=dtype, device=device, seed=M)
        gamma = torch.ones(K, dtype=dtype, device=device) if norm else None
        dot = kernel_module.dot_eligible(a, M, N) and not norm
        matmul_nbits(a, *w, K=K, N=N, block_size=bs, tiles=tiles_for[dot],
                     norm=(None, gamma, 1e-5) if norm else None)
        return bool(calls)

    low = kernel_module.DOT_MIN_M
    assert not run(low - 1, torch.float16)
    assert run(low, torch.float16) and run(low, torch.bfloat16)
    assert not run(16, torch.float32)
    assert not run(low, torch.float16, norm=True)
    if device == "cpu":  # the interpreter's rule counts one SM: N = 1024 is vocabulary-wide there
        assert not run(low - 1, torch.float16, N=1024 * sms) and run(low, torch.float16, N=1024 * sms)


@pytest.mark.parametrize("device", DEVICES)
def test_dot_kernel_errors(device: str) -> None:
    B, scales, zp = _weight(16, 64, 32, None, torch.float16, device)
    a = rand(4, 64, dtype=torch.float16, device=device)
    kw = {"K": 64, "N": 16, "block_size": 32, "dot": True}
    with pytest.raises(TypeError, match="float16/bfloat16"):
        matmul_nbits(a.float(), B, scales, **kw)
    with pytest.raises(ValueError, match="BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, num_warps"):
        matmul_nbits(a, B, scales, tiles=(16, 16, 64, 4), **kw)
    with pytest.raises(ValueError, match="powers of two >= 16"):
        matmul_nbits(a, B, scales, tiles=(16, 8, 64, 1, 4), **kw)
    with pytest.raises(ValueError, match="multiple of block_size"):
        matmul_nbits(a, B, scales, tiles=(16, 16, 16, 1, 4), **kw)
    with pytest.raises(ValueError, match="SPLIT_K in"):
        matmul_nbits(a, B, scales, tiles=(16, 16, 64, 65, 4), **kw)


def test_dot_tiles_for_decode_shapes() -> None:
    """The matrix-unit rule on a 132-SM GPU at Qwen2-0.5B's and Llama-3.2-1B's decode shapes: legal tiles, about four
    programs per SM where the N tiles are fewer, no split for the vocabulary products, 64-row tiles past 16 rows."""
    for K, N in [(896, 1152), (896, 896), (896, 9728), (4864, 896), (896, 151936), (2048, 3072), (2048, 2048),
                 (2048, 16384), (8192, 2048), (2048, 128256)]:
        for M in (4, 8, 16, 32, 64):
            bm, bn, bk, split, warps = pick_dot_tiles(M, N, K, 32, 132)
            assert (bn, bk, warps) == (64, 128, 4) and bm == (16 if M <= 16 else 64)
            n_prog = -(-N // bn) * -(-M // bm)
            assert 1 <= split <= min(64, -(-K // bk))
            assert n_prog >= 4 * 132 and split == 1 or n_prog * split >= min(4 * 132, n_prog * -(-K // bk))
    assert pick_dot_tiles(8, 151936, 896, 32, 132)[3] == 1
    assert pick_dot_tiles(8, 896, 4864, 32, 132)[3] == 38
    assert pick_dot_tiles(8, 16, 64, 128, 132)[2] == 128  # a K step holds a whole quantization block


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter-only: routes CPU tensors to the kernel")
def test_op_routes_batched_rows_to_the_dot_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The op (forced onto the kernels for CPU tensors, interpreted): fp16 rows past KERNEL_MAX_M up to DOT_MAX_M
    take the matrix-unit kernel; more rows, or fp32 ones past KERNEL_MAX_M, dequantize and multiply."""
    import crossml.ops.contrib.matmul_nbits as op_module

    calls = record_calls(monkeypatch, kernel_module, "_dot_product", "dequantize")
    original = kernel_module.matmul_nbits
    monkeypatch.setattr(kernel_module, "matmul_nbits",
                        lambda *args, **kw: original(*args, **kw, tiles=(16, 16, 64, 2, 4)))
    monkeypatch.setattr(op_module, "_use_kernel", lambda *args: True)
    K, N, bs = 96, 24, 32
    B, scales, zp = _weight(N, K, bs, "packed", torch.float16, "cpu")
    bias = rand(N, dtype=torch.float16, seed=2)
    for M, dtype, want in [(op_module.KERNEL_MAX_M + 4, torch.float16, "_dot_product"),
                           (kernel_module.DOT_MAX_M, torch.float16, "_dot_product"),
                           (kernel_module.DOT_MAX_M + 1, torch.float16, "dequantize"),
                           (op_module.KERNEL_MAX_M + 4, torch.float32, "dequantize")]:
        calls.clear()
        a = rand(M, K, dtype=dtype, seed=M)
        y = matmul_nbits_op(a, B, scales.to(dtype), zp, None, bias.to(dtype), K=K, N=N, block_size=bs)
        assert calls == [want], (M, dtype)
        ref = _reference(a, B, scales.to(dtype), zp, bias.to(dtype), K=K, N=N, block_size=bs)
        assert_close(y, ref, dtype)


GATHER_CASES = [  # V, row bytes (K / 2), block size, zero points, indices
    (10, 48, 32, "packed", [[3]]),  # one decode token, K = 96: 3 blocks
    (10, 40, 32, None, [[0, -1, 9], [4, 4, 2]]),  # K = 80: a partial last block; a negative index
    (7, 128, 128, "packed", [[6, 1], [0, 3]]),  # K = 256, two blocks, rows of 2 x 2 indices
    (40, 24, 16, "packed", [list(range(-20, 20))]),  # 40 rows: more than one program of rows
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", GATHER_CASES, ids=lambda c: f"V{c[0]}_K{2 * c[1]}_bs{c[2]}_{c[3]}")
def test_gather_rows_equals_the_ops_composition(device: str, dtype: torch.dtype, case: tuple) -> None:
    """GatherBlockQuantized's 4-bit row gather in one launch gives the op's torch composition bit for bit
    (int32 and int64 indices, negative ones, zero points packed or absent, a partial last block)."""
    V, row_bytes, bs, zp_kind, idx = case
    g = torch.Generator().manual_seed(V)
    nb = -(-row_bytes * 2 // bs)
    data = torch.randint(0, 256, (V, row_bytes), generator=g, dtype=torch.uint8)
    scales = (torch.rand(V, nb, generator=g) * 0.05 + 0.01).to(dtype)
    zp = torch.randint(0, 256, (V, -(-nb // 2)), generator=g, dtype=torch.uint8) if zp_kind else None
    ref = gather_op(data, torch.tensor(idx), scales, zp, bits=4, block_size=bs)  # CPU: the torch composition
    for itype in (torch.int32, torch.int64):
        to = {"device": device}
        y = gather_rows(data.to(**to), torch.tensor(idx, dtype=itype, **to), scales.to(**to),
                        None if zp is None else zp.to(**to), block_size=bs)
        assert y.shape == (*torch.tensor(idx).shape, row_bytes * 2) and y.dtype == dtype
        if device == "cpu" and dtype == torch.bfloat16:
            torch.testing.assert_close(y, ref, rtol=2.0 ** -7, atol=0)  # the interpreter truncates to bf16
        else:
            assert torch.equal(y.cpu(), ref)


@pytest.mark.parametrize("device", DEVICES)
def test_gather_rows_out_of_range_rows_are_zeros_and_errors(device: str) -> None:
    data = torch.randint(0, 256, (5, 16), dtype=torch.uint8, device=device)
    scales = torch.rand(5, 1, device=device)
    y = gather_rows(data, torch.tensor([[1, 5, -6, 2]], device=device), scales, block_size=32)
    assert torch.equal(y[0, 1].cpu(), torch.zeros(32)) and torch.equal(y[0, 2].cpu(), torch.zeros(32))
    assert y[0, 0].abs().sum() > 0 and y[0, 3].abs().sum() > 0
    with pytest.raises(TypeError, match="indices"):
        gather_rows(data, torch.tensor([1.0], device=device), scales, block_size=32)
    with pytest.raises(ValueError, match="scales"):
        gather_rows(data, torch.tensor([1], device=device), scales[:4], block_size=32)
    with pytest.raises(ValueError, match="block_size"):
        gather_rows(data, torch.tensor([1], device=device), scales, block_size=24)


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter-only: routes CPU tensors to the kernel")
def test_gather_op_routes_4bit_rows_to_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The op's GPU path (forced on for CPU tensors, interpreted) takes 4-bit row gathers only."""
    import crossml.kernels.matmul_nbits as kernel
    import crossml.ops.contrib.matmul_nbits as op_module

    calls = record_calls(monkeypatch, kernel, "gather_rows")
    monkeypatch.setattr(op_module, "TRITON_DEVICES", ("cpu",))
    data = torch.randint(0, 256, (6, 16), dtype=torch.uint8)
    scales, idx = torch.rand(6, 1).half(), torch.tensor([[2, 5]])
    y = gather_op(data, idx, scales, bits=4, block_size=32)
    assert calls == ["gather_rows"]
    monkeypatch.setattr(op_module, "TRITON_DEVICES", ())
    assert torch.equal(y, gather_op(data, idx, scales, bits=4, block_size=32))
    monkeypatch.setattr(op_module, "TRITON_DEVICES", ("cpu",))
    gather_op(data, idx.int(), scales.float(), bits=4, block_size=32, gather_axis=0, quantize_axis=1)
    gather_op(data[:, :8].contiguous(), idx, scales, bits=4, block_size=16)  # 16-value blocks
    assert calls == ["gather_rows"] * 3
    gather_op(data, idx, scales, bits=8, block_size=16)  # 8-bit: the torch path
    gather_op(data.reshape(6, 1, 16), idx, scales.reshape(6, 1, 1), bits=4, block_size=32, quantize_axis=2)  # 3-D
    assert calls == ["gather_rows"] * 3


def test_importing_crossml_does_not_import_triton() -> None:
    code = "import sys, crossml, crossml.ops.contrib.matmul_nbits; assert 'triton' not in sys.modules"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


# --- GPU: compiled kernel at decode shapes, through the op's fast path, and under graph capture ---


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("K", "N"), [(896, 4864), (4864, 896), (896, 151936)])
def test_gpu_decode_shapes(dtype: torch.dtype, K: int, N: int) -> None:
    B, scales, zp = _weight(N, K, 32, "packed", dtype, "cuda")
    a = rand(1, 1, K, dtype=dtype, device="cuda", seed=1)
    y = matmul_nbits(a, B, scales, zp, K=K, N=N, block_size=32)
    ref = _reference(a.reshape(1, K), B, scales, zp, None, K=K, N=N, block_size=32).reshape(1, 1, N)
    rtol, atol = TOL[dtype]
    assert_close(y, ref, dtype, tol=(rtol * 2, atol * 4))


@pytest.mark.gpu
@pytest.mark.parametrize("level", [0, 4])
@pytest.mark.parametrize("M", [1, 5, 16, 17])
def test_gpu_op_fast_path(level: int, M: int) -> None:
    """The op on CUDA (kernel for M <= 16, dequantize + matmul above) against its own CPU path."""
    K, N, bs = 320, 200, 32
    B, scales, zp = _weight(N, K, bs, "packed", torch.float16, "cuda")
    a = rand(M, K, dtype=torch.float16, device="cuda", seed=1)
    bias = rand(N, dtype=torch.float16, device="cuda", seed=2)
    kw = {"K": K, "N": N, "block_size": bs, "accuracy_level": level}
    y = matmul_nbits_op(a, B, scales, zp, None, bias, **kw)
    ref = matmul_nbits_op(a.cpu(), B.cpu(), scales.cpu(), zp.cpu(), None, bias.cpu(), **kw)
    torch.testing.assert_close(y.cpu(), ref, rtol=1e-2, atol=3e-2)


@pytest.mark.gpu
def test_gpu_graph_capture() -> None:
    K, N, bs = 896, 4864, 32
    B, scales, zp = _weight(N, K, bs, None, torch.float16, "cuda")
    a = rand(1, K, dtype=torch.float16, device="cuda", seed=1)
    y0 = matmul_nbits(a, B, scales, zp, K=K, N=N, block_size=bs)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = matmul_nbits(a, B, scales, zp, K=K, N=N, block_size=bs)
    a.copy_(rand(1, K, dtype=torch.float16, device="cuda", seed=7))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, matmul_nbits(a, B, scales, zp, K=K, N=N, block_size=bs))
    assert not torch.equal(y, y0)



@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("K", "N"), [(896, 1152), (4864, 896), (2048, 16384), (896, 151936)])
@pytest.mark.parametrize("M", [4, 8, 16, 33, 64])
def test_gpu_dot_decode_shapes(dtype: torch.dtype, K: int, N: int, M: int) -> None:
    """The matrix-unit kernel at batched-decode shapes (the rule's tiles, K split or not) against the reference."""
    B, scales, zp = _weight(N, K, 32, "packed", dtype, "cuda")
    a = rand(M, K, dtype=dtype, device="cuda", seed=1)
    y = matmul_nbits(a, B, scales, zp, K=K, N=N, block_size=32, dot=True, const_w=True)
    rtol, atol = TOL[dtype]
    assert_close(y, _reference(a, B, scales, zp, None, K=K, N=N, block_size=32), dtype, tol=(rtol * 2, atol * 4))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("zp_kind", [None, "packed", "float"])
@pytest.mark.parametrize(("K", "N", "M"), [(896, 1152, 8), (2048, 16384, 16), (300, 130, 33)])
def test_gpu_dot_variants_are_bit_identical(dtype: torch.dtype, zp_kind: str | None, K: int, N: int, M: int,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Every variant of the matrix-unit kernel dequantizes the same weights and multiplies them in the same order as
    the others of its kind (one dot per K step, or two with ``halves``): the products equal the first's of the kind
    bit for bit (K split or not, a partial last K step, partial tiles), and the kinds agree within rounding."""
    B, scales, zp = _weight(N, K, 32, zp_kind, dtype, "cuda", seed=2)
    a = rand(M, K, dtype=dtype, device="cuda", seed=3) * 8
    bias = rand(N, dtype=dtype, device="cuda", seed=4)
    first = {}
    for options in DOT_VARIANTS:
        monkeypatch.setattr(kernel_module, "DOT_OPTIONS", {**kernel_module.DOT_OPTIONS, **options})
        y = matmul_nbits(a, B, scales, zp, bias, K=K, N=N, block_size=32, dot=True, const_w=True)
        want = first.setdefault(options["halves"] > 0, y)
        assert torch.equal(y, want), options
    assert_close(first[True], first[False].double().cpu(), dtype)


@pytest.mark.gpu
def test_gpu_dot_graph_capture() -> None:
    """The matrix-unit kernel with its K split (two launches, a workspace) inside a CUDA graph: replays follow the
    input and equal the eager call bit for bit."""
    K, N, M, bs = 4864, 896, 8, 32
    B, scales, zp = _weight(N, K, bs, "packed", torch.float16, "cuda")
    a = rand(M, K, dtype=torch.float16, device="cuda", seed=1)
    assert pick_dot_tiles(M, N, K, bs, kernel_module.rule_processors(a))[3] > 1
    y0 = matmul_nbits(a, B, scales, zp, K=K, N=N, block_size=bs, const_w=True)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = matmul_nbits(a, B, scales, zp, K=K, N=N, block_size=bs, const_w=True)
    a.copy_(rand(M, K, dtype=torch.float16, device="cuda", seed=7))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, matmul_nbits(a, B, scales, zp, K=K, N=N, block_size=bs, const_w=True))
    assert not torch.equal(y, y0)

def _rms_reference(x: torch.Tensor, skip: torch.Tensor | None, gamma: torch.Tensor, eps: float):
    """fp64 RMSNorm(x (+ skip)) * gamma of the (rounded) inputs, and x + skip rounded to x's dtype."""
    s = x.double().cpu() + (0 if skip is None else skip.double().cpu())
    h = s * torch.rsqrt(s.square().mean(-1, keepdim=True) + eps) * gamma.double().cpu()
    return h, s.to(x.dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", [(32, 96, 130, 1, None, False, True), (16, 256, 24, 3, "packed", True, True),
                                  (128, 64, 24, 1, "float", False, False), (32, 96, 40, 3, None, True, False)],
                         ids=lambda c: "bs{}_K{}_N{}_M{}_{}_{}_{}".format(*c[:5], "bias" if c[5] else "",
                                                                        "skip" if c[6] else "noskip"))
def test_rms_norm_fused(device: str, dtype: torch.dtype, case: tuple) -> None:
    """``norm``: the product of RMSNorm(a (+ skip)) * gamma (not rounded to a's dtype in between), and a + skip
    stored by the first column tile's programs."""
    bs, K, N, M, zp_kind, with_bias, with_skip = case
    B, scales, zp = _weight(N, K, bs, zp_kind, dtype, device)
    a = rand(M, K, dtype=dtype, device=device, seed=5) * 3
    skip = rand(M, K, dtype=dtype, device=device, seed=6) if with_skip else None
    gamma = (rand(K, dtype=dtype, device=device, seed=7) * 0.5 + 1).to(dtype)
    bias = rand(N, dtype=dtype, device=device, seed=2) if with_bias else None
    total = torch.full_like(a, float("nan")) if with_skip else None
    tiles = (1 if M == 1 else 4, 16, max(bs, 32), 4) if device == "cpu" else None  # several column tiles
    y = matmul_nbits(a, B, scales, zp, bias, K=K, N=N, block_size=bs, tiles=tiles, norm=(skip, gamma, 1e-6),
                     sum_out=total)
    h, s = _rms_reference(a, skip, gamma, 1e-6)
    w = dequantize_nbits(B.cpu(), scales.cpu(), None if zp is None else zp.cpu(), None, K=K, N=N, bits=4,
                         block_size=bs, dtype=dtype)
    want = h @ w.double().T + (0 if bias is None else bias.cpu().to(dtype).double())
    assert_close(y, want, dtype)
    if with_skip:
        torch.testing.assert_close(total.cpu(), s, rtol=0, atol=0)


@pytest.mark.skipif(not INTERPRET, reason="calls the kernel on CPU tensors, which needs Triton's interpreter "
                    "(TRITON_INTERPRET=1, set by this module where torch sees no GPU)")
def test_rms_norm_fused_rejects_mismatched_inputs() -> None:
    B, scales, _ = _weight(8, 64, 32, None, torch.float32, "cpu")
    a = torch.zeros(1, 64)
    with pytest.raises(ValueError, match="gamma must have K=64"):
        matmul_nbits(a, B, scales, K=64, N=8, block_size=32, norm=(None, torch.ones(32), 1e-6))
    with pytest.raises(ValueError, match="sum_out needs a skip"):
        matmul_nbits(a, B, scales, K=64, N=8, block_size=32, norm=(None, torch.ones(64), 1e-6),
                     sum_out=torch.empty(1, 64))


PAIR_CASES = [  # N, K, block_size, zero points, M, norm (0 none, 1 RMSNorm, 2 with skip), activation scale
    (1152, 896, 32, None, 1, 0, 1.0), (896, 896, 32, "packed", 1, 1, 1.0), (9728, 896, 32, "packed", 1, 2, 1.0),
    (300, 1000, 16, "float", 3, 0, 1.0),  # K not a multiple of the block or of a word pair; bias
    (257, 520, 64, "packed", 2, 2, 1.0), (128, 4096, 128, None, 1, 0, 1.0), (100, 96, 32, None, 5, 1, 1.0),
    (64, 2048, 256, "packed", 16, 0, 1.0),
    (6, 64, 32, None, 1, 0, 1.0),  # narrower than any of the rule's tiles (the pair kernel asked for by name)
    (256, 4096, 32, "packed", 2, 2, 1.0),  # a fused norm over two K steps (its statistics pass); the others take one
    # activations whose pair sums would pass fp16's range (8 * 15 * 2400), the outputs within it: the step scales down
    (512, 2048, 32, None, 1, 0, 600.0),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", PAIR_CASES, ids=lambda c: "N{}_K{}_bs{}_{}_M{}_norm{}_x{}".format(*c))
def test_gpu_fp16_pair_kernel(case: tuple) -> None:
    """The fp16-pair kernel (products in fp16 pairs, sums in float32) against the fp64 definition, within fp16
    rounding: every zero-point form, block sizes 16-256, K tails, several rows, the fused norms and sum_out,
    and activations whose products would overflow fp16 pair sums unscaled."""
    N, K, bs, zp_kind, M, norm_kind, scale = case
    dev, h = "cuda", torch.float16
    B, scales, zp = _weight(N, K, bs, zp_kind, h, dev)
    a = (rand(M, K, dtype=torch.float32, device=dev, seed=1) * scale).to(h)
    if scale > 100:
        a[0, 5] = 20000.0
    bias = rand(N, dtype=h, device=dev, seed=2) if M == 3 else None
    norm = total = None
    if norm_kind:
        skip = rand(M, K, dtype=h, device=dev, seed=6) if norm_kind == 2 else None
        norm = (skip, (rand(K, dtype=torch.float32, device=dev, seed=7).abs() * 0.5 + 0.5).to(h), 1e-6)
        total = torch.full_like(a, float("nan")) if skip is not None else None
    y = matmul_nbits(a, B, scales, zp, bias, K=K, N=N, block_size=bs, norm=norm, sum_out=total, pairs=True)
    if norm is None:
        want = _reference(a, B, scales, zp, bias, K=K, N=N, block_size=bs)
    else:
        hn, s = _rms_reference(a, norm[0], norm[1], norm[2])
        w = dequantize_nbits(B.cpu(), scales.cpu(), None if zp is None else zp.cpu(), None, K=K, N=N, bits=4,
                             block_size=bs, dtype=h)
        want = hn.to(h).double() @ w.double().T + (0 if bias is None else bias.cpu().double())
        if total is not None:
            torch.testing.assert_close(total.cpu(), s, rtol=0, atol=0)
    assert torch.isfinite(y).all()
    # fp16 pair products (unit roundoff 2^-11 = 4.9e-4): the largest error within a few roundings of the largest
    # output, the typical one within about one (a wrong nibble, pair or scale is off by the output's size)
    diff = y.double().cpu() - want
    worst, rms = float(diff.abs().max() / want.abs().max()), float(diff.norm() / want.norm())
    assert worst < 4e-3 and rms < 1e-3, f"largest error {worst:.2e} of the largest output, rms {rms:.2e}"
    ref32 = matmul_nbits(a, B, scales, zp, bias, K=K, N=N, block_size=bs, norm=norm, pairs=False)
    assert (ref32.double().cpu() - want).abs().max() / want.abs().max() < 2e-3


@pytest.mark.gpu
def test_gpu_fp16_pair_kernel_is_chosen_for_wide_products_and_captures() -> None:
    """matmul_nbits takes the pair kernel by itself where the rule says it pays (wide N), the float32 kernel
    for narrow products and other dtypes; a call captures into a CUDA graph and replays a new input."""
    from crossml.kernels import matmul_nbits as module

    assert module.fp16_pairs(torch.zeros(1, device="cuda", dtype=torch.float16))
    assert not module.fp16_pairs(torch.zeros(1, device="cuda", dtype=torch.bfloat16))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    N, K, bs = 64 * sms, 512, 32
    assert module.pick_pair_tiles(1, N, K, bs, sms) is not None
    assert module.pick_pair_tiles(1, 896, 896, bs, sms) is None
    B, scales, zp = _weight(N, K, bs, "packed", torch.float16, "cuda")
    a = rand(1, K, dtype=torch.float16, device="cuda", seed=1)
    auto = matmul_nbits(a, B, scales, zp, K=K, N=N, block_size=bs)
    assert torch.equal(auto, matmul_nbits(a, B, scales, zp, K=K, N=N, block_size=bs, pairs=True))
    assert not torch.equal(auto, matmul_nbits(a, B, scales, zp, K=K, N=N, block_size=bs, pairs=False))
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = matmul_nbits(a, B, scales, zp, K=K, N=N, block_size=bs, const_w=True)
    a.copy_(rand(1, K, dtype=torch.float16, device="cuda", seed=7))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, matmul_nbits(a, B, scales, zp, K=K, N=N, block_size=bs, pairs=True))


def test_pair_tiles_rule() -> None:
    """The fp16-pair kernel's rule on a 132-SM GPU: the float32 kernel for narrow products (None), legal tiles
    of 4+ rows otherwise; the measured choices for the lm_head, merged gate+up and Llama's square products."""
    assert pick_pair_tiles(1, 896, 4864, 32, 132) is None and pick_pair_tiles(1, 1152, 896, 32, 132) is None
    assert pick_pair_tiles(1, 151936, 896, 32, 132) == (1, 32, 256, 1)
    assert pick_pair_tiles(1, 16384, 2048, 32, 132) == (1, 8, 512, 1)
    assert pick_pair_tiles(1, 9728, 896, 32, 132) == (1, 8, 1024, 2)
    assert pick_pair_tiles(1, 2048, 8192, 32, 132) == (1, 8, 2048, 2)
    # after an early-launching SiluMul (SiluMulMatMulNBits) a long K takes 4096-value steps at four warps
    assert pick_pair_tiles(1, 2048, 8192, 32, 132, early_input=True) == (1, 8, 4096, 4)
    assert pick_pair_tiles(1, 3072, 2048, 32, 132, early_input=True) == pick_pair_tiles(1, 3072, 2048, 32, 132)
    for N, K, bs, M in [(3072, 2048, 16, 1), (16384, 2048, 128, 3), (151936, 64, 256, 17), (2048, 100, 32, 1)]:
        bm, bn, bk, warps = pick_pair_tiles(M, N, K, bs, 132)
        assert bm == min(16, triton_next_pow2(M)) and bn >= 4 and bk % bs == 0 and bk & (bk - 1) == 0 and bk >= 16


def triton_next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def test_fp16_pairs_off_the_gpu() -> None:
    """The pair kernel's PTX runs on NVIDIA GPUs only: CPU tensors (and the interpreter) keep the float32 path."""
    from crossml.kernels import matmul_nbits as module

    assert not module.fp16_pairs(torch.zeros(1, dtype=torch.float16))


# --- The Gluon mma kernel (crossml.kernels.nbits_mma): 2 to 16 rows of fp16; Gluon does not run in the interpreter ---


@pytest.mark.skipif(not INTERPRET, reason="calls the kernel on CPU tensors, which needs Triton's interpreter "
                    "(TRITON_INTERPRET=1, set by this module where torch sees no GPU)")
def test_mma_kernel_is_never_taken_on_the_cpu() -> None:
    """On the CPU (the interpreter's device) nothing is mma-eligible, and forcing the kernel names what it needs."""
    B, scales, zp = _weight(16, 128, 32, "packed", torch.float16, "cpu")
    a = rand(4, 128, dtype=torch.float16, device="cpu")
    assert not kernel_module.mma_eligible(a, 4, 128, 16, 32, zp)
    with pytest.raises(ValueError, match="mma kernel.*fp16 A on an NVIDIA GPU.*K a multiple of 128"):
        matmul_nbits(a, B, scales, zp, K=128, N=16, block_size=32, mma=True)


def test_mma_kernel_needs_the_gluon_of_triton_3_6(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gluon's API moves between Triton releases: an older Triton leaves the 4-bit products on the other kernels."""
    import triton

    from crossml.kernels._launch import gluon_kernels

    gluon_kernels.cache_clear()
    monkeypatch.setattr(triton, "__version__", "3.5.1")
    assert kernel_module._mma_kernels() is None
    gluon_kernels.cache_clear()
    monkeypatch.undo()
    assert kernel_module._mma_kernels() is not None
    gluon_kernels.cache_clear()


#: (arch, constexprs) the CPU compiles the mma kernel for: the rule's tiles with packed zero points and float32
#: partial sums; symmetric weights with a bias and a 64-value block for sm_80; four A tiles, two steps ahead
MMA_COMPILES = [(90, {}), (80, {"ZP": False, "PARTIAL": False, "HAS_BIAS": True, "BS": 64, "M_TILES": 2}),
                (90, {"M_TILES": 4, "WARPS": 4, "DEPTH": 2, "HALF_M": True, "BLOCK_N": 128, "PDL": False})]


def test_mma_kernel_compiles_without_shared_memory() -> None:
    """Gluon kernels do not run in Triton's interpreter, so the CPU compiles the kernel ahead of time (no GPU needed):
    its operand layouts convert in registers (``assert_trivial``), nothing goes through shared memory, the weights
    and activations load as 128-bit vectors and the product is mma instructions. (In a process of its own: the
    interpreter's patches of Triton's language, left by the interpreted tests, break compiling.)"""
    code = (
        "import json\n"
        "from crossml.kernels import nbits_mma\n"
        f"out = []\nfor arch, consts in {MMA_COMPILES!r}:\n"
        "    k = nbits_mma.compile_for(arch, **consts)\n"
        "    ptx = k.asm['ptx']\n"
        "    out.append([k.metadata.shared, 'ld.global.v4.b32' in ptx or 'ld.global.nc.v4.b32' in ptx,\n"
        "                'mma.sync.aligned.m16n8k16' in ptx])\n"
        "print(json.dumps(out))\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [[0, True, True]] * len(MMA_COMPILES)


def test_mma_tiles_for_decode_shapes() -> None:
    """The mma kernel's rule: 64 weight rows at two warps, one step ahead, K split (in whole 128-value steps, at most
    64 ranges) to about SPLIT_PER_SM programs per SM; a vocabulary is not split."""
    from crossml.kernels import nbits_mma

    assert nbits_mma.pick_tiles(8, 1152, 896, 132) == (64, 2, 1, 7)  # Qwen2.5-0.5B qkv: K = 7 steps, all split
    assert nbits_mma.pick_tiles(2, 896, 4864, 132) == (64, 2, 1, 38)  # its down projection
    assert nbits_mma.pick_tiles(16, 2048, 8192, 132) == (64, 2, 1, 17)  # Llama-3.2-1B's down projection
    assert nbits_mma.pick_tiles(4, 128256, 2048, 132) == (64, 2, 1, 1)  # its lm_head
    assert nbits_mma.pick_tiles(4, 64, 128 * 100, 132) == (64, 2, 1, 64)  # at most 64 splits
    a = torch.empty(4, 256, dtype=torch.float16)
    assert not nbits_mma.supported(a, 256, 64, 32, None)  # not on the CPU


MMA_CASES = [  # block_size, K, N, M, zero points, bias, tiles (BLOCK_N, WARPS, DEPTH, SPLIT_K) or None (the rule)
    (32, 128, 64, 2, "packed", False, (64, 2, 1, 1)),
    (32, 256, 200, 3, None, True, (64, 1, 1, 1)),  # a partial N tile, symmetric weights, bias, one launch
    (32, 896, 1152, 8, "packed", True, None),  # the rule: K split, bias in the reduction
    (32, 896, 1152, 9, "packed", False, (128, 4, 2, 3)),  # more than 8 rows, two steps ahead, split
    (64, 512, 96, 16, "packed", True, (32, 1, 2, 2)),
    (128, 384, 130, 5, None, False, (64, 2, 1, 3)),
    (256, 384, 72, 16, "packed", True, (64, 2, 2, 1)),  # padded blocks: B rows longer than K / 2
    (32, 2048, 16384, 16, "packed", False, None),
    (32, 896, 1152, 17, "packed", True, None),  # two 16-row tiles of A on each dequantized step
    (32, 512, 200, 33, None, False, (64, 2, 1, 2)),  # four tiles, the last partial
    (64, 256, 72, 64, "packed", True, (64, 4, 2, 1)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", MMA_CASES, ids=lambda c: "bs{}_K{}_N{}_M{}_{}_{}_{}".format(
    *c[:5], "bias" if c[5] else "", "rule" if c[6] is None else "x".join(map(str, c[6]))))
def test_gpu_mma_kernel_matches_dequantize_matmul(case: tuple) -> None:
    bs, K, N, M, zp_kind, with_bias, tiles = case
    B, scales, zp = _weight(N, K, bs, zp_kind, torch.float16, "cuda")
    a = rand(M, K, dtype=torch.float16, device="cuda", seed=1)
    bias = rand(N, dtype=torch.float16, device="cuda", seed=2) if with_bias else None
    y = matmul_nbits(a, B, scales, zp, bias, K=K, N=N, block_size=bs, tiles=tiles, mma=True, const_w=True)
    assert y.shape == (M, N) and y.dtype == torch.float16
    rtol, atol = TOL[torch.float16]
    assert_close(y, _reference(a, B, scales, zp, bias, K=K, N=N, block_size=bs), torch.float16,
                 tol=(rtol * 2, atol * 4))


@pytest.mark.gpu
@pytest.mark.parametrize("zp_kind", [None, "packed"])
@pytest.mark.parametrize("bs", [32, 64, 256])
def test_gpu_mma_kernel_dequantizes_bit_for_bit(zp_kind: str | None, bs: int) -> None:
    """One-hot activation rows pick single weights: every weight of the product, sixteen (or 64: four tiles of A) K
    positions a call (K split and not), equals ``dequantize`` bit for bit, so the permuted K order and the PTX
    dequantization are exact."""
    K, N = 512, 136
    B, scales, zp = _weight(N, K, bs, zp_kind, torch.float16, "cuda", seed=3)
    want = dequantize(B, scales, zp, K=K, N=N, block_size=bs, dtype=torch.float16).T  # [K, N]
    eye = torch.eye(K, dtype=torch.float16, device="cuda")
    for tiles in ((64, 2, 1, 1), (128, 4, 2, 4)):
        got = torch.cat([matmul_nbits(eye[k:k + 16], B, scales, zp, K=K, N=N, block_size=bs, tiles=tiles, mma=True)
                         for k in range(0, K, 16)])
        assert torch.equal(got, want), tiles
    got = torch.cat([matmul_nbits(eye[k:k + 64], B, scales, zp, K=K, N=N, block_size=bs, mma=True)
                     for k in range(0, K, 64)])
    assert torch.equal(got, want)


@pytest.mark.gpu
def test_gpu_mma_kernel_graph_replays_and_const_w() -> None:
    """const_w changes when the weights are first read, not the result; a captured call's replays give the eager
    result bit for bit (K split: a fixed-order reduction)."""
    K, N, M, bs = 896, 1152, 4, 32
    B, scales, zp = _weight(N, K, bs, "packed", torch.float16, "cuda", seed=4)
    a = rand(M, K, dtype=torch.float16, device="cuda", seed=5)
    kw = {"K": K, "N": N, "block_size": bs, "mma": True}
    y0 = matmul_nbits(a, B, scales, zp, **kw)
    assert torch.equal(matmul_nbits(a, B, scales, zp, const_w=True, **kw), y0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = matmul_nbits(a, B, scales, zp, const_w=True, **kw)
    a.copy_(rand(M, K, dtype=torch.float16, device="cuda", seed=6))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, matmul_nbits(a, B, scales, zp, **kw)) and not torch.equal(y, y0)


@pytest.mark.gpu
def test_gpu_mma_kernel_routing(monkeypatch: pytest.MonkeyPatch) -> None:
    """``matmul_nbits`` takes the mma kernel for MMA_MIN_M to MMA_MAX_M rows of fp16 where it applies (narrow products
    from MMA_NARROW_MIN_M rows, weights of MMA_WIDE_MIN_WEIGHT values or more to MMA_WIDE_MAX_M rows): not for one row, 17 rows, bf16, float zero points, K off the 128-value step, a fused
    norm, or with MMA_MAX_M set to 0."""
    from crossml.kernels import nbits_mma

    calls = record_calls(monkeypatch, nbits_mma, "mma_product")
    bs = 32

    def run(M: int, *, dtype: torch.dtype = torch.float16, zp_kind: str | None = "packed", k: int = 256,
            n: int = 64, norm: bool = False) -> bool:
        calls.clear()
        B, scales, zp = _weight(n, k, bs, zp_kind, dtype, "cuda")
        a = rand(M, k, dtype=dtype, device="cuda", seed=M)
        y = matmul_nbits(a, B, scales, zp, K=k, N=n, block_size=bs,
                         norm=(None, torch.ones(k, dtype=dtype, device="cuda"), 1e-5) if norm else None)
        if not norm:
            assert_close(y, _reference(a, B, scales, zp, None, K=k, N=n, block_size=bs), dtype,
                         tol=tuple(2 * t for t in TOL[dtype]))
        return bool(calls)

    narrow = kernel_module.MMA_NARROW_MIN_M
    assert narrow == 3 and kernel_module.MMA_NARROW_K >= 256 and kernel_module.MMA_NARROW_N >= 64
    assert [run(M) for M in (1, 2, 3, 8, 16, 17)] == [False, False, True, True, True, False]
    monkeypatch.setattr(kernel_module, "MMA_WIDE_MIN_WEIGHT", 256 * 64)  # this weight counts as wide: to 32 rows
    assert [run(M) for M in (16, 17, 32, 33)] == [True, True, True, False]
    monkeypatch.setattr(kernel_module, "MMA_WIDE_MIN_WEIGHT", 256 * 64 + 1)
    wide = kernel_module.MMA_NARROW_K + 128  # past the narrow products' K: from MMA_MIN_M rows
    assert [run(M, k=wide) for M in (1, 2)] == [False, True]
    assert not run(4, dtype=torch.bfloat16)
    assert not run(4, zp_kind="float")
    assert not run(4, k=320)
    assert not run(4, norm=True)
    monkeypatch.setattr(kernel_module, "MMA_MAX_M", 0)
    assert not run(4)


@pytest.mark.gpu
def test_gpu_mma_kernel_errors() -> None:
    B, scales, zp = _weight(64, 256, 32, "packed", torch.float16, "cuda")
    a = rand(4, 256, dtype=torch.float16, device="cuda")
    kw = {"K": 256, "N": 64, "block_size": 32, "mma": True}
    with pytest.raises(ValueError, match="tiles .*BLOCK_N"):
        matmul_nbits(a, B, scales, zp, tiles=(48, 2, 1, 1), **kw)
    with pytest.raises(ValueError, match="DEPTH 1 or 2"):
        matmul_nbits(a, B, scales, zp, tiles=(64, 2, 3, 1), **kw)
    with pytest.raises(ValueError, match="M=65"):
        matmul_nbits(rand(65, 256, dtype=torch.float16, device="cuda"), B, scales, zp, **kw)
    with pytest.raises(ValueError, match="A torch.bfloat16"):
        matmul_nbits(a.bfloat16(), B, scales.bfloat16(), zp, **kw)
