"""x * 0.5 * (1 + erf(x / √2))  (as exporters write GELU)  =>  Gelu (one kernel)."""

from __future__ import annotations

import math

import onnx
from onnx import helper

from crossml.graph.passes import GraphView, Match, Rule
from crossml.graph.passes._consts import near, other_input, scalar

DOMAIN = "com.crossml"


def match(view: GraphView, node: onnx.NodeProto) -> Match | None:
    if node.op_type != "Erf":
        return None
    div = view.producer.get(node.input[0])
    add = view.only_consumer(node.output[0])
    if div is None or div.op_type not in ("Div", "Mul") or add is None or add.op_type != "Add":
        return None
    x = div.input[0]
    mul1 = view.only_consumer(add.output[0])
    if mul1 is None or mul1.op_type != "Mul":
        return None
    mul2 = view.only_consumer(mul1.output[0])
    if mul2 is None or mul2.op_type != "Mul":
        return None
    return Match([div, node, add, mul1, mul2], {"x": x})


def check(view: GraphView, m: Match) -> str | None:
    div, erf, add, mul1, mul2 = m.nodes
    x = m.info["x"]
    c = scalar(view, div.input[1])
    if not (near(c, math.sqrt(2)) if div.op_type == "Div" else near(c, 1 / math.sqrt(2))):
        return f"erf argument is not x/√2 (constant {c})"
    if not near(scalar(view, other_input(add, erf.output[0])), 1.0):
        return "not erf(...) + 1"
    if other_input(mul1, add.output[0]) != x:
        return "(1 + erf) is not multiplied by x"
    if not near(scalar(view, other_input(mul2, mul1.output[0])), 0.5):
        return "not scaled by 0.5"
    if view.only_consumer(div.output[0]) is None:
        return "x/√2 is used elsewhere"
    return None


def rewrite(view: GraphView, m: Match) -> list[onnx.NodeProto]:
    return [helper.make_node("FastGeluErf", [m.info["x"]], [m.nodes[-1].output[0]],
                             name=f"{m.nodes[1].name or 'erf'}_gelu", domain=DOMAIN)]


RULE = Rule("FuseGelu", match, check, rewrite, domains=((DOMAIN, 1),))
