"""com.microsoft activations and layer norms against onnxruntime CPU."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP

from tests.ops.contrib._ort import check

RNG = np.random.default_rng(0)
F32, F16 = np.float32, np.float16


def rand(*shape, dtype=F32):
    return RNG.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("op_type", ["Gelu", "QuickGelu", "FastGelu"])
def test_unary_activation(op_type, dtype):
    tol = 1e-5 if dtype == F32 else 2e-3
    x = rand(2, 5, 16, dtype=dtype) * 3
    check(op_type, {"x": x}, [("y", TP.FLOAT if dtype == F32 else TP.FLOAT16)], atol=tol, rtol=tol)


def test_quick_gelu_alpha():
    check("QuickGelu", {"x": rand(3, 8) * 4}, [("y", TP.FLOAT)], alpha=1.3)


@pytest.mark.parametrize("dtype", [F32, F16])
def test_fast_gelu_bias(dtype):
    tol = 1e-5 if dtype == F32 else 2e-3
    check("FastGelu", {"x": rand(2, 3, 16, dtype=dtype), "b": rand(16, dtype=dtype)},
          [("y", TP.FLOAT if dtype == F32 else TP.FLOAT16)], atol=tol, rtol=tol)


def test_bias_gelu():
    check("BiasGelu", {"a": rand(2, 3, 16), "b": rand(16)}, [("y", TP.FLOAT)])


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("axis", [-1, 1])
def test_simplified_layer_norm(dtype, axis):
    tol = 1e-5 if dtype == F32 else 3e-3
    t = TP.FLOAT if dtype == F32 else TP.FLOAT16
    x = rand(2, 4, 32, dtype=dtype)
    scale = rand(*x.shape[axis:], dtype=dtype) if axis != -1 else rand(32, dtype=dtype)
    check("SimplifiedLayerNormalization", {"x": x, "s": scale}, [("y", t), ("inv", TP.FLOAT)], domain="",
          atol=tol, rtol=tol, axis=axis, epsilon=1e-6)


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(2, 5, 64), (7, 64)])
def test_skip_simplified_layer_norm(dtype, bias, shape):
    tol = 1e-5 if dtype == F32 else 3e-3
    t = TP.FLOAT if dtype == F32 else TP.FLOAT16
    ins = {"x": rand(*shape, dtype=dtype), "skip": rand(*shape, dtype=dtype), "gamma": rand(64, dtype=dtype),
           "bias": rand(64, dtype=dtype) if bias else None}
    outs = [("y", t), ("", 0), ("inv", TP.FLOAT), ("sum", t)]
    check("SkipSimplifiedLayerNormalization", ins, outs, atol=tol, rtol=tol, epsilon=1e-6)
    check("SkipSimplifiedLayerNormalization", ins, outs[:1], atol=tol, rtol=tol, epsilon=1e-6)


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("beta,bias", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("skip_shape", [(2, 5, 64), (1, 5, 64), (5, 64)])
def test_skip_layer_norm(dtype, beta, bias, skip_shape):
    tol = 1e-5 if dtype == F32 else 3e-3
    t = TP.FLOAT if dtype == F32 else TP.FLOAT16
    ins = {"x": rand(2, 5, 64, dtype=dtype), "skip": rand(*skip_shape, dtype=dtype),
           "gamma": rand(64, dtype=dtype), "beta": rand(64, dtype=dtype) if beta else None,
           "bias": rand(64, dtype=dtype) if bias else None}
    outs = [("y", t), ("mean", TP.FLOAT), ("inv", TP.FLOAT), ("sum", t)]
    check("SkipLayerNormalization", ins, outs, atol=tol, rtol=tol, epsilon=1e-5)


def test_skip_layer_norm_default_epsilon():
    ins = {"x": rand(2, 3, 32) * 1e-3, "skip": rand(2, 3, 32) * 1e-3, "gamma": rand(32)}
    check("SkipLayerNormalization", ins, [("y", TP.FLOAT)], atol=1e-4)
    check("SkipSimplifiedLayerNormalization", ins, [("y", TP.FLOAT)], atol=1e-4)


@pytest.mark.parametrize("axis", [-1, 1])
def test_layer_norm_opset1(axis):
    x = rand(2, 4, 16)
    check("LayerNormalization", {"x": x, "s": rand(*x.shape[axis:]), "b": rand(*x.shape[axis:])},
          [("y", TP.FLOAT), ("mean", TP.FLOAT), ("inv", TP.FLOAT)], domain="", axis=axis, epsilon=1e-5)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows,skip_shape", [((2, 5), (2, 5, 896)), ((2, 5), (5, 896)), ((2, 5), (1, 5, 896)),
                                             ((1, 1), (1, 1, 896))], ids=str)
def test_skip_simplified_cpu_kernel_equals_onnxruntime(rows, skip_shape, bias, monkeypatch):
    """float32 SkipSimplifiedLayerNormalization on the CPU takes numba's kernel (``crossml.kernels.cpu_norm``,
    checked with a spy), which does onnxruntime's CPU arithmetic in its order: the output and the sum equal
    onnxruntime's bit for bit."""
    pytest.importorskip("numba", reason="the CPU kernel is compiled by numba (the test extra installs it)")
    from crossml.kernels import cpu_norm

    calls = []
    real = cpu_norm.skip_rms_norm
    monkeypatch.setattr(cpu_norm, "skip_rms_norm", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    ins = {"x": rand(*rows, 896) * 3, "skip": rand(*skip_shape), "gamma": rand(896),
           "bias": rand(896) if bias else None}
    outs = [("y", TP.FLOAT), ("", 0), ("", 0), ("sum", TP.FLOAT)]
    assert check("SkipSimplifiedLayerNormalization", ins, outs, atol=0, rtol=0, epsilon=1e-6) == 0.0
    assert calls
