"""The residual-norm rule (Add -> LayerNormalization => com.microsoft SkipLayerNormalization): what it fuses,
what it refuses (with a reason), and that the fused model gives the unfused results on the CPU (the op's torch
path) and on a GPU (its Triton kernel)."""

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
from crossml.graph.passes.skip_layer_norm import SKIP_LAYER_NORM
from tests.conftest import make_model
from tests.graph._rules import rule_reason

H = 48


def block(*, shape_b=(2, 5, H), bias=True, axis=-1, stash_type=1, sum_used=False, stats=False,
          elem=T.FLOAT) -> onnx.ModelProto:
    """a + b -> LayerNormalization(scale, B) -> y, as BERT's residual tails."""
    rng = np.random.default_rng(0)
    dt = onnx.helper.tensor_dtype_to_np_dtype(elem)
    inits = [numpy_helper.from_array(rng.standard_normal(H).astype(dt), "scale")]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(H).astype(dt), "B"))
    outs = [h.make_tensor_value_info("y", elem, None)]
    norm_outs = ["y", "mean"] if stats else ["y"]
    if stats:
        outs.append(h.make_tensor_value_info("mean", T.FLOAT, None))
    if sum_used:
        outs.append(h.make_tensor_value_info("s", elem, None))
    nodes = [h.make_node("Add", ["a", "b"], ["s"], name="add"),
             h.make_node("LayerNormalization", ["s", "scale"] + (["B"] if bias else []), norm_outs, name="ln",
                         axis=axis, epsilon=1e-6, stash_type=stash_type)]
    return prepare(make_model(nodes, [h.make_tensor_value_info("a", elem, [2, 5, H]),
                                      h.make_tensor_value_info("b", elem, list(shape_b))], outs, inits))


def feeds(elem=T.FLOAT) -> dict:
    rng = np.random.default_rng(1)
    dt = onnx.helper.tensor_dtype_to_np_dtype(elem)
    return {"a": (3 * rng.standard_normal((2, 5, H)) + 1).astype(dt), "b": rng.standard_normal((2, 5, H)).astype(dt)}


@pytest.mark.parametrize("bias", [True, False])
def test_fuses_with_the_unfused_results(bias):
    m = block(bias=bias)
    want = crossml.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feeds())[0]
    assert apply_rules(m, [SKIP_LAYER_NORM]) == {"SkipLayerNorm": 1}
    (node,) = m.graph.node
    assert node.op_type == "SkipLayerNormalization" and node.domain == "com.microsoft"
    assert list(node.input) == ["a", "b", "scale"] + (["B"] if bias else [])
    got = crossml.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feeds())[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_refuses_with_reasons():
    assert "not one known shape" in rule_reason(SKIP_LAYER_NORM, block(shape_b=(1, 5, H)), "LayerNormalization")
    assert "is not the last" in rule_reason(SKIP_LAYER_NORM, block(axis=1), "LayerNormalization")
    assert "stash_type" in rule_reason(SKIP_LAYER_NORM, block(stash_type=0), "LayerNormalization")
    assert "outputs are used" in rule_reason(SKIP_LAYER_NORM, block(stats=True), "LayerNormalization")
    m = block(sum_used=True)  # the sum is also a graph output: nothing to fuse
    assert apply_rules(m, [SKIP_LAYER_NORM]) == {}


def test_cpu_sessions_keep_the_model_ops():
    s = crossml.InferenceSession(block(), providers=["CPUExecutionProvider"])
    assert [st.op_type for st in s._plan.steps] == ["Add", "LayerNormalization"]


@pytest.mark.gpu
@pytest.mark.parametrize("elem", [T.FLOAT, T.FLOAT16])
def test_gpu_session_fuses_and_matches_the_cpu(elem):
    m = block(elem=elem)
    want = crossml.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feeds(elem))[0]
    s = crossml.InferenceSession(m, providers=["GPUExecutionProvider"])
    assert [st.op_type for st in s._plan.steps] == ["SkipLayerNormalization"]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        got = s.run(None, feeds(elem))[0]
        torch.cuda.synchronize()
    assert any("_rms_norm_kernel" in e.name for e in prof.events()), "the Triton kernel did not run"
    tol = 1e-2 if elem == T.FLOAT16 else 1e-5  # fp16: the fused sum is not rounded before normalizing
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=tol, atol=tol)
