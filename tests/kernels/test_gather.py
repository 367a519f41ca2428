"""The Triton Gather (crossml.kernels.gather) against numpy's take: negative indices, out-of-range indices
(rows of zeros, as onnxruntime's CUDA Gather), every axis, index shapes including a scalar, and element
types copied bit for bit. CPU cases run in Triton's interpreter; ``gpu`` cases compile, and also check that
the Gather op routes GPU tensors to the kernel."""

from __future__ import annotations

import os

import numpy as np
import torch

if not torch.cuda.is_available():  # before triton's first import: interpret the kernels on the CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from crossml.kernels.gather import gather, supported  # noqa: E402
from tests.kernels._common import DEVICES, record_calls  # noqa: E402


def _expected(data: np.ndarray, idx: np.ndarray, axis: int) -> np.ndarray:
    """numpy take with ONNX's negative indices, zeros for indices outside [-size, size)."""
    size = data.shape[axis]
    wrapped = np.where(idx < 0, idx + size, idx)
    inside = (wrapped >= 0) & (wrapped < size)
    out = np.take(data, np.where(inside, wrapped, 0), axis=axis)
    shape = [1] * out.ndim
    shape[axis:axis + idx.ndim] = idx.shape
    return np.where(inside.reshape(shape), out, np.zeros((), dtype=data.dtype))


CASES = {  # name: data shape, axis, indices
    "embedding-row": ((50, 24), 0, np.array([[7]])),
    "negative": ((50, 24), 0, np.array([-1, 0, -50, 49])),
    "out-of-range": ((10, 8), 0, np.array([10, -11, 3, 1000])),
    "middle-axis": ((3, 9, 5), 1, np.array([[2, -2], [0, 8]])),
    "last-axis": ((4, 6), 1, np.array([5, -6, 1])),
    "scalar-index": ((6, 3, 2), 0, np.array(-2)),
    "wide-rows": ((4, 2500), 0, np.array([3, 1])),  # more than one chunk per row
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype", [torch.float16, torch.int64, torch.uint8])
def test_gather_matches_take(device: str, case: str, dtype: torch.dtype) -> None:
    shape, axis, idx = CASES[case]
    g = torch.Generator().manual_seed(len(case))
    data = (torch.randn(shape, generator=g) * 50).to(dtype)
    for idx_dtype in (torch.int64, torch.int32):
        got = gather(data.to(device), torch.as_tensor(idx, dtype=idx_dtype).to(device), axis)
        want = _expected(data.numpy(), idx, axis)
        assert tuple(got.shape) == want.shape
        np.testing.assert_array_equal(got.cpu().numpy(), want, err_msg=f"{case} {idx_dtype}")


@pytest.mark.parametrize("device", DEVICES)
def test_gather_reads_strided_data_in_place(device: str) -> None:
    """A transposed table (a tied embedding is the output projection's transpose) is read through its strides,
    not copied; a layout that cannot be viewed as [outer, size, inner] is refused (the op then uses torch)."""
    table = torch.randn(24, 50).to(device)
    emb = table.t()  # [50, 24], strides (1, 50)
    idx = np.array([[3, -1], [49, 0]])
    got = gather(emb, torch.as_tensor(idx).to(device), 0)
    np.testing.assert_array_equal(got.cpu().numpy(), _expected(emb.cpu().numpy(), idx, 0))
    odd = torch.randn(4, 6, 5).to(device).permute(0, 2, 1)  # axis 0, inner dims (5, 6) not mergeable
    assert not supported(odd, torch.tensor([1], device=device), 0)
    assert supported(odd, torch.tensor([1], device=device), 1)


@pytest.mark.parametrize("device", DEVICES)
def test_gather_empty_axis_and_empty_indices(device: str) -> None:
    data = torch.zeros((3, 0, 2), device=device)
    assert tuple(gather(data, torch.tensor([0, -1], device=device), 1).shape) == (3, 2, 2)
    assert not gather(torch.ones((2, 0), device=device).t().contiguous(), torch.tensor([1], device=device),
                      0).any()
    assert tuple(gather(torch.ones((4, 3), device=device), torch.zeros((0,), dtype=torch.long, device=device),
                        0).shape) == (0, 3)


def test_gather_refuses_what_it_does_not_take() -> None:
    data = torch.zeros(4, 3)
    assert not supported(data, torch.zeros(2), 0)  # float indices
    assert not supported(data.bool(), torch.zeros(2, dtype=torch.long), 0)  # callers view bool as uint8
    assert not supported(torch.zeros(70000, 1, 1), torch.zeros(1, dtype=torch.long), 1)  # outer beyond the grid
    with pytest.raises(ValueError, match="use the registered op"):
        gather(data, torch.zeros(2), 0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: the op routes only GPU tensors to the kernel")
def test_gather_op_routes_gpu_tensors_to_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    from crossml.kernels import gather as kernel
    from crossml.ops.indexing import gather as gather_op

    calls = record_calls(monkeypatch, kernel, "gather")
    data = torch.randn(30, 16, dtype=torch.float16)
    idx = torch.tensor([[3, -1], [29, 0]])
    got = gather_op(data.cuda(), idx.cuda(), axis=0)
    assert calls and torch.equal(got.cpu(), gather_op(data, idx, axis=0))
    bools = torch.rand(5, 4) > 0.5
    assert torch.equal(gather_op(bools.cuda(), idx.cuda() % 5, axis=0).cpu(), gather_op(bools, idx % 5, axis=0))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(3, 7, 24), (2, 5), (2, 4, 3, 700)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.int64])
def test_gather_rows_matches_indexing(device: str, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    """gather_rows (com.crossml GatherRows' kernel): one position per batch row, negative ones from the end, zeros
    outside [-positions, positions)."""
    from crossml.kernels.gather import gather_rows

    data = (torch.randn(shape, generator=torch.Generator().manual_seed(1)) * 50).to(dtype)
    n = shape[1]
    rows = np.array([n - 1, -n, n, -n - 1, 0][:shape[0]])
    for rows_dtype in (torch.int64, torch.int32):
        got = gather_rows(data.to(device), torch.as_tensor(rows, dtype=rows_dtype).to(device))
        wrapped = np.where(rows < 0, rows + n, rows)
        inside = (wrapped >= 0) & (wrapped < n)
        want = data.numpy()[np.arange(shape[0]), np.where(inside, wrapped, 0)][:, None]
        want[~inside] = 0
        assert tuple(got.shape) == want.shape
        np.testing.assert_array_equal(got.cpu().numpy(), want)


@pytest.mark.parametrize("device", DEVICES)
def test_gather_rows_refuses_what_it_does_not_take(device: str) -> None:
    from crossml.kernels.gather import gather_rows

    x = torch.randn(2, 3, 4, device=device)
    rows = torch.tensor([0, 1], device=device)
    assert gather_rows(x.to(torch.complex64), rows) is None
    assert gather_rows(x, rows.float()) is None
    assert gather_rows(torch.randn(2, 3, 4, 5, device=device).transpose(2, 3), rows) is None  # not [b, s, inner]
    strided = torch.randn(4, 3, 2, device=device).transpose(0, 1)  # [3, 4, 2] read through its strides
    got = gather_rows(strided, torch.tensor([3, 0, -1], device=device))
    assert torch.equal(got[:, 0], strided[torch.arange(3), torch.tensor([3, 0, 3])])
