"""The embedding-norm rule (Gather of a table's rows, then SimplifiedLayerNormalization => com.crossml GatherNorm):
what it fuses, what it refuses (with a reason), and that the fused model gives the unfused results, on the CPU (the
op's torch path) and on a GPU (its Triton kernel)."""

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
from crossml.graph.passes.gather_norm import GATHER_NORM
from crossml.runtime.session import fusion_rules
from tests.conftest import make_model
from tests.graph._rules import rule_reason

V, H = 50, 32


def embed_norm(*, dtype: int = T.FLOAT, gather_axis: int | None = None, norm_attrs: dict | None = None,
               inv_used: bool = False, table_input: bool = False, table_shape: list | None = None,
               tied: bool = False) -> onnx.ModelProto:
    """The builder's model head: Gather(table, input_ids) -> rows, SimplifiedLayerNormalization(rows, scale) -> y,
    and rows read again by the first residual Add. ``tied``: the table is Transpose(lm_head weight [H, V]), as the
    builder exports a model whose embeddings are tied to its output projection."""
    np_type = {T.FLOAT: np.float32, T.FLOAT16: np.float16, T.INT64: np.int64}[dtype]
    rng = np.random.default_rng(0)
    table = (rng.standard_normal((V, H)) * 2).astype(np_type)
    scale = rng.standard_normal(H).astype(np.float32 if dtype == T.INT64 else np_type)
    inits = [numpy_helper.from_array(scale, "scale")]
    inputs = [h.make_tensor_value_info("input_ids", T.INT64, ["batch", "seq"])]
    nodes = []
    if table_input:
        inputs.append(h.make_tensor_value_info("table", dtype, table_shape))
    elif tied:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(table.T), "lm_head"))
        nodes.append(h.make_node("Transpose", ["lm_head"], ["table"], name="tied", perm=[1, 0]))
    else:
        inits.append(numpy_helper.from_array(table, "table"))
    gather_kw = {} if gather_axis is None else {"axis": gather_axis}
    norm_outputs = ["y", "inv"] if inv_used else ["y"]
    nodes += [h.make_node("Gather", ["table", "input_ids"], ["rows"], name="embed", **gather_kw),
             h.make_node("SimplifiedLayerNormalization", ["rows", "scale"], norm_outputs, name="norm",
                         **({"axis": -1, "epsilon": 1e-6, "stash_type": 1} | (norm_attrs or {}))),
             h.make_node("Add", ["rows", "y"], ["residual"], name="residual")]
    y_type = T.FLOAT if dtype == T.INT64 else dtype
    outputs = [h.make_tensor_value_info("y", y_type, None), h.make_tensor_value_info("residual", y_type, None)]
    if inv_used:
        outputs.append(h.make_tensor_value_info("inv", T.FLOAT, None))
    return prepare(make_model(nodes, inputs, outputs, inits))


def _ids() -> np.ndarray:
    return np.array([[3, 49, 0, 17], [-1, 5, 5, -50]], dtype=np.int64)


@pytest.mark.parametrize("variant", [{}, {"gather_axis": 0}, {"norm_attrs": {"axis": 2}},
                                     {"norm_attrs": {"epsilon": 1e-2}}, {"dtype": T.FLOAT16}, {"tied": True}],
                         ids=["builder", "axis-0-explicit", "positive-norm-axis", "epsilon", "float16", "tied"])
def test_fused_model_equals_unfused(variant: dict) -> None:
    m = embed_norm(**variant)
    feed = {"input_ids": _ids()}
    want = crossml.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feed)
    fused = onnx.ModelProto()
    fused.CopyFrom(m)
    assert apply_rules(fused, [GATHER_NORM]) == {"GatherNorm": 1}
    assert [n.op_type for n in fused.graph.node] == ["Transpose"] * bool(variant.get("tied")) + ["GatherNorm", "Add"]
    assert list(fused.graph.node[-2].output) == ["y", "rows"]
    got = crossml.InferenceSession(fused, providers=["CPUExecutionProvider"]).run(None, feed)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape == (2, 4, H)
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize(("variant", "reason"), [
    ({"gather_axis": 1}, "does not gather along axis 0"),
    ({"norm_attrs": {"stash_type": 0}}, "stash_type 0"),
    ({"norm_attrs": {"axis": 1}}, "does not normalize over the last axis alone"),
    ({"inv_used": True}, "the inverse standard deviation 'inv' of 'norm' is used"),
    ({"table_input": True, "table_shape": None}, "is not known to be 2-D"),
    ({"table_input": True, "table_shape": [V, 4, 8]}, "is not known to be 2-D"),
    ({"dtype": T.INT64}, "is not a float / float16 / bfloat16 tensor"),
])
def test_rule_refuses_with_a_reason(variant: dict, reason: str) -> None:
    assert reason in rule_reason(GATHER_NORM, embed_norm(**variant), "SimplifiedLayerNormalization")


def test_rule_takes_a_table_input_of_known_shape() -> None:
    m = embed_norm(table_input=True, table_shape=[V, H])
    assert rule_reason(GATHER_NORM, m, "SimplifiedLayerNormalization") is None
    rng = np.random.default_rng(1)
    feed = {"input_ids": _ids(), "table": rng.standard_normal((V, H)).astype(np.float32)}
    want = crossml.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feed)
    assert apply_rules(m, [GATHER_NORM]) == {"GatherNorm": 1}
    got = crossml.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feed)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_fused_op_raises_as_gather_for_indices_outside_the_table_on_the_cpu() -> None:
    m = embed_norm()
    assert apply_rules(m, [GATHER_NORM]) == {"GatherNorm": 1}
    sess = crossml.InferenceSession(m, providers=["CPUExecutionProvider"])
    with pytest.raises(Exception, match="index|out of range|bounds"):
        sess.run(None, {"input_ids": np.array([[V]], dtype=np.int64)})


def test_rule_runs_off_the_cpu_only() -> None:
    assert GATHER_NORM not in fusion_rules(None, torch.device("cpu"))
    assert GATHER_NORM in fusion_rules(None, torch.device("cuda"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: the fused node's Triton kernel runs on GPUs")
@pytest.mark.parametrize(("dtype", "tied"), [(T.FLOAT, False), (T.FLOAT16, False), (T.FLOAT16, True)])
def test_gpu_session_fuses_and_matches_the_cpu(dtype: int, tied: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused node runs the one kernel (a tied table too: a transposed view) and gives the CPU's results."""
    from crossml.kernels import rmsnorm
    from tests.kernels._common import record_calls

    calls = record_calls(monkeypatch, rmsnorm, "gather_rms_norm")
    m = embed_norm(dtype=dtype, tied=tied)
    feed = {"input_ids": _ids()}
    want = crossml.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feed)
    sess = crossml.InferenceSession(m, providers=["GPUExecutionProvider"])
    assert [n.op_type for n in sess._model.graph.node if n.op_type != "Transpose"] == ["GatherNorm", "Add"]
    got = sess.run(None, feed)
    assert calls and set(calls) == {"gather_rms_norm"}
    tol = 1e-5 if dtype == T.FLOAT else 2e-3
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g.astype(np.float32), w.astype(np.float32), rtol=tol, atol=tol)
