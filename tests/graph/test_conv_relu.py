"""The Conv(+Add)+Relu fusion rule: what it fuses, what it refuses (with a reason), same results."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h

import crossml
from crossml.graph.load import prepare
from crossml.graph.passes import GraphView, apply_rules
from crossml.graph.passes.conv_relu import RULE
from tests.conftest import make_model

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
