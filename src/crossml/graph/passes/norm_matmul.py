"""SimplifiedLayerNormalization(x, gamma) → h, MatMulNBits(h, B, scales, ...) → y  =>
com.crossml NormMatMulNBits(x, "", gamma, B, scales, ...) → y; the same for com.microsoft
SkipSimplifiedLayerNormalization(x, skip, gamma) → (h, -, -, sum), whose sum output the fused node keeps.

At decode sizes on a GPU the fused node is one Triton launch that normalizes the activations as it
multiplies (every program of the 4-bit GEMV walks all of K, so it sums the squares on the way): one
launch fewer per norm, two per transformer layer of a builder-made LLM (for K up to the op's
NORM_FUSE_MAX_K, or wider where the fp16-pair kernel takes all of K in one step; other products keep two
launches, see crossml.ops.fused.norm_fuses).

The rule needs the norm's normalized output read by this product alone (after MergeGateUp the gate
and up products are one), its statistics outputs unused, the last axis normalized (stash_type 1),
no bias on the skip norm, a 1-D gamma of K values, and a 4-bit product without g_idx or
accuracy_level 4 (whose int8 activation quantization needs the rounded normalized values). CPU sessions
run NORM_MATMUL_CPU, which takes level-4 products too (the fused node's CPU path runs the two ops' kernels).
"""

from __future__ import annotations

import functools

import onnx
from onnx import helper

from crossml.graph.passes import GraphView, Match, Rule, node_attrs

DOMAIN = "com.crossml"
MS_DOMAIN = "com.microsoft"
#: the norms the rule takes: (domain, op type) -> number of declared outputs
NORMS = {("", "SimplifiedLayerNormalization"): 2, ("ai.onnx", "SimplifiedLayerNormalization"): 2,
         (MS_DOMAIN, "SkipSimplifiedLayerNormalization"): 4}



def match(view: GraphView, node: onnx.NodeProto) -> Match | None:
    if node.op_type != "MatMulNBits" or node.domain != MS_DOMAIN or len(node.input) < 3 or not node.input[0]:
        return None
    norm = view.producer.get(node.input[0])
    if norm is None or (norm.domain, norm.op_type) not in NORMS or norm.output[0] != node.input[0]:
        return None
    # the product last: apply_rules puts the replacement where the last node was
    return Match([norm, node], {"skip": norm.op_type.startswith("Skip")})


def check(view: GraphView, m: Match, *, int8: bool = False) -> str | None:
    """Why the match is refused (None: accepted); ``int8`` accepts products at accuracy level 4 (the CPU's rule)."""
    norm, product = m.nodes
    h = norm.output[0]
    if not view.read_once(h):
        return f"the normalized output ('{h}') of '{norm.name}' is used elsewhere"
    stats = norm.output[1:3] if m.info["skip"] else norm.output[1:2]
    for name in stats:
        if view.is_read(name):
            return f"'{norm.name}' output '{name}' (a statistic) is used"
    na = node_attrs(norm)
    if na.get("axis", -1) != -1 or na.get("stash_type", 1) != 1:
        return f"'{norm.name}' has axis={na.get('axis', -1)} stash_type={na.get('stash_type', 1)} (needs -1 and 1)"
    if m.info["skip"] and len(norm.input) > 3 and norm.input[3]:
        return f"'{norm.name}' has a bias input"
    pa = node_attrs(product)
    if pa.get("bits", 4) != 4 or (pa.get("accuracy_level", 0) == 4 and not int8) or pa.get("weight_prepacked", 0):
        return (f"'{product.name}' has bits={pa.get('bits', 4)}, accuracy_level={pa.get('accuracy_level', 0)}, "
                f"weight_prepacked={pa.get('weight_prepacked', 0)} (needs 4, not 4, 0)")
    if len(product.input) > 4 and product.input[4]:
        return f"'{product.name}' has a g_idx input"
    gamma = norm.input[2 if m.info["skip"] else 1]
    t = view.initializers.get(gamma)
    if t is None or list(t.dims) != [int(pa["K"])]:
        return f"gamma ('{gamma}') of '{norm.name}' is not a constant of K={pa.get('K')} values"
    return None


def rewrite(view: GraphView, m: Match) -> list[onnx.NodeProto]:
    norm, product = m.nodes
    skip = m.info["skip"]
    x, skip_in, gamma = (norm.input[0], norm.input[1], norm.input[2]) if skip else (norm.input[0], "", norm.input[1])
    pin = list(product.input) + [""] * (6 - len(product.input))
    inputs = [x, skip_in, gamma, pin[1], pin[2], pin[3], pin[5]]
    while inputs and not inputs[-1]:
        inputs.pop()
    outputs = [product.output[0], norm.output[3] if skip and len(norm.output) > 3 else ""]
    while outputs and not outputs[-1]:
        outputs.pop()
    pa = node_attrs(product)
    attrs = {k: pa[k] for k in ("K", "N", "block_size") if k in pa}
    attrs["bits"] = pa.get("bits", 4)
    if pa.get("accuracy_level", 0):
        attrs["accuracy_level"] = pa["accuracy_level"]
    attrs["epsilon"] = float(node_attrs(norm).get("epsilon", 1e-12 if skip else 1e-5))
    return [helper.make_node("NormMatMulNBits", inputs, outputs, name=f"{norm.name}_{product.name}_fused",
                             domain=DOMAIN, **attrs)]


NORM_MATMUL = Rule("NormMatMulNBits", match, check, rewrite, domains=((DOMAIN, 1),))
#: NORM_MATMUL for CPU sessions, level-4 products included: on the CPU the fused node runs the skip norm's kernel
#: and the int8 product (``crossml.ops.fused.norm_matmul_nbits``), the two ops' values, in one node
NORM_MATMUL_CPU = Rule("NormMatMulNBits", match, functools.partial(check, int8=True), rewrite, domains=((DOMAIN, 1),))
