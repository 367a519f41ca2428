"""The Conv(+Add)+Relu / Clip(0, max) fusion rule: what it fuses, what it refuses (with a reason), same results."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto as T
from onnx import helper as h

import crossml
from crossml.graph.load import prepare
from crossml.graph.passes import GraphView, apply_rules, node_attrs
from crossml.graph.passes.conv_relu import RULE
from crossml.ops.fused import fused_conv
from tests.conftest import make_model
from tests.graph._rules import rule_reason

RNG = np.random.default_rng(0)


def block(pads=(1, 1, 1, 1), residual=True, extra_use=False) -> onnx.ModelProto:
    w = onnx.numpy_helper.from_array(RNG.standard_normal((3, 3, 3, 3)).astype(np.float32), "w")
    b = onnx.numpy_helper.from_array(RNG.standard_normal(3).astype(np.float32), "b")
    nodes = [h.make_node("Conv", ["x", "w", "b"], ["c"], pads=list(pads), name="conv")]
    outs = [h.make_tensor_value_info("y", T.FLOAT, None)]
    if residual:
        nodes += [h.make_node("Add", ["x", "c"], ["s"]), h.make_node("Relu", ["s"], ["y"])]
    else:
        nodes += [h.make_node("Relu", ["c"], ["y"])]
    if extra_use:
        outs.append(h.make_tensor_value_info("c", T.FLOAT, None))
    return prepare(make_model(nodes, [h.make_tensor_value_info("x", T.FLOAT, [2, 3, 8, 8])], outs, [w, b]))


def test_fuses_residual_and_plain_blocks_with_same_results():
    x = RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)
    for residual in (True, False):
        m = block(residual=residual)
        want = crossml.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        assert apply_rules(m, [RULE]) == {"FuseConvRelu": 1}
        assert [n.op_type for n in m.graph.node] == ["FusedConv"]
        assert any(o.domain == "com.crossml" for o in m.opset_import)
        got = crossml.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_refuses_with_reasons():
    m = block(pads=(1, 1, 0, 0))
    view = GraphView.of(m.graph)
    match = RULE.match(view, m.graph.node[0])
    assert "symmetric pads" in RULE.check(view, match)
    assert apply_rules(m, [RULE]) == {}
    m2 = block(extra_use=True)  # the conv output is also a graph output: nothing to fuse
    assert RULE.match(GraphView.of(m2.graph), m2.graph.node[0]) is None


def clip_block(lo=0.0, hi=6.0, opset=17, const_bounds=True, residual=False) -> onnx.ModelProto:
    """Conv (+ Add) -> Clip: MobileNet's ReLU6 with the bounds as inputs (opset 11+) or attributes (opset 6)."""
    w = onnx.numpy_helper.from_array(RNG.standard_normal((3, 3, 3, 3)).astype(np.float32), "w")
    b = onnx.numpy_helper.from_array(RNG.standard_normal(3).astype(np.float32), "b")
    inits = [w, b]
    nodes = [h.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv")]
    last = "c"
    if residual:
        nodes.append(h.make_node("Add", ["c", "x"], ["s"]))
        last = "s"
    inputs = [h.make_tensor_value_info("x", T.FLOAT, [2, 3, 8, 8])]
    if opset < 11:
        nodes.append(h.make_node("Clip", [last], ["y"], min=lo, max=hi))
    elif const_bounds:
        inits += [onnx.numpy_helper.from_array(np.array(lo, np.float32), "lo")]
        nodes += [h.make_node("Constant", [], ["hi"], value=onnx.numpy_helper.from_array(np.array(hi, np.float32)))]
        nodes.append(h.make_node("Clip", [last, "lo", "hi"], ["y"]))
    else:
        inputs.append(h.make_tensor_value_info("hi", T.FLOAT, []))
        inits += [onnx.numpy_helper.from_array(np.array(lo, np.float32), "lo")]
        nodes.append(h.make_node("Clip", [last, "lo", "hi"], ["y"]))
    return prepare(make_model(nodes, inputs, [h.make_tensor_value_info("y", T.FLOAT, None)], inits, opset=opset))


@pytest.mark.parametrize("opset,residual", [(17, False), (6, False), (17, True)])
def test_fuses_relu6_clip_with_same_results(opset, residual):
    x = 3 * RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)
    m = clip_block(opset=opset, residual=residual)
    want = crossml.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert 0 < (want == 6).sum() and 0 < (want == 0).sum()  # both bounds bite
    assert apply_rules(m, [RULE]) == {"FuseConvRelu": 1}
    fused = [n for n in m.graph.node if n.op_type == "FusedConv"]
    assert len(fused) == 1 and node_attrs(fused[0])["activation"] == b"Clip"
    assert node_attrs(fused[0])["activation_params"] == [0.0, 6.0]
    got = crossml.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_refuses_clips_that_are_not_relu6():
    assert "not (0, a finite max)" in rule_reason(RULE, clip_block(lo=-1.0), "Conv")
    assert "not (0, a finite max)" in rule_reason(RULE, clip_block(hi=-1.0), "Conv")
    assert "not constants" in rule_reason(RULE, clip_block(const_bounds=False), "Conv")


def test_fused_conv_rejects_other_activations():
    x = torch.zeros(1, 3, 4, 4)
    w = torch.zeros(3, 3, 1, 1)
    with pytest.raises(ValueError, match="activation 'Relu', or 'Clip' with activation_params"):
        fused_conv(x, w, activation="Clip", activation_params=[-1.0, 6.0])
    with pytest.raises(ValueError, match="got 'Sigmoid'"):
        fused_conv(x, w, activation="Sigmoid")
