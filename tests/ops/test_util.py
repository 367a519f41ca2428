"""Helpers of the op library (crossml.ops._util)."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest
import torch

from crossml.ops._util import broadcast_shapes

SHAPES = [(), (0,), (1,), (3,), (2, 1), (1, 3), (2, 3), (0, 3), (4, 1, 1), (4, 2, 3), (2, 0)]


@pytest.mark.parametrize(("a", "b"), list(itertools.product(SHAPES, repeat=2)))
def test_broadcast_shapes_is_torchs(a: tuple[int, ...], b: tuple[int, ...]) -> None:
    try:
        want = torch.broadcast_shapes(a, b)
    except RuntimeError:
        with pytest.raises(RuntimeError, match="cannot be broadcast"):
            broadcast_shapes(a, b)
        return
    assert broadcast_shapes(a, b) == want and broadcast_shapes(a, b, (1,) * len(want)) == want


def test_broadcast_shapes_imports_no_sympy() -> None:
    """torch.broadcast_shapes imports torch's symbolic shapes (and sympy) on its first call; ours does not."""
    code = ("import sys; from crossml.ops._util import broadcast_shapes; broadcast_shapes((2, 1), (3,)); "
            "print('sympy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
