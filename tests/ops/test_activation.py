"""Activation ops against onnx.reference.ReferenceEvaluator (or numpy formulas) on the cases the ONNX
node tests miss: float16/bfloat16/float64, integer Relu/PRelu/Shrink, opset < 13 Softmax-family
coercion to 2-D, Hardmax ties, PRelu's per-channel slope before opset 7."""

from __future__ import annotations

import math

import numpy as np
import onnxruntime as ort
import pytest

from tests.ops.test_elementwise import BF16, PROVIDERS, check, ints, model, reference

RNG = np.random.default_rng(11)
HALF = [np.float16, BF16]


def tol(dtype) -> float:
    return {np.dtype(np.float16): 5e-3, BF16: 3e-2}.get(np.dtype(dtype), 1e-5)


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


UNARY = {
    "Relu": ({}, lambda x: np.maximum(x, 0)),
    "LeakyRelu": ({"alpha": 0.1}, lambda x: np.where(x >= 0, x, 0.1 * x)),
    "Elu": ({"alpha": 0.7}, lambda x: np.where(x > 0, x, 0.7 * np.expm1(x))),
    "Selu": ({}, lambda x: 1.0507009873554805 * np.where(x > 0, x, 1.6732632423543772 * np.expm1(x))),
    "Celu": ({"alpha": 2.0}, lambda x: np.maximum(x, 0) + np.minimum(0, 2.0 * np.expm1(x / 2.0))),
    "ThresholdedRelu": ({"alpha": 0.3}, lambda x: np.where(x > 0.3, x, 0)),
    "HardSigmoid": ({"alpha": 0.3, "beta": 0.4}, lambda x: np.clip(0.3 * x + 0.4, 0, 1)),
    "HardSwish": ({}, lambda x: x * np.clip(x / 6 + 0.5, 0, 1)),
    "Sigmoid": ({}, _sigmoid),
    "Tanh": ({}, np.tanh),
    "Softplus": ({}, lambda x: np.log1p(np.exp(x))),
    "Softsign": ({}, lambda x: x / (1 + np.abs(x))),
    "Mish": ({}, lambda x: x * np.tanh(np.log1p(np.exp(x)))),
    "Swish": ({"alpha": 1.5}, lambda x: x * _sigmoid(1.5 * x)),
    "Gelu": ({}, lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))),
    "Shrink": ({"bias": 0.2, "lambd": 0.4}, lambda x: np.where(x < -0.4, x + 0.2, np.where(x > 0.4, x - 0.2, 0))),
}


@pytest.mark.parametrize("providers", PROVIDERS)
@pytest.mark.parametrize("dtype", [np.float16, BF16, np.float32, np.float64])
@pytest.mark.parametrize("op_type", sorted(UNARY))
def test_unary_activation(op_type, dtype, providers):
    attrs, fn = UNARY[op_type]
    x = (RNG.standard_normal((3, 7)) * 3).astype(dtype)
    want = fn(x.astype(np.float64)).astype(dtype)
    t = tol(dtype)
    check(op_type, {"x": x}, opset=24, providers=providers, expected=want, rtol=t, atol=t, **attrs)


@pytest.mark.parametrize("providers", PROVIDERS)
def test_gelu_tanh(providers):
    x = (RNG.standard_normal((4, 5)) * 3).astype(np.float32)
    want = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    check("Gelu", {"x": x}, providers=providers, opset=20, approximate="tanh", expected=want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opset", [1, 6])
def test_legacy_opsets(opset):
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    for op_type in ("Relu", "Sigmoid", "Tanh", "LeakyRelu", "Elu", "Selu", "HardSigmoid"):
        check(op_type, {"x": x}, opset=opset, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64])
