"""MatMul(h, W) → y (or com.crossml Linear(h, W, b) → y), SkipSimplifiedLayerNormalization(r, y, gamma) →
(normed, -, -, sum)  =>  com.crossml MatMulSkipNorm(h, W, b, r, gamma) → (normed, sum).

In a builder-made LLM every attention output projection and every MLP down projection feeds the
residual stream's next RMSNorm this way (the product is the norm's ``skip`` input). At decode sizes on a
GPU the fused node runs the Triton GEMV and then one kernel that adds its split-K partial sums, the
residual and normalizes (``crossml.kernels.gemv.gemv_skip_norm``): one launch fewer per norm, two per
transformer layer, and the product is never stored. Elsewhere it runs the two ops. SILU_MUL_NORM then
folds the MLP's SiluMul into the down projection's fused node (the GEMV gates the activations as it
loads them), unless MATMUL_SILU_MUL (which runs first) has folded it into the gate/up product (whose GEMV
stores the gated activations).

The rule needs the product's output read by this norm alone, the norm's statistics outputs unused, no
bias on the norm, W a 2-D constant and gamma a 1-D constant of W's N values. It runs on GPU sessions
only (not with disable_metacommands, whose products take crossml's own kernels at every size).
"""

from __future__ import annotations

import onnx
from onnx import helper

from crossml.graph.passes import GraphView, Match, Rule, node_attrs

DOMAIN = "com.crossml"
MS_DOMAIN = "com.microsoft"
#: the plain products: (domain, op type)
MATMULS = {("", "MatMul"), ("ai.onnx", "MatMul")}
#: the products the rule takes
PRODUCTS = MATMULS | {(DOMAIN, "Linear")}


def _producer(view: GraphView, name: str, kinds: set[tuple[str, str]]) -> onnx.NodeProto | None:
    """The node that writes ``name`` where its (domain, op type) is one of ``kinds``, else None."""
    node = view.producer.get(name)
    return node if node is not None and (node.domain, node.op_type) in kinds else None


def _plain_skip_norm(node: onnx.NodeProto) -> bool:
    """Whether ``node`` is a MatMulSkipNorm whose product reads its input as it is (no SiLU gate folded in)."""
    return node.op_type == "MatMulSkipNorm" and node.domain == DOMAIN and not node_attrs(node).get("silu_mul", 0)


def match(view: GraphView, node: onnx.NodeProto) -> Match | None:
    if node.op_type != "SkipSimplifiedLayerNormalization" or node.domain != MS_DOMAIN or len(node.input) < 3:
        return None
    product = _producer(view, node.input[1], PRODUCTS)
    if product is None:
        return None
    # the norm last: apply_rules puts the replacement where the last node was
    return Match([product, node], {})


def check(view: GraphView, m: Match) -> str | None:
    product, norm = m.nodes
    y = product.output[0]
    if not view.read_once(y):
        return f"the product's output ('{y}') of '{product.name}' is used elsewhere"
    for name in norm.output[1:3]:
        if view.is_read(name):
            return f"'{norm.name}' output '{name}' (a statistic) is used"
    if len(norm.input) > 3 and norm.input[3]:
        return f"'{norm.name}' has a bias input"
    if not norm.output or not norm.output[0]:
        return f"'{norm.name}' has no normalized output"
    w = view.initializers.get(product.input[1])
    if w is None or len(w.dims) != 2:
        return f"the weight ('{product.input[1]}') of '{product.name}' is not a 2-D constant"
    gamma = view.initializers.get(norm.input[2])
    if gamma is None or list(gamma.dims) != [w.dims[1]]:
        return f"gamma ('{norm.input[2]}') of '{norm.name}' is not a constant of N={w.dims[1]} values"
    return None


def rewrite(view: GraphView, m: Match) -> list[onnx.NodeProto]:
    product, norm = m.nodes
    bias = product.input[2] if product.op_type == "Linear" and len(product.input) > 2 else ""
    outputs = [norm.output[0], norm.output[3] if len(norm.output) > 3 else ""]
    if not outputs[-1]:
        outputs.pop()
    eps = node_attrs(norm).get("epsilon", 1e-12)
    return [helper.make_node("MatMulSkipNorm", [product.input[0], product.input[1], bias, norm.input[0],
                                                norm.input[2]], outputs,
                             name=f"{product.name}_{norm.name}_fused", domain=DOMAIN, epsilon=float(eps))]


