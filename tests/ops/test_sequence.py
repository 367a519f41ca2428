"""Sequence and optional ops against onnxruntime (CPU): negative positions, SplitToSequence with a
scalar split, ConcatFromSequence with new_axis, SequenceErase/Length, and the error messages."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import crossml

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def run(nodes, inputs, outputs, feed, opset=18):
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    blob = model.SerializeToString()
    want = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, feed)
    got = crossml.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, feed)
    return want, got


def same(want, got):
    if isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want)
        for w, g in zip(want, got):
            same(w, g)
        return
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    np.testing.assert_array_equal(got, want)


X = np.arange(24, dtype=np.float32).reshape(4, 6)
XI = [helper.make_tensor_value_info("x", F, [4, 6])]


@pytest.mark.parametrize("split,axis,keepdims", [(None, 1, 0), (None, 0, 1), (4, 1, 1), ([1, 3], 0, 1)])
def test_split_to_sequence_then_concat(split, axis, keepdims):
    ins = ["x"]
    feed = {"x": X}
    inputs = list(XI)
    if split is not None:
        ins.append("split")
        feed["split"] = np.array(split, np.int64)
        inputs.append(helper.make_tensor_value_info("split", I64, None))
    nodes = [helper.make_node("SplitToSequence", ins, ["seq"], axis=axis, keepdims=keepdims),
             helper.make_node("SequenceLength", ["seq"], ["n"]),
             helper.make_node("ConcatFromSequence", ["seq"], ["back"], axis=axis, new_axis=1 - keepdims)]
    outs = [helper.make_tensor_value_info("n", I64, []), helper.make_tensor_value_info("back", F, None),
            helper.make_tensor_sequence_value_info("seq", F, None)]
    want, got = run(nodes, inputs, outs, feed)
    for w, g in zip(want, got):
        same(w, g)


@pytest.mark.parametrize("pos", [0, -1, 2, -3])
def test_insert_at_erase(pos):
    p = np.array(pos, np.int64)
    nodes = [helper.make_node("SequenceConstruct", ["a", "b", "a"], ["s"]),
             helper.make_node("SequenceInsert", ["s", "b", "p"], ["s2"]),
             helper.make_node("SequenceAt", ["s2", "p"], ["at"]),
             helper.make_node("SequenceErase", ["s2", "p"], ["s3"]),
             helper.make_node("SequenceErase", ["s3"], ["s4"])]
    inputs = [helper.make_tensor_value_info(n, F, None) for n in ("a", "b")] + [
        helper.make_tensor_value_info("p", I64, [])]
    outs = [helper.make_tensor_value_info("at", F, None), helper.make_tensor_sequence_value_info("s4", F, None)]
    feed = {"a": np.ones((2, 2), np.float32), "b": np.zeros((3,), np.float32), "p": p}
    want, got = run(nodes, inputs, outs, feed)
    for w, g in zip(want, got):
        same(w, g)


def test_sequence_at_out_of_range_names_the_range():
    nodes = [helper.make_node("SequenceConstruct", ["a"], ["s"]), helper.make_node("SequenceAt", ["s", "p"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", F, None),
                                           helper.make_tensor_value_info("p", I64, [])],
                              [helper.make_tensor_value_info("y", F, None)])
    blob = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()
    sess = crossml.InferenceSession(blob)
    with pytest.raises(Exception, match=r"position 3 is out of range .* \[-1, 0\]"):
        sess.run(None, {"a": np.ones(2, np.float32), "p": np.array(3, np.int64)})


def test_optional_roundtrip():
    nodes = [helper.make_node("Optional", ["x"], ["o"]),
             helper.make_node("OptionalHasElement", ["o"], ["has"]),
             helper.make_node("OptionalGetElement", ["o"], ["y"])]
    outs = [helper.make_tensor_value_info("has", TensorProto.BOOL, []), helper.make_tensor_value_info("y", F, None)]
    want, got = run(nodes, XI, outs, {"x": X})
    for w, g in zip(want, got):
        same(w, g)
