"""Conv, ConvTranspose, DeformConv, Col2Im against onnxruntime (CPU) / the onnx reference evaluator.

Covers what the ONNX node tests miss: 1-D and 3-D, groups, dilations, asymmetric pads, auto_pad
on strided inputs, output_shape, float16 / float64, the opset 1 and 11 forms.
``run_node`` is shared with the pool / norm / resize tests.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import helper as h
from onnx.reference import ReferenceEvaluator

import crossml
from crossml.dtypes import onnx_type_of_numpy

F32, F16, F64 = np.float32, np.float16, np.float64


def node_model(op_type: str, feeds: dict[str, np.ndarray | None], attrs: dict[str, Any], opset: int,
               n_out: int = 1, out_types: list[int] | None = None) -> onnx.ModelProto:
    names = [k if v is not None else "" for k, v in feeds.items()]
    while names and not names[-1]:
        names.pop()
    ins = [h.make_tensor_value_info(k, onnx_type_of_numpy(v.dtype), list(v.shape))
           for k, v in feeds.items() if v is not None]
    first = next(v for v in feeds.values() if v is not None)
    types = out_types or [onnx_type_of_numpy(first.dtype)] * n_out
    outs = [f"y{i}" for i in range(n_out)]
    node = h.make_node(op_type, names, outs, **attrs)
    g = h.make_graph([node], "g", ins, [h.make_tensor_value_info(o, t, None) for o, t in zip(outs, types)])
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=8)


def run_node(op_type: str, feeds: dict[str, np.ndarray | None], attrs: dict[str, Any] | None = None, *,
             opset: int = 22, n_out: int = 1, out_types: list[int] | None = None, rtol: float = 1e-4,
             atol: float = 1e-5, reference: bool = False) -> list[np.ndarray]:
    """Run one node in crossml and in onnxruntime (or the reference evaluator); assert they agree."""
    m = node_model(op_type, feeds, attrs or {}, opset, n_out, out_types)
    data = {k: v for k, v in feeds.items() if v is not None}
    got = crossml.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, data)
    if reference:
        want = ReferenceEvaluator(m).run(None, data)
    else:
        want = onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, data)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype, f"dtype {g.dtype} != {w.dtype}"
        assert g.shape == w.shape, f"shape {g.shape} != {w.shape}"
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol)
    return got


def rand(rng: np.random.Generator, *shape: int, dtype: type = F32) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


CONV_CASES = [
    # (x shape, w shape, attrs)
    ((1, 3, 11), (4, 3, 3), {"strides": [2], "pads": [1, 2]}),
    ((2, 4, 9, 10), (6, 2, 3, 3), {"group": 2, "dilations": [2, 1], "pads": [0, 1, 2, 1]}),
    ((1, 4, 9, 10), (4, 1, 3, 3), {"group": 4, "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 9, 10), (3, 2, 4, 2), {"strides": [2, 3], "auto_pad": "SAME_LOWER"}),
    ((1, 2, 9, 10), (3, 2, 3, 3), {"auto_pad": "VALID", "strides": [2, 2]}),
    ((1, 2, 5, 6, 7), (3, 2, 3, 2, 3), {"pads": [1, 0, 2, 0, 1, 1], "strides": [1, 2, 1]}),
    ((1, 6, 5, 6, 7), (6, 2, 2, 2, 2), {"group": 3, "dilations": [2, 1, 2]}),
]


@pytest.mark.parametrize("case", range(len(CONV_CASES)))
@pytest.mark.parametrize("dtype", [F32, F64, F16])
def test_conv(case: int, dtype: type) -> None:
    xs, ws, attrs = CONV_CASES[case]
    rng = np.random.default_rng(case)
    tol = {"rtol": 1e-2, "atol": 2e-2} if dtype == F16 else {}
    run_node("Conv", {"x": rand(rng, *xs, dtype=dtype), "w": rand(rng, *ws, dtype=dtype),
                      "b": rand(rng, ws[0], dtype=dtype)}, attrs, reference=dtype == F64, **tol)


@pytest.mark.parametrize("opset", [1, 11])
def test_conv_old_opsets_without_bias(opset: int) -> None:
    rng = np.random.default_rng(0)
    run_node("Conv", {"x": rand(rng, 1, 2, 7, 7), "w": rand(rng, 3, 2, 3, 3)},
             {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, opset=opset)


CONVT_CASES = [
    ((1, 3, 5), (3, 2, 3), {"strides": [2], "pads": [1, 0]}),
    ((1, 4, 4, 5), (4, 3, 3, 3), {"group": 2, "strides": [2, 2], "output_padding": [1, 0]}),
    ((1, 2, 4, 5), (2, 3, 3, 2), {"strides": [2, 3], "dilations": [2, 1], "pads": [1, 0, 2, 1]}),
    ((1, 2, 4, 5), (2, 3, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 4, 5), (2, 3, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ((1, 2, 4, 5), (2, 3, 3, 3), {"strides": [3, 2], "output_shape": [12, 11]}),
    ((1, 2, 4, 5), (2, 3, 3, 3), {"strides": [2, 2], "output_shape": [8, 10], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 3, 4, 3), (2, 2, 2, 3, 2), {"strides": [2, 1, 2], "pads": [0, 1, 0, 1, 1, 0]}),
]


@pytest.mark.parametrize("case", range(len(CONVT_CASES)))
@pytest.mark.parametrize("dtype", [F32, F16])
def test_conv_transpose(case: int, dtype: type) -> None:
    xs, ws, attrs = CONVT_CASES[case]
    rng = np.random.default_rng(case)
    tol = {"rtol": 1e-2, "atol": 2e-2} if dtype == F16 else {}
    run_node("ConvTranspose", {"x": rand(rng, *xs, dtype=dtype), "w": rand(rng, *ws, dtype=dtype),
                               "b": rand(rng, ws[1] * attrs.get("group", 1), dtype=dtype)}, attrs, **tol)


@pytest.mark.parametrize("use_mask", [False, True])
def test_deform_conv_groups_and_offset_groups(use_mask: bool) -> None:
    rng = np.random.default_rng(1)
    n, c, hgt, wid, oc, kh, kw, g, og = 2, 4, 6, 7, 4, 2, 3, 2, 2
    attrs = {"group": g, "offset_group": og, "pads": [1, 0, 1, 1], "strides": [1, 2], "dilations": [2, 1]}
    oh = (hgt + 2 - 2 * (kh - 1) - 1) // 1 + 1
    ow = (wid + 1 - (kw - 1) - 1) // 2 + 1
    feeds = {"x": rand(rng, n, c, hgt, wid), "w": rand(rng, oc, c // g, kh, kw),
             "offset": (2 * rand(rng, n, og * 2 * kh * kw, oh, ow)).astype(F32), "b": rand(rng, oc),
             "mask": rng.uniform(0, 1, (n, og * kh * kw, oh, ow)).astype(F32) if use_mask else None}
    run_node("DeformConv", feeds, attrs, opset=19, reference=True)


@pytest.mark.parametrize("image, block, attrs", [
    ([6, 7], [2, 3], {"pads": [1, 0, 0, 1], "strides": [2, 1]}),
    ([5, 5], [2, 2], {"dilations": [2, 1]}),
    ([4, 5, 3], [2, 2, 2], {"strides": [1, 2, 1], "pads": [0, 1, 0, 1, 0, 1]}),
])
def test_col2im(image: list[int], block: list[int], attrs: dict) -> None:
    n = len(image)
    st = attrs.get("strides", [1] * n)
    dl = attrs.get("dilations", [1] * n)
    pd = attrs.get("pads", [0] * 2 * n)
    count = 1
    for i in range(n):
        count *= (image[i] + pd[i] + pd[n + i] - dl[i] * (block[i] - 1) - 1) // st[i] + 1
    rng = np.random.default_rng(0)
    feeds = {"x": rand(rng, 2, 3 * int(np.prod(block)), count), "image": np.array(image, np.int64),
             "block": np.array(block, np.int64)}
    run_node("Col2Im", feeds, attrs, opset=18, reference=True)


def test_conv_rejects_rank_6() -> None:
    rng = np.random.default_rng(0)
    m = node_model("Conv", {"x": rand(rng, 1, 1, 2, 2, 2, 2), "w": rand(rng, 1, 1, 1, 1, 1, 1)}, {}, 22)
    s = crossml.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    with pytest.raises(Exception, match="1 to 3 spatial axes"):
        s.run(None, {"x": rand(rng, 1, 1, 2, 2, 2, 2), "w": rand(rng, 1, 1, 1, 1, 1, 1)})
