"""[Cast(x → float32)] → SimplifiedLayerNormalization → [Cast(→ T)]  =>  com.crossml SimplifiedLayerNormalization(x,
to=T): the float32 Casts around an RMSNorm of a half-precision model go.

The builder's Gemma 2/3/4 exports keep the residual stream in float32 and normalize in float32 between Casts: Gemma 4's
query, key and post-attention / post-feed-forward norms read a Cast of a half-precision tensor, its input norm (and
the query and key norms) feed a Cast back to float16: seven elementwise launches a layer in a decode step, 84 of a
Gemma-4-shaped 12-layer step's ~200 small torch kernels. com.crossml's SimplifiedLayerNormalization
(``crossml.ops.contrib.norm``) reads x as it is and computes in float32, and rounds once to ``to``: half precision
widens to float32 exactly and the one rounding is the outer Cast's, so the folded node gives the nodes' values bit for
bit. The rule folds the inner Cast where its input is float16 or bfloat16 (its type known), it casts to float32 and
the norm alone reads it; the outer Cast where it is the norm's only reader and casts to a float type; at least one of
them; the norm's statistics outputs unused, stash_type 1. It runs off the CPU only, after the other fusions of the GPU
plans (which take the norms they fuse first).
"""

from __future__ import annotations

import onnx
from onnx import helper

from crossml.graph.passes import GraphView, Match, Rule, node_attrs
from crossml.graph.passes._consts import constant, scalar

DOMAIN = "com.crossml"
_HALF = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
_FLOATS = (onnx.TensorProto.FLOAT, *_HALF)


def _cast(node: onnx.NodeProto | None) -> onnx.NodeProto | None:
    return node if node is not None and node.op_type == "Cast" and node.domain in ("", "ai.onnx") else None


def match(view: GraphView, node: onnx.NodeProto) -> Match | None:
    if node.op_type != "SimplifiedLayerNormalization" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
        return None
    if any(view.is_read(name) for name in node.output[1:]):
        return None  # the mean / inverse deviation are read
    inner = _cast(view.producer.get(node.input[0]))
    if inner is not None and (node_attrs(inner).get("to") != onnx.TensorProto.FLOAT
                              or view.elem_type(inner.input[0]) not in _HALF or not view.read_once(node.input[0])):
        inner = None
    outer = _cast(view.only_consumer(node.output[0])) if view.read_once(node.output[0]) else None
    if outer is not None and node_attrs(outer).get("to") not in _FLOATS:
        outer = None
    if inner is None and outer is None:
        return None
    return Match([n for n in (inner, node, outer) if n is not None], {"inner": inner, "outer": outer})


def check(view: GraphView, m: Match) -> str | None:
    norm = next(n for n in m.nodes if n.op_type == "SimplifiedLayerNormalization")
    if node_attrs(norm).get("stash_type", 1) != 1:
        return "stash_type is not 1 (float32 statistics)"
    return None


def rewrite(view: GraphView, m: Match) -> list[onnx.NodeProto]:
    inner, outer = m.info["inner"], m.info["outer"]
    norm = next(n for n in m.nodes if n.op_type == "SimplifiedLayerNormalization")
    attrs = {k: v for k, v in node_attrs(norm).items() if k in ("axis", "epsilon", "stash_type")}
    if outer is not None:
        attrs["to"] = node_attrs(outer)["to"]
    x = inner.input[0] if inner is not None else norm.input[0]
    y = outer.output[0] if outer is not None else norm.output[0]
    return [helper.make_node("SimplifiedLayerNormalization", [x, *norm.input[1:2]], [y], name=norm.name,
                             domain=DOMAIN, **attrs)]


NORM_CASTS = Rule("FoldNormCasts", match, check, rewrite, domains=((DOMAIN, 1),))


MS_DOMAIN = "com.microsoft"


def _type_of(view: GraphView, name: str) -> int | None:
    """``name``'s element type: as the graph types it, else as the Mul / SimplifiedLayerNormalization writing it
    makes it (a Mul's, its inputs' type; a norm's, ``to`` or its scale's type), else None."""
    elem = view.elem_type(name)
    node = view.producer.get(name)
    if elem is not None or node is None:
        return elem
    if node.op_type == "Mul" and node.domain in ("", "ai.onnx"):
        types = {view.elem_type(i) for i in node.input} - {None}
        return types.pop() if len(types) == 1 else None
    if node.op_type == "SimplifiedLayerNormalization" and len(node.input) > 1 and node.output[0] == name:
        return node_attrs(node).get("to") or view.elem_type(node.input[1])
    return None


def _scalar_mul(view: GraphView, name: str, elem: int) -> tuple[onnx.NodeProto, str, float] | None:
    """(Mul, its other operand, c) where ``name`` is Mul(v, c) (either order) of a one-element constant c of at most
    one dimension (not a graph input), of element type ``elem``, read once; else None."""
    mul = view.producer.get(name)
    if mul is None or mul.op_type != "Mul" or mul.domain not in ("", "ai.onnx") or len(mul.input) != 2 \
            or mul.attribute or not view.read_once(name) or _type_of(view, name) != elem:
        return None
    graph_inputs = {vi.name for vi in view.graph.input}
    for c, v in ((mul.input[1], mul.input[0]), (mul.input[0], mul.input[1])):
        t = constant(view, c)
        if t is not None and c not in graph_inputs and len(t.dims) <= 1 and (value := scalar(view, c)) is not None:
            return mul, v, value
    return None


