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


@pytest.mark.parametrize("B", [1, 2], ids=["decode", "batch-decode"])
def test_rotary_one_position_one_token(B):
    """A decode step's one-element position (p0 for every row: no arange on the way): onnxruntime's values
    (onnxruntime takes [B, S] or a 1-D first position)."""
    x = RNG.standard_normal((B, 1, 4 * 32)).astype(np.float32)
    cos, sin = caches(64, 16, np.float32)
    for pos in (np.array([9], np.int64), *([np.array([[9]], np.int64)] if B == 1 else [])):
        check("RotaryEmbedding", {"x": x, "pos": pos, "cos": cos, "sin": sin}, [("y", TP.FLOAT)], num_heads=4)


def test_rotary_no_num_heads():
    """num_heads 0: head size from the cos cache (what the builder emits for full rotation)."""
    x = RNG.standard_normal((1, 4, 64)).astype(np.float32)
    cos, sin = caches(16, 16, np.float32)
    check("RotaryEmbedding", {"x": x, "pos": np.arange(4, dtype=np.int64).reshape(1, 4), "cos": cos, "sin": sin},
          [("y", TP.FLOAT)])


@pytest.mark.parametrize("layout", [0, 1], ids=["sectioned", "interleaved-streams"])
@pytest.mark.parametrize("section,rot", [([2, 3, 3], 0), ([4, 2, 2], 0), ([1, 1, 0], 4)],
                         ids=["qwen2vl", "uneven", "partial"])
@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("layout_x", ["bsd", "bnsh"])
def test_m_rotary(layout, section, rot, interleaved, layout_x):
    """com.microsoft MRotaryEmbedding: three position streams picking the frequencies of their sections."""
    B, S, N, H = 2, 5, 3, 16
    half = (rot or H) // 2
    x = RNG.standard_normal((B, S, N * H) if layout_x == "bsd" else (B, N, S, H)).astype(np.float32)
    pos = RNG.integers(0, 30, size=(3, B, S)).astype(np.int64)
    cos, sin = (RNG.standard_normal((32, half)).astype(np.float32) for _ in range(2))
    attrs = {"mrope_section": section, "mrope_layout": layout, "interleaved": interleaved, "num_heads": N}
    if rot:
        attrs["rotary_embedding_dim"] = rot
    check("MRotaryEmbedding", {"x": x, "pos": pos, "cos": cos, "sin": sin}, [("y", TP.FLOAT)], **attrs)


def test_m_rotary_text_positions_are_rotary_embedding():
    """Equal position streams (text tokens) give RotaryEmbedding's values."""
    x = RNG.standard_normal((1, 4, 2 * 16)).astype(np.float32)
    pos = np.arange(4, dtype=np.int64).reshape(1, 4)
    cos, sin = caches(16, 8, np.float32)
    from tests.ops.contrib._ort import run_both, single_node_model

    m, feeds = single_node_model("MRotaryEmbedding", {"x": x, "pos": np.stack([pos] * 3), "cos": cos, "sin": sin},
                                 [("y", TP.FLOAT)], mrope_section=[2, 3, 3], num_heads=2)
    _, got = run_both(m, feeds)
    r, feeds = single_node_model("RotaryEmbedding", {"x": x, "pos": pos, "cos": cos, "sin": sin}, [("y", TP.FLOAT)],
                                 num_heads=2)
    _, want = run_both(r, feeds)
    np.testing.assert_array_equal(got[0], want[0])


@pytest.mark.parametrize("attrs,needle", [({"mrope_section": [2, 2, 2]}, "adding up to"),
                                          ({"mrope_section": [2, 3, 3], "mrope_layout": 2}, "mrope_layout"),
                                          ({"mrope_section": [2, 3, 3], "is_packed_batching": 1}, "is_packed")])
def test_m_rotary_errors(attrs, needle):
    import crossml
    from tests.ops.contrib._ort import single_node_model

    x = RNG.standard_normal((1, 3, 16)).astype(np.float32)
    cos, sin = caches(8, 8, np.float32)
    m, feeds = single_node_model("MRotaryEmbedding", {"x": x, "pos": np.zeros((3, 1, 3), np.int64), "cos": cos,
                                                      "sin": sin}, [("y", TP.FLOAT)], **attrs)
    with pytest.raises(Exception, match=needle):
        crossml.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
