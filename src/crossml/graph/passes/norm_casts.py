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

DOMAIN = "com.crossml"
_HALF = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
_FLOATS = (onnx.TensorProto.FLOAT, *_HALF)


def _cast(node: onnx.NodeProto | None) -> onnx.NodeProto | None:
    return node if node is not None and node.op_type == "Cast" and node.domain in ("", "ai.onnx") else None


def match(view: GraphView, node: onnx.NodeProto) -> Match | None:
    if node.op_type != "SimplifiedLayerNormalization" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
        return None
    if any(name and (view.consumers.get(name) or name in view.outputs) for name in node.output[1:]):
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
