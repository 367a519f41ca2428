"""MatMul(Q, Kᵀ) -> Div|Mul(scale) -> [Add(mask)] -> Softmax(-1) -> MatMul(·, V)  =>  com.crossml
ScaledDotProductAttention (flash / memory-efficient attention kernels on GPUs, fused on CPUs).

Kᵀ may come from a Transpose swapping the last two axes (then K itself is used) or be given.
"""

from __future__ import annotations

import onnx
from onnx import helper

from crossml.graph.passes import GraphView, Match, Rule
from crossml.graph.passes._consts import other_input, scalar

DOMAIN = "com.crossml"
FLOATS = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}


def match(view: GraphView, node: onnx.NodeProto) -> Match | None:
    if node.op_type != "Softmax":
        return None
    nodes: list[onnx.NodeProto] = []
    cur = view.producer.get(node.input[0])
    mask = None
    if cur is not None and cur.op_type == "Add":
        scaled = cur
        prev = view.producer.get(cur.input[0])
        name = cur.input[0]
        if prev is None or prev.op_type not in ("Div", "Mul", "MatMul"):
            prev, name = view.producer.get(cur.input[1]), cur.input[1]
        if prev is None or view.only_consumer(name) is not scaled:
            return None
        mask = other_input(scaled, name)
        nodes.insert(0, scaled)
        cur = prev
    scale_node = None
    if cur is not None and cur.op_type in ("Div", "Mul"):
        scale_node = cur
        nodes.insert(0, cur)
        cur = view.producer.get(cur.input[0])
    if cur is None or cur.op_type != "MatMul" or view.only_consumer(cur.output[0]) is None:
        return None
    qk = cur
    out = view.only_consumer(node.output[0])
    if out is None or out.op_type != "MatMul" or out.input[0] != node.output[0]:
        return None
    info = {"q": qk.input[0], "kt": qk.input[1], "v": out.input[1], "mask": mask, "scale_node": scale_node}
    return Match([qk, *nodes, node, out], info)


def check(view: GraphView, m: Match) -> str | None:
    softmax = next(n for n in m.nodes if n.op_type == "Softmax")
    axis = next((helper.get_attribute_value(a) for a in softmax.attribute if a.name == "axis"), -1)
    q = view.shape(m.info["q"])
    if q is None or len(q) != 4:
        return f"Q is not known to be 4-D (shape {q})"
    if axis not in (-1, 3):
        return f"softmax axis {axis} is not the last"
    if view.elem_type(m.info["q"]) not in FLOATS:
        return "Q is not a float tensor"
    sn = m.info["scale_node"]
    if sn is not None:
        c = scalar(view, sn.input[1])
        if c is None or c == 0:
            return "the scale is not a constant scalar"
        m.info["scale"] = 1.0 / c if sn.op_type == "Div" else c
    else:
        m.info["scale"] = 1.0
    for node in m.nodes[1:-1]:  # intermediates must feed only the pattern
        if view.only_consumer(node.output[0]) is None:
            return f"'{node.output[0]}' is used outside the attention pattern"
    return None


def rewrite(view: GraphView, m: Match) -> list[onnx.NodeProto]:
    kt = m.info["kt"]
    tr = view.producer.get(kt)
    k_input, k_transposed = kt, 1
    if tr is not None and tr.op_type == "Transpose":
        perm = next((list(helper.get_attribute_value(a)) for a in tr.attribute if a.name == "perm"), None)
        if perm == [0, 1, 3, 2]:
            k_input, k_transposed = tr.input[0], 0
    inputs = [m.info["q"], k_input, m.info["v"], m.info["mask"] or ""]
    return [helper.make_node("ScaledDotProductAttention", inputs, [m.nodes[-1].output[0]],
                             name=f"{m.nodes[0].name or 'attention'}_sdpa", domain=DOMAIN,
                             scale=float(m.info["scale"]), k_transposed=k_transposed)]


RULE = Rule("FuseAttention", match, check, rewrite, domains=((DOMAIN, 1),))
