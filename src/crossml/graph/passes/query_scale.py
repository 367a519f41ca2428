"""Mul(q, c) → LinearAttention(query=…, scale=s)  =>  LinearAttention(query=q, scale=s * c): a constant factor on the
query of a com.microsoft LinearAttention folds into the op's ``scale`` attribute.

Qwen3.5's Gated DeltaNet layers scale the L2-normalized query by 1 / sqrt(d_k) in a Mul of their own (the builder
gives LinearAttention ``scale=1``): in a decode step that Mul is a launch of its own on a strided view, one a layer.
The op multiplies ``scale`` into ``q^T S`` in float32, so the folded graph computes the same product with the factor
applied once in float32 instead of rounding ``q * c`` to the query's type first: the values agree within that
rounding (exactly where c is a power of two and ``q * c`` stays a normal number). The rule needs the Mul's other
input to be a one-element floating constant (an initializer that is not a graph input, or a Constant node), the
Mul's output read by that LinearAttention alone, as its query, and the op's ``scale`` attribute set and non-zero (0,
its default, means 1 / sqrt(d_k), which would need the query's shape). It runs off the CPU only, where the CPU
provider keeps the model's ops (its values stay bit-close to onnxruntime's).
"""

from __future__ import annotations

import math

import onnx
from onnx import helper

from crossml.graph.passes import GraphView, Match, Rule, node_attrs
from crossml.graph.passes._consts import constant, other_input, scalar

_MS = "com.microsoft"
_FLOATS = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE)


def _is_linear_attention(node: onnx.NodeProto) -> bool:
    return node.op_type == "LinearAttention" and node.domain == _MS


def _factor_input(view: GraphView, mul: onnx.NodeProto) -> tuple[str, float] | None:
    """The Mul's input that is a one-element constant (the other one being the query) and its value, else None."""
    for name in mul.input:
        if (value := scalar(view, name)) is not None:
            return name, value
    return None


def match(view: GraphView, node: onnx.NodeProto) -> Match | None:
    if node.op_type != "Mul" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
        return None
    user = view.only_consumer(node.output[0])
    if user is None or not _is_linear_attention(user) or user.input[0] != node.output[0]:
        return None
    found = _factor_input(view, node)
    if found is None:
        return None
    factor, value = found
    return Match([node, user], {"factor": factor, "value": value, "query": other_input(node, factor)})


def check(view: GraphView, m: Match) -> str | None:
    mul, la = m.nodes
    factor = m.info["factor"]
    if m.info["query"] == factor:
        return f"both inputs of '{mul.name}' are the constant '{factor}'"
    if any(vi.name == factor for vi in view.graph.input):
        return f"the factor '{factor}' of '{mul.name}' is a graph input (an overridable initializer)"
    t = constant(view, factor)
    if t is not None and t.data_type not in _FLOATS:
        return f"the factor '{factor}' of '{mul.name}' is not a floating-point constant"
    if not view.read_once(mul.output[0]):
        return f"the output of '{mul.name}' is read by more than '{la.name}'"
    scale = node_attrs(la).get("scale", 0.0)
    if not scale:
        return (f"'{la.name}' has the default scale (0: 1 / sqrt(d_k)), which folding a factor into would need "
                "the query's shape")
    if not math.isfinite(scale * m.info["value"]):
        return f"scale {scale} times the factor of '{mul.name}' is not finite"
    return None


def rewrite(view: GraphView, m: Match) -> list[onnx.NodeProto]:
    mul, la = m.nodes
    attrs = node_attrs(la)
    attrs["scale"] = float(attrs.get("scale", 0.0)) * m.info["value"]
    node = helper.make_node(la.op_type, [m.info["query"], *la.input[1:]], list(la.output), name=la.name,
                            domain=la.domain, **attrs)
    return [node]


QUERY_SCALE = Rule("FoldQueryScale", match, check, rewrite)