def _skip_norm(view: GraphView, name: str, elem: int) -> onnx.NodeProto | None:
    """The SimplifiedLayerNormalization (ai.onnx, or com.crossml's) writing ``name``, read once, over the last axis,
    stash_type 1, its statistics unused, its result of element type ``elem``; else None."""
    norm = view.producer.get(name)
    if norm is None or norm.op_type != "SimplifiedLayerNormalization" or len(norm.input) < 2 \
            or norm.domain not in ("", "ai.onnx", DOMAIN) or not view.read_once(name) or _type_of(view, name) != elem:
        return None
    a = node_attrs(norm)
    if a.get("axis", -1) != -1 or a.get("stash_type", 1) != 1 or norm.output[0] != name:
        return None
    if any(view.is_read(o) for o in norm.output[1:]):
        return None
    return norm


def match_skip(view: GraphView, node: onnx.NodeProto) -> Match | None:
    if node.op_type != "SkipSimplifiedLayerNormalization" or node.domain != MS_DOMAIN or len(node.input) < 3 \
            or not node.output or not node.output[0]:
        return None
    if any(view.is_read(o) for o in node.output[1:3]):
        return None  # the mean / inverse deviation are read
    elem = _type_of(view, node.input[0])
    if elem not in _FLOATS or _type_of(view, node.input[1]) != elem:
        return None
    info: dict = {"x": node.input[0], "skip": node.input[1]}
    nodes: list[onnx.NodeProto] = []
    if (xm := _scalar_mul(view, node.input[0], elem)) is not None:
        nodes.append(xm[0])
        info["x"], info["input_scale"] = xm[1], xm[2]
    if (km := _scalar_mul(view, node.input[1], elem)) is not None:
        nodes.append(km[0])
        info["skip"], info["skip_scale"] = km[1], km[2]
    norm = _skip_norm(view, info["skip"], elem)
    if norm is not None:
        nodes.append(norm)
        info["skip"], info["skip_norm"] = norm.input[0], norm
    outer = _cast(view.only_consumer(node.output[0])) if view.read_once(node.output[0]) else None
    if outer is not None and node_attrs(outer).get("to") in _FLOATS:
        nodes.append(outer)
        info["to"] = node_attrs(outer)["to"]
        info["y"] = outer.output[0]
    if not nodes:
        return None
    return Match([*nodes, node], info)  # the norm last: the replacement takes its place


def check_skip(view: GraphView, m: Match) -> str | None:
    node = m.nodes[-1]
    if len(node.input) > 3 and node.input[3] and view.elem_type(node.input[3]) not in (None, *_FLOATS):
        return f"'{node.name}' has a bias of another type"
    return None


def rewrite_skip(view: GraphView, m: Match) -> list[onnx.NodeProto]:
    node, info = m.nodes[-1], m.info
    attrs = {"epsilon": float(node_attrs(node).get("epsilon", 1e-12))}
    for key in ("input_scale", "skip_scale", "to"):
        if key in info:
            attrs[key] = info[key]
    bias = node.input[3] if len(node.input) > 3 else ""
    inputs = [info["x"], info["skip"], node.input[2], bias]
    if "skip_norm" in info:
        norm = info["skip_norm"]
        inputs.append(norm.input[1])
        attrs["skip_epsilon"] = float(node_attrs(norm).get("epsilon", 1e-5))
    while not inputs[-1]:
        inputs.pop()
    outputs = [info.get("y", node.output[0]), node.output[3] if len(node.output) > 3 else ""]
    if not outputs[-1]:
        outputs.pop()
    return [helper.make_node("SkipSimplifiedLayerNormalization", inputs, outputs, name=node.name, domain=DOMAIN,
                             **attrs)]


#: com.microsoft SkipSimplifiedLayerNormalization with the nodes around it  =>  com.crossml
#: SkipSimplifiedLayerNormalization (``crossml.ops.contrib.norm``): a Mul by a constant scalar on either input (Gemma 4's
#: layer scalars), a SimplifiedLayerNormalization writing the skip (Gemma's post-attention / post-feed-forward norms,
#: after FoldNormCasts has taken their Casts), a Cast of the result to a float type: up to five launches a norm in
#: one, the nodes' steps (each intermediate of x's type, as its node stores it: bit for bit on the torch path; the
#: compiled kernel within an ulp or two, where it contracts a product and a sum into an FMA at another step). Each
#: folded node's result must be read by the next alone, of x's element type; the statistics outputs unused. Off the
#: CPU, after FoldNormCasts.
FOLD_SKIP_NORM = Rule("FoldSkipNorm", match_skip, check_skip, rewrite_skip, domains=((DOMAIN, 1),))
