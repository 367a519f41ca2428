"""MergeSiblingMatMul: the products of one activation by constant weights become one MatMul and a Split (Qwen3.5's
four input projections of a Gated DeltaNet layer). What it merges, what it refuses (with a reason), and the merged
model's values against the unmerged one."""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from crossml.graph.passes import apply_rules
from crossml.graph.passes.sibling_matmul import SIBLING_MATMUL
from crossml.runtime.session import fusion_rules
from tests.conftest import make_model
from tests.graph._rules import unfused_session

RNG = np.random.default_rng(5)
K = 16
WIDTHS = [24, 8, 4, 4]  # a q | k | v projection, a gate, two narrow gate inputs


def siblings(*, widths=WIDTHS, weight_input: bool = False, other_k: bool = False, opset: int = 21) -> onnx.ModelProto:
    """x -> norm -> one MatMul per width, each output used by its own node (the products' consumers come after all
    of them, as in the builder's graphs, and one before the last product)."""
    inits, nodes = [], [h.make_node("Relu", ["x"], ["a"], name="norm")]
    inputs = [h.make_tensor_value_info("x", T.FLOAT, ["batch", "length", K])]
    outputs = []
    for i, n in enumerate(widths):
        w = RNG.standard_normal((K + (4 if other_k and i == 2 else 0), n)).astype(np.float32)
        if weight_input and i == 1:
            inputs.append(h.make_tensor_value_info(f"w{i}", T.FLOAT, list(w.shape)))
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(h.make_node("MatMul", ["a", f"w{i}"], [f"y{i}"], name=f"mm{i}"))
        if i == 0:  # a consumer between the products: the merged node must come before it
            nodes.append(h.make_node("Sigmoid", ["y0"], ["s0"], name="early"))
            outputs.append(h.make_tensor_value_info("s0", T.FLOAT, None))
    for i in range(1, len(widths)):
        nodes.append(h.make_node("Tanh", [f"y{i}"], [f"t{i}"], name=f"use{i}"))
        outputs.append(h.make_tensor_value_info(f"t{i}", T.FLOAT, None))
    return make_model(nodes, inputs, outputs, inits, opset=opset)


def test_merges_the_products_with_the_unmerged_values() -> None:
    m = siblings()
    ref = unfused_session(m)
    merged = onnx.ModelProto()
    merged.CopyFrom(m)
    assert apply_rules(merged, [SIBLING_MATMUL]) == {"MergeSiblingMatMul": 1}
    ops = [n.op_type for n in merged.graph.node]
    assert ops.count("MatMul") == 1 and ops.count("Split") == 1
    assert ops.index("MatMul") < ops.index("Sigmoid")  # ahead of every consumer
    (w,) = [t for t in merged.graph.initializer if t.name.endswith("siblings_weight")]
    assert list(w.dims) == [K, sum(WIDTHS)] and not any(t.name in ("w0", "w1") for t in merged.graph.initializer)
    x = {"x": RNG.standard_normal((2, 3, K)).astype(np.float32)}
    got = unfused_session(merged).run(None, x)
    for a, b in zip(got, ref.run(None, x)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_refusals_name_the_reason() -> None:
    from tests.graph._rules import rule_reason

    assert "is not a constant 2-D initializer" in rule_reason(SIBLING_MATMUL, siblings(weight_input=True), "MatMul")
    assert "differ in weight type or K" in rule_reason(SIBLING_MATMUL, siblings(other_k=True), "MatMul")
    m = siblings(opset=12)
    assert apply_rules(m, [SIBLING_MATMUL]) == {}  # Split takes its sizes as an input from opset 13


def test_a_single_product_is_left_alone() -> None:
    assert apply_rules(siblings(widths=[24]), [SIBLING_MATMUL]) == {}


def test_runs_off_the_cpu_only() -> None:
    assert SIBLING_MATMUL in fusion_rules(None, torch.device("cuda"))
    assert SIBLING_MATMUL not in fusion_rules(None, torch.device("cpu"))
