"""MultiHeadAttention (com.microsoft) against onnxruntime CPU."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP

from tests.ops.contrib._ort import check

RNG = np.random.default_rng(4)


def r(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("past", [False, True])
@pytest.mark.parametrize("unidirectional", [0, 1])
@pytest.mark.parametrize("mask", [None, "2d", "lengths"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_mha_self(past, unidirectional, mask, with_bias):
    B, S, N, H, P = 2, 4, 3, 8, 5
    L = P + S if past else S
    ins = {"q": r(B, S, N * H), "k": r(B, S, N * H), "v": r(B, S, N * H),
           "bias": r(3 * N * H) if with_bias else None, "mask": None, "ab": None,
           "pk": r(B, N, P, H) if past else None, "pv": r(B, N, P, H) if past else None}
    if mask == "2d":
        m = np.ones((B, L), np.int32)
        m[1, -2:] = 0
        ins["mask"] = m
    elif mask == "lengths":
        ins["mask"] = np.array([L, L - 2], np.int32)
    outs = [("out", TP.FLOAT)] + ([("present_key", TP.FLOAT), ("present_value", TP.FLOAT)] if past else [])
    check("MultiHeadAttention", ins, outs, num_heads=N, unidirectional=unidirectional, atol=1e-5)


def test_mha_attention_bias_and_scale():
    B, S, L, N, H = 2, 3, 5, 2, 8
    ins = {"q": r(B, S, N * H), "k": r(B, L, N * H), "v": r(B, L, N * H), "bias": None, "mask": None,
           "ab": r(1, N, S, L)}
    check("MultiHeadAttention", ins, [("out", TP.FLOAT)], num_heads=N, scale=0.2, atol=1e-5)


def test_mha_cross_attention_bnsh_kv():
    B, S, L, N, H = 2, 3, 6, 2, 8
    ins = {"q": r(B, S, N * H), "k": r(B, N, L, H), "v": r(B, N, L, H)}
    check("MultiHeadAttention", ins, [("out", TP.FLOAT)], num_heads=N, atol=1e-5)


def test_mha_fp16():
    B, S, N, H = 2, 5, 2, 16
    ins = {"q": r(B, S, N * H, dtype=np.float16), "k": r(B, S, N * H, dtype=np.float16),
           "v": r(B, S, N * H, dtype=np.float16)}
    check("MultiHeadAttention", ins, [("out", TP.FLOAT16)], num_heads=N, atol=3e-3, rtol=3e-3)
