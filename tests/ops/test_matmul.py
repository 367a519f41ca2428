"""Matrix products against onnxruntime / the ONNX reference: integer dtypes, Gemm variants, Einsum,
MatMulInteger zero points, Det; and the exact integer GEMM used off the CPU."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto as T
from onnx import helper
from onnx.reference import ReferenceEvaluator

import crossml
from crossml import dtypes
from crossml.ops.matmul import int_matmul


def _model(op_type: str, inputs: dict[str, np.ndarray], out_type: int, opset: int = 13, **attrs) -> onnx.ModelProto:
    vis = [helper.make_tensor_value_info(n, dtypes.onnx_type_of_numpy(v.dtype), list(v.shape)) for n, v in inputs.items()]
    node = helper.make_node(op_type, list(inputs), ["y"], **attrs)
    graph = helper.make_graph([node], "g", vis, [helper.make_tensor_value_info("y", out_type, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _crossml(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> np.ndarray:
    return crossml.InferenceSession(model.SerializeToString()).run(None, feed)[0]


def _ort(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint32, np.uint64, np.float16, np.float64])
@pytest.mark.parametrize("shapes", [((3,), (3,)), ((2, 3), (3,)), ((3,), (3, 4)), ((2, 1, 2, 3), (5, 3, 4))])
def test_matmul_dtypes_and_broadcasting(dtype: type, shapes: tuple) -> None:
    rng = np.random.default_rng(0)
    a = rng.integers(0, 7, shapes[0]).astype(dtype)
    b = rng.integers(0, 7, shapes[1]).astype(dtype)
    feed = {"a": a, "b": b}
    got = _crossml(_model("MatMul", feed, dtypes.onnx_type_of_numpy(a.dtype)), feed)
    expected = np.matmul(a, b)
    assert got.dtype == a.dtype and got.shape == expected.shape
    np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64), rtol=1e-3)


@pytest.mark.parametrize("trans", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("c_shape", [None, (), (1,), (4,), (3, 1), (3, 4)])
@pytest.mark.parametrize("opset", [7, 11, 13])
def test_gemm_variants(trans: tuple[int, int], c_shape: tuple | None, opset: int) -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal((5, 3) if trans[0] else (3, 5)).astype(np.float32)
    b = rng.standard_normal((4, 5) if trans[1] else (5, 4)).astype(np.float32)
    feed = {"a": a, "b": b}
    if c_shape is not None:
        feed["c"] = rng.standard_normal(c_shape).astype(np.float32)
    elif opset < 11:
        pytest.skip("C is required before opset 11")
    model = _model("Gemm", feed, T.FLOAT, opset, alpha=0.5, beta=2.0, transA=trans[0], transB=trans[1])
    np.testing.assert_allclose(_crossml(model, feed), _ort(model, feed), rtol=1e-5, atol=1e-5)


def test_gemm_integer_keeps_dtype() -> None:
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    b = np.arange(12, dtype=np.int32).reshape(3, 4)
    c = np.arange(4, dtype=np.int32)
    feed = {"a": a, "b": b, "c": c}
    got = _crossml(_model("Gemm", feed, T.INT32), feed)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, a @ b + c)
    got = _crossml(_model("Gemm", feed, T.INT32, alpha=2.0, beta=3.0), feed)
    np.testing.assert_array_equal(got, 2 * (a @ b) + 3 * c)


@pytest.mark.parametrize("equation,shapes", [
    ("ij,jk->ik", [(2, 3), (3, 4)]),
    ("bij, bjk -> bik", [(2, 2, 3), (2, 3, 4)]),
    ("...ii->...i", [(3, 4, 4)]),
    ("ij->", [(3, 4)]),
    ("i,i", [(5,), (5,)]),
])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float64])
def test_einsum(equation: str, shapes: list, dtype: type) -> None:
    rng = np.random.default_rng(2)
    feed = {f"x{i}": rng.integers(-3, 4, s).astype(dtype) for i, s in enumerate(shapes)}
    model = _model("Einsum", feed, dtypes.onnx_type_of_numpy(np.dtype(dtype)), 12, equation=equation)
    got = _crossml(model, feed)
    expected = ReferenceEvaluator(model).run(None, feed)[0]
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_allclose(got, expected.astype(dtype), rtol=1e-5)


@pytest.mark.parametrize("a_dtype,b_dtype", [(np.uint8, np.uint8), (np.int8, np.int8), (np.uint8, np.int8)])
@pytest.mark.parametrize("zp", ["none", "scalar", "vector"])
def test_matmul_integer(a_dtype: type, b_dtype: type, zp: str) -> None:
    rng = np.random.default_rng(3)
    a = rng.integers(-100 if a_dtype == np.int8 else 0, 120, (4, 6)).astype(a_dtype)
    b = rng.integers(-100 if b_dtype == np.int8 else 0, 120, (6, 5)).astype(b_dtype)
    feed = {"a": a, "b": b}
    if zp == "scalar":
        feed["azp"] = np.array(3, dtype=a_dtype)
        feed["bzp"] = np.array(5, dtype=b_dtype)
    elif zp == "vector":
        feed["azp"] = rng.integers(0, 9, (4,)).astype(a_dtype)
        feed["bzp"] = rng.integers(0, 9, (5,)).astype(b_dtype)
    model = _model("MatMulInteger", feed, T.INT32, 10)
    got = _crossml(model, feed)
    assert got.dtype == np.int32
    a32, b32 = a.astype(np.int32), b.astype(np.int32)
    if zp != "none":  # a 1-D zero point of A is per row (onnxruntime's CPU kernel takes scalars only)
        a32 = a32 - feed["azp"].astype(np.int32).reshape(-1, 1) if zp == "vector" else a32 - feed["azp"]
        b32 = b32 - feed["bzp"].astype(np.int32)
    np.testing.assert_array_equal(got, a32 @ b32)
    if zp != "vector":
        np.testing.assert_array_equal(got, _ort(model, feed))


def test_det_batched() -> None:
    x = np.random.default_rng(4).standard_normal((2, 3, 3, 3)).astype(np.float32)
    got = _crossml(_model("Det", {"x": x}, T.FLOAT, 11), {"x": x})
    np.testing.assert_allclose(got, np.linalg.det(x), rtol=1e-4, atol=1e-5)


def test_int_matmul_wraps_like_c() -> None:
    a = torch.tensor([[2**31 - 1, 1]], dtype=torch.int32)
    b = torch.tensor([[2], [3]], dtype=torch.int32)
    assert int_matmul(a, b).item() == np.int32(np.int64(2**31 - 1) * 2 + 3 - 2**32)


def test_matmul_rank0_is_an_error() -> None:
    feed = {"a": np.array(1.0, dtype=np.float32), "b": np.ones(3, dtype=np.float32)}
    with pytest.raises(Exception, match="rank >= 1"):
        _crossml(_model("MatMul", feed, T.FLOAT), feed)


def test_column_major_weight_rule(monkeypatch):
    """Which constant weights a GPU plan stores column-major: float32 2-D weights of MatMul / Linear / Gemm
    without transB multiplied with TF32, where the device layer says its BLAS prefers it (CUDA builds; never
    the CPU)."""
    import crossml.device.vendor as vendor
    from crossml.ops.matmul import column_major_weight

    w = torch.zeros(8, 4)
    cuda = torch.device("cuda")
    assert not column_major_weight("", "MatMul", w, torch.device("cpu"), {}, True)
    monkeypatch.setattr(vendor, "column_major_fp32_weights", lambda device: device.type == "cuda")
    assert column_major_weight("", "MatMul", w, cuda, {}, True)
    assert column_major_weight("com.crossml", "Linear", w, cuda, {}, True)
    assert column_major_weight("", "Gemm", w, cuda, {"transB": 0}, True)
    assert not column_major_weight("", "Gemm", w, cuda, {"transB": 1}, True)  # already Wᵀ row-major
    assert not column_major_weight("", "MatMul", w.half(), cuda, {}, True)  # too small for the GEMV
    assert not column_major_weight("", "MatMul", torch.zeros(2, 8, 4), cuda, {}, True)
    assert not column_major_weight("", "MatMul", torch.zeros(8, 1), cuda, {}, True)
    assert not column_major_weight("com.microsoft", "MatMulNBits", w, cuda, {}, True)
    assert not column_major_weight("", "MatMul", np.zeros((8, 4), np.float32), cuda, {}, True)
    assert not column_major_weight("", "MatMul", w, cuda, {}, False)  # strict fp32: row-major is as fast


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_decode_weights_go_column_major(dtype: torch.dtype) -> None:
    """Half-precision weights that the Triton GEMV takes at decode sizes are stored column-major on GEMV devices
    (MatMul, Linear, MatMulSkipNorm; TF32 or not), and so are vocabulary-sized ones whose K the GEMV streams; nothing
    else: the CPU, tiny weights, past the size cap with a longer K, Gemm, weights of other ops."""
    from crossml.ops.matmul import GEMV_MAX_WEIGHT, GEMV_MIN_KN, GEMV_STREAM_MAX_K, column_major_weight

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    w = torch.zeros(896, 1152, dtype=dtype)
    for domain, op_type in [("", "MatMul"), ("com.crossml", "Linear"), ("com.crossml", "MatMulSkipNorm")]:
        assert column_major_weight(domain, op_type, w, cuda, {}, True)
        assert column_major_weight(domain, op_type, w, cuda, {}, False)
        assert not column_major_weight(domain, op_type, w, cpu, {}, True)
    assert not column_major_weight("", "Gemm", w, cuda, {}, True)
    assert not column_major_weight("com.microsoft", "MatMulNBits", w, cuda, {}, True)
    assert not column_major_weight("", "MatMul", torch.zeros(GEMV_MIN_KN - 1, 1152, dtype=dtype), cuda, {}, True)
    vocab = torch.empty(896, GEMV_MAX_WEIGHT // 896 + 1, dtype=dtype, device="meta")  # an lm_head: the GEMV streams
    assert column_major_weight("", "MatMul", vocab, cuda, {}, True)
    long_k = torch.empty(GEMV_STREAM_MAX_K * 2, GEMV_MAX_WEIGHT // GEMV_STREAM_MAX_K, dtype=dtype, device="meta")
    assert not column_major_weight("", "MatMul", long_k, cuda, {}, True)  # past the cap, K too long: the vendor GEMM
    assert not column_major_weight("com.crossml", "MatMulSiluMul", vocab, cuda, {}, True)  # fused past the cap
    assert not column_major_weight("", "MatMul", torch.zeros(2, 896, 1152, dtype=dtype), cuda, {}, True)
