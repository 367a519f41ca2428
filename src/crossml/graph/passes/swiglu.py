"""Sigmoid(g), Mul(g, σ), Mul(·, up)  (the SiLU-gated MLP product onnxruntime-genai's model builder
writes)  =>  com.crossml SiluMul(g, up) (one kernel instead of three, no intermediate tensors).

GEGLU: Gelu(g, approximate="tanh"), Mul(·, up)  (the GELU-gated MLP product of the builder's Gemma exports)  =>
com.crossml SiluMul(g, up, activation="gelu_tanh"); the rules that take SiluMul next (the gate/up merge, the 4-bit
down projection's SiluMulMatMulNBits) carry the activation. On the CPU the op runs torch's gelu and mul, the nodes'
values bit for bit.

Either Mul may take its operands in either order. The fused op does not broadcast on the GPU, so
the rule refuses g and up of known, different shapes.
"""

from __future__ import annotations

import onnx
from onnx import helper

from crossml.graph.passes import GraphView, Match, Rule
from crossml.graph.passes._consts import other_input

DOMAIN = "com.crossml"
FLOATS = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}


def _is_mul(node: onnx.NodeProto | None) -> bool:
    return node is not None and node.op_type == "Mul" and node.domain in ("", "ai.onnx") and len(node.input) == 2


def match(view: GraphView, node: onnx.NodeProto) -> Match | None:
    if node.op_type != "Sigmoid" or node.domain not in ("", "ai.onnx"):
        return None
    g, s = node.input[0], node.output[0]
    # the Mul(g, σ(g)) among σ's users (the check refuses when there are others)
    act = next((n for n in view.consumers.get(s, []) if _is_mul(n) and other_input(n, s) == g), None)
    if act is None:
        return None
    gate = next((n for n in view.consumers.get(act.output[0], []) if _is_mul(n)), None)
    if gate is None:
        return None
    return Match([node, act, gate], {"g": g, "up": other_input(gate, act.output[0])})


def check(view: GraphView, m: Match) -> str | None:
    sig, act, gate = m.nodes
    g, up = m.info["g"], m.info["up"]
    for name, what in ((sig.output[0], "σ(g)"), (act.output[0], "g·σ(g)")):
        if len(view.consumers.get(name, [])) != 1 or name in view.outputs:
            return f"{what} ('{name}') is used elsewhere"
    if up == act.output[0]:
        return "g·σ(g) is multiplied by itself"
    if any(a.name in ("broadcast", "axis") for n in (act, gate) for a in n.attribute):
        return "a Mul uses the legacy (opset < 7) broadcast attributes"
    return _check_operands(view, g, up, [sig.output[0], act.output[0]])


def _check_operands(view: GraphView, g: str, up: str, inner: list[str]) -> str | None:
    """Why g and up cannot be SiluMul's operands (types, shapes; ``inner``, the replaced values, read in a
    subgraph); None when they can."""
    tg, tu = view.elem_type(g), view.elem_type(up)
    for name, t in ((g, tg), (up, tu)):
        if t is not None and t not in FLOATS:
            return f"'{name}' is not a float tensor (element type {onnx.TensorProto.DataType.Name(t)})"
    if tg is not None and tu is not None and tg != tu:
        return (f"g ('{g}') and up ('{up}') differ in element type: {onnx.TensorProto.DataType.Name(tg)} "
                f"and {onnx.TensorProto.DataType.Name(tu)}")
    sg, su = view.shape(g), view.shape(up)
    if sg is not None and su is not None and (
            len(sg) != len(su) or any(a is not None and b is not None and a != b for a, b in zip(sg, su))):
        return f"g ('{g}') and up ('{up}') differ in shape: {sg} and {su} (SiluMul does not broadcast)"
    if set(inner) & view.nested_reads:
        return "an intermediate value is read inside a subgraph"
    return None


def rewrite(view: GraphView, m: Match) -> list[onnx.NodeProto]:
    sig, _, gate = m.nodes
    return [helper.make_node("SiluMul", [m.info["g"], m.info["up"]], [gate.output[0]],
                             name=f"{gate.name or sig.name or 'sigmoid'}_silu_mul", domain=DOMAIN)]


SWIGLU = Rule("FuseSwiGLU", match, check, rewrite, domains=((DOMAIN, 1),))


def _is_gelu_tanh(node: onnx.NodeProto) -> bool:
    return (node.op_type == "Gelu" and node.domain in ("", "ai.onnx") and len(node.input) == 1
            and any(a.name == "approximate" and a.s == b"tanh" for a in node.attribute))


def match_geglu(view: GraphView, node: onnx.NodeProto) -> Match | None:
    if not _is_gelu_tanh(node):
        return None
    # the Mul among gelu(g)'s readers (the check refuses when there are others)
    gate = next((n for n in view.consumers.get(node.output[0], []) if _is_mul(n)), None)
    if gate is None:
        return None
    return Match([node, gate], {"g": node.input[0], "up": other_input(gate, node.output[0])})


def check_geglu(view: GraphView, m: Match) -> str | None:
    gelu, gate = m.nodes
    a = gelu.output[0]
    if not view.read_once(a):
        return f"gelu(g) ('{a}') is used elsewhere"
    if m.info["up"] == a:
        return "gelu(g) is multiplied by itself"
    if any(x.name in ("broadcast", "axis") for x in gate.attribute):
        return "the Mul uses the legacy (opset < 7) broadcast attributes"
    return _check_operands(view, m.info["g"], m.info["up"], [a])


def rewrite_geglu(view: GraphView, m: Match) -> list[onnx.NodeProto]:
    gelu, gate = m.nodes
    return [helper.make_node("SiluMul", [m.info["g"], m.info["up"]], [gate.output[0]],
                             name=f"{gate.name or gelu.name or 'gelu'}_gelu_mul", domain=DOMAIN,
                             activation="gelu_tanh")]


GEGLU = Rule("FuseGeGLU", match_geglu, check_geglu, rewrite_geglu, domains=((DOMAIN, 1),))
