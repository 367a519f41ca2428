"""Shared by the rule tests: why a rule refuses the match it makes at a model's first node of a type; a rule applied
to a copy of a model; a session without the provider's fusions."""

from __future__ import annotations

import onnx
from onnx import helper

import crossml
from crossml.graph.load import prepare
from crossml.graph.passes import GraphView, Rule, apply_rules, model_opset
from tests.conftest import make_model


def rule_reason(rule: Rule, m: onnx.ModelProto, op_type: str) -> str | None:
    """``rule``'s check of its match at the first ``op_type`` node of ``m`` (which must match): the reason it
    refuses, None when it accepts."""
    view = GraphView.of(m.graph)
    view.opset = model_opset(m)
    node = next(n for n in m.graph.node if n.op_type == op_type)
    match = rule.match(view, node)
    assert match is not None
    return rule.check(view, match)


def fold_copy(m: onnx.ModelProto, rule: Rule) -> tuple[onnx.ModelProto, dict[str, int]]:
    """A copy of ``m`` with ``rule`` applied, and the rule's counts (``apply_rules``); ``m`` stays as it is."""
    out = onnx.ModelProto()
    out.CopyFrom(m)
    return out, apply_rules(out, [rule])


def contrib_model(nodes: list, inputs: list, outputs: list, inits: list, *domains: str) -> onnx.ModelProto:
    """A prepared model of these nodes importing com.microsoft (and ``domains``) at opset 1."""
    m = make_model(nodes, inputs, outputs, inits)
    m.opset_import.extend(helper.make_opsetid(d, 1) for d in ("com.microsoft", *domains))
    return prepare(m)


def unfused_session(m: onnx.ModelProto, provider: str = "CPUExecutionProvider") -> crossml.InferenceSession:
    """A session of ``m`` with the graph rewrites off (session entry ep.dml.disable_graph_fusion=1): the reference a
    fused graph is compared with (CPU sessions fuse some 4-bit patterns themselves)."""
    so = crossml.SessionOptions()
    so.add_session_config_entry("ep.dml.disable_graph_fusion", "1")
    return crossml.InferenceSession(m, so, providers=[provider])
