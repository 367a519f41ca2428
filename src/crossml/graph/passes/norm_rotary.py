"""Reshape(x, [0, -1, n]) → SimplifiedLayerNormalization(w) → Reshape(·, [0, -1, D]) → com.microsoft
RotaryEmbedding  =>  com.crossml RotaryEmbedding(x, positions, cos, sin, w, norm_epsilon=...).

The builder's Gemma 3/4 exports normalize each query and key head (RMSNorm over its n channels, between two Reshapes
of the [B, S, D] projection) before rotating it: two norm launches a layer in a decode step. com.crossml's
RotaryEmbedding (``crossml.ops.contrib.rotary``) rotates with the norm done by the rotary kernel. The rule needs x of
rank 3 whose last dimension is D where known, the first Reshape's shape [0, -1, n] and the second's [0, -1, D]
(constants), the norm (ai.onnx, or com.crossml's after FoldNormCasts) over the last axis with stash_type 1, its
weight a constant of n values, its result of x's element type, its statistics unused, and each intermediate read by
the next node alone. It runs off the CPU, after FoldNormCasts (whose folded norms it takes).
"""

from __future__ import annotations

import onnx
from onnx import helper

from crossml.graph import external
from crossml.graph.passes import GraphView, Match, Rule, node_attrs
from crossml.graph.passes._consts import constant
from crossml.graph.passes.norm_casts import _type_of

DOMAIN = "com.crossml"
MS_DOMAIN = "com.microsoft"


def _reshape(view: GraphView, name: str) -> tuple[onnx.NodeProto, list[int]] | None:
    """(Reshape, its constant shape) writing ``name``, else None."""
    node = view.producer.get(name)
    if node is None or node.op_type != "Reshape" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
        return None
    if node_attrs(node).get("allowzero", 0):
        return None
    t = constant(view, node.input[1])
    return (node, [int(v) for v in external.array(t).reshape(-1)]) if t is not None else None


def match(view: GraphView, node: onnx.NodeProto) -> Match | None:
    if node.op_type != "RotaryEmbedding" or node.domain != MS_DOMAIN or len(node.input) < 4:
        return None
    outer = _reshape(view, node.input[0])
    if outer is None:
        return None
    norm = view.producer.get(outer[0].input[0])
    if norm is None or norm.op_type != "SimplifiedLayerNormalization" or norm.domain not in ("", "ai.onnx", DOMAIN) \
            or len(norm.input) < 2:
        return None
    inner = _reshape(view, norm.input[0])
    if inner is None:
        return None
    return Match([inner[0], norm, outer[0], node], {"inner": inner[1], "outer": outer[1], "x": inner[0].input[0]})


def check(view: GraphView, m: Match) -> str | None:
    inner, norm, outer, rotary = m.nodes
    x, si, so = m.info["x"], m.info["inner"], m.info["outer"]
    if len(si) != 3 or si[:2] != [0, -1] or si[2] <= 0:
        return f"'{inner.name}' reshapes to {si}, not [0, -1, n]"
    if len(so) != 3 or so[:2] != [0, -1] or so[2] <= 0 or so[2] % si[2]:
        return f"'{outer.name}' reshapes to {so}, not [0, -1, D] of whole heads of {si[2]}"
    shape = view.shape(x)
    if shape is None or len(shape) != 3 or (isinstance(shape[2], int) and shape[2] != so[2]):
        return f"'{x}' is not known to be [B, S, {so[2]}] (shape {shape})"
    for name, reader in ((inner.output[0], norm), (norm.output[0], outer), (outer.output[0], rotary)):
        if not view.read_once(name):
            return f"'{name}' is read by another node than '{reader.name}'"
    if any(view.is_read(o) for o in norm.output[1:]):
        return f"'{norm.name}' has its statistics read"
    a = node_attrs(norm)
    if a.get("axis", -1) not in (-1, 2) or a.get("stash_type", 1) != 1:
        return f"'{norm.name}' is not over the last axis with stash_type 1"
    w = view.initializers.get(norm.input[1])
    if w is None or [int(d) for d in w.dims] not in ([si[2]], [1, si[2]]):
        return f"the weight '{norm.input[1]}' of '{norm.name}' is not a constant of {si[2]} values"
    et = view.elem_type(x)
    if et is None or _type_of(view, norm.output[0]) != et:
        return f"'{norm.name}' does not write x's element type"
    if {"norm_epsilon"} & set(node_attrs(rotary)):
        return f"'{rotary.name}' has an attribute named norm_epsilon"
    return None


def rewrite(view: GraphView, m: Match) -> list[onnx.NodeProto]:
    inner, norm, outer, rotary = m.nodes
    inputs = [m.info["x"], *rotary.input[1:4], norm.input[1]]
    eps = float(node_attrs(norm).get("epsilon", 1e-5))
    return [helper.make_node("RotaryEmbedding", inputs, list(rotary.output), name=rotary.name, domain=DOMAIN,
                             norm_epsilon=eps, **node_attrs(rotary))]


NORM_ROTARY = Rule("NormRotary", match, check, rewrite, domains=((DOMAIN, 1),))
