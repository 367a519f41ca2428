"""If / Loop / Scan against onnxruntime (CPU) on cases the node tests miss: Loop without a trip count
or without a condition, zero iterations, outer-scope reads; Scan-9 axes and directions; Scan-8 with
sequence_lens."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import crossml

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def both(model, feed: dict) -> None:
    model.ir_version = 8
    blob = model.SerializeToString()
    want = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, feed)
    got = crossml.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, feed)
    assert len(want) == len(got)
    for w, g in zip(want, got):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        np.testing.assert_allclose(g, w, rtol=1e-6)


def loop_model(with_m: bool, with_cond: bool, opset: int = 13):
    """acc += x * (i + 1) while i < M and acc < limit (the body's condition); scan output: acc per step."""
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["i_f"], to=F),
         helper.make_node("Add", ["i_f", "one"], ["i1"]),
         helper.make_node("Mul", ["x", "i1"], ["step"]),
         helper.make_node("Add", ["acc_in", "step"], ["acc_out"]),
         helper.make_node("ReduceSum", ["acc_out"], ["total"], keepdims=0),
         helper.make_node("Less", ["total", "limit"], ["cond_out"]),
         helper.make_node("Identity", ["acc_out"], ["scan_out"])],
        "body",
        [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("c", B, []),
         helper.make_tensor_value_info("acc_in", F, [2])],
        [helper.make_tensor_value_info("cond_out", B, []), helper.make_tensor_value_info("acc_out", F, [2]),
         helper.make_tensor_value_info("scan_out", F, [2])],
        [helper.make_tensor("one", F, [], [1.0])])
    node = helper.make_node("Loop", ["M" if with_m else "", "cond" if with_cond else "", "acc0"],
                            ["acc", "scans"], body=body)
    inputs = [helper.make_tensor_value_info("x", F, [2]), helper.make_tensor_value_info("limit", F, []),
              helper.make_tensor_value_info("acc0", F, [2])]
    if with_m:
        inputs.append(helper.make_tensor_value_info("M", I64, []))
    if with_cond:
        inputs.append(helper.make_tensor_value_info("cond", B, []))
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("acc", F, [2]),
                                                    helper.make_tensor_value_info("scans", F, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("with_m,with_cond", [(True, True), (True, False), (False, True)])
def test_loop_trip_count_and_condition(with_m, with_cond):
    feed = {"x": np.array([1.0, 2.0], np.float32), "limit": np.array(20.0, np.float32),
            "acc0": np.zeros(2, np.float32)}
    if with_m:
        feed["M"] = np.array(5, np.int64)
    if with_cond:
        feed["cond"] = np.array(True)
    both(loop_model(with_m, with_cond), feed)


def test_loop_zero_iterations_keeps_initial_values():
    feed = {"x": np.array([1.0, 2.0], np.float32), "limit": np.array(20.0, np.float32),
            "acc0": np.array([3.0, 4.0], np.float32), "M": np.array(0, np.int64), "cond": np.array(True)}
    got = crossml.InferenceSession(loop_model(True, True).SerializeToString()).run(None, feed)
    np.testing.assert_array_equal(got[0], feed["acc0"])
    assert got[1].shape[0] == 0 and got[1].dtype == np.float32


def test_if_reads_outer_scope():
    then = helper.make_graph([helper.make_node("Add", ["a", "b"], ["r1"])], "then", [],
                             [helper.make_tensor_value_info("r1", F, [3])])
    other = helper.make_graph([helper.make_node("Sub", ["a", "b"], ["r2"])], "else", [],
                              [helper.make_tensor_value_info("r2", F, [3])])
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)], "g",
        [helper.make_tensor_value_info("c", B, []), helper.make_tensor_value_info("a", F, [3]),
         helper.make_tensor_value_info("b", F, [3])], [helper.make_tensor_value_info("y", F, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    a, b = np.arange(3, dtype=np.float32), np.ones(3, np.float32)
    for c in (True, False):
        both(model, {"c": np.array(c), "a": a, "b": b})


def scan9_model(in_axis: int, in_dir: int, out_axis: int, out_dir: int):
    """state += slice; scan output: state * slice."""
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]), helper.make_node("Mul", ["s_out", "x_t"], ["y_t"])],
        "body", [helper.make_tensor_value_info("s_in", F, [3]), helper.make_tensor_value_info("x_t", F, [3])],
        [helper.make_tensor_value_info("s_out", F, [3]), helper.make_tensor_value_info("y_t", F, [3])])
    node = helper.make_node("Scan", ["s0", "x"], ["s", "y"], body=body, num_scan_inputs=1,
                            scan_input_axes=[in_axis], scan_input_directions=[in_dir],
                            scan_output_axes=[out_axis], scan_output_directions=[out_dir])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("s0", F, [3]),
                                            helper.make_tensor_value_info("x", F, None)],
                              [helper.make_tensor_value_info("s", F, [3]), helper.make_tensor_value_info("y", F, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])


@pytest.mark.parametrize("in_axis,in_dir,out_axis,out_dir", [(0, 0, 0, 0), (1, 1, 0, 0), (0, 0, 1, 1),
                                                             (1, 0, -1, 0), (0, 1, 0, 1)])
def test_scan9_axes_and_directions(in_axis, in_dir, out_axis, out_dir):
    x = np.random.default_rng(1).standard_normal((4, 3) if in_axis == 0 else (3, 4)).astype(np.float32)
    both(scan9_model(in_axis, in_dir, out_axis, out_dir), {"s0": np.zeros(3, np.float32), "x": x})


def test_scan8_sequence_lens():
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]), helper.make_node("Identity", ["s_out"], ["y_t"])],
        "body", [helper.make_tensor_value_info("s_in", F, [2]), helper.make_tensor_value_info("x_t", F, [2])],
        [helper.make_tensor_value_info("s_out", F, [2]), helper.make_tensor_value_info("y_t", F, [2])])
    node = helper.make_node("Scan", ["lens", "s0", "x"], ["s", "y"], body=body, num_scan_inputs=1, directions=[1])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("lens", I64, [2]),
                                            helper.make_tensor_value_info("s0", F, [2, 2]),
                                            helper.make_tensor_value_info("x", F, [2, 3, 2])],
                              [helper.make_tensor_value_info("s", F, [2, 2]), helper.make_tensor_value_info("y", F, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 8)])
    x = np.arange(12, dtype=np.float32).reshape(2, 3, 2)
    both(model, {"lens": np.array([3, 2], np.int64), "s0": np.ones((2, 2), np.float32), "x": x})
