"""com.crossml GatherRows (``crossml.ops.rows``) against numpy's indexing: one position per batch row, negative
positions from the end, an empty ``rows`` handing X on untouched, and bad rows named."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from crossml.ops.rows import gather_rows


@pytest.mark.parametrize("shape", [(3, 5), (3, 5, 4), (2, 6, 2, 3)])
def test_gather_rows_matches_numpy(shape: tuple[int, ...]) -> None:
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    rows = np.array([4, 0, -1][:shape[0]], dtype=np.int64)
    y = gather_rows(torch.as_tensor(x), torch.as_tensor(rows)).numpy()
    want = x[np.arange(shape[0]), rows][:, None]
    assert y.shape == want.shape
    np.testing.assert_array_equal(y, want)


def test_empty_rows_hand_x_on() -> None:
    x = torch.randn(2, 3, 4)
    assert gather_rows(x, torch.zeros(0, dtype=torch.long)) is x


def test_bad_rows_are_named() -> None:
    x = torch.randn(2, 3, 4)
    with pytest.raises(ValueError, match=r"one position per batch row, shape \(2,\), got \(1,\)"):
        gather_rows(x, torch.zeros(1, dtype=torch.long))
    with pytest.raises(ValueError, match=r"position -4 of batch row 0 is outside \[-3, 3\)"):
        gather_rows(x, torch.tensor([-4, 0]))
    with pytest.raises(ValueError, match=r"\[batch, positions, \.\.\.\]"):
        gather_rows(torch.randn(3), torch.tensor([0, 0, 0]))


@pytest.mark.gpu
def test_gather_rows_on_the_gpu_matches_the_cpu() -> None:
    """On a GPU: the CPU's values, and zeros for a position out of range (no host sync to check it)."""
    x = torch.randn(3, 7, 16, dtype=torch.float16)
    rows = torch.tensor([6, -7, 2])
    got = gather_rows(x.cuda(), rows.cuda()).cpu()
    assert torch.equal(got, gather_rows(x, rows))
    bad = gather_rows(x.cuda(), torch.tensor([7, 0, -8], device="cuda")).cpu()
    assert torch.equal(bad[0], torch.zeros_like(bad[0])) and torch.equal(bad[2], torch.zeros_like(bad[2]))
    assert torch.equal(bad[1, 0], x[1, 0])
