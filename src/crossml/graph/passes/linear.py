"""MatMul(x, W) -> Add(b), W a 2-D constant and b a 1-D constant  =>  com.crossml Linear
(one library call with the bias in the epilogue)."""

from __future__ import annotations

import onnx
from onnx import helper

from crossml.graph.passes import GraphView, Match, Rule
from crossml.graph.passes._consts import other_input

DOMAIN = "com.crossml"
FLOATS = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}


def match(view: GraphView, node: onnx.NodeProto) -> Match | None:
    if node.op_type != "MatMul" or node.input[1] not in view.initializers:
        return None
    add = view.only_consumer(node.output[0])
    if add is None or add.op_type != "Add":
        return None
    bias = other_input(add, node.output[0])
    if bias not in view.initializers:
        return None
    return Match([node, add], {"x": node.input[0], "w": node.input[1], "b": bias})


def check(view: GraphView, m: Match) -> str | None:
    w, b = view.initializers[m.info["w"]], view.initializers[m.info["b"]]
    if len(w.dims) != 2 or len(b.dims) != 1 or b.dims[0] != w.dims[1]:
        return f"weight {list(w.dims)} / bias {list(b.dims)} are not a linear layer's"
    if w.data_type not in FLOATS or b.data_type != w.data_type:
        return "not a float linear layer"
    x = view.shape(m.info["x"])
    if x is None or len(x) < 2:
        return "x is not known to be at least 2-D"
    return None


def rewrite(view: GraphView, m: Match) -> list[onnx.NodeProto]:
    return [helper.make_node("Linear", [m.info["x"], m.info["w"], m.info["b"]], [m.nodes[-1].output[0]],
                             name=f"{m.nodes[0].name or 'matmul'}_linear", domain=DOMAIN)]


RULE = Rule("FuseLinear", match, check, rewrite, domains=((DOMAIN, 1),))
