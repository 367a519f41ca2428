"""NegativeLogLikelihoodLoss / SoftmaxCrossEntropyLoss against the ONNX reference."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

import crossml
from crossml import dtypes


def _model(op_type: str, feed: dict, n_out: int, **attrs) -> onnx.ModelProto:
    vis = [helper.make_tensor_value_info(n, dtypes.onnx_type_of_numpy(v.dtype), list(v.shape)) for n, v in feed.items()]
    et = dtypes.onnx_type_of_numpy(next(iter(feed.values())).dtype)
    outs = ["loss", "log_prob"][:n_out]
    node = helper.make_node(op_type, list(feed), outs, **attrs)
    graph = helper.make_graph([node], "g", vis, [helper.make_tensor_value_info(o, et, None) for o in outs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=10)


def _check(model: onnx.ModelProto, feed: dict, tol: float = 1e-5, use_ort: bool = False) -> None:
    got = crossml.InferenceSession(model.SerializeToString()).run(None, feed)
    if use_ort:
        expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
    else:
        expected = ReferenceEvaluator(model).run(None, feed)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape, (g.dtype, e.dtype, g.shape, e.shape)
        np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=tol, atol=tol)


def _inputs(shape: tuple[int, ...], weights: bool, ignore: int | None, dtype: type = np.float32) -> dict:
    rng = np.random.default_rng(sum(shape))
    feed = {"x": rng.standard_normal(shape).astype(dtype),
            "t": rng.integers(0, shape[1], (shape[0],) + shape[2:]).astype(np.int64)}
    if ignore is not None:
        feed["t"].reshape(-1)[::3] = ignore
    if weights:
        feed["w"] = rng.uniform(0.5, 2.0, (shape[1],)).astype(dtype)
    return feed


@pytest.mark.parametrize("op_type,n_out", [("NegativeLogLikelihoodLoss", 1), ("SoftmaxCrossEntropyLoss", 1),
                                           ("SoftmaxCrossEntropyLoss", 2)])
@pytest.mark.parametrize("shape", [(4, 5), (3, 4, 6), (2, 3, 4, 2)])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weights", [False, True])
@pytest.mark.parametrize("ignore", [None, 1, -1])
def test_losses_vs_reference(op_type: str, n_out: int, shape: tuple, reduction: str, weights: bool,
                             ignore: int | None) -> None:
    feed = _inputs(shape, weights, ignore)
    attrs = {"reduction": reduction}
    if ignore is not None:
        attrs["ignore_index"] = ignore
    # the reference's NLL averages over ignored targets too when ignore_index == -1 without weights;
    # onnxruntime (and crossml) divide by the number of targets kept
    quirk = op_type == "NegativeLogLikelihoodLoss" and ignore == -1 and not weights and reduction == "mean"
    _check(_model(op_type, feed, n_out, **attrs), feed, use_ort=quirk)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_other_float_types(dtype: type) -> None:
    feed = _inputs((3, 4, 5), True, 2, dtype)
    _check(_model("SoftmaxCrossEntropyLoss", feed, 2, ignore_index=2), feed, tol=2e-3)


def test_target_shape_mismatch_is_an_error() -> None:
    feed = {"x": np.zeros((3, 4), np.float32), "t": np.zeros((4,), np.int64)}
    with pytest.raises(Exception, match="target shape"):
        crossml.InferenceSession(_model("NegativeLogLikelihoodLoss", feed, 1).SerializeToString()).run(None, feed)
