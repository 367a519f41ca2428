"""Normalisation ops against onnxruntime (CPU) / the reference evaluator: float16, old opsets,
LayerNormalization's Mean / InvStdDev outputs, GroupNormalization 18 (per-group) vs 21 (per-channel),
LRN with an even size, BatchNormalization training mode."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T

import crossml
from tests.ops.test_conv import F16, F32, node_model, rand, run_node

HALF_TOL = {"rtol": 1e-2, "atol": 1e-2}


@pytest.mark.parametrize("opset", [7, 9, 15])
@pytest.mark.parametrize("dtype", [F32, F16])
def test_batch_norm_inference(opset: int, dtype: type) -> None:
    rng = np.random.default_rng(opset)
    c = 3
    feeds = {"x": rand(rng, 2, c, 4, 5, dtype=dtype), "s": rand(rng, c, dtype=dtype), "b": rand(rng, c, dtype=dtype),
             "m": rand(rng, c, dtype=dtype), "v": rng.uniform(0.5, 2, c).astype(dtype)}
    run_node("BatchNormalization", feeds, {"epsilon": 1e-3}, opset=opset, **(HALF_TOL if dtype == F16 else {}))


def test_batch_norm_training_mode() -> None:
    rng = np.random.default_rng(0)
    c = 3
    feeds = {"x": rand(rng, 2, c, 4, 5), "s": rand(rng, c), "b": rand(rng, c), "m": rand(rng, c),
             "v": rng.uniform(0.5, 2, c).astype(F32)}
    run_node("BatchNormalization", feeds, {"training_mode": 1, "momentum": 0.8}, opset=15, n_out=3, reference=True)


@pytest.mark.parametrize("shape", [(2, 3, 7), (2, 3, 4, 5), (1, 2, 3, 4, 5)])
@pytest.mark.parametrize("dtype", [F32, F16])
def test_instance_norm(shape: tuple[int, ...], dtype: type) -> None:
    rng = np.random.default_rng(0)
    feeds = {"x": rand(rng, *shape, dtype=dtype), "s": rand(rng, shape[1], dtype=dtype),
             "b": rand(rng, shape[1], dtype=dtype)}
    run_node("InstanceNormalization", feeds, {"epsilon": 1e-4}, **(HALF_TOL if dtype == F16 else {}))


@pytest.mark.parametrize("axis", [-1, -2, 1])
@pytest.mark.parametrize("dtype", [F32, F16])
def test_layer_norm_with_stats(axis: int, dtype: type) -> None:
    rng = np.random.default_rng(0)
    shape = (2, 3, 4, 5)
    norm_shape = shape[axis:]
    feeds = {"x": rand(rng, *shape, dtype=dtype), "s": rand(rng, *norm_shape, dtype=dtype),
             "b": rand(rng, *norm_shape, dtype=dtype)}
    et = T.FLOAT16 if dtype == F16 else T.FLOAT
    tol = HALF_TOL if dtype == F16 else {}
    run_node("LayerNormalization", feeds, {"axis": axis}, opset=17, n_out=3, out_types=[et, T.FLOAT, T.FLOAT], **tol)
    run_node("LayerNormalization", {**feeds, "b": None}, {"axis": axis, "epsilon": 1e-3}, opset=17, **tol)


def test_layer_norm_broadcast_scale() -> None:
    rng = np.random.default_rng(0)
    feeds = {"x": rand(rng, 2, 3, 4), "s": rand(rng, 1, 4), "b": rand(rng, 4)}
    run_node("LayerNormalization", feeds, {"axis": 1}, opset=17)


def test_group_norm_18_per_group_and_21_per_channel() -> None:
    rng = np.random.default_rng(0)
    x = rand(rng, 2, 6, 3, 4)
    run_node("GroupNormalization", {"x": x, "s": rand(rng, 3), "b": rand(rng, 3)}, {"num_groups": 3}, opset=18,
             reference=True)
    run_node("GroupNormalization", {"x": x, "s": rand(rng, 6), "b": rand(rng, 6)}, {"num_groups": 2}, opset=21)
    x16 = x.astype(F16)
    run_node("GroupNormalization", {"x": x16, "s": rand(rng, 6, dtype=F16), "b": rand(rng, 6, dtype=F16)},
             {"num_groups": 3}, opset=21, **HALF_TOL)


@pytest.mark.parametrize("axis", [-1, 1])
def test_rms_norm(axis: int) -> None:
    rng = np.random.default_rng(0)
    x = rand(rng, 2, 3, 4)
    run_node("RMSNormalization", {"x": x, "s": rand(rng, *x.shape[axis:])}, {"axis": axis}, opset=23, reference=True)
    run_node("RMSNormalization", {"x": x.astype(F16), "s": rand(rng, *x.shape[axis:], dtype=F16)}, {"axis": axis},
             opset=23, reference=True, **HALF_TOL)


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
def test_lrn(size: int) -> None:
    x = rand(np.random.default_rng(size), 2, 7, 3, 4)
    if size % 2:
        run_node("LRN", {"x": x}, {"size": size, "alpha": 0.01, "beta": 0.6, "bias": 1.5}, opset=13)
        run_node("LRN", {"x": x.astype(F16)}, {"size": size}, opset=13, **HALF_TOL)
        return
    # onnxruntime accepts odd sizes only and the reference evaluator sums the wrong axis: the spec by hand
    sq = np.zeros_like(x)
    for c in range(x.shape[1]):
        lo, hi = max(0, c - (size - 1) // 2), min(x.shape[1], c + size // 2 + 1)
        sq[:, c] = (x[:, lo:hi] ** 2).sum(axis=1)
    want = x / (1.5 + 0.01 / size * sq) ** 0.6
    got = crossml.InferenceSession(
        node_model("LRN", {"x": x}, {"size": size, "alpha": 0.01, "beta": 0.6, "bias": 1.5}, 13).SerializeToString(),
        providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("p, axis", [(1, 0), (2, -1), (2, 1)])
def test_lp_normalization(p: int, axis: int) -> None:
    x = rand(np.random.default_rng(0), 3, 4, 5)
    x[1, :, 2] = 0
    run_node("LpNormalization", {"x": x}, {"p": p, "axis": axis}, opset=1)


@pytest.mark.parametrize("axes", [None, [0, 1], [2, 3], [1]])
def test_mean_variance_normalization(axes: list[int] | None) -> None:
    x = rand(np.random.default_rng(0), 2, 3, 4, 5)
    run_node("MeanVarianceNormalization", {"x": x}, {} if axes is None else {"axes": axes}, opset=13)
