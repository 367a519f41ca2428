"""Random ops and Dropout: shapes, dtypes, seeding, value ranges and the dropout mask."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper

import crossml
from crossml import dtypes


def _run(op_type: str, feed: dict, out_types: list[int], opset: int = 15, names: list[str] | None = None,
         **attrs) -> list[np.ndarray]:
    vis = [helper.make_tensor_value_info(n, dtypes.onnx_type_of_numpy(v.dtype), list(v.shape)) for n, v in feed.items()]
    outs = [f"y{i}" for i in range(len(out_types))]
    node = helper.make_node(op_type, names if names is not None else list(feed), outs, **attrs)
    graph = helper.make_graph([node], "g", vis, [helper.make_tensor_value_info(o, t, None) for o, t in zip(outs, out_types)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    return crossml.InferenceSession(model.SerializeToString()).run(None, feed)


@pytest.mark.parametrize("dtype", [T.FLOAT, T.DOUBLE, T.FLOAT16])
def test_random_normal_and_uniform(dtype: int) -> None:
    n = _run("RandomNormal", {}, [dtype], shape=[200, 50], mean=3.0, scale=0.5, dtype=dtype)[0]
    assert n.shape == (200, 50) and n.dtype == dtypes.np_dtype(dtype)
    assert abs(float(n.astype(np.float64).mean()) - 3.0) < 0.05
    assert abs(float(n.astype(np.float64).std()) - 0.5) < 0.05
    u = _run("RandomUniform", {}, [dtype], shape=[1000], low=-2.0, high=-1.0, dtype=dtype)[0]
    assert u.dtype == dtypes.np_dtype(dtype) and u.min() >= -2.0 and u.max() <= -1.0


def test_seed_makes_runs_repeat() -> None:
    a = _run("RandomUniform", {}, [T.FLOAT], shape=[5], seed=3.0)[0]
    b = _run("RandomUniform", {}, [T.FLOAT], shape=[5], seed=3.0)[0]
    c = _run("RandomUniform", {}, [T.FLOAT], shape=[5], seed=4.0)[0]
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_like_ops_take_shape_and_dtype_from_input() -> None:
    x = np.zeros((3, 4), np.float64)
    assert _run("RandomNormalLike", {"x": x}, [T.DOUBLE])[0].dtype == np.float64
    y = _run("RandomUniformLike", {"x": x}, [T.FLOAT], dtype=T.FLOAT)[0]
    assert y.shape == (3, 4) and y.dtype == np.float32


def test_bernoulli_extremes_and_dtype() -> None:
    p = np.array([0.0, 1.0, 0.0, 1.0], np.float32)
    np.testing.assert_array_equal(_run("Bernoulli", {"p": p}, [T.FLOAT])[0], p)
    y = _run("Bernoulli", {"p": p}, [T.INT32], dtype=T.INT32)[0]
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, p.astype(np.int32))


def test_multinomial_samples_the_only_possible_class() -> None:
    logits = np.array([[-1e9, 0.0, -1e9], [0.0, -1e9, -1e9]], np.float32)
    y = _run("Multinomial", {"x": logits}, [T.INT64], 7, sample_size=4, dtype=T.INT64)[0]
    assert y.dtype == np.int64 and y.shape == (2, 4)
    np.testing.assert_array_equal(y, [[1] * 4, [0] * 4])


@pytest.mark.parametrize("opset", [7, 10, 13])
def test_dropout_is_identity_at_inference(opset: int) -> None:
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    mask_type = T.BOOL if opset >= 10 else T.FLOAT
    y, mask = _run("Dropout", {"x": x}, [T.FLOAT, mask_type], opset)
    np.testing.assert_array_equal(y, x)
    assert mask.dtype == dtypes.np_dtype(mask_type) and mask.all()


def test_training_dropout_scales_kept_values() -> None:
    x = np.ones((100, 100), np.float32)
    feed = {"x": x, "ratio": np.array(0.25, np.float32), "training": np.array(True)}
    y, mask = _run("Dropout", feed, [T.FLOAT, T.BOOL], 13, seed=0)
    np.testing.assert_allclose(y[mask], 1 / 0.75, rtol=1e-6)
    assert (y[~mask] == 0).all()
    assert abs(mask.mean() - 0.75) < 0.03
