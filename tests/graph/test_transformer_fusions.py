"""Attention, GELU and Linear fusions on a torch-exported BERT encoder: they fire, and the fused
model still matches onnxruntime (fp32, 1e-4)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime

import crossml
from crossml.graph.load import prepare
from crossml.graph.passes import apply_rules
from crossml.graph.passes.attention import RULE as ATTENTION
from crossml.graph.passes.gelu import RULE as GELU
from crossml.graph.passes.linear import RULE as LINEAR
from crossml.zoo import example_inputs, export


def test_bert_fusions_fire_and_match_onnxruntime():
    path = export("bert_tiny")
    m = prepare(onnx.load(path))
    fired = apply_rules(m, [GELU, ATTENTION, LINEAR])
    layers = 2
    assert fired["FuseAttention"] == layers and fired["FuseGelu"] == layers
    assert fired["FuseLinear"] >= 4 * layers  # qkv, out, ff1, ff2 per layer
    ops = {n.op_type for n in m.graph.node}
    assert {"ScaledDotProductAttention", "FastGeluErf", "Linear"} <= ops and "Softmax" not in ops and "Erf" not in ops
    feeds = example_inputs("bert_tiny", batch=2, seq=24, seed=5)
    want = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = crossml.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def test_disabling_fusion_by_session_entry():
    so = crossml.SessionOptions()
    so.add_session_config_entry("ep.dml.disable_graph_fusion", "1")
    s = crossml.InferenceSession(export("bert_tiny"), so, providers=["CPUExecutionProvider"])
    assert "Softmax" in {st.op_type for st in s._plan.steps}
    s2 = crossml.InferenceSession(export("bert_tiny"), providers=["CPUExecutionProvider"])
    assert "ScaledDotProductAttention" in {st.op_type for st in s2._plan.steps}
