"""The Triton row sum + offset + cast (crossml.kernels.sum_cast) against the ops it replaces (ReduceSum over the
last axis with keepdims, Sub / Add of a constant, Cast), in torch. CPU cases run in Triton's interpreter; ``gpu``
cases compile, and check that the SumCast op routes GPU tensors to the kernel."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before triton's first import: interpret the kernels on the CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from crossml.kernels.sum_cast import sum_cast  # noqa: E402
from tests.kernels._common import DEVICES, record_calls  # noqa: E402


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(1, 800), (3, 5), (2, 3, 2500), (4, 1), (2, 0)])
@pytest.mark.parametrize("dtypes", [(torch.int64, torch.int32), (torch.int32, torch.int64), (torch.int64,) * 2])
@pytest.mark.parametrize("offset", [-1, 0, 1, 7])
@pytest.mark.parametrize("keepdim", [True, False])
def test_sum_cast_matches_reduce_sub_cast(device: str, shape: tuple[int, ...], dtypes: tuple[torch.dtype, ...],
                                          offset: int, keepdim: bool) -> None:
    src, dst = dtypes
    g = torch.Generator().manual_seed(len(shape) + offset)
    x = torch.randint(-3, 4, shape, generator=g).to(src)
    want = (x.sum(-1, keepdim=keepdim, dtype=src) + torch.tensor(offset, dtype=src)).to(dst)
    got = sum_cast(x.to(device), offset, dst, keepdim)
    assert got.dtype == dst and tuple(got.shape) == tuple(want.shape)
    assert torch.equal(got.cpu(), want)


def test_sum_cast_rejects_other_types() -> None:
    with pytest.raises(ValueError, match="int32/int64 tensors of rank >= 1"):
        sum_cast(torch.zeros(2, 3), 0, torch.int32)
    with pytest.raises(ValueError, match="int32/int64 tensors of rank >= 1"):
        sum_cast(torch.tensor(3), 0, torch.int32)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: the op routes only GPU tensors to the kernel")
def test_sum_cast_op_routes_gpu_tensors_to_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    from onnx import TensorProto

    from crossml.kernels import sum_cast as kernel
    from crossml.ops.fused import sum_cast as op

    calls = record_calls(monkeypatch, kernel, "sum_cast")
    mask = torch.ones(2, 600, dtype=torch.int64)
    mask[1, 400:] = 0
    got = op(mask.cuda(), offset=-1, to=TensorProto.INT32, keepdims=0)
    assert calls and got.cpu().tolist() == [599, 399]
    assert torch.equal(op(mask, offset=-1, to=TensorProto.INT32, keepdims=0), got.cpu())
