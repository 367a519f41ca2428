"""Cast / CastLike / BitCast: narrow float and sub-byte conversions against ml_dtypes and the ONNX
helpers, string conversions against onnxruntime."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto as T
from onnx import helper
from onnx.numpy_helper import saturate_cast, to_float8e8m0

import crossml
from crossml import dtypes
from crossml.ops.cast import cast, cast_to, float_to_fp4, fp4_to_float
from crossml.ops.registry import OpContext

WIDE = np.concatenate([
    np.random.default_rng(0).standard_normal(200) * 10.0 ** np.random.default_rng(1).integers(-8, 8, 200),
    [0.0, -0.0, np.nan, np.inf, -np.inf, 448, 464, 465, 480, 57344, 61440, 61441, 240, 248, 1e-7],
]).astype(np.float32)

F8 = {T.FLOAT8E4M3FN: ml_dtypes.float8_e4m3fn, T.FLOAT8E4M3FNUZ: ml_dtypes.float8_e4m3fnuz,
      T.FLOAT8E5M2: ml_dtypes.float8_e5m2, T.FLOAT8E5M2FNUZ: ml_dtypes.float8_e5m2fnuz}


def _same_floats(got: np.ndarray, expected: np.ndarray) -> None:
    np.testing.assert_array_equal(got.astype(np.float64), expected.astype(np.float64))


@pytest.mark.parametrize("to", list(F8))
@pytest.mark.parametrize("src", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("saturate", [0, 1])
def test_float8(to: int, src: type, saturate: int) -> None:
    with np.errstate(over="ignore"):
        x = WIDE.astype(src)
    got = dtypes.to_numpy(cast_to(torch.from_numpy(x), to, saturate=saturate))
    expected = saturate_cast(x, F8[to]) if saturate else x.astype(F8[to])
    _same_floats(got, expected)


@pytest.mark.parametrize("mode", ["up", "down", "nearest"])
@pytest.mark.parametrize("saturate", [0, 1])
def test_float8e8m0_round_modes(mode: str, saturate: int) -> None:
    x = np.abs(WIDE)
    x = np.concatenate([x, [2.0**127 * 1.5, 3.0, 0.75, 2.0**-127]]).astype(np.float32)
    got = cast_to(torch.from_numpy(x), T.FLOAT8E8M0, saturate=saturate, round_mode=mode)
    expected = to_float8e8m0(x, bool(saturate), mode)
    np.testing.assert_array_equal(got.view(torch.uint8).numpy(), expected.view(np.uint8))


@pytest.mark.parametrize("to,np_type", [(T.INT4, ml_dtypes.int4), (T.UINT4, ml_dtypes.uint4)])
def test_int4_truncates_and_wraps_like_ml_dtypes(to: int, np_type: type) -> None:
    x = np.array([-100.5, -9, -8.7, -7.5, -0.5, 0.5, 1.5, 7.6, 8.4, 15.5, 16.5, 100], dtype=np.float32)
    got = cast_to(torch.from_numpy(x), to).numpy()
    np.testing.assert_array_equal(got, x.astype(np_type).astype(np.int64))
    ints = np.arange(-20, 20, dtype=np.int32)
    np.testing.assert_array_equal(cast_to(torch.from_numpy(ints), to).numpy(), ints.astype(np_type).astype(np.int64))


def test_float4e2m1_round_trip() -> None:
    x = np.concatenate([WIDE, np.arange(-8, 8, 0.125)]).astype(np.float32)
    codes = float_to_fp4(torch.from_numpy(x)).numpy()
    np.testing.assert_array_equal(codes, x.astype(ml_dtypes.float4_e2m1fn).view(np.uint8))
    all_codes = np.arange(16, dtype=np.uint8)
    _same_floats(fp4_to_float(torch.from_numpy(all_codes)).numpy(),
                 all_codes.view(ml_dtypes.float4_e2m1fn).astype(np.float32))


def test_float4e2m1_input_decoded_when_engine_gives_input_types() -> None:
    codes = torch.tensor([1, 2, 9, 15], dtype=torch.uint8)
    ctx = OpContext(node_name="n", op_type="Cast", opset=23, num_outputs=1, output_types=(T.FLOAT,),
                    outputs_wanted=(True,), extra={"input_types": (T.FLOAT4E2M1,)})
    np.testing.assert_array_equal(cast(codes, to=T.FLOAT, ctx=ctx).numpy(), [0.5, 1.0, -0.5, -6.0])


def _cast_model(src: int, dst: int, op: str = "Cast") -> onnx.ModelProto:
    inputs = [helper.make_tensor_value_info("x", src, None)]
    if op == "Cast":
        node = helper.make_node("Cast", ["x"], ["y"], to=dst)
    else:
        inputs.append(helper.make_tensor_value_info("like", dst, None))
        node = helper.make_node("CastLike", ["x", "like"], ["y"])
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", dst, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def _both(model: onnx.ModelProto, feed: dict) -> tuple[np.ndarray, np.ndarray]:
    got = crossml.InferenceSession(model.SerializeToString()).run(None, feed)[0]
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    return got, expected


@pytest.mark.parametrize("src,values", [
    (T.FLOAT, np.array([0.47892547, 1e-7, np.nan, np.inf, -np.inf, 1e6, 123456789, 0.1, -0.0, 3], np.float32)),
    (T.DOUBLE, np.array([0.47892547, 1e-7, np.nan, 0.1, 1 / 3, 1e20], np.float64)),
    (T.FLOAT16, np.array([0.47892547, 1e-7, 0.1], np.float16)),
    (T.BOOL, np.array([True, False])),
    (T.INT64, np.array([-5, 2**62], np.int64)),
    (T.UINT8, np.array([0, 255], np.uint8)),
])
def test_number_to_string_like_onnxruntime(src: int, values: np.ndarray) -> None:
    got, expected = _both(_cast_model(src, T.STRING), {"x": values})
    assert got.tolist() == expected.tolist()


@pytest.mark.parametrize("dst,values", [
    (T.FLOAT, ["1.5", "NaN", "-INF", "inf", "1e-3", " 2", "-nan", "+3"]),
    (T.DOUBLE, ["0.1", "-1e300"]),
    (T.INT32, ["15", "-3"]),
    (T.INT64, ["9007199254740993", "-1"]),
    (T.BOOL, ["1", "0"]),
])
def test_string_to_number_like_onnxruntime(dst: int, values: list[str]) -> None:
    got, expected = _both(_cast_model(T.STRING, dst), {"x": np.array(values, dtype=object)})
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


def test_castlike_to_string_and_back() -> None:
    x = np.array([1.25, -2.0], dtype=np.float32)
    got, expected = _both(_cast_model(T.FLOAT, T.STRING, "CastLike"), {"x": x, "like": np.array(["a"], dtype=object)})
    assert got.tolist() == expected.tolist() == ["1.25", "-2"]


@pytest.mark.parametrize("src,dst", [(T.FLOAT, T.UINT32), (T.DOUBLE, T.UINT64), (T.FLOAT, T.UINT16),
                                     (T.UINT64, T.FLOAT), (T.FLOAT16, T.INT8), (T.BOOL, T.DOUBLE)])
def test_numeric_pairs_like_onnxruntime(src: int, dst: int) -> None:
    x = np.array([0, 1.5, 7.9, 100, 250], dtype=np.float32).astype(dtypes.np_dtype(src))
    got, expected = _both(_cast_model(src, dst), {"x": x})
    assert got.dtype == expected.dtype
    _same_floats(got, expected)


@pytest.mark.parametrize("src,dst", [(T.INT32, T.BFLOAT16), (T.FLOAT8E4M3FN, T.INT32), (T.BFLOAT16, T.FLOAT16),
                                     (T.FLOAT8E5M2, T.FLOAT8E4M3FNUZ), (T.INT4, T.FLOAT8E5M2)])
def test_numeric_pairs_like_numpy(src: int, dst: int) -> None:
    x = np.array([0, 1.5, 3, -4, 7], dtype=np.float32).astype(dtypes.np_dtype(src))
    got = crossml.InferenceSession(_cast_model(src, dst).SerializeToString()).run(None, {"x": x})[0]
    expected = saturate_cast(x, dtypes.np_dtype(dst)) if dst in F8 else x.astype(dtypes.np_dtype(dst))
    assert got.dtype == expected.dtype
    _same_floats(got, expected)


def test_bitcast_width_mismatch_is_an_error() -> None:
    from crossml.ops.cast import bit_cast

    with pytest.raises(TypeError, match="one bit width"):
        bit_cast(torch.zeros(3, dtype=torch.float32), to=T.INT64)
    assert bit_cast(torch.tensor([1.0]), to=T.INT32).item() == 0x3F800000
