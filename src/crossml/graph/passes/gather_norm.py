"""Gather(table, indices, axis=0) → rows, SimplifiedLayerNormalization(rows, scale) → y  =>
com.crossml GatherNorm(table, indices, scale, epsilon) → (y, rows).

Every model of the GenAI builder starts this way: the embedding lookup of the input ids, then the first layer's
RMSNorm (``input_layernorm``); the looked-up rows also feed the first residual add, so the fused node keeps them
as its second output. At each decode step that was two launches (the Gather kernel, then the RMSNorm kernel) at
the head of the step's chain of dependent kernels; GatherNorm is one (``crossml.kernels.rmsnorm.gather_rms_norm``
on GPUs).

The rule needs a 2-D table of a float type, Gather on axis 0, the norm over the last axis with stash_type 1, and
the norm's inverse-standard-deviation output unread. It runs on sessions off the CPU (the CPU keeps the model's
ops).
"""

from __future__ import annotations

import onnx
from onnx import helper

from crossml.graph.passes import GraphView, Match, Rule, node_attrs

DOMAIN = "com.crossml"
_FLOATS = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)


def match(view: GraphView, node: onnx.NodeProto) -> Match | None:
    if node.op_type != "SimplifiedLayerNormalization" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
        return None
    gather = view.producer.get(node.input[0])
    if gather is None or gather.op_type != "Gather" or gather.domain not in ("", "ai.onnx"):
        return None
    return Match([gather, node], {})


def _table_shape(view: GraphView, name: str) -> list | None:
    t = view.initializers.get(name)
    return list(t.dims) if t is not None else view.shape(name)


def check(view: GraphView, m: Match) -> str | None:
    gather, norm = m.nodes
    table = gather.input[0]
    if view.elem_type(table) not in _FLOATS:
        return f"the table '{table}' of '{gather.name}' is not a float / float16 / bfloat16 tensor of known type"
    shape = _table_shape(view, table)
    if shape is None or len(shape) != 2:
        return f"the table '{table}' of '{gather.name}' is not known to be 2-D (shape {shape})"
    if node_attrs(gather).get("axis", 0) not in (0, -2):
        return f"'{gather.name}' does not gather along axis 0"
    attrs = node_attrs(norm)
    if attrs.get("stash_type", 1) != 1:
        return f"'{norm.name}' has stash_type {attrs.get('stash_type')} (the fused kernel keeps float32 statistics)"
    axis = attrs.get("axis", -1)
    if axis != -1:
        rank = view.shape(norm.input[0])
        if rank is None or axis != len(rank) - 1:
            return f"'{norm.name}' does not normalize over the last axis alone (axis {axis})"
    inv = norm.output[1] if len(norm.output) > 1 else ""
    if view.is_read(inv) or (inv and inv in view.nested_reads):
        return f"the inverse standard deviation '{norm.output[1]}' of '{norm.name}' is used"
    return None


def rewrite(view: GraphView, m: Match) -> list[onnx.NodeProto]:
    gather, norm = m.nodes
    return [helper.make_node("GatherNorm", [gather.input[0], gather.input[1], norm.input[1]],
                             [norm.output[0], gather.output[0]], name=f"{gather.name}_{norm.name}_fused",
                             domain=DOMAIN, epsilon=float(node_attrs(norm).get("epsilon", 1e-5)))]


GATHER_NORM = Rule("GatherNorm", match, check, rewrite, domains=((DOMAIN, 1),))
