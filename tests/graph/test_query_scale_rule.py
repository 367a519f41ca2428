"""FoldQueryScale: a constant factor on com.microsoft LinearAttention's query (Qwen3.5's query scaling Mul) folds
into the op's scale attribute. What it folds, what it refuses (with a reason), and the folded model's values against
the unfolded one."""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from crossml.graph.passes import node_attrs
from crossml.graph.passes.query_scale import QUERY_SCALE
from crossml.runtime.session import fusion_rules
from tests.graph._rules import contrib_model, fold_copy, rule_reason, unfused_session

RNG = np.random.default_rng(11)
HEADS, D = 2, 8
FACTOR = 0.35355339  # 1 / sqrt(8): not a power of two


def scaled_query(*, scale: float | None = 1.0, factor_input: bool = False, factor_first: bool = False,
                 second_reader: bool = False, constant_node: bool = False) -> onnx.ModelProto:
    """q -> Mul(factor) -> LinearAttention(gated_delta) with k, v, decay and beta inputs."""
    hd = HEADS * D
    inputs = [h.make_tensor_value_info(n, T.FLOAT, ["batch", "length", hd]) for n in ("q", "k", "v")]
    inputs += [h.make_tensor_value_info(n, T.FLOAT, ["batch", "length", HEADS]) for n in ("decay", "beta")]
    inits, nodes = [], []
    if constant_node:
        nodes.append(h.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array(FACTOR, np.float32))))
    else:
        inits.append(numpy_helper.from_array(np.array([FACTOR], np.float32), "c"))
    if factor_input:
        inputs.append(h.make_tensor_value_info("c", T.FLOAT, [1]))
    nodes.append(h.make_node("Mul", ["c", "q"] if factor_first else ["q", "c"], ["qs"], name="q_scaled"))
    attrs = dict(q_num_heads=HEADS, kv_num_heads=HEADS, update_rule="gated_delta")
    if scale is not None:
        attrs["scale"] = scale
    nodes.append(h.make_node("LinearAttention", ["qs", "k", "v", "", "decay", "beta"], ["o", "state"], name="la",
                             domain="com.microsoft", **attrs))
    outputs = [h.make_tensor_value_info(n, T.FLOAT, None) for n in ("o", "state")]
    if second_reader:
        nodes.append(h.make_node("Neg", ["qs"], ["n"], name="other"))
        outputs.append(h.make_tensor_value_info("n", T.FLOAT, None))
    return contrib_model(nodes, inputs, outputs, inits)


def _feed(batch: int = 2, length: int = 5) -> dict[str, np.ndarray]:
    keys = RNG.standard_normal((batch, length, HEADS, D))
    keys /= np.linalg.norm(keys, axis=-1, keepdims=True)
    return {"q": RNG.standard_normal((batch, length, HEADS * D)).astype(np.float32),
            "k": keys.reshape(batch, length, -1).astype(np.float32),
            "v": RNG.standard_normal((batch, length, HEADS * D)).astype(np.float32),
            "decay": -RNG.random((batch, length, HEADS)).astype(np.float32),
            "beta": RNG.random((batch, length, HEADS)).astype(np.float32)}


def test_folds_the_factor_with_the_unfolded_values() -> None:
    for kw in ({}, {"factor_first": True}, {"constant_node": True}, {"scale": 0.5}):
        m = scaled_query(**kw)
        folded, counts = fold_copy(m, QUERY_SCALE)
        assert counts == {"FoldQueryScale": 1}, kw
        assert [n.op_type for n in folded.graph.node if n.op_type != "Constant"] == ["LinearAttention"]
        (la,) = [n for n in folded.graph.node if n.op_type == "LinearAttention"]
        assert la.input[0] == "q" and la.domain == "com.microsoft"
        attrs = node_attrs(la)
        assert np.isclose(attrs["scale"], kw.get("scale", 1.0) * FACTOR, rtol=1e-6)
        assert attrs["update_rule"] in ("gated_delta", b"gated_delta") and attrs["q_num_heads"] == HEADS
        assert not any(t.name == "c" for t in folded.graph.initializer)
        x = _feed()
        for a, b in zip(unfused_session(folded).run(None, x), unfused_session(m).run(None, x)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_refusals_name_the_reason() -> None:
    assert "default scale" in rule_reason(QUERY_SCALE, scaled_query(scale=None), "Mul")
    assert "default scale" in rule_reason(QUERY_SCALE, scaled_query(scale=0.0), "Mul")
    assert "graph input" in rule_reason(QUERY_SCALE, scaled_query(factor_input=True), "Mul")
    assert fold_copy(scaled_query(second_reader=True), QUERY_SCALE)[1] == {}  # the scaled query is read elsewhere too


def test_runs_off_the_cpu_only() -> None:
    assert QUERY_SCALE in fusion_rules(None, torch.device("cuda"))
    assert QUERY_SCALE not in fusion_rules(None, torch.device("cpu"))
