"""Element-wise ops against onnx.reference.ReferenceEvaluator (or exact Python-integer results) on
the cases the ONNX node tests miss: unsigned and narrow integer types, wrapping, broadcasting,
float16/bfloat16, legacy opsets, uint64 values above 2**63."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import onnx
import pytest
import torch
from onnx.reference import ReferenceEvaluator

import crossml
from tests.ops._models import one_node_model

RNG = np.random.default_rng(7)
BF16 = np.dtype(ml_dtypes.bfloat16)

PROVIDERS = [
    pytest.param(["CPUExecutionProvider"], id="cpu"),
    pytest.param(["GPUExecutionProvider", "CPUExecutionProvider"], id="gpu",
                 marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")]),
]


def model(op_type: str, inputs: dict[str, np.ndarray | None], opset: int, n_out: int = 1,
          **attrs: object) -> onnx.ModelProto:
    return one_node_model(op_type, inputs, opset, n_out, **attrs)


def run(op_type: str, inputs: dict[str, np.ndarray | None], opset: int = 21, providers=None,
        **attrs: object) -> np.ndarray:
    m = model(op_type, inputs, opset, **attrs)
    sess = crossml.InferenceSession(m.SerializeToString(), providers=providers or ["CPUExecutionProvider"])
    return sess.run(None, {k: v for k, v in inputs.items() if v is not None})[0]


def reference(op_type: str, inputs: dict[str, np.ndarray | None], opset: int = 21, **attrs: object) -> np.ndarray:
    m = model(op_type, inputs, opset, **attrs)
    return ReferenceEvaluator(m).run(None, {k: v for k, v in inputs.items() if v is not None})[0]


def check(op_type: str, inputs: dict[str, np.ndarray | None], opset: int = 21, providers=None,
          expected: np.ndarray | None = None, rtol: float = 1e-6, atol: float = 1e-6, **attrs: object) -> None:
    got = run(op_type, inputs, opset, providers, **attrs)
    want = np.asarray(expected if expected is not None else reference(op_type, inputs, opset, **attrs))
    assert got.dtype == want.dtype, f"dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    if want.dtype.kind in "biuO":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol,
                                   equal_nan=True)


def ints(dtype, shape, lo=None, hi=None) -> np.ndarray:
    info = np.iinfo(dtype)
    lo = info.min if lo is None else lo
    hi = info.max if hi is None else hi
    return RNG.integers(lo, hi, size=shape, dtype=dtype, endpoint=True)


INT_TYPES = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]
U64 = np.uint64


# --------------------------------------------------------------------------------------------
# arithmetic


@pytest.mark.parametrize("providers", PROVIDERS)
@pytest.mark.parametrize("dtype", INT_TYPES)
@pytest.mark.parametrize("op_type", ["Add", "Sub", "Mul"])
def test_wrapping_arithmetic(op_type, dtype, providers):
    a, b = ints(dtype, (3, 4)), ints(dtype, (4,))  # broadcast, full range: wraps
    with np.errstate(over="ignore"):
        want = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}[op_type](a, b)
    check(op_type, {"a": a, "b": b}, providers=providers, expected=want)


@pytest.mark.parametrize("providers", PROVIDERS)
@pytest.mark.parametrize("dtype", INT_TYPES)
def test_integer_div_truncates(dtype, providers):
    a = ints(dtype, (5, 6))
    b = ints(dtype, (6,))
    b[b == 0] = 3
    pairs = zip(a.reshape(-1).tolist(), np.broadcast_to(b, a.shape).reshape(-1).tolist())
    want = _cast([_trunc_div(x, y) for x, y in pairs], dtype).reshape(a.shape)  # int8 -128 / -1 wraps
    check("Div", {"a": a, "b": b}, providers=providers, expected=want)


def _trunc_div(x: int, y: int) -> int:
    q = abs(x) // abs(y)
    return q if (x >= 0) == (y >= 0) else -q


def _cast(values: list[int], dtype) -> np.ndarray:
    """Python integers to ``dtype``, wrapping modulo 2**bits like C."""
    info = np.iinfo(dtype)
    mod = [v % 2**info.bits for v in values]
    return np.array([v - 2**info.bits if info.min < 0 and v > info.max else v for v in mod], dtype=dtype)


@pytest.mark.parametrize("providers", PROVIDERS)
@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", INT_TYPES)
def test_integer_mod(dtype, fmod, providers):
    a = ints(dtype, (4, 5))
    b = ints(dtype, (5,))
    b[b == 0] = 7
    pairs = zip(a.reshape(-1).tolist(), np.broadcast_to(b, a.shape).reshape(-1).tolist())
    want = [x - _trunc_div(x, y) * y if fmod else x % y for x, y in pairs]  # Python % is the fmod=0 rule
    check("Mod", {"a": a, "b": b}, providers=providers, fmod=fmod,
          expected=_cast(want, dtype).reshape(a.shape))


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_float_mod(dtype, fmod):
    a = (RNG.standard_normal((3, 4)) * 10).astype(dtype)
    b = (RNG.standard_normal((4,)) * 3).astype(dtype)
    want = np.fmod(a, b) if fmod else np.mod(a, b)
    check("Mod", {"a": a, "b": b}, fmod=fmod, expected=want, rtol=1e-2 if dtype == np.float16 else 1e-5, atol=1e-2)


@pytest.mark.parametrize("dtype", [np.float16, BF16, np.float64])
@pytest.mark.parametrize("op_type", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("providers", PROVIDERS)
def test_float_arithmetic_keeps_dtype(op_type, dtype, providers):
    a = RNG.standard_normal((2, 3, 4)).astype(dtype)
    b = (RNG.standard_normal((3, 1)) + 3).astype(dtype)
    fn = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}[op_type]
    want = fn(a.astype(np.float32), b.astype(np.float32)).astype(dtype)
    check(op_type, {"a": a, "b": b}, providers=providers, expected=want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("opset", [1, 6])
def test_legacy_broadcast_axis(opset):
    a = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    b = RNG.standard_normal((3, 4)).astype(np.float32)
    got = run("Add", {"a": a, "b": b}, opset=opset, broadcast=1, axis=1)
    np.testing.assert_allclose(got, a + b[None, :, :, None], rtol=1e-6)
    c = RNG.standard_normal((5,)).astype(np.float32)  # no axis: suffix alignment
    np.testing.assert_allclose(run("Mul", {"a": a, "b": c}, opset=opset, broadcast=1), a * c, rtol=1e-6)


def test_type_mismatch_is_reported():
    m = model("Add", {"a": np.zeros(2, np.float32), "b": np.zeros(2, np.float32)}, 14)
    m.graph.input[1].type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
    try:
        sess = crossml.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        sess.run(None, {"a": np.zeros(2, np.float32), "b": np.zeros(2, np.float64)})
    except Exception as exc:  # the loader or the op may refuse it; either must name the problem
        assert "type" in str(exc).lower()
    else:
        pytest.fail("Add of float and double was accepted")


# --------------------------------------------------------------------------------------------
# uint64 above 2**63 (int64 bit patterns would get these wrong)

BIG = np.array([2**64 - 1, 2**63, 2**63 + 12345, 10, 2**63 - 1, 0, 7], dtype=U64)
BIG_B = np.array([3, 2**63 + 1, 2**63 + 12345, 2**64 - 2, 1, 5, 2**63], dtype=U64)


@pytest.mark.parametrize("providers", PROVIDERS)
def test_uint64_division_and_mod(providers):
    a, b = [int(x) for x in BIG], [int(x) for x in BIG_B]
    check("Div", {"a": BIG, "b": BIG_B}, providers=providers,
          expected=np.array([x // y for x, y in zip(a, b)], dtype=U64))
    for fmod in (0, 1):
        check("Mod", {"a": BIG, "b": BIG_B}, providers=providers, fmod=fmod,
              expected=np.array([x % y for x, y in zip(a, b)], dtype=U64))


@pytest.mark.parametrize("providers", PROVIDERS)
@pytest.mark.parametrize("op_type", ["Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Equal"])
def test_uint64_comparisons(op_type, providers):
    check(op_type, {"a": BIG, "b": BIG_B}, providers=providers)


@pytest.mark.parametrize("providers", PROVIDERS)
def test_uint64_max_min_clip(providers):
    c = BIG_B[::-1].copy()
    check("Max", {"a": BIG, "b": BIG_B, "c": c}, providers=providers, expected=np.maximum(np.maximum(BIG, BIG_B), c))
    check("Min", {"a": BIG, "b": BIG_B, "c": c}, providers=providers, expected=np.minimum(np.minimum(BIG, BIG_B), c))
    lo, hi = np.array(2**62, U64), np.array(2**63 + 100, U64)
    check("Clip", {"x": BIG, "lo": lo, "hi": hi}, providers=providers, expected=np.clip(BIG, lo, hi))


@pytest.mark.parametrize("providers", PROVIDERS)
@pytest.mark.parametrize("dtype", INT_TYPES)
def test_comparisons_integers(dtype, providers):
    a, b = ints(dtype, (3, 4)), ints(dtype, (1, 4))
    b[0, :2] = a[0, :2]  # some ties
    for op_type in ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"):
        check(op_type, {"a": a, "b": b}, providers=providers)


@pytest.mark.parametrize("dtype", [np.float16, BF16])
def test_comparisons_half(dtype):
    a = RNG.standard_normal((3, 4)).astype(dtype)
    b = a.copy()
    b[1] = RNG.standard_normal(4).astype(dtype)
    check("Less", {"a": a, "b": b}, expected=a.astype(np.float32) < b.astype(np.float32))
    check("Equal", {"a": a, "b": b}, expected=a.astype(np.float32) == b.astype(np.float32))


def test_equal_strings():
    a = np.array(["x", "yy", "z"], dtype=object)
    b = np.array(["x", "y", "z"], dtype=object)
    check("Equal", {"a": a, "b": b}, opset=19, expected=np.array([True, False, True]))


# --------------------------------------------------------------------------------------------
# Pow


@pytest.mark.parametrize(("base", "exp"), [(np.int32, np.float32), (np.int64, np.int64), (np.float32, np.int32),
                                           (np.float16, np.float32), (np.uint8, np.int64), (np.float64, np.int64),
                                           (np.int8, np.int8)])
@pytest.mark.parametrize("providers", PROVIDERS)
def test_pow_types(base, exp, providers):
    a = np.array([[1, 2, 3], [-2, 0, 5]]).astype(base) if np.dtype(base).kind != "u" else np.array([[1, 2, 3]], base)
    b = np.array([3, 2, 1]).astype(exp)
    with np.errstate(over="ignore"):
        want = np.power(a.astype(np.float64), b.astype(np.float64)).astype(base)
    check("Pow", {"a": a, "b": b}, providers=providers, expected=want, rtol=1e-3)


def test_pow_uint64_wraps():
    a = np.array([3, 2**40], U64)
    b = np.array([41, 2], U64)
    check("Pow", {"a": a, "b": b}, expected=np.array([3**41 % 2**64, 2**80 % 2**64], U64))


# --------------------------------------------------------------------------------------------
# unary


@pytest.mark.parametrize("dtype", [np.float16, BF16, np.float64])
@pytest.mark.parametrize("op_type", ["Abs", "Neg", "Reciprocal", "Sqrt", "Exp", "Log", "Sin", "Cos", "Tan", "Asin",
                                     "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Ceil", "Floor",
                                     "Round", "Sign", "Erf"])
@pytest.mark.parametrize("providers", PROVIDERS)
def test_unary_float(op_type, dtype, providers):
    x = RNG.uniform(-0.95, 0.95, (3, 5)).astype(np.float32)
    if op_type in ("Sqrt", "Log", "Reciprocal"):
        x = np.abs(x) + 0.1
    if op_type == "Acosh":
        x = np.abs(x) + 1.0
    if op_type == "Round":
        x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 2.4, -2.6], np.float32)
    x = x.astype(dtype)
    ref_dtype = np.float64 if dtype == np.float64 else np.float32
    if op_type == "Erf":  # the reference evaluator's Erf is float32-accurate
        want = np.vectorize(math.erf)(x.astype(np.float64)).astype(dtype)
    else:
        want = reference(op_type, {"x": x.astype(ref_dtype)}).astype(dtype)
    tol = 1e-12 if dtype == np.float64 else 2e-2
    check(op_type, {"x": x}, providers=providers, expected=want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", INT_TYPES)
@pytest.mark.parametrize("providers", PROVIDERS)
def test_abs_sign_integers(dtype, providers):
    x = ints(dtype, (10,))
    if np.dtype(dtype).kind == "i":
        x[0] = np.iinfo(dtype).min
    with np.errstate(over="ignore"):
        check("Abs", {"x": x}, providers=providers, expected=np.abs(x))
    check("Sign", {"x": x}, providers=providers, expected=np.sign(x).astype(dtype))


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
def test_neg_integers(dtype):
    x = ints(dtype, (10,))
    with np.errstate(over="ignore"):
        check("Neg", {"x": x}, expected=np.negative(x))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize(("neg", "pos"), [(1, 1), (0, 1), (1, 0), (0, 0)])
@pytest.mark.parametrize("providers", PROVIDERS)
def test_isinf_isnan(dtype, neg, pos, providers):
    x = np.array([1.0, np.inf, -np.inf, np.nan, 0.0, -3.0], dtype)
    check("IsInf", {"x": x}, providers=providers, detect_negative=neg, detect_positive=pos,
          expected=(np.isposinf(x) & bool(pos)) | (np.isneginf(x) & bool(neg)))
    check("IsNaN", {"x": x}, providers=providers, expected=np.isnan(x))


@pytest.mark.parametrize("providers", PROVIDERS)
def test_isnan_float8(providers):
    x = np.array([1.0, np.nan, -2.0], np.float32).astype(ml_dtypes.float8_e4m3fn)
    check("IsNaN", {"x": x}, providers=providers, expected=np.array([False, True, False]))


# --------------------------------------------------------------------------------------------
# logical and bitwise


@pytest.mark.parametrize("opset", [1, 7])
def test_logical(opset):
    a = RNG.integers(0, 2, (3, 4)).astype(bool)
    b = RNG.integers(0, 2, (3, 4) if opset == 1 else (4,)).astype(bool)
    for op_type, fn in [("And", np.logical_and), ("Or", np.logical_or), ("Xor", np.logical_xor)]:
        check(op_type, {"a": a, "b": b}, opset=opset, expected=fn(a, b))
    check("Not", {"a": a}, expected=~a)


@pytest.mark.parametrize("providers", PROVIDERS)
@pytest.mark.parametrize("dtype", INT_TYPES)
def test_bitwise(dtype, providers):
    a, b = ints(dtype, (3, 4)), ints(dtype, (4,))
    for op_type, fn in [("BitwiseAnd", np.bitwise_and), ("BitwiseOr", np.bitwise_or),
                        ("BitwiseXor", np.bitwise_xor)]:
        check(op_type, {"a": a, "b": b}, providers=providers, expected=fn(a, b))
    check("BitwiseNot", {"a": a}, providers=providers, expected=np.invert(a))


def _shift(x: int, s: int, left: bool, bits: int, signed: bool) -> int:
    if s < 0 or s >= bits:
        return -1 if (not left and x < 0) else 0
    v = (x << s) if left else (x >> s)
    v %= 2**bits
    return v - 2**bits if signed and v >= 2 ** (bits - 1) else v


@pytest.mark.parametrize("providers", PROVIDERS)
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", INT_TYPES)
def test_bitshift(dtype, direction, providers):
    info = np.iinfo(dtype)
    x = ints(dtype, (16,))
    lo = -2 if info.min < 0 else 0
    y = RNG.integers(lo, info.bits + 2, (16,)).astype(dtype)
    y[:3] = [0, 1, info.bits - 1]
    want = [_shift(int(a), int(s), direction == "LEFT", info.bits, info.min < 0) for a, s in zip(x, y)]
    opset = 11 if info.min == 0 else 28
    check("BitShift", {"x": x, "y": y}, opset=opset, providers=providers, direction=direction,
          expected=_cast(want, dtype))


# --------------------------------------------------------------------------------------------
# variadic, Where, Clip


@pytest.mark.parametrize("providers", PROVIDERS)
@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.uint16, np.uint32, np.int64, np.float16, np.float32])
def test_variadic(dtype, providers):
    if np.dtype(dtype).kind == "f":
        xs = [RNG.standard_normal(s).astype(dtype) for s in [(2, 3, 4), (3, 1), (4,)]]
    else:
        xs = [ints(dtype, s) for s in [(2, 3, 4), (3, 1), (4,)]]
    feed = dict(zip("abc", xs))
    with np.errstate(over="ignore"):
        total = xs[0] + xs[1] + xs[2]
    tol = 1e-2 if dtype == np.float16 else 1e-6
    check("Sum", feed, providers=providers, expected=total, rtol=tol, atol=tol)
    check("Max", feed, providers=providers, expected=np.maximum(np.maximum(xs[0], xs[1]), xs[2]))
    check("Min", feed, providers=providers, expected=np.minimum(np.minimum(xs[0], xs[1]), xs[2]))
    if np.dtype(dtype).kind == "f":
        check("Mean", feed, providers=providers, rtol=tol, atol=tol,
              expected=((xs[0].astype(np.float32) + xs[1] + xs[2]) / 3).astype(dtype))
    check("Sum", {"a": xs[1]}, providers=providers, expected=xs[1])


def test_max_propagates_nan():
    a = np.array([1.0, np.nan, 3.0], np.float32)
    b = np.array([np.nan, 2.0, 1.0], np.float32)
    check("Max", {"a": a, "b": b}, expected=np.maximum(a, b))
    check("Min", {"a": a, "b": b}, expected=np.minimum(a, b))


@pytest.mark.parametrize("providers", PROVIDERS)
@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.uint64, np.int8, np.float16, BF16, np.bool_])
def test_where(dtype, providers):
    cond = RNG.integers(0, 2, (3, 1, 4)).astype(bool)
    x = RNG.integers(0, 100, (2, 4)).astype(dtype)
    y = RNG.integers(0, 100, (4,)).astype(dtype)
    check("Where", {"c": cond, "x": x, "y": y}, providers=providers, expected=np.where(cond, x, y))


def test_where_strings():
    cond = np.array([True, False])
    check("Where", {"c": cond, "x": np.array(["a", "b"], object), "y": np.array(["c", "d"], object)},
          expected=np.array(["a", "d"], object))


@pytest.mark.parametrize("providers", PROVIDERS)
@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.uint16, np.uint32, np.int64, np.float16, np.float32])
def test_clip_inputs(dtype, providers):
    x = (RNG.standard_normal((3, 4)) * 50).astype(dtype) if np.dtype(dtype).kind == "f" else ints(dtype, (3, 4))
    lo, hi = np.array(5, dtype), np.array(100, dtype)
    check("Clip", {"x": x, "lo": lo, "hi": hi}, providers=providers, expected=np.clip(x, lo, hi))
    check("Clip", {"x": x, "lo": None, "hi": hi}, providers=providers, expected=np.minimum(x, hi))
    check("Clip", {"x": x, "lo": lo}, providers=providers, expected=np.maximum(x, lo))
    check("Clip", {"x": x, "lo": hi, "hi": lo}, providers=providers,
          expected=np.full_like(x, lo))  # min > max: numpy.clip gives max everywhere


@pytest.mark.parametrize("opset", [1, 6])
def test_clip_attributes(opset):
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    check("Clip", {"x": x}, opset=opset, min=-0.5, max=0.25, expected=np.clip(x, -0.5, 0.25))
    check("Clip", {"x": x}, opset=opset, max=0.25, expected=np.minimum(x, 0.25))
