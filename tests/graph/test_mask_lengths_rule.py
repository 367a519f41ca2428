"""The attention-mask lengths rule (ReduceSum over the last axis, Sub / Add of a constant, Cast => com.crossml
SumCast): what it fuses, what it refuses (with a reason), and that the fused model gives the unfused results, on
the CPU (the op's torch path) and on a GPU (its Triton kernel)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

import crossml
from crossml.graph.load import prepare
from crossml.graph.passes import apply_rules
from crossml.graph.passes.mask_lengths import MASK_LENGTHS
from crossml.runtime.session import fusion_rules
from tests.conftest import make_model
from tests.graph._rules import rule_reason


def lengths(*, arith: str = "Sub", c: int = 1, axes: list[int] | None = None, keepdims: int = 0,
            mask_type: int = T.INT64, to: int = T.INT32, sum_used: bool = False,
            axes_node: bool = True, opset: int = 17, rank1: bool = False) -> onnx.ModelProto:
    """The builder's attn_mask_subgraph: ReduceSum(mask, axes) -> Sub(., c) -> Cast(to)."""
    axes = [1] if axes is None else axes
    nodes, inits = [], [numpy_helper.from_array(np.array([c], np.int64 if mask_type == T.INT64 else np.int32), "c")]
    if opset >= 13:
        if axes_node:
            nodes.append(h.make_node("Constant", [], ["axes"], value=numpy_helper.from_array(np.array(axes, np.int64))))
        else:
            inits.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
        nodes.append(h.make_node("ReduceSum", ["mask", "axes"], ["s"], name="sum", keepdims=keepdims))
    else:
        nodes.append(h.make_node("ReduceSum", ["mask"], ["s"], name="sum", axes=axes, keepdims=keepdims))
    nodes += [h.make_node(arith, ["s", "c"], ["t"], name="sub"),
              h.make_node("Cast", ["t"], ["seqlens"], name="cast", to=to)]
    outputs = [h.make_tensor_value_info("seqlens", to, None)]
    if sum_used:
        outputs.append(h.make_tensor_value_info("s", mask_type, None))
    axes_dims = ["total"] if rank1 else ["batch", "total"]  # rank 1, keepdims 0: the sum is a scalar, c is [1]
    m = make_model(nodes, [h.make_tensor_value_info("mask", mask_type, axes_dims)], outputs, inits, opset=opset)
    return prepare(m)


def _mask(rows: int = 3, cols: int = 37, dtype: type = np.int64) -> np.ndarray:
    m = np.ones((rows, cols), dtype)
    for r in range(rows):
        m[r, cols - 5 * r:] = 0
    return m


@pytest.mark.parametrize("variant", [{}, {"keepdims": 1}, {"arith": "Add", "c": 2}, {"axes": [-1]}, {"to": T.INT64},
                                     {"mask_type": T.INT32}, {"axes_node": False}, {"opset": 11}],
                         ids=["builder", "keepdims", "add", "negative-axis", "to-int64", "int32-mask", "axes-init",
                              "axes-attr"])
def test_fused_model_equals_unfused(variant: dict) -> None:
    m = lengths(**variant)
    feed = {"mask": _mask(dtype=np.int32 if variant.get("mask_type") == T.INT32 else np.int64)}
    want = crossml.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feed)[0]
    fused = onnx.ModelProto()
    fused.CopyFrom(m)
    assert apply_rules(fused, [MASK_LENGTHS]) == {"MaskLengths": 1}
    assert [n.op_type for n in fused.graph.node if n.op_type != "Constant"] == ["SumCast"]
    got = crossml.InferenceSession(fused, providers=["CPUExecutionProvider"]).run(None, feed)[0]
    assert got.dtype == want.dtype and got.shape == want.shape == ((3, 1) if variant.get("keepdims") else (3,))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(("variant", "reason"), [
    ({"rank1": True, "axes": [0]}, "would add dimensions to the sums"),
    ({"axes": [0]}, "does not reduce the last axis"),
    ({"axes": [0, 1]}, "does not reduce the last axis"),
    ({"to": T.FLOAT}, "casts to a type other than int32/int64"),
    ({"sum_used": True}, "'s' of 'sum' is used elsewhere"),
])
def test_rule_refuses_with_a_reason(variant: dict, reason: str) -> None:
    assert reason in rule_reason(MASK_LENGTHS, lengths(**variant), "Cast")


def test_rule_refuses_float_masks_and_unknown_constants() -> None:
    m = lengths()
    m.graph.input[0].type.tensor_type.elem_type = T.FLOAT
    assert "not an int32/int64 tensor" in rule_reason(MASK_LENGTHS, m, "Cast")
    m = lengths()
    m.graph.input.append(h.make_tensor_value_info("c2", T.INT64, [1]))
    next(n for n in m.graph.node if n.op_type == "Sub").input[1] = "c2"
    assert "one-value integer constant" in rule_reason(MASK_LENGTHS, m, "Cast")


def test_rule_runs_off_the_cpu_only() -> None:
    assert MASK_LENGTHS not in fusion_rules(None, torch.device("cpu"))
    assert MASK_LENGTHS in fusion_rules(None, torch.device("cuda"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: the fused node's Triton kernel runs on GPUs")
def test_gpu_session_fuses_and_matches_the_cpu() -> None:
    m = lengths()
    feed = {"mask": _mask(rows=2, cols=700)}
    want = crossml.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feed)[0]
    sess = crossml.InferenceSession(m, providers=["GPUExecutionProvider"])
    assert [n.op_type for n in sess._model.graph.node if n.op_type != "Constant"] == ["SumCast"]
    np.testing.assert_array_equal(sess.run(None, feed)[0], want)
