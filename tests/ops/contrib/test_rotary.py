"""com.microsoft RotaryEmbedding against onnxruntime CPU."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP

from tests.ops.contrib._ort import check

RNG = np.random.default_rng(2)


def caches(max_pos, half, dtype):
    inv = 1.0 / (10000 ** (np.arange(half) / half))
    ang = np.arange(max_pos)[:, None] * inv[None, :]
    return np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("layout", ["bsd", "bnsh"])
@pytest.mark.parametrize("pos_kind", ["2d", "scalar"])
@pytest.mark.parametrize("partial", [False, True])
def test_rotary(dtype, interleaved, layout, pos_kind, partial):
    B, S, N, H = 2, 5, 3, 32
    rot = 16 if partial else H
    x = RNG.standard_normal((B, S, N * H) if layout == "bsd" else (B, N, S, H)).astype(dtype)
    pos = RNG.integers(0, 40, size=(B, S)).astype(np.int64) if pos_kind == "2d" else np.array([7], np.int64)
    cos, sin = caches(64, rot // 2, dtype)
    attrs = {"interleaved": interleaved}
    if partial:
        attrs.update(num_heads=N, rotary_embedding_dim=rot)
    elif layout == "bsd":
        attrs["num_heads"] = N
    tol = 1e-5 if dtype == np.float32 else 2e-3
    t = TP.FLOAT if dtype == np.float32 else TP.FLOAT16
    check("RotaryEmbedding", {"x": x, "pos": pos, "cos": cos, "sin": sin}, [("y", t)], atol=tol, rtol=tol, **attrs)


def test_rotary_no_num_heads():
    """num_heads 0: head size from the cos cache (what the builder emits for full rotation)."""
    x = RNG.standard_normal((1, 4, 64)).astype(np.float32)
    cos, sin = caches(16, 16, np.float32)
    check("RotaryEmbedding", {"x": x, "pos": np.arange(4, dtype=np.int64).reshape(1, 4), "cos": cos, "sin": sin},
          [("y", TP.FLOAT)])
