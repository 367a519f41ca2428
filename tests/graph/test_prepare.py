"""graph.load.prepare: onnx shape inference on the weightless skeleton, its findings copied back."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from crossml.graph.load import SKELETON_MAX_ELEMENTS, prepare, skeleton
from tests.conftest import make_model


def _model() -> onnx.ModelProto:
    """x @ W (a large initializer), reshaped by a small shape initializer, and an If whose branches add a bias."""
    w = numpy_helper.from_array(np.ones((8, 16), np.float32), "W")
    shape = numpy_helper.from_array(np.array([4, 2, 8], np.int64), "shape")
    then = h.make_graph([h.make_node("Add", ["r", "W2"], ["t"])], "then", [], [h.make_tensor_value_info("t", T.FLOAT, None)])
    els = h.make_graph([h.make_node("Sub", ["r", "W2"], ["e"])], "else", [], [h.make_tensor_value_info("e", T.FLOAT, None)])
    w2 = numpy_helper.from_array(np.ones((5, 4, 2, 8), np.float32), "W2")
    nodes = [h.make_node("MatMul", ["x", "W"], ["y"]), h.make_node("Reshape", ["y", "shape"], ["r"]),
             h.make_node("If", ["c"], ["z"], then_branch=then, else_branch=els)]
    inputs = [h.make_tensor_value_info("x", T.FLOAT, [4, 8]), h.make_tensor_value_info("c", T.BOOL, [])]
    return make_model(nodes, inputs, [h.make_tensor_value_info("z", T.FLOAT, None)], [w, shape, w2])


def test_skeleton_turns_large_initializers_into_inputs() -> None:
    m = _model()
    sk = skeleton(m)
    assert {t.name for t in sk.graph.initializer} == {"shape"}  # 3 elements <= SKELETON_MAX_ELEMENTS
    big = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in sk.graph.input}
    assert big["W"] == [8, 16] and big["W2"] == [5, 4, 2, 8]
    assert 8 * 16 > SKELETON_MAX_ELEMENTS >= 3
    assert len(m.graph.initializer) == 3 and numpy_helper.to_array(m.graph.initializer[0]).shape == (8, 16)


def test_prepare_infers_through_the_skeleton() -> None:
    given = _model()
    m = prepare(given)
    assert m is not given and not given.graph.value_info  # the argument is left as it was
    types = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in m.graph.value_info}
    assert types["y"] == [4, 16] and types["r"] == [4, 2, 8]  # the reshape target was read (data propagation)
    assert [d.dim_value for d in m.graph.output[0].type.tensor_type.shape.dim] == [5, 4, 2, 8]
    assert {t.name for t in m.graph.initializer} == {"W", "shape", "W2"}  # the weights stay initializers
    assert not any(vi.name == "W" for vi in m.graph.input)
    branch = next(a.g for a in m.graph.node[2].attribute if a.name == "then_branch")
    assert [d.dim_value for d in branch.output[0].type.tensor_type.shape.dim] == [5, 4, 2, 8]
