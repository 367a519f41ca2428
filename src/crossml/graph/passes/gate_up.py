"""MatMul(x, Wg) → g, MatMul(x, Wu) → up, com.crossml SiluMul(g, up)  =>  MatMul(x, [Wg | Wu]) → gu,
SiluMul(gu)  (one matrix product instead of two: at decode sizes, one kernel launch fewer per layer).

The same for two com.microsoft MatMulNBits nodes with constant block-quantized weights: B, scales
and zero points are concatenated along N (their first axis) and the merged node has N doubled. The
gate's columns come first, so SiluMul's single input holds g in its first half and up in its second.
Columns of a product are independent, so the merged product computes the same values.

The rule needs constant weights (initializers that are not graph inputs, so no feed can override
them) of one shape, type and quantization, and g and up used by the SiluMul only. It runs after
SWIGLU (which makes the SiluMul). The replaced weights are dropped by ``apply_rules`` once no node
reads them. GATE_UP_NBITS, the CPU's rule, merges MatMulNBits products only.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from crossml.graph import external
from crossml.graph.passes import GraphView, Match, Rule, add_initializer, node_attrs, unique_name

DOMAIN = "com.crossml"
MS_DOMAIN = "com.microsoft"
#: MatMulNBits' attribute defaults (the ones that must agree between the two nodes)
NBITS_ATTRS = {"K": None, "N": None, "bits": 4, "block_size": None, "accuracy_level": 0}


def _kind(node: onnx.NodeProto | None) -> str | None:
    if node is None:
        return None
    if node.op_type == "MatMul" and node.domain in ("", "ai.onnx") and len(node.input) == 2:
        return "MatMul"
    if node.op_type == "MatMulNBits" and node.domain == MS_DOMAIN:
        return "MatMulNBits"
    return None


def match(view: GraphView, node: onnx.NodeProto) -> Match | None:
    if node.op_type != "SiluMul" or node.domain != DOMAIN or len(node.input) != 2 or not all(node.input):
        return None
    gate, up = view.producer.get(node.input[0]), view.producer.get(node.input[1])
    kind = _kind(gate)
    if kind is None or _kind(up) != kind:
        return None
    # the SiluMul last: apply_rules puts the replacement where the last node was
    return Match([gate, up, node], {"kind": kind, "g": node.input[0], "up": node.input[1]})



def _constant(view: GraphView, node: onnx.NodeProto, i: int, what: str) -> str | None:
    """Why input ``i`` (``what``) of ``node`` is not a constant weight; None when it is."""
    name = node.input[i]
    t = view.initializers.get(name)
    if t is None:
        return f"{what} ('{name}') of '{node.name}' is not an initializer"
    if any(vi.name == name for vi in view.graph.input):
        return f"{what} ('{name}') of '{node.name}' is a graph input (a feed may override it)"
    return None


def _same_tensors(view: GraphView, gate: onnx.NodeProto, up: onnx.NodeProto, i: int, what: str) -> str | None:
    for node in (gate, up):
        reason = _constant(view, node, i, what)
        if reason is not None:
            return reason
    tg, tu = view.initializers[gate.input[i]], view.initializers[up.input[i]]
    if list(tg.dims) != list(tu.dims) or tg.data_type != tu.data_type:
        return (f"{what} of '{gate.name}' and '{up.name}' differ: {list(tg.dims)} "
                f"{onnx.TensorProto.DataType.Name(tg.data_type)} and {list(tu.dims)} "
                f"{onnx.TensorProto.DataType.Name(tu.data_type)}")
    return None


def _check_matmul(view: GraphView, gate: onnx.NodeProto, up: onnx.NodeProto) -> str | None:
    reason = _same_tensors(view, gate, up, 1, "weight")
    if reason is not None:
        return reason
    dims = list(view.initializers[gate.input[1]].dims)
    if len(dims) != 2:
        return f"weight ('{gate.input[1]}') of '{gate.name}' is not 2-D: {dims}"
    return None


def _check_nbits(view: GraphView, gate: onnx.NodeProto, up: onnx.NodeProto) -> str | None:
    for node in (gate, up):
        if any(node.input[4:]):
            return f"'{node.name}' has g_idx or bias inputs"
    ag, au = node_attrs(gate), node_attrs(up)
    for name, default in NBITS_ATTRS.items():
        if ag.get(name, default) != au.get(name, default):
            return f"'{gate.name}' and '{up.name}' differ in {name}: {ag.get(name, default)} and {au.get(name, default)}"
    for node, a in ((gate, ag), (up, au)):
        if a.get("weight_prepacked", 0):
            return f"'{node.name}' has a prepacked weight (weight_prepacked={a['weight_prepacked']})"
    for i, what in ((1, "B"), (2, "scales")):
        reason = _same_tensors(view, gate, up, i, what)
        if reason is not None:
            return reason
    zg, zu = len(gate.input) > 3 and gate.input[3], len(up.input) > 3 and up.input[3]
    if bool(zg) != bool(zu):
        return f"one of '{gate.name}' and '{up.name}' has zero points, the other not"
    return _same_tensors(view, gate, up, 3, "zero points") if zg else None


def check(view: GraphView, m: Match) -> str | None:
    gate, up, silu = m.nodes
    g, u = m.info["g"], m.info["up"]
    if gate is up:
        return f"g and up are one product ('{gate.name}')"
    if gate.input[0] != up.input[0]:
        return f"'{gate.name}' and '{up.name}' read different activations: '{gate.input[0]}' and '{up.input[0]}'"
    nested = view.nested_reads
    for name, what in ((g, "g"), (u, "up")):
        if len(view.consumers.get(name, [])) != 1 or name in view.outputs or name in nested:
            return f"{what} ('{name}') is used elsewhere"
    if m.info["kind"] == "MatMul":
        return _check_matmul(view, gate, up)
    return _check_nbits(view, gate, up)


def _concat(view: GraphView, gate: onnx.NodeProto, up: onnx.NodeProto, i: int, axis: int, suffix: str) -> str:
    """A new initializer: input ``i`` of ``gate`` and of ``up`` concatenated along ``axis``."""
    tg, tu = (view.initializers[n.input[i]] for n in (gate, up))
    name = unique_name(view, f"{gate.name or gate.output[0]}_gate_up_{suffix}")
    add_initializer(view, name, np.concatenate([external.array(tg), external.array(tu)], axis=axis), tg)
    return name


def rewrite(view: GraphView, m: Match) -> list[onnx.NodeProto]:
    gate, up, silu = m.nodes
    gu = unique_name(view, f"{gate.output[0]}_gate_up")
    name = unique_name(view, f"{gate.name or gate.output[0]}_gate_up")
    if m.info["kind"] == "MatMul":
        w = _concat(view, gate, up, 1, 1, "weight")  # [K, N] | [K, N] -> [K, 2N]
        product = helper.make_node("MatMul", [gate.input[0], w], [gu], name=name, domain=gate.domain)
        n = view.initializers[gate.input[1]].dims[1]
    else:
        # B [N, n_blocks, blob], scales, zero points: rows of N first, so along axis 0
        inputs = [gate.input[0]] + [_concat(view, gate, up, i, 0, what)
                                    for i, what in ((1, "B"), (2, "scales"), (3, "zero_points"))
                                    if i < len(gate.input) and gate.input[i]]
        attrs = node_attrs(gate)
        n = int(attrs["N"])
        attrs["N"] = 2 * n
        product = helper.make_node("MatMulNBits", inputs, [gu], name=name, domain=MS_DOMAIN, **attrs)
    elem = view.elem_type(m.info["g"])
    shape = view.shape(m.info["g"])
    if elem is not None:  # what the merged product writes: g's type, last dimension 2N
        dims = None if shape is None else [*shape[:-1], 2 * int(n)]
        view.graph.value_info.append(helper.make_tensor_value_info(gu, elem, dims))
    return [product, helper.make_node("SiluMul", [gu], list(silu.output), name=silu.name, domain=DOMAIN,
                                      **node_attrs(silu))]


GATE_UP = Rule("MergeGateUp", match, check, rewrite, domains=((DOMAIN, 1),))


def match_nbits(view: GraphView, node: onnx.NodeProto) -> Match | None:
    """``match`` for two MatMulNBits products only (GATE_UP_NBITS)."""
    m = match(view, node)
    return m if m is not None and m.info["kind"] == "MatMulNBits" else None


#: GATE_UP for MatMulNBits products only: the CPU's rule. Each column of a 4-bit product is computed alone (on the
#: int8 path the activations are quantized per row and block, whatever N is), so the merged product's values are
#: the two products' bit for bit, where merged float MatMuls could round differently in the BLAS.
GATE_UP_NBITS = Rule("MergeGateUp", match_nbits, check, rewrite, domains=((DOMAIN, 1),))
