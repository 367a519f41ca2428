"""The row selection pass (``crossml.graph.passes.output_rows``) and the session entry ``crossml.output_rows``: a run
that feeds ``crossml.rows`` gets the output at those positions only, one that does not gets every position as before,
and the tail computes every position later from the inputs the selecting run gave. The reference is onnx's
ReferenceEvaluator on the model without the pass."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto as T
from onnx import helper as h
from onnx.reference import ReferenceEvaluator

import crossml
from crossml.graph.passes.output_rows import select_rows
from crossml.runtime.errors import InvalidArgument
from crossml.runtime.session import OUTPUT_ROWS, ROWS_INPUT
from tests.conftest import make_model

K, V = 8, 11


def _model(*, weight_input: bool = False, tail_output: bool = False, rank: int = 3,
           softmax: bool = False) -> onnx.ModelProto:
    """x [batch, positions, K] -> Add(0.5) -> MatMul(W) -> Div(3) -> Tanh -> Mul(3) -> logits (Gemma's softcap)."""
    rng = np.random.default_rng(0)
    dims = ["batch", "positions", K][3 - rank:]
    inits = [onnx.numpy_helper.from_array(np.float32(0.5), "half"), onnx.numpy_helper.from_array(np.float32(3), "cap")]
    inputs = [h.make_tensor_value_info("x", T.FLOAT, dims)]
    if weight_input:
        inputs.append(h.make_tensor_value_info("W", T.FLOAT, [K, V]))
    else:
        inits.append(onnx.numpy_helper.from_array(rng.standard_normal((K, V)).astype(np.float32), "W"))
    nodes = [h.make_node("Add", ["x", "half"], ["hidden"], name="add"),
             h.make_node("MatMul", ["hidden", "W"], ["product"], name="lm_head"),
             h.make_node("Div", ["product", "cap"], ["scaled"], name="div"),
             h.make_node("Softmax" if softmax else "Tanh", ["scaled"], ["capped"], name="tanh"),
             h.make_node("Mul", ["capped", "cap"], ["logits"], name="mul")]
    outputs = [h.make_tensor_value_info("logits", T.FLOAT, dims[:-1] + [V])]
    if tail_output:
        outputs.append(h.make_tensor_value_info("scaled", T.FLOAT, dims[:-1] + [V]))
    return make_model(nodes, inputs, outputs, inits)


def _session(m: onnx.ModelProto) -> crossml.InferenceSession:
    so = crossml.SessionOptions()
    so.add_session_config_entry(OUTPUT_ROWS, "logits")
    return crossml.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


def test_selected_rows_and_the_tail_match_the_model() -> None:
    m = _model()
    x = np.random.default_rng(1).standard_normal((3, 5, K)).astype(np.float32)
    ref = ReferenceEvaluator(m).run(None, {"x": x})[0]
    sess = _session(m)
    assert sess._tail is not None and [n.op_type for n in sess._tail.nodes] == ["MatMul", "Div", "Tanh", "Mul"]
    assert sess._tail.inputs == ["hidden"]
    assert [o.name for o in sess.get_outputs()] == ["logits", "hidden"]
    assert [a.name for a in sess.get_overridable_initializers()] == [ROWS_INPUT]
    # not fed: every position, as without the pass
    np.testing.assert_allclose(sess.run(["logits"], {"x": x})[0], ref, rtol=1e-6, atol=1e-6)
    rows = np.array([4, 0, -2], dtype=np.int64)
    logits, hidden = sess.run(None, {"x": x, ROWS_INPUT: rows})
    assert logits.shape == (3, 1, V)
    np.testing.assert_allclose(logits[:, 0], ref[np.arange(3), rows], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(hidden, x + 0.5)  # every position of the product's input
    full = sess._run_tail([torch.as_tensor(hidden)])
    np.testing.assert_allclose(full.numpy(), ref, rtol=1e-6, atol=1e-6)


def test_bad_rows_are_named() -> None:
    sess = _session(_model())
    x = np.zeros((2, 4, K), dtype=np.float32)
    with pytest.raises(Exception, match="one position per batch row"):
        sess.run(None, {"x": x, ROWS_INPUT: np.zeros(3, dtype=np.int64)})
    with pytest.raises(Exception, match=r"position 4 of batch row 1 is outside \[-4, 4\)"):
        sess.run(None, {"x": x, ROWS_INPUT: np.array([0, 4], dtype=np.int64)})


@pytest.mark.parametrize("case", ["weight_input", "tail_output", "rank2", "softmax"])
def test_outputs_the_pass_leaves(case: str) -> None:
    """A product whose weight is not a constant, a tail value read elsewhere (here a graph output), a rank-2 output and
    a node that is not applied position by position (Softmax) each leave the graph as it is."""
    m = _model(weight_input=case == "weight_input", tail_output=case == "tail_output", rank=2 if case == "rank2" else 3,
               softmax=case == "softmax")
    before = m.SerializeToString()
    assert select_rows(m, "logits", ROWS_INPUT) is None
    assert m.SerializeToString() == before
    sess = _session(m)
    assert sess._tail is None and ROWS_INPUT not in [a.name for a in sess.get_overridable_initializers()]
    with pytest.raises(InvalidArgument, match=OUTPUT_ROWS):
        sess._run_tail([torch.zeros(1, 1, K)])


def test_runs_without_rows_keep_the_graphs_steps() -> None:
    """Plans of runs that do not feed ``crossml.rows`` (decode steps) have no GatherRows step: their steps, and what
    each kernel knows of the step before it, are those of a session without the pass; a run that feeds it has one."""
    m = _model()
    sess = _session(m)
    plain = crossml.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    assert [st.op_type for st in sess._plan.steps] == [st.op_type for st in plain._plan.steps]
    x = np.ones((2, 3, K), dtype=np.float32)
    sess.run(None, {"x": x})
    assert sess._rows_plan is None
    sess.run(None, {"x": x, ROWS_INPUT: np.array([2, 0], dtype=np.int64)})
    assert [st.op_type for st in sess._rows_plan.steps].count("GatherRows") == 1


def test_optimized_model_of_a_selecting_session(tmp_path) -> None:
    """The optimized model a selecting session writes (its generic plan's nodes: GatherRows passed through as an
    Identity) is a valid model computing every position."""
    m = _model()
    so = crossml.SessionOptions()
    so.add_session_config_entry(OUTPUT_ROWS, "logits")
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    crossml.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    written = onnx.load(str(tmp_path / "opt.onnx"))
    x = np.random.default_rng(2).standard_normal((2, 3, K)).astype(np.float32)
    want = ReferenceEvaluator(m).run(["logits"], {"x": x})[0]
    got = crossml.InferenceSession(written.SerializeToString(), providers=["CPUExecutionProvider"]).run(["logits"], {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
