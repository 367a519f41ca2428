"""The Triton whole-sequence attention (crossml.kernels.attention) against its float64 definition and torch's
scaled_dot_product_attention: masks (additive, boolean, broadcast), transposed / broadcast operands, ragged
sequence and head sizes, fully masked rows. CPU cases run in Triton's interpreter; ``gpu`` cases compile, and
check that com.crossml ScaledDotProductAttention routes fp32 GPU tensors to the kernel where TF32 is allowed."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before triton's first import: interpret the kernels on the CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from crossml.kernels.attention import attention, attention_reference, supported  # noqa: E402
from tests.kernels._common import DEVICES, TF32_TOL, TOL, rand, record_calls  # noqa: E402


def _tol(dtype: torch.dtype, device: str) -> tuple[float, float]:
    # compiled fp32 products use TF32 (the default of torch.backends.cuda.matmul.allow_tf32 in a session)
    return TF32_TOL if dtype == torch.float32 and device == "cuda" else TOL[dtype]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 2, 8, 16, 8), (2, 3, 19, 37, 24), (1, 1, 33, 5, 64), (2, 1, 1, 40, 16)])
@pytest.mark.parametrize("masking", ["none", "padding", "full", "bool"])
def test_attention_matches_definition(device: str, dtype: torch.dtype, shape: tuple[int, ...], masking: str) -> None:
    b, h, sq, sk, d = shape
    q = rand(b, h, sq, d, dtype=dtype, seed=1)
    k = rand(b, h, sk, d, dtype=dtype, seed=2)
    v = rand(b, h, sk, d, dtype=dtype, seed=3)
    mask = None
    if masking == "padding":  # BERT's [B, 1, 1, SK] additive mask: -10000 past each sequence's length
        lengths = torch.tensor([sk - i for i in range(b)])
        mask = ((torch.arange(sk)[None, :] >= lengths[:, None]).to(torch.float32) * -10000.0)[:, None, None, :]
    elif masking == "full":
        mask = rand(sq, sk, seed=4)
    elif masking == "bool":
        mask = torch.rand(b, 1, sq, sk, generator=torch.Generator().manual_seed(5)) > 0.3
        mask[..., 0] = True  # every row keeps a key
    want = attention_reference(q, k, v, mask, scale=0.3)
    got = attention(q.to(device), k.to(device), v.to(device), None if mask is None else mask.to(device), scale=0.3)
    assert got.shape == q.shape and got.dtype == dtype
    rtol, atol = _tol(dtype, device)
    torch.testing.assert_close(got.cpu().double(), want.double(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("device", DEVICES)
def test_attention_reads_strided_and_broadcast_operands(device: str) -> None:
    q = rand(2, 8, 3, 16, seed=1).transpose(1, 2)  # [2, 3, 8, 16], head axis strided
    kt = rand(1, 3, 16, 12, seed=2)  # kᵀ given, batch axis broadcast
    v = rand(3, 12, 16, seed=3)  # no batch axis
    mask = rand(12, seed=4)  # one row for every query
    want = attention_reference(q, kt.transpose(-1, -2), v, mask)
    got = attention(q.to(device), kt.to(device).transpose(-1, -2), v.to(device), mask.to(device))
    assert got.is_contiguous()
    torch.testing.assert_close(got.cpu(), want.float(), rtol=_tol(torch.float32, device)[0],
                               atol=_tol(torch.float32, device)[1])


@pytest.mark.parametrize("device", DEVICES)
def test_fully_masked_rows_are_nan_like_softmax(device: str) -> None:
    # the unfused ONNX graph (Softmax of a row of -inf) gives NaN; torch's SDPA would give zeros
    q, k, v = rand(1, 1, 4, 8, seed=1), rand(1, 1, 6, 8, seed=2), rand(1, 1, 6, 8, seed=3)
    for mask in (torch.ones(4, 6, dtype=torch.bool), torch.zeros(4, 6)):
        mask[2] = False if mask.dtype == torch.bool else float("-inf")
        got = attention(q.to(device), k.to(device), v.to(device), mask.to(device)).cpu()
        want = attention_reference(q, k, v, mask)
        assert torch.isnan(got[0, 0, 2]).all() and torch.isnan(want[0, 0, 2]).all()
        keep = torch.tensor([0, 1, 3])
        torch.testing.assert_close(got[0, 0, keep], want[0, 0, keep], rtol=5e-3, atol=5e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_operands(device: str) -> None:
    q = rand(1, 2, 0, 8).to(device)
    assert attention(q, rand(1, 2, 5, 8).to(device), rand(1, 2, 5, 8).to(device)).shape == (1, 2, 0, 8)
    got = attention(rand(1, 1, 3, 8).to(device), rand(1, 1, 0, 8).to(device), rand(1, 1, 0, 8).to(device))
    assert torch.isnan(got.cpu()).all()


def test_supported_refuses_what_the_kernel_does_not_take() -> None:
    q = rand(1, 2, 4, 8)
    assert supported(q, q, q, None)
    assert not supported(q, rand(1, 2, 4, 16), rand(1, 2, 4, 16), None)  # head sizes differ
    assert not supported(rand(1, 1, 4, 512), rand(1, 1, 4, 512), rand(1, 1, 4, 512), None)  # head over 256
    assert not supported(q, rand(3, 2, 4, 8), rand(3, 2, 4, 8), None)  # k's batch is larger than q's
    assert not supported(q, q, q, torch.zeros(4, 5))  # mask does not broadcast
    assert not supported(q, q, q, torch.zeros(4, 4, dtype=torch.int64))  # integer mask
    assert not supported(q.double(), q.double(), q.double(), None)
    with pytest.raises(ValueError, match="head size at most 256"):
        attention(q, rand(1, 2, 4, 16), rand(1, 2, 4, 16))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: the op routes only GPU tensors to the kernel")
@pytest.mark.parametrize("tf32", [True, False])
def test_sdpa_op_routes_tf32_gpu_tensors_to_the_kernel(monkeypatch: pytest.MonkeyPatch, tf32: bool) -> None:
    from crossml.kernels import attention as kernel
    from crossml.ops.fused import scaled_dot_product_attention as op

    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", tf32)
    calls = record_calls(monkeypatch, kernel, "attention")
    q, k, v = (rand(2, 12, 128, 64, seed=i) for i in range(3))
    mask = torch.zeros(2, 1, 1, 128)
    mask[1, ..., 100:] = -10000.0
    got = op(q.cuda(), k.cuda().transpose(-1, -2), v.cuda(), mask.cuda(), scale=0.125, k_transposed=1)
    assert bool(calls) == tf32  # strict fp32 keeps torch's kernels (faster at large batches)
    want = attention_reference(q, k, v, mask, scale=0.125)
    rtol, atol = TF32_TOL if tf32 else TOL[torch.float32]
    torch.testing.assert_close(got.cpu(), want.float(), rtol=rtol, atol=atol)
    half = op(q.cuda().half(), k.cuda().half(), v.cuda().half(), mask.cuda(), scale=0.125)
    assert len(calls) == int(tf32) and half.dtype == torch.float16  # half precision keeps torch's flash kernels
