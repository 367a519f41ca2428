"""Conv -> Relu and Conv -> Add -> Relu  =>  com.crossml FusedConv (one cuDNN call on GPUs); the same
with Clip(0, max) (ReLU6: MobileNet's activation) in place of Relu, which runs as the cuDNN call and a
clamp to max in place.

The residual form is ResNet's block tail: conv(x) + identity, then ReLU.
"""

from __future__ import annotations

import onnx
from onnx import helper

from crossml.graph.passes import GraphView, Match, Rule, node_attrs
from crossml.graph.passes._consts import scalar

FLOATS = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16}
DOMAIN = "com.crossml"


def _activation(view: GraphView, node: onnx.NodeProto | None) -> dict | None:
    """What ``node`` tells FusedConv when it is a Relu or a Clip with constant bounds, else None."""
    if node is None:
        return None
    if node.op_type == "Relu":
        return {"activation": "Relu"}
    if node.op_type != "Clip":
        return None
    attrs = node_attrs(node)
    if len(node.input) > 1 or not attrs:  # opset 11+: optional bound inputs
        names = [node.input[i] if len(node.input) > i else "" for i in (1, 2)]
        bounds = [scalar(view, name) if name else None for name in names]
        if any(name and v is None for name, v in zip(names, bounds)):
            return {"activation": "Clip", "refuse": "the Clip bounds are not constants"}
    else:
        bounds = [attrs.get("min"), attrs.get("max")]
    return {"activation": "Clip", "activation_params": bounds}


def match(view: GraphView, node: onnx.NodeProto) -> Match | None:
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx"):
        return None
    nxt = view.only_consumer(node.output[0])
    if nxt is None:
        return None
    act = _activation(view, nxt)
    if act is not None:
        return Match([node, nxt], act)
    if nxt.op_type == "Add":
        last = view.only_consumer(nxt.output[0])
        act = _activation(view, last)
        if act is not None:
            other = nxt.input[1] if nxt.input[0] == node.output[0] else nxt.input[0]
            return Match([node, nxt, last], {**act, "z": other})
    return None


def check(view: GraphView, m: Match) -> str | None:
    conv = m.nodes[0]
    attrs = node_attrs(conv)
    if "refuse" in m.info:
        return m.info["refuse"]
    if m.info["activation"] == "Clip":
        lo, hi = m.info["activation_params"]
        if lo != 0 or hi is None or not 0 <= hi < float("inf"):
            return f"the Clip bounds ({lo}, {hi}) are not (0, a finite max): not a ReLU followed by a clamp"
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
    params = {}
    if "activation_params" in m.info:
        params["activation_params"] = [float(v) for v in m.info["activation_params"]]
    fused = helper.make_node("FusedConv", inputs, [last.output[0]], name=f"{conv.name or 'conv'}_fused",
                             domain=DOMAIN, activation=m.info["activation"], **params)
    fused.attribute.extend(a for a in conv.attribute if a.name != "auto_pad")
    return [fused]


RULE = Rule("FuseConvRelu", match, check, rewrite, domains=((DOMAIN, 1),))
