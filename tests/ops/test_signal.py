"""DFT / STFT / windows / MelWeightMatrix against numpy, torch and the ONNX reference."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto as T
from onnx import helper
from onnx.reference import ReferenceEvaluator

import crossml
from crossml.ops.signal import dft


def _model(op_type: str, feed: dict, out_type: int, opset: int, names: list[str] | None = None,
           **attrs) -> onnx.ModelProto:
    from crossml import dtypes

    vis = [helper.make_tensor_value_info(n, dtypes.onnx_type_of_numpy(v.dtype), list(v.shape)) for n, v in feed.items()]
    node = helper.make_node(op_type, names if names is not None else list(feed), ["y"], **attrs)
    graph = helper.make_graph([node], "g", vis, [helper.make_tensor_value_info("y", out_type, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _complex(y: np.ndarray) -> np.ndarray:
    return y[..., 0] + 1j * y[..., 1]


@pytest.mark.parametrize("axis", [1, 2, -2])
@pytest.mark.parametrize("onesided", [0, 1])
@pytest.mark.parametrize("length", [None, 6, 12])
def test_forward_dft_matches_numpy(axis: int, onesided: int, length: int | None) -> None:
    x = np.random.default_rng(0).standard_normal((2, 8, 9, 2))
    y = dft(torch.from_numpy(x), length, axis, False, bool(onesided)).numpy()
    ax = axis % 4
    expected = np.fft.fft(_complex(x), n=length, axis=ax)
    if onesided:
        n = length or x.shape[ax]
        expected = np.take(expected, range(n // 2 + 1), axis=ax)
    np.testing.assert_allclose(_complex(y), expected, rtol=1e-10, atol=1e-10)


def test_inverse_dft_round_trip_and_irfft() -> None:
    x = np.random.default_rng(1).standard_normal((3, 10, 1))
    spec = dft(torch.from_numpy(x), None, 1, False, False)
    back = dft(spec, None, 1, True, False).numpy()
    np.testing.assert_allclose(back[..., 0], x[..., 0], atol=1e-12)
    np.testing.assert_allclose(back[..., 1], 0, atol=1e-12)
    half = dft(torch.from_numpy(x), None, 1, False, True)
    real = dft(half, None, 1, True, True).numpy()
    np.testing.assert_allclose(real[..., 0], x[..., 0], atol=1e-12)


@pytest.mark.parametrize("opset", [17, 20])
def test_dft_opsets_through_a_session(opset: int) -> None:
    x = np.random.default_rng(2).standard_normal((2, 7, 1)).astype(np.float32)
    feed = {"x": x, "n": np.array(8, np.int64)}
    if opset == 20:
        feed["axis"] = np.array(1, np.int64)
    model = _model("DFT", feed, T.FLOAT, opset, onesided=1)
    got = crossml.InferenceSession(model.SerializeToString()).run(None, feed)[0]
    expected = ReferenceEvaluator(model).run(None, feed)[0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window", [False, True])
@pytest.mark.parametrize("onesided", [0, 1])
def test_stft_vs_reference(window: bool, onesided: int) -> None:
    rng = np.random.default_rng(3)
    feed = {"signal": rng.standard_normal((2, 64, 1)).astype(np.float32), "step": np.array(8, np.int64)}
    names = ["signal", "step"]
    if window:
        feed["window"] = np.hanning(16).astype(np.float32)
        names.append("window")
    else:
        feed["length"] = np.array(16, np.int64)
        names += ["", "length"]
    model = _model("STFT", feed, T.FLOAT, 17, names=names, onesided=onesided)
    got = crossml.InferenceSession(model.SerializeToString()).run(None, feed)[0]
    expected = ReferenceEvaluator(model).run(None, feed)[0]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op_type,fn", [("HannWindow", torch.hann_window), ("HammingWindow", None),
                                        ("BlackmanWindow", torch.blackman_window)])
@pytest.mark.parametrize("periodic", [0, 1])
@pytest.mark.parametrize("dtype", [T.FLOAT, T.DOUBLE])
def test_windows(op_type: str, fn, periodic: int, dtype: int) -> None:
    feed = {"size": np.array(10, np.int32)}
    model = _model(op_type, feed, dtype, 17, periodic=periodic, output_datatype=dtype)
    got = crossml.InferenceSession(model.SerializeToString()).run(None, feed)[0]
    expected = ReferenceEvaluator(model).run(None, feed)[0]
    assert got.dtype == expected.dtype
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    if fn is not None:
        np.testing.assert_allclose(got, fn(10, periodic=bool(periodic), dtype=torch.float64).numpy(), atol=1e-6)


def test_mel_weight_matrix_vs_reference() -> None:
    feed = {"bins": np.array(8, np.int64), "n": np.array(64, np.int64), "rate": np.array(16000, np.int64),
            "lo": np.array(20.0, np.float32), "hi": np.array(7000.0, np.float32)}
    model = _model("MelWeightMatrix", feed, T.FLOAT, 17)
    got = crossml.InferenceSession(model.SerializeToString()).run(None, feed)[0]
    np.testing.assert_allclose(got, ReferenceEvaluator(model).run(None, feed)[0], rtol=1e-6)


def test_dft_on_the_complex_axis_is_an_error() -> None:
    with pytest.raises(ValueError, match="real, imaginary"):
        dft(torch.zeros(2, 4, 2), None, -1, False, False)
