"""Resize / Upsample / GridSample / AffineGrid against onnxruntime (CPU) and the reference evaluator.

Non-integer scales, every coordinate mode with every interpolation mode, old opsets (Resize-10,
Upsample-7/9), 8-bit and float16 inputs, and the fast paths (integer nearest repeat,
F.interpolate) checked against the general index/weight tables.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from crossml.ops import resize as rz
from tests.ops.test_conv import F16, F32, rand, run_node

COORDS = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric"]


def scales(*v: float) -> np.ndarray:
    return np.array(v, F32)


@pytest.mark.parametrize("coord", COORDS)
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("sc", [(1, 1, 2, 3), (1, 1, 0.6, 1.7), (1, 1, 3, 0.5), (1, 1, 1.0, 2.5)])
def test_resize_scales(coord: str, mode: str, sc: tuple[float, ...]) -> None:
    x = rand(np.random.default_rng(0), 2, 3, 5, 6)
    feeds = {"x": x, "roi": None, "scales": scales(*sc)}
    attrs = {"mode": mode, "coordinate_transformation_mode": coord}
    # onnxruntime aligns corners on the integer output length; ONNX (and its node tests) on in * scale
    fractional = any(int(s * n) != s * n for s, n in zip(sc, x.shape))
    ref = coord == "half_pixel_symmetric" or (coord == "align_corners" and fractional)
    run_node("Resize", feeds, attrs, opset=19, reference=ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
@pytest.mark.parametrize("coord", ["half_pixel", "asymmetric", "align_corners"])
def test_resize_nearest_modes_sizes(nearest_mode: str, coord: str) -> None:
    x = rand(np.random.default_rng(1), 1, 2, 4, 7)
    for sizes in ([1, 2, 8, 14], [1, 2, 7, 3], [1, 2, 9, 10]):
        feeds = {"x": x, "roi": None, "scales": None, "sizes": np.array(sizes, np.int64)}
        run_node("Resize", feeds, {"mode": "nearest", "nearest_mode": nearest_mode,
                                   "coordinate_transformation_mode": coord}, opset=13)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("exclude", [0, 1])
def test_resize_cubic_a_exclude_outside(mode: str, exclude: int) -> None:
    x = rand(np.random.default_rng(2), 1, 1, 6, 7)
    for sc in ((1, 1, 1.5, 0.7), (1, 1, 0.5, 2.0)):
        run_node("Resize", {"x": x, "roi": None, "scales": scales(*sc)},
                 {"mode": mode, "cubic_coeff_a": -0.5, "exclude_outside": exclude}, opset=13, rtol=1e-4, atol=1e-4,
                 reference=mode == "linear" and exclude == 1)  # onnxruntime refuses exclude_outside for linear


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("sc", [(1, 1, 0.5, 0.35), (1, 1, 0.8, 1.5)])
def test_resize_antialias(mode: str, sc: tuple[float, ...]) -> None:
    x = rand(np.random.default_rng(3), 1, 2, 12, 13)
    run_node("Resize", {"x": x, "roi": None, "scales": scales(*sc)}, {"mode": mode, "antialias": 1}, opset=18,
             reference=True, rtol=1e-4, atol=1e-4)


def test_resize_tf_crop_and_resize_3d_axes_and_extrapolation() -> None:
    x = rand(np.random.default_rng(4), 1, 3, 6, 7)
    roi = np.array([0.12, -0.2, 0.83, 1.3], F32)  # no source coordinate on a rounding tie
    for mode in ("nearest", "linear"):
        feeds = {"x": x, "roi": roi, "scales": None, "sizes": np.array([5, 9], np.int64)}
        run_node("Resize", feeds, {"mode": mode, "coordinate_transformation_mode": "tf_crop_and_resize",
                                   "extrapolation_value": -3.0, "axes": [2, 3]}, opset=18, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("policy", ["not_larger", "not_smaller"])
def test_resize_keep_aspect_ratio(policy: str) -> None:
    x = rand(np.random.default_rng(5), 1, 2, 6, 9)
    feeds = {"x": x, "roi": None, "scales": None, "sizes": np.array([4, 4], np.int64)}
    attrs = {"mode": "linear", "axes": [2, 3], "keep_aspect_ratio_policy": policy}
    # onnxruntime maps coordinates with the rounded sizes' own scales; ONNX with the one kept scale
    run_node("Resize", feeds, attrs, opset=18, rtol=1e-4, atol=1e-4, reference=True)
    run_node("Resize", feeds, {**attrs, "mode": "nearest"}, opset=18)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, F16])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_8bit_and_half(dtype: type, mode: str) -> None:
    rng = np.random.default_rng(6)
    x = rng.integers(0, 120, (1, 3, 5, 6)).astype(dtype)
    tol = {"rtol": 0, "atol": 1} if dtype != F16 else {"rtol": 1e-2, "atol": 2e-2}
    for sc in ((1, 1, 2, 2), (1, 1, 1.6, 0.8)):
        run_node("Resize", {"x": x, "roi": None, "scales": scales(*sc)}, {"mode": mode}, opset=13, **tol)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("sc", [(1, 1, 2, 3), (1, 1, 0.5, 0.5), (1, 1, 1.5, 2.5)])
def test_resize_10_and_upsample(mode: str, sc: tuple[float, ...]) -> None:
    x = rand(np.random.default_rng(7), 1, 2, 4, 6)
    run_node("Resize", {"x": x, "scales": scales(*sc)}, {"mode": mode}, opset=10, rtol=1e-4, atol=1e-4)
    if min(sc) >= 1:
        run_node("Upsample", {"x": x, "scales": scales(*sc)}, {"mode": mode}, opset=9, rtol=1e-4, atol=1e-4)
        run_node("Upsample", {"x": x}, {"mode": mode, "scales": [float(v) for v in sc]}, opset=7, rtol=1e-4,
                 atol=1e-4)


@pytest.mark.parametrize("shape, sizes", [((2, 3, 7), [2, 3, 11]), ((1, 2, 3, 4, 5), [1, 2, 5, 3, 8])])
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_1d_and_3d(shape: tuple[int, ...], sizes: list[int], mode: str) -> None:
    x = rand(np.random.default_rng(8), *shape)
    feeds = {"x": x, "roi": None, "scales": None, "sizes": np.array(sizes, np.int64)}
    # onnxruntime's cubic mode is 2-D only
    run_node("Resize", feeds, {"mode": mode}, opset=13, reference=mode == "cubic", rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m", [
    rz._Mode("nearest", "half_pixel", "round_prefer_floor"), rz._Mode("nearest", "asymmetric", "floor"),
    rz._Mode("linear", "half_pixel"), rz._Mode("linear", "align_corners"), rz._Mode("linear", "pytorch_half_pixel"),
    rz._Mode("cubic", "half_pixel"), rz._Mode("cubic", "align_corners"),
])
@pytest.mark.parametrize("sc", [[1, 1, 2.0, 3.0], [1, 1, 0.5, 1.5], [1, 1, 1.7, 0.6]])
def test_fast_paths_match_tables(m: rz._Mode, sc: list[float]) -> None:
    x = torch.randn(2, 3, 6, 7, dtype=torch.float64)
    out, full = rz._output_geometry(list(x.shape), sc, [], [0, 1, 2, 3], "stretch")
    fast = rz._fast(x, out, full, m)
    if fast is None:
        pytest.skip("no fast path for this case")
    y = x
    for a in range(4):
        if full[a] != 1.0:
            idx, w, _ = rz._device_table(x.shape[a], out[a], full[a], None, m, x.device, x.dtype)
            y = rz._resize_axis(y, a, idx, w)
    torch.testing.assert_close(fast, y, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_16(mode: str, padding_mode: str, align: int) -> None:
    rng = np.random.default_rng(9)
    feeds = {"x": rand(rng, 2, 3, 5, 6), "grid": rng.uniform(-1.3, 1.3, (2, 4, 7, 2)).astype(F32)}
    run_node("GridSample", feeds, {"mode": mode, "padding_mode": padding_mode, "align_corners": align}, opset=16,
             rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
def test_grid_sample_20_1d_and_3d(mode: str) -> None:
    rng = np.random.default_rng(10)
    feeds = {"x": rand(rng, 2, 3, 6), "grid": rng.uniform(-1.2, 1.2, (2, 5, 1)).astype(F32)}
    run_node("GridSample", feeds, {"mode": mode, "padding_mode": "border"}, opset=20, reference=True,
             rtol=1e-4, atol=1e-4)
    if mode != "cubic":
        feeds = {"x": rand(rng, 1, 2, 3, 4, 5), "grid": rng.uniform(-1.1, 1.1, (1, 2, 3, 2, 3)).astype(F32)}
        run_node("GridSample", feeds, {"mode": mode}, opset=20, rtol=1e-4, atol=1e-4)
        feeds16 = {k: v.astype(F16) for k, v in feeds.items()}
        run_node("GridSample", feeds16, {"mode": mode}, opset=20, reference=True, rtol=1e-2, atol=2e-2)


@pytest.mark.parametrize("size", [[2, 3, 4, 5], [2, 3, 4, 5, 6]])
@pytest.mark.parametrize("align", [0, 1])
def test_affine_grid(size: list[int], align: int) -> None:
    rng = np.random.default_rng(11)
    k = len(size) - 2
    feeds = {"theta": rand(rng, size[0], k, k + 1), "size": np.array(size, np.int64)}
    run_node("AffineGrid", feeds, {"align_corners": align}, opset=20, reference=True, rtol=1e-5, atol=1e-5)