@pytest.mark.parametrize("providers", PROVIDERS)
def test_relu_integers(dtype, providers):
    x = ints(dtype, (20,))
    check("Relu", {"x": x}, providers=providers, opset=14, expected=np.maximum(x, 0))


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.float16])
@pytest.mark.parametrize("providers", PROVIDERS)
def test_shrink_dtypes(dtype, providers):
    x = np.arange(-6, 7).astype(dtype) if np.dtype(dtype).kind != "u" else np.arange(0, 13).astype(dtype)
    check("Shrink", {"x": x}, providers=providers, opset=9, bias=1.5, lambd=2.0)


@pytest.mark.parametrize("providers", PROVIDERS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int64, np.uint32, np.uint64])
def test_prelu_broadcast(dtype, providers):
    if np.dtype(dtype).kind == "f":
        x = RNG.standard_normal((2, 3, 4)).astype(dtype)
        slope = RNG.standard_normal((3, 1)).astype(dtype)
    else:
        x = ints(dtype, (2, 3, 4), -1000 if np.dtype(dtype).kind == "i" else 0, 1000)
        slope = ints(dtype, (3, 1), 0, 5)
    want = np.where(x < 0, x * slope, x).astype(dtype)
    check("PRelu", {"x": x, "slope": slope}, opset=16, providers=providers, expected=want, rtol=tol(dtype))


@pytest.mark.parametrize("opset", [1, 6])
def test_prelu_per_channel_legacy(opset):
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    slope = np.array([0.1, 0.2, 0.3], np.float32)
    want = np.where(x < 0, x * slope[None, :, None, None], x)
    check("PRelu", {"x": x, "slope": slope}, opset=opset, expected=want)


# --------------------------------------------------------------------------------------------
# Softmax family

SOFTMAX = ["Softmax", "LogSoftmax", "Hardmax"]


def ort_reference(op_type: str, x: np.ndarray, opset: int, **attrs: object) -> np.ndarray:
    """onnxruntime CPU (the reference evaluator applies opset < 13 Softmax along one axis, not 2-D)."""
    m = model(op_type, {"x": x}, opset, **attrs)
    m.ir_version = 7
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.mark.parametrize("providers", PROVIDERS)
@pytest.mark.parametrize("op_type", SOFTMAX)
@pytest.mark.parametrize("opset", [1, 11, 13])
@pytest.mark.parametrize("axis", [None, 0, 1, 2, -1, -3])
def test_softmax_family(op_type, opset, axis, providers):
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    x[0, 0, :2] = 5.0  # a tie for Hardmax: the first maximum wins
    attrs = {} if axis is None else {"axis": axis}
    want = ort_reference(op_type, x, opset, **attrs)
    check(op_type, {"x": x}, opset=opset, providers=providers, expected=want, rtol=1e-5, atol=1e-6, **attrs)


@pytest.mark.parametrize("op_type", SOFTMAX)
def test_opset11_coerces_to_2d(op_type):
    """Opset < 13 normalizes over all dims from axis on, not along one axis."""
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    got = ort_reference(op_type, x, 11, axis=1)
    check(op_type, {"x": x}, opset=11, axis=1, expected=got, rtol=1e-5, atol=1e-6)
    if op_type != "Hardmax":
        rows = np.exp(got.reshape(2, 12)) if op_type == "LogSoftmax" else got.reshape(2, 12)
        np.testing.assert_allclose(rows.sum(axis=1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("dtype", [np.float16, BF16, np.float64])
@pytest.mark.parametrize("op_type", SOFTMAX)
@pytest.mark.parametrize("providers", PROVIDERS)
def test_softmax_family_dtypes(op_type, dtype, providers):
    x = RNG.standard_normal((3, 5)).astype(dtype)
    want = reference(op_type, {"x": x.astype(np.float64)}, opset=13).astype(dtype)
    check(op_type, {"x": x}, providers=providers, opset=13, expected=want, rtol=tol(dtype), atol=tol(dtype))


def test_hardmax_empty():
    x = np.zeros((2, 0), np.float32)
    check("Hardmax", {"x": x}, opset=13, expected=x)
