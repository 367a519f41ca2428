"""Pooling ops against onnxruntime (CPU): dilations, ceil_mode, asymmetric pads, MaxPool indices
(with pads and storage_order), int8 / float16 inputs, 1-D and 3-D, RoiAlign, MaxRoiPool."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T

from tests.ops.test_conv import F16, F32, rand, run_node

POOL_CASES = [
    ((1, 2, 11), {"kernel_shape": [3], "strides": [2], "pads": [1, 2]}),
    ((1, 2, 9, 10), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ((1, 2, 9, 10), {"kernel_shape": [3, 2], "strides": [2, 3], "pads": [0, 1, 2, 1], "ceil_mode": 1}),
    ((2, 3, 9, 10), {"kernel_shape": [3, 3], "strides": [1, 2], "dilations": [2, 2]}),
    ((1, 2, 9, 10), {"kernel_shape": [3, 3], "strides": [2, 2], "dilations": [2, 1], "pads": [1, 1, 2, 2],
                     "ceil_mode": 1}),
    ((1, 2, 9, 10), {"kernel_shape": [4, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 9, 10), {"kernel_shape": [4, 3], "strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ((1, 2, 5, 6, 7), {"kernel_shape": [2, 3, 2], "strides": [2, 1, 2], "pads": [1, 0, 1, 0, 1, 1]}),
    ((1, 1, 7, 7), {"kernel_shape": [3, 3], "pads": [2, 2, 2, 2]}),
]


@pytest.mark.parametrize("case", range(len(POOL_CASES)))
@pytest.mark.parametrize("include_pad", [0, 1])
def test_average_pool(case: int, include_pad: int) -> None:
    shape, attrs = POOL_CASES[case]
    run_node("AveragePool", {"x": rand(np.random.default_rng(case), *shape)},
             {**attrs, "count_include_pad": include_pad})


@pytest.mark.parametrize("case", range(len(POOL_CASES)))
def test_average_pool_dilated_vs_reference(case: int) -> None:
    shape, attrs = POOL_CASES[case]
    for include_pad in (0, 1):
        run_node("AveragePool", {"x": rand(np.random.default_rng(case), *shape)},
                 {**attrs, "count_include_pad": include_pad}, reference=True)


@pytest.mark.parametrize("case", range(len(POOL_CASES)))
@pytest.mark.parametrize("dtype", [F32, F16, np.int8, np.uint8])
def test_max_pool_with_indices(case: int, dtype: type) -> None:
    shape, attrs = POOL_CASES[case]
    rng = np.random.default_rng(case)
    x = (rng.permutation(int(np.prod(shape))).reshape(shape) % 250 - (120 if dtype == np.int8 else 0)).astype(dtype)
    et = {F32: T.FLOAT, F16: T.FLOAT16, np.int8: T.INT8, np.uint8: T.UINT8}[dtype]
    n_out = 1 if dtype in (np.int8, np.uint8) else 2  # onnxruntime has no Indices output for 8-bit inputs
    run_node("MaxPool", {"x": x}, attrs, n_out=n_out, out_types=[et, T.INT64][:n_out])


def test_max_pool_storage_order_and_opset8() -> None:
    x = rand(np.random.default_rng(0), 2, 3, 6, 7)
    run_node("MaxPool", {"x": x}, {"kernel_shape": [2, 3], "strides": [2, 2], "storage_order": 1,
                                   "pads": [1, 0, 0, 1]}, n_out=2, out_types=[T.FLOAT, T.INT64], opset=12)
    run_node("MaxPool", {"x": x}, {"kernel_shape": [2, 2]}, n_out=2, out_types=[T.FLOAT, T.INT64], opset=8)
    run_node("MaxPool", {"x": x}, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, opset=1)


@pytest.mark.parametrize("case", range(len(POOL_CASES)))
@pytest.mark.parametrize("p", [1, 2, 3])
def test_lp_pool(case: int, p: int) -> None:
    shape, attrs = POOL_CASES[case]
    run_node("LpPool", {"x": rand(np.random.default_rng(case), *shape)}, {**attrs, "p": p}, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 5), (1, 2, 3, 4, 5)])
@pytest.mark.parametrize("op_type", ["GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"])
def test_global_pools(shape: tuple[int, ...], op_type: str) -> None:
    opset = 2 if op_type == "GlobalLpPool" else 22  # onnxruntime stops at GlobalLpPool-2
    run_node(op_type, {"x": rand(np.random.default_rng(0), *shape)}, opset=opset, rtol=1e-4, atol=1e-4)
    if op_type != "GlobalLpPool":
        run_node(op_type, {"x": rand(np.random.default_rng(0), *shape, dtype=F16)}, rtol=1e-2, atol=1e-2)


def test_max_unpool_roundtrip_with_pads() -> None:
    rng = np.random.default_rng(0)
    x = rand(rng, 1, 2, 6, 6)
    pool = run_node("MaxPool", {"x": x}, {"kernel_shape": [2, 2], "strides": [2, 2]}, n_out=2,
                    out_types=[T.FLOAT, T.INT64])
    run_node("MaxUnpool", {"x": pool[0], "i": pool[1]}, {"kernel_shape": [2, 2], "strides": [2, 2]}, opset=11)
    run_node("MaxUnpool", {"x": pool[0], "i": pool[1], "shape": np.array([1, 2, 7, 7], np.int64)},
             {"kernel_shape": [2, 2], "strides": [2, 2]}, opset=11, reference=True)


@pytest.mark.parametrize("opset, attrs", [
    (10, {"output_height": 3, "output_width": 2, "sampling_ratio": 2, "spatial_scale": 0.5}),
    (16, {"output_height": 2, "output_width": 3, "sampling_ratio": 0, "spatial_scale": 0.25}),
    (16, {"output_height": 2, "output_width": 2, "coordinate_transformation_mode": "output_half_pixel"}),
    (16, {"output_height": 3, "output_width": 3, "mode": "max", "sampling_ratio": 2}),
])
def test_roi_align(opset: int, attrs: dict) -> None:
    rng = np.random.default_rng(opset)
    x = rand(rng, 2, 3, 10, 12)
    xy = rng.uniform(-2, 20, (6, 2))
    rois = np.concatenate([xy, xy + rng.uniform(0.5, 18, (6, 2))], 1).astype(F32)
    feeds = {"x": x, "rois": rois, "batch": rng.integers(0, 2, 6).astype(np.int64)}
    run_node("RoiAlign", feeds, attrs, opset=opset, rtol=1e-4, atol=1e-4)


def test_max_roi_pool() -> None:
    rng = np.random.default_rng(0)
    x = rand(rng, 2, 3, 8, 9)
    rois = np.array([[0, 0, 0, 7, 7], [1, 1.2, 2.6, 5.1, 7.9], [1, 3, 3, 3, 3], [0, -1, 2, 20, 4]], F32)
    run_node("MaxRoiPool", {"x": x, "rois": rois}, {"pooled_shape": [3, 2], "spatial_scale": 1.0}, opset=1)
    run_node("MaxRoiPool", {"x": x, "rois": rois}, {"pooled_shape": [2, 4], "spatial_scale": 0.5}, opset=1)
