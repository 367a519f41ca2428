"""The Triton expert GEMV (crossml.kernels.moe) against its torch reference (the chosen experts' weights gathered
and dequantized). CPU cases run in Triton's interpreter; ``gpu`` cases compile."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before triton's first import: interpret the kernels on the CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from crossml.kernels.moe import expert_gemv, expert_gemv_reference  # noqa: E402
from tests.kernels._common import DEVICES, TOL, assert_close, rand  # noqa: E402

E = 5
#: the expert of each of 6 rows: repeats (1, 3) and unused experts (2)
EXPERTS = [1, 4, 1, 0, 3, 3]


def _quantized(N: int, K: int, bits: int, block_size: int, with_zp: bool, dtype: torch.dtype, device: str,
               seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Random packed weights [E, N, K * bits / 8], scales and (packed) zero points in QMoE's layout."""
    g = torch.Generator().manual_seed(seed)
    blocks = K // block_size if block_size else 1
    w = torch.randint(0, 256, (E, N, K * bits // 8), generator=g, dtype=torch.uint8)
    scales = (torch.rand((E, N, blocks) if block_size else (E, N), generator=g) * 0.05 + 0.01).to(dtype)
    zp = None
    if with_zp:
        zshape = (E, N, -(-blocks * bits // 8)) if block_size else (E, -(-N * bits // 8))
        zp = torch.randint(0, 256, zshape, generator=g, dtype=torch.uint8).to(device)
    return w.to(device), scales.to(device), zp


def _compare(device: str, dtype: torch.dtype, N: int, K: int, rows_per_token: int, with_bias: bool, **quant) -> None:
    experts = torch.tensor(EXPERTS, device=device)
    x = rand(len(EXPERTS) // rows_per_token, K, dtype=dtype, device=device, seed=1)
    bias = rand(E, N, dtype=dtype, device=device, seed=2) if with_bias else None
    if quant.get("bits"):
        w, scales, zp = _quantized(N, K, quant["bits"], quant["block_size"], quant.pop("zero_points"), dtype, device)
        quant.update(scales=scales, zero_points=zp)
    else:
        w = (rand(E, N, K, dtype=torch.float32, device=device, seed=3) * 0.3).to(dtype)
    args = dict(N=N, K=K, rows_per_token=rows_per_token, **quant)
    y = expert_gemv(x, experts, w, bias, **args)
    assert y.shape == (len(EXPERTS), N) and y.device.type == device
    ref = expert_gemv_reference(x.cpu(), experts.cpu(), w.cpu(), None if bias is None else bias.cpu(),
                                **{n: v.cpu() if isinstance(v, torch.Tensor) else v for n, v in args.items()})
    rtol, atol = TOL[dtype]
    scale = max(1.0, float(ref.float().abs().max()))  # 8-bit products reach ~100: scale atol with the output
    assert_close(y, ref.double(), dtype, (rtol, atol * scale))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows_per_token,with_bias", [(1, True), (2, False)], ids=["fc2_bias", "fc1_k2"])
def test_dense_matches_reference(device: str, dtype: torch.dtype, rows_per_token: int, with_bias: bool) -> None:
    # N = 40: a partial BLOCK_N tile; K = 80: a partial last K step
    _compare(device, dtype, 40, 80, rows_per_token, with_bias)


QUANT_CASES = [  # bits, block_size, zero points, rows_per_token, bias: each value of each axis, not the product
    (4, 16, True, 1, True),
    (4, 32, False, 3, False),
    (4, 0, True, 2, False),
    (4, 0, False, 1, True),
    (8, 16, False, 2, True),
    (8, 32, True, 1, False),
    (8, 0, True, 3, True),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", QUANT_CASES, ids=lambda c: "int{}_bs{}_{}_rows{}_{}".format(
    c[0], c[1], "zp" if c[2] else "nozp", c[3], "bias" if c[4] else "nobias"))
def test_quantized_matches_reference(device: str, case: tuple) -> None:
    bits, bs, zp, rows_per_token, with_bias = case
    # K = 96: three 32-blocks, a partial last K step of the interpreter's 32 x 2^n tiles at block 16
    _compare(device, torch.float32, 40, 96, rows_per_token, with_bias, bits=bits, block_size=bs, zero_points=zp)


@pytest.mark.parametrize("device", DEVICES)
def test_quantized_fp16_wide_blocks(device: str) -> None:
    """fp16 activations and scales; a block wider than the default interpreter K step (BLOCK_K grows to it)."""
    _compare(device, torch.float16, 24, 128, 2, True, bits=4, block_size=64, zero_points=True)


@pytest.mark.parametrize("device", DEVICES)
def test_tiles_and_int32_indices(device: str) -> None:
    """Explicit tiles (several K steps, two blocks a step) and int32 expert indices give the same rows."""
    w, scales, zp = _quantized(33, 64, 4, 16, True, torch.float32, device)
    x = rand(3, 64, device=device, seed=4)
    experts = torch.tensor([2, 2, 0, 4, 1, 2], device=device)
    args = dict(scales=scales, zero_points=zp, bits=4, block_size=16, N=33, K=64, rows_per_token=2)
    a = expert_gemv(x, experts, w, **args)
    b = expert_gemv(x, experts.to(torch.int32), w, tiles=(8, 32, 1), **args)
    ref = expert_gemv_reference(x.cpu(), experts.cpu(), w.cpu(), **{n: v.cpu() if isinstance(v, torch.Tensor) else v
                                                                    for n, v in args.items()})
    assert_close(a, ref.double(), torch.float32)
    assert_close(b, ref.double(), torch.float32)


def test_errors_name_the_input() -> None:
    x = torch.zeros(2, 32)
    experts = torch.tensor([0, 1, 1, 0])
    w = torch.zeros(2, 8, 32)
    kw = dict(N=8, K=32, rows_per_token=2)
    with pytest.raises(ValueError, match="x .* must be \\[2, 32\\]"):
        expert_gemv(torch.zeros(3, 32), experts, w, **kw)
    with pytest.raises(ValueError, match="experts torch.float32"):
        expert_gemv(x, experts.float(), w, **kw)
    with pytest.raises(ValueError, match="rows_per_token 3 must be >= 1 and divide the 4 rows"):
        expert_gemv(x, experts, w, **dict(kw, rows_per_token=3))
    with pytest.raises(ValueError, match="dense weight .* must be float16/bfloat16/float32 \\[2, 8, 32\\]"):
        expert_gemv(x, experts, torch.zeros(2, 8, 16), **kw)
    with pytest.raises(ValueError, match="bias .* must be .* \\[2, 8\\]"):
        expert_gemv(x, experts, w, torch.zeros(8), **kw)
    q = torch.zeros(2, 8, 16, dtype=torch.uint8)
    with pytest.raises(ValueError, match="scales \\(none\\) must be"):
        expert_gemv(x, experts, q, bits=4, block_size=16, **kw)
    with pytest.raises(ValueError, match="scales .* must be float16/bfloat16/float32 \\[2, 8, 2\\]"):
        expert_gemv(x, experts, q, scales=torch.ones(2, 8), bits=4, block_size=16, **kw)
    with pytest.raises(ValueError, match="zero_points .* must be uint8 \\[2, 8, 1\\]"):
        expert_gemv(x, experts, q, scales=torch.ones(2, 8, 2), zero_points=torch.zeros(2, 8, 2, dtype=torch.uint8),
                    bits=4, block_size=16, **kw)
    with pytest.raises(ValueError, match="quantized weight .* must be uint8 \\[2, 8, 32\\]"):
        expert_gemv(x, experts, q, scales=torch.ones(2, 8), bits=8, **kw)
    with pytest.raises(ValueError, match="block_size 24 must be a power of two"):
        expert_gemv(x, experts, q, scales=torch.ones(2, 8, 1), bits=4, block_size=24, **kw)
    with pytest.raises(ValueError, match="bits 2 must be 0"):
        expert_gemv(x, experts, q, scales=torch.ones(2, 8), bits=2, **kw)
