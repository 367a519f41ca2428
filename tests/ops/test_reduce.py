"""Reductions against onnx.reference.ReferenceEvaluator: dtypes, opsets, noop and empty sets."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

import crossml
from crossml import dtypes

OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
       "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]


def _model(op_type: str, x: np.ndarray, opset: int, axes: list[int] | None, **attrs) -> tuple[onnx.ModelProto, dict]:
    et = dtypes.onnx_type_of_numpy(x.dtype)
    axes_as_input = opset >= (13 if op_type == "ReduceSum" else 18)
    inputs = [helper.make_tensor_value_info("x", et, list(x.shape))]
    feed = {"x": x}
    names = ["x"]
    if axes is not None:
        if axes_as_input:
            inputs.append(helper.make_tensor_value_info("axes", onnx.TensorProto.INT64, [len(axes)]))
            feed["axes"] = np.array(axes, dtype=np.int64)
            names.append("axes")
        else:
            attrs["axes"] = axes
    node = helper.make_node(op_type, names, ["y"], **attrs)
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", et, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10), feed


def _check(op_type: str, x: np.ndarray, opset: int, axes: list[int] | None, **attrs) -> None:
    model, feed = _model(op_type, x, opset, axes, **attrs)
    expected = ReferenceEvaluator(model).run(None, feed)[0]
    if x.dtype.kind in "iu":  # the reference lets numpy widen integer sums; ONNX keeps the type
        expected = expected.astype(x.dtype)
    got = crossml.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    tol = 1e-2 if x.dtype == np.float16 else 1e-5  # numpy accumulates float16 in float16
    np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64), rtol=tol, atol=tol)


@pytest.mark.parametrize("op_type", OPS)
@pytest.mark.parametrize("opset", [11, 13, 18])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_float_axes_opsets(op_type: str, opset: int, keepdims: int) -> None:
    x = np.random.default_rng(0).uniform(0.5, 2.0, (2, 3, 4)).astype(np.float32)
    _check(op_type, x, opset, [0, -1], keepdims=keepdims)
    _check(op_type, x, opset, None, keepdims=keepdims)


@pytest.mark.parametrize("op_type", ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare",
                                     "ReduceL1"])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.int64, np.uint32, np.uint64])
def test_integer_types_keep_dtype(op_type: str, dtype: type) -> None:
    if op_type in ("ReduceMax", "ReduceMin") and dtype in (np.uint32, np.uint64):
        pytest.skip("the reference evaluator's schema check rejects these")
    x = np.random.default_rng(1).integers(0, 5, (3, 4)).astype(dtype)
    _check(op_type, x, 18, [1], keepdims=0)


def test_uint64_max_above_int64_range() -> None:
    x = np.array([[1, 2**63 + 5, 7], [2**64 - 1, 0, 3]], dtype=np.uint64)
    model, feed = _model("ReduceMax", x, 18, [1], keepdims=0)
    got = crossml.InferenceSession(model.SerializeToString()).run(None, feed)[0]
    np.testing.assert_array_equal(got, np.array([2**63 + 5, 2**64 - 1], dtype=np.uint64))


@pytest.mark.parametrize("op_type", OPS)
def test_noop_with_empty_axes(op_type: str) -> None:
    x = np.random.default_rng(2).uniform(0.5, 2.0, (2, 3)).astype(np.float32)
    _check(op_type, x, 18, [], noop_with_empty_axes=1)
    _check(op_type, x, 18, [], noop_with_empty_axes=0)


@pytest.mark.parametrize("op_type", OPS)
def test_empty_set(op_type: str) -> None:
    x = np.zeros((2, 0, 4), dtype=np.float32)
    _check(op_type, x, 18, [1], keepdims=1)


@pytest.mark.parametrize("dtype", [np.int32, np.int8])
def test_integer_max_of_empty_set_is_type_min(dtype: type) -> None:
    x = np.zeros((2, 0), dtype=dtype)
    model, feed = _model("ReduceMax", x, 18, [1], keepdims=0)
    got = crossml.InferenceSession(model.SerializeToString()).run(None, feed)[0]
    np.testing.assert_array_equal(got, np.full((2,), np.iinfo(dtype).min, dtype=dtype))


def test_bool_max_min_opset20() -> None:
    x = np.array([[True, False], [False, False]])
    _check("ReduceMax", x, 20, [1], keepdims=0)
    _check("ReduceMin", x, 20, [0], keepdims=1)


def test_float16_sum() -> None:
    x = np.random.default_rng(3).uniform(-1, 1, (4, 64)).astype(np.float16)
    _check("ReduceSum", x, 13, [1])
    _check("ReduceMean", x, 18, [0])


def test_axis_out_of_range_is_an_error() -> None:
    x = np.ones((2, 3), dtype=np.float32)
    model, feed = _model("ReduceSum", x, 13, [2])
    with pytest.raises(Exception, match="axis 2 is out of range"):
        crossml.InferenceSession(model.SerializeToString()).run(None, feed)
