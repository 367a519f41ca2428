"""Shared by the rule tests: why a rule refuses the match it makes at a model's first node of a type."""

from __future__ import annotations

import onnx

from crossml.graph.passes import GraphView, Rule


def rule_reason(rule: Rule, m: onnx.ModelProto, op_type: str) -> str | None:
    """``rule``'s check of its match at the first ``op_type`` node of ``m`` (which must match): the reason it
    refuses, None when it accepts."""
    view = GraphView.of(m.graph)
    node = next(n for n in m.graph.node if n.op_type == op_type)
    match = rule.match(view, node)
    assert match is not None
    return rule.check(view, match)
