"""NonMaxSuppression against onnxruntime on random boxes (both box formats, thresholds, limits)."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import crossml


def nms_model(center: int) -> bytes:
    ins = [h.make_tensor_value_info("boxes", T.FLOAT, None), h.make_tensor_value_info("scores", T.FLOAT, None),
           h.make_tensor_value_info("k", T.INT64, [1]), h.make_tensor_value_info("iou", T.FLOAT, [1]),
           h.make_tensor_value_info("st", T.FLOAT, [1])]
    n = h.make_node("NonMaxSuppression", ["boxes", "scores", "k", "iou", "st"], ["sel"], center_point_box=center)
    g = h.make_graph([n], "nms", ins, [h.make_tensor_value_info("sel", T.INT64, None)])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 11)], ir_version=8).SerializeToString()


@pytest.mark.parametrize("center", [0, 1])
@pytest.mark.parametrize("seed", range(4))
def test_nms_matches_onnxruntime(center: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    b, c, n = 2, 3, 40
    xy = rng.uniform(0, 10, (b, n, 2)).astype(np.float32)
    wh = rng.uniform(0.5, 4, (b, n, 2)).astype(np.float32)
    boxes = np.concatenate([xy, wh], -1) if center else np.concatenate([xy, xy + wh], -1)
    feeds = {"boxes": boxes, "scores": rng.uniform(0, 1, (b, c, n)).astype(np.float32),
             "k": np.array([int(rng.integers(1, 12))], np.int64), "iou": np.array([rng.uniform(0.2, 0.7)], np.float32),
             "st": np.array([rng.uniform(0, 0.5)], np.float32)}
    m = nms_model(center)
    want = onnxruntime.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = crossml.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_array_equal(got, want)


def test_nms_rejects_bad_shapes() -> None:
    s = crossml.InferenceSession(nms_model(0), providers=["CPUExecutionProvider"])
    feeds = {"boxes": np.zeros((1, 5, 3), np.float32), "scores": np.zeros((1, 1, 5), np.float32),
             "k": np.array([1], np.int64), "iou": np.array([0.5], np.float32), "st": np.array([0.0], np.float32)}
    with pytest.raises(crossml.RuntimeException, match=r"boxes must be \[batch, boxes, 4\]"):
        s.run(None, feeds)
