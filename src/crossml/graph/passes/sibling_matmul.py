"""MatMul(x, W1) → y1, ..., MatMul(x, Wk) → yk  =>  MatMul(x, [W1 | ... | Wk]) → y, Split(y) → y1, ..., yk: the
products of one activation by constant weights become one (at decode sizes, one GEMV launch instead of k, and no
narrow product left to a vendor library).

Qwen3.5's Gated DeltaNet layers read their normalized input with four products (the packed q | k | v projection,
the output gate's z, and the a and b gate inputs of 16 columns each, which went to cuBLAS); the builder packs the
other architectures' q, k and v itself, and MergeGateUp (``gate_up``) takes SwiGLU's gate and up pairs first.

Columns of a product are independent, so the merged product computes the same values up to the order of its
sums (the kernels' tiles follow the merged width). The rule needs at least two ai.onnx MatMul nodes reading ``x``
as their first input, each with a constant 2-D weight (an initializer that is not a graph input) of one element
type and one K, in a model of opset 13 or later (Split's sizes input). The merged node takes the first product's place, ahead of every consumer. It runs off the CPU
only, where the CPU provider keeps the model's products (its values stay bit-close to onnxruntime's).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from crossml.graph import external
from crossml.graph.passes import GraphView, Match, Rule, add_initializer, unique_name


def _is_matmul(node: onnx.NodeProto) -> bool:
    return node.op_type == "MatMul" and node.domain in ("", "ai.onnx") and len(node.input) == 2


def _weight(view: GraphView, node: onnx.NodeProto) -> onnx.TensorProto | None:
    name = node.input[1]
    t = view.initializers.get(name)
    if t is None or len(t.dims) != 2 or any(vi.name == name for vi in view.graph.input):
        return None
    return t


def match(view: GraphView, node: onnx.NodeProto) -> Match | None:
    if not _is_matmul(node) or not node.input[0]:
        return None
    siblings = [n for n in view.consumers.get(node.input[0], []) if _is_matmul(n) and n.input[0] == node.input[0]]
    if len(siblings) < 2 or siblings[0] is not node:  # once per activation, at its first product
        return None
    # the first product last: apply_rules puts the replacement where the last matched node was
    return Match([*siblings[1:], node])


def check(view: GraphView, m: Match) -> str | None:
    if view.opset < 13:
        return f"the model's opset {view.opset} has no Split with a sizes input (13 and later)"
    weights = [_weight(view, n) for n in m.nodes]
    for n, t in zip(m.nodes, weights):
        if t is None:
            return f"the weight ('{n.input[1]}') of '{n.name}' is not a constant 2-D initializer"
        if t.data_type != weights[0].data_type or t.dims[0] != weights[0].dims[0]:
            return (f"'{n.name}' and '{m.nodes[0].name}' differ in weight type or K: {list(t.dims)} and "
                    f"{list(weights[0].dims)}")
        if t.data_type not in external.RAW_TYPES:
            return f"the weight of '{n.name}' has an element type the merge does not copy ({t.data_type})"
    if len({n.input[1] for n in m.nodes}) != len(m.nodes):
        return "two of the products share a weight"
    return None


def rewrite(view: GraphView, m: Match) -> list[onnx.NodeProto]:
    nodes = [m.nodes[-1], *m.nodes[:-1]]  # graph order: the first product, then the others
    tensors = [view.initializers[n.input[1]] for n in nodes]
    first = nodes[0]
    base = first.name or first.output[0]
    wname = unique_name(view, f"{base}_siblings_weight")
    add_initializer(view, wname, np.concatenate([external.array(t) for t in tensors], axis=1), tensors[0])
    out = unique_name(view, f"{first.output[0]}_siblings")
    widths = [int(w.dims[1]) for w in tensors]
    sizes = unique_name(view, f"{base}_siblings_split")
    view.graph.initializer.append(onnx.numpy_helper.from_array(np.array(widths, dtype=np.int64), sizes))
    view.initializers[sizes] = view.graph.initializer[-1]
    elem, shape = view.elem_type(first.output[0]), view.shape(first.output[0])
    if elem is not None:
        dims = None if shape is None else [*shape[:-1], sum(widths)]
        view.graph.value_info.append(helper.make_tensor_value_info(out, elem, dims))
    product = helper.make_node("MatMul", [first.input[0], wname], [out], name=unique_name(view, f"{base}_siblings"))
    split = helper.make_node("Split", [out, sizes], [n.output[0] for n in nodes], axis=-1,
                             name=unique_name(view, f"{base}_siblings_split_node"))
    return [product, split]


SIBLING_MATMUL = Rule("MergeSiblingMatMul", match, check, rewrite)