MATMUL_NORM = Rule("MatMulSkipNorm", match, check, rewrite, domains=((DOMAIN, 1),))


def _gated(view: GraphView, node: onnx.NodeProto) -> Match | None:
    """[gate, node] where ``node``'s first input is written by a one-input SiluMul (of a merged gate/up product)."""
    gate = _producer(view, node.input[0], {(DOMAIN, "SiluMul")}) if node.input and node.input[0] else None
    return Match([gate, node], {}) if gate is not None and len(gate.input) == 1 else None


def match_gated(view: GraphView, node: onnx.NodeProto) -> Match | None:
    return _gated(view, node) if _plain_skip_norm(node) else None


def _activation(gate: onnx.NodeProto) -> str:
    return node_attrs(gate).get("activation", "silu")


def _check_read_once(view: GraphView, m: Match) -> str | None:
    gate, _ = m.nodes
    h = gate.output[0]
    if not view.read_once(h):
        return f"the gated activations ('{h}') of '{gate.name}' are used elsewhere"
    return None


def check_gated(view: GraphView, m: Match) -> str | None:
    if _activation(m.nodes[0]) != "silu":
        return f"'{m.nodes[0].name}' gates with {_activation(m.nodes[0])}; the GEMV's loads gate with SiLU only"
    return _check_read_once(view, m)


def rewrite_gated(view: GraphView, m: Match) -> list[onnx.NodeProto]:
    gate, fused = m.nodes
    attrs = node_attrs(fused)
    attrs["silu_mul"] = 1
    return [helper.make_node("MatMulSkipNorm", [gate.input[0], *fused.input[1:]], list(fused.output),
                             name=f"{gate.name}_{fused.name}", domain=DOMAIN, **attrs)]


#: com.crossml SiluMul(gu) → h, MatMulSkipNorm(h, W, ...)  =>  MatMulSkipNorm(gu, W, ..., silu_mul=1): the MLP's
#: gate (one-input SiluMul of the merged gate/up product, graph/passes/gate_up.py) computed as the down projection
#: loads its activations, one launch fewer per layer. Runs after MATMUL_NORM.
SILU_MUL_NORM = Rule("SiluMulSkipNorm", match_gated, check_gated, rewrite_gated, domains=((DOMAIN, 1),))


def match_gated_nbits(view: GraphView, node: onnx.NodeProto) -> Match | None:
    return _gated(view, node) if node.op_type == "MatMulNBits" and node.domain == MS_DOMAIN else None


def check_gated_nbits(view: GraphView, m: Match) -> str | None:
    gate, product = m.nodes
    if len(product.input) > 4 and product.input[4]:
        return f"'{product.name}' has g_idx ('{product.input[4]}')"
    if "activation" in node_attrs(product):
        return f"'{product.name}' has an attribute named activation"
    return _check_read_once(view, m)


def rewrite_gated_nbits(view: GraphView, m: Match) -> list[onnx.NodeProto]:
    gate, product = m.nodes
    act = {"activation": _activation(gate)} if _activation(gate) != "silu" else {}
    return [helper.make_node("SiluMulMatMulNBits", [gate.input[0], *product.input[1:]], list(product.output),
                             name=f"{gate.name}_{product.name}", domain=DOMAIN, **node_attrs(product), **act)]


#: com.crossml SiluMul(gu) → h, com.microsoft MatMulNBits(h, B, scales, ...) => com.crossml SiluMulMatMulNBits(gu, B,
#: scales, ...): a 4-bit MLP's down projection with its gate (``crossml.ops.fused.silu_mul_matmul_nbits``: at batch 1
#: the gate's kernel lets the product launch early). Not where the product has g_idx.
SILU_MUL_NBITS = Rule("SiluMulMatMulNBits", match_gated_nbits, check_gated_nbits, rewrite_gated_nbits,
                      domains=((DOMAIN, 1),))


#: MATMUL_SILU_MUL applies (False leaves the gate to SILU_MUL_NORM; benchmarks)
GATE_IN_PRODUCT = True


