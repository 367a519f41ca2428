"""ReduceSum(x, axes=[last], keepdims) → s, Sub(s, c) (or Add(s, c)) → t, Cast(t, to) → y  =>
com.crossml SumCast(x, offset=-c (or c), to, keepdims) → y.

Every model of the GenAI builder computes GroupQueryAttention's ``seqlens_k`` from the attention mask this way
(``attn_mask_reformat``: the mask's row sums minus one, as int32). At each decode step that was three small
torch kernels; SumCast is one (``crossml.kernels.sum_cast`` on GPUs).

The rule needs x an int32 / int64 tensor of known rank, the reduced axis its last (keepdims 0 or 1), c a one-value
integer constant of no more dimensions than the sums (so Sub does not broadcast them to a new shape), each
intermediate read by the next node only, and the cast to int32 or int64. It runs on
sessions off the CPU (the CPU keeps the model's ops).
"""

from __future__ import annotations

import onnx
from onnx import helper

from crossml.graph import external
from crossml.graph.passes import GraphView, Match, Rule, node_attrs
from crossml.graph.passes._consts import constant, scalar

DOMAIN = "com.crossml"
_INTS = (onnx.TensorProto.INT32, onnx.TensorProto.INT64)


def _axes(view: GraphView, node: onnx.NodeProto) -> list[int] | None:
    """ReduceSum's axes: the constant second input (opset 13+) or the attribute; None if not constant."""
    if len(node.input) > 1 and node.input[1]:
        t = constant(view, node.input[1])
        return None if t is None else [int(a) for a in external.array(t).reshape(-1)]
    axes = node_attrs(node).get("axes")
    return None if axes is None else [int(a) for a in axes]


def match(view: GraphView, node: onnx.NodeProto) -> Match | None:
    if node.op_type != "Cast" or node.domain not in ("", "ai.onnx"):
        return None
    arith = view.producer.get(node.input[0])
    if arith is None or arith.op_type not in ("Sub", "Add") or arith.domain not in ("", "ai.onnx"):
        return None
    reduce = view.producer.get(arith.input[0])
    if reduce is None or reduce.op_type != "ReduceSum" or reduce.domain not in ("", "ai.onnx"):
        return None
    return Match([reduce, arith, node], {})


def check(view: GraphView, m: Match) -> str | None:
    reduce, arith, cast = m.nodes
    x = reduce.input[0]
    if view.elem_type(x) not in _INTS:
        return f"'{x}' is not an int32/int64 tensor of known type"
    shape = view.shape(x)
    if not shape:
        return f"the rank of '{x}' is not known"
    axes = _axes(view, reduce)
    if axes is None or len(axes) != 1 or axes[0] not in (len(shape) - 1, -1):
        return f"'{reduce.name}' does not reduce the last axis of '{x}' alone (axes {axes})"
    c = scalar(view, arith.input[1])
    if c is None or c != int(c):
        return f"'{arith.name}' does not take a one-value integer constant as its second input"
    c_tensor = constant(view, arith.input[1])
    c_shape = None if c_tensor is None else list(c_tensor.dims)
    if c_shape is None or len(c_shape) > (len(shape) if node_attrs(reduce).get("keepdims", 1) else len(shape) - 1):
        return f"the constant '{arith.input[1]}' of '{arith.name}' (shape {c_shape}) would add dimensions to the sums"
    if node_attrs(cast).get("to") not in _INTS:
        return f"'{cast.name}' casts to a type other than int32/int64"
    for n in (reduce, arith):
        if not view.read_once(n.output[0]):
            return f"'{n.output[0]}' of '{n.name}' is used elsewhere"
    return None


def rewrite(view: GraphView, m: Match) -> list[onnx.NodeProto]:
    reduce, arith, cast = m.nodes
    c = int(scalar(view, arith.input[1]))
    offset = -c if arith.op_type == "Sub" else c
    return [helper.make_node("SumCast", [reduce.input[0]], [cast.output[0]], name=f"{reduce.name}_sum_cast",
                             domain=DOMAIN, offset=offset, to=int(node_attrs(cast)["to"]),
                             keepdims=int(node_attrs(reduce).get("keepdims", 1)))]


MASK_LENGTHS = Rule("MaskLengths", match, check, rewrite, domains=((DOMAIN, 1),))
