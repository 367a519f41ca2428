"""Conv -> Relu and Conv -> Add -> Relu  =>  com.crossml FusedConv (one cuDNN call on GPUs).

The residual form is ResNet's block tail: conv(x) + identity, then ReLU.
"""

from __future__ import annotations

import onnx
from onnx import helper

from crossml.graph.passes import GraphView, Match, Rule, node_attrs

FLOATS = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16}
DOMAIN = "com.crossml"


def match(view: GraphView, node: onnx.NodeProto) -> Match | None:
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx"):
        return None
    nxt = view.only_consumer(node.output[0])
    if nxt is None:
        return None
    if nxt.op_type == "Relu":
        return Match([node, nxt])
    if nxt.op_type == "Add":
        relu = view.only_consumer(nxt.output[0])
        if relu is not None and relu.op_type == "Relu":
            other = nxt.input[1] if nxt.input[0] == node.output[0] else nxt.input[0]
            return Match([node, nxt, relu], {"z": other})
    return None


def check(view: GraphView, m: Match) -> str | None:
    conv = m.nodes[0]
    attrs = node_attrs(conv)
    if attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return "auto_pad is set"
    pads = attrs.get("pads", [0, 0, 0, 0])
    if len(pads) != 4 or pads[:2] != pads[2:]:
        return f"not a 2-D convolution with symmetric pads (pads={pads})"
    if view.elem_type(conv.input[0]) not in FLOATS:
        return "input is not float32/float16"
    if "z" in m.info:
        out, z = view.shape(conv.output[0]), view.shape(m.info["z"])
        if out is None or z is None or out != z or None in out:
            return f"the residual's shape {z} is not known to equal the convolution's {out}"
    return None


def rewrite(view: GraphView, m: Match) -> list[onnx.NodeProto]:
    conv, last = m.nodes[0], m.nodes[-1]
    inputs = list(conv.input) + [""] * (3 - len(conv.input))
    if "z" in m.info:
        inputs.append(m.info["z"])
    fused = helper.make_node("FusedConv", inputs, [last.output[0]], name=f"{conv.name or 'conv'}_fused",
                             domain=DOMAIN, activation="Relu")
    fused.attribute.extend(a for a in conv.attribute if a.name != "auto_pad")
    return [fused]


RULE = Rule("FuseConvRelu", match, check, rewrite, domains=((DOMAIN, 1),))