def match_gate_product(view: GraphView, node: onnx.NodeProto) -> Match | None:
    if not GATE_IN_PRODUCT or node.op_type != "SiluMul" or node.domain != DOMAIN or len(node.input) != 1 \
            or _activation(node) != "silu":  # the GEMV's stored gate is SiLU's
        return None
    product = _producer(view, node.input[0], MATMULS)
    if product is None:
        return None
    return Match([product, node], {})


def check_gate_product(view: GraphView, m: Match) -> str | None:
    product, gate = m.nodes
    gu = product.output[0]
    if not view.read_once(gu):
        return f"the gate/up product ('{gu}') of '{product.name}' is used elsewhere"
    w = view.initializers.get(product.input[1])
    if w is None or len(w.dims) != 2 or w.dims[1] % 2:
        return f"the weight ('{product.input[1]}') of '{product.name}' is not a 2-D constant of an even N"
    return None


def rewrite_gate_product(view: GraphView, m: Match) -> list[onnx.NodeProto]:
    product, gate = m.nodes
    return [helper.make_node("MatMulSiluMul", list(product.input[:2]), list(gate.output),
                             name=f"{product.name}_{gate.name}", domain=DOMAIN)]


#: MatMul(h, [Wg | Wu]) → gu, com.crossml SiluMul(gu) → a  =>  com.crossml MatMulSiluMul(h, [Wg | Wu]) → a: the MLP's
#: gate computed where its merged gate/up product (graph/passes/gate_up.py) is, so at decode sizes the GEMV stores
#: the I gated activations instead of the 2I products and the down projection reads them as they are. Runs before
#: SILU_MUL_NORM, which it leaves nothing to fold.
MATMUL_SILU_MUL = Rule("MatMulSiluMul", match_gate_product, check_gate_product, rewrite_gate_product,
                       domains=((DOMAIN, 1),))


#: ATTENTION_NORM applies (False keeps the attention and its output projection apart; benchmarks)
ATTENTION_IN_PRODUCT = True


def match_attention(view: GraphView, node: onnx.NodeProto) -> Match | None:
    if not ATTENTION_IN_PRODUCT or not _plain_skip_norm(node):
        return None
    attention = _producer(view, node.input[0], {(MS_DOMAIN, "GroupQueryAttention")})
    if attention is None:
        return None
    return Match([attention, node], {})


def check_attention(view: GraphView, m: Match) -> str | None:
    attention, fused = m.nodes
    out = attention.output[0]
    if not view.read_once(out):
        return f"the attention output ('{out}') of '{attention.name}' is used elsewhere"
    if len(attention.output) > 3 and attention.output[3] and (view.consumers.get(attention.output[3])
                                                               or attention.output[3] in view.outputs):
        return f"'{attention.name}' output '{attention.output[3]}' (the attention scores) is used"
    if {"gqa_inputs", "epsilon"} & set(node_attrs(attention)):
        return f"'{attention.name}' has an attribute named like one of MatMulSkipNorm's"
    return None


def rewrite_attention(view: GraphView, m: Match) -> list[onnx.NodeProto]:
    attention, fused = m.nodes
    extra = list(fused.input[1:]) + [""] * (5 - len(fused.input))
    # all four outputs named or "": the op returns four values
    outputs = [*list(fused.output) + [""] * (2 - len(fused.output)), *(list(attention.output[1:3]) + ["", ""])[:2]]
    return [helper.make_node("AttentionSkipNorm", [*attention.input, *extra], outputs,
                             name=f"{attention.name}_{fused.name}", domain=DOMAIN, gqa_inputs=len(attention.input),
                             **node_attrs(attention), **node_attrs(fused))]


#: com.microsoft GroupQueryAttention → o, com.crossml MatMulSkipNorm(o, W, ...)  =>  com.crossml
#: AttentionSkipNorm(attention inputs..., W, ...): the decode step's split attention combined and multiplied with the
#: output projection in one launch (``crossml.kernels.decode_attention.combine_product``), its partial sums added by
#: the skip-norm kernel, one launch fewer per layer. Runs after MATMUL_NORM and SILU_MUL_NORM.
ATTENTION_NORM = Rule("AttentionSkipNorm", match_attention, check_attention, rewrite_attention,
                      domains=((DOMAIN, 1),))
