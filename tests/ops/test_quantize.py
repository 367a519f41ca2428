"""Quantization ops against the ONNX reference and onnxruntime: per-axis and blocked scales,
int16 / int4 targets, DynamicQuantizeLinear, QLinearConv and ConvInteger with padding."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper
from onnx.reference import ReferenceEvaluator

import crossml
from crossml import dtypes


def _model(op_type: str, feed: dict[str, np.ndarray], out_types: list[int], opset: int, **attrs) -> onnx.ModelProto:
    vis = [helper.make_tensor_value_info(n, dtypes.onnx_type_of_numpy(v.dtype), list(v.shape)) for n, v in feed.items()]
    outs = [f"y{i}" for i in range(len(out_types))]
    node = helper.make_node(op_type, list(feed), outs, **attrs)
    graph = helper.make_graph([node], "g", vis, [helper.make_tensor_value_info(o, t, None) for o, t in zip(outs, out_types)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _crossml(model: onnx.ModelProto, feed: dict) -> list[np.ndarray]:
    return crossml.InferenceSession(model.SerializeToString()).run(None, feed)


def _ort(model: onnx.ModelProto, feed: dict) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)


@pytest.mark.parametrize("zp_dtype", [np.uint8, np.int8, np.int16, np.uint16])
@pytest.mark.parametrize("mode", ["tensor", "axis", "block"])
def test_quantize_dequantize_round_trip_vs_reference(zp_dtype: type, mode: str) -> None:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((4, 6)) * 50).astype(np.float32)
    if mode == "tensor":
        scale, zp, attrs = np.array(0.7, np.float32), np.array(3, zp_dtype), {}
    elif mode == "axis":
        scale, zp, attrs = rng.uniform(0.2, 1, (6,)).astype(np.float32), np.arange(6).astype(zp_dtype), {"axis": 1}
    else:
        scale = rng.uniform(0.2, 1, (4, 2)).astype(np.float32)
        zp, attrs = np.ones((4, 2), zp_dtype), {"axis": 1, "block_size": 4}
    feed = {"x": x, "scale": scale, "zp": zp}
    qt = dtypes.onnx_type_of_numpy(np.dtype(zp_dtype))
    q_model = _model("QuantizeLinear", feed, [qt], 21, **attrs)
    q = _crossml(q_model, feed)[0]
    expected = ReferenceEvaluator(q_model).run(None, feed)[0]
    assert q.dtype == expected.dtype
    np.testing.assert_array_equal(q, expected)
    d_feed = {"q": q, "scale": scale, "zp": zp}
    d_model = _model("DequantizeLinear", d_feed, [T.FLOAT], 21, **attrs)
    np.testing.assert_allclose(_crossml(d_model, d_feed)[0], ReferenceEvaluator(d_model).run(None, d_feed)[0],
                               rtol=1e-6)


def test_quantize_int4_uses_the_declared_output_type() -> None:
    x = np.array([-20, -8.4, -1, 0, 1.5, 2.5, 6.9, 30], dtype=np.float32)
    scale = np.array(1.0, np.float32)
    zp = helper.make_tensor("zp", T.INT4, [], [0])
    node = helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", T.FLOAT, [8]),
                                            helper.make_tensor_value_info("scale", T.FLOAT, [])],
                              [helper.make_tensor_value_info("y", T.INT4, [8])], initializer=[zp])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    got = _crossml(model, {"x": x, "scale": scale})[0]
    np.testing.assert_array_equal(got.astype(np.int8), [-8, -8, -1, 0, 2, 2, 7, 7])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dynamic_quantize_linear_vs_onnxruntime(seed: int) -> None:
    x = (np.random.default_rng(seed).standard_normal((3, 5)) * (seed + 1)).astype(np.float32)
    if seed == 2:
        x = np.abs(x)  # min clamps to 0
    model = _model("DynamicQuantizeLinear", {"x": x}, [T.UINT8, T.FLOAT, T.UINT8], 11)
    for g, e in zip(_crossml(model, {"x": x}), _ort(model, {"x": x})):
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=1e-6)


@pytest.mark.parametrize("attrs", [{}, {"pads": [1, 0, 2, 1]}, {"strides": [2, 2], "auto_pad": "SAME_UPPER"},
                                   {"dilations": [2, 1], "group": 2}])
@pytest.mark.parametrize("per_channel", [False, True])
def test_qlinear_conv_vs_onnxruntime(attrs: dict, per_channel: bool) -> None:
    rng = np.random.default_rng(3)
    x = rng.integers(0, 255, (1, 4, 7, 6)).astype(np.uint8)
    w = rng.integers(-100, 100, (6, 4 // attrs.get("group", 1), 3, 2)).astype(np.int8)
    w_scale = rng.uniform(0.001, 0.01, (6,) if per_channel else ()).astype(np.float32)
    feed = {"x": x, "x_scale": np.array(0.05, np.float32), "x_zp": np.array(120, np.uint8), "w": w,
            "w_scale": w_scale, "w_zp": np.zeros((6,) if per_channel else (), np.int8),
            "y_scale": np.array(0.3, np.float32), "y_zp": np.array(100, np.uint8),
            "b": rng.integers(-500, 500, (6,)).astype(np.int32)}
    model = _model("QLinearConv", feed, [T.UINT8], 10, **attrs)
    got = _crossml(model, feed)[0]
    np.testing.assert_array_equal(got, ReferenceEvaluator(model).run(None, feed)[0])
    # onnxruntime's x86 u8s8 kernel saturates int16 pair sums (u8 * s8 * 2 > 32767): compare on small weights
    feed["w"] = (w // 4).astype(np.int8)
    np.testing.assert_array_equal(_crossml(model, feed)[0], _ort(model, feed)[0])


def test_conv_integer_vs_onnxruntime() -> None:
    rng = np.random.default_rng(4)
    feed = {"x": rng.integers(0, 255, (2, 3, 5, 5)).astype(np.uint8),
            "w": rng.integers(0, 255, (4, 3, 3, 3)).astype(np.uint8),
            "x_zp": np.array(128, np.uint8), "w_zp": np.array(3, np.uint8)}
    model = _model("ConvInteger", feed, [T.INT32], 10, pads=[1, 1, 1, 1])
    got = _crossml(model, feed)[0]
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, _ort(model, feed)[0])


def test_qlinear_matmul_per_row_and_column_scales() -> None:
    rng = np.random.default_rng(5)
    feed = {"a": rng.integers(0, 255, (3, 4)).astype(np.uint8), "a_scale": np.array(0.02, np.float32),
            "a_zp": np.array(128, np.uint8), "b": rng.integers(0, 255, (4, 5)).astype(np.uint8),
            "b_scale": np.array(0.03, np.float32), "b_zp": np.array(120, np.uint8),
            "y_scale": np.array(0.1, np.float32), "y_zp": np.array(10, np.uint8)}
    model = _model("QLinearMatMul", feed, [T.UINT8], 10)
    np.testing.assert_array_equal(_crossml(model, feed)[0], _ort(model, feed)[0])


def test_bad_per_axis_scale_is_an_error() -> None:
    feed = {"x": np.ones((2, 3), np.float32), "scale": np.ones((2,), np.float32), "zp": np.zeros((2,), np.uint8)}
    with pytest.raises(Exception, match="per-axis"):
        _crossml(_model("QuantizeLinear", feed, [T.UINT8], 13, axis=1), feed)
