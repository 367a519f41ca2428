"""Shared by the rule tests: why a rule refuses the match it makes at a model's first node of a type."""

from __future__ import annotations

import onnx
from onnx import helper

from crossml.graph.load import prepare
from crossml.graph.passes import GraphView, Rule
from tests.conftest import make_model


def rule_reason(rule: Rule, m: onnx.ModelProto, op_type: str) -> str | None:
    """``rule``'s check of its match at the first ``op_type`` node of ``m`` (which must match): the reason it
    refuses, None when it accepts."""
    view = GraphView.of(m.graph)
    node = next(n for n in m.graph.node if n.op_type == op_type)
    match = rule.match(view, node)
    assert match is not None
    return rule.check(view, match)


def contrib_model(nodes: list, inputs: list, outputs: list, inits: list, *domains: str) -> onnx.ModelProto:
    """A prepared model of these nodes importing com.microsoft (and ``domains``) at opset 1."""
    m = make_model(nodes, inputs, outputs, inits)
    m.opset_import.extend(helper.make_opsetid(d, 1) for d in ("com.microsoft", *domains))
    return prepare(m)
