"""Add(a, b) → s, LayerNormalization(s, scale, B) → y  =>  com.microsoft SkipLayerNormalization(a, b, scale, B) → y.

The residual tail of post-norm transformers (BERT: ``LayerNorm(x + sublayer(x))``). On GPUs
SkipLayerNormalization is one Triton launch (``crossml.kernels.rmsnorm.skip_layer_norm``) where the
unfused pair takes two, and the sum is kept in float32 instead of rounded to the storage type
before normalizing (onnxruntime's optimizer makes the same fusion).

The rule needs a and b of one known shape of rank 2 or 3 (no broadcasting), s read by the norm only,
the norm over the last axis with float32 statistics (stash_type 1) and only its first output used.
It runs on sessions off the CPU (the CPU keeps the model's ops).
"""

from __future__ import annotations

import onnx
from onnx import helper

from crossml.graph.passes import GraphView, Match, Rule, node_attrs

DOMAIN = "com.microsoft"
FLOATS = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}


def match(view: GraphView, node: onnx.NodeProto) -> Match | None:
    if node.op_type != "LayerNormalization" or node.domain not in ("", "ai.onnx"):
        return None
    add = view.producer.get(node.input[0])
    if add is None or add.op_type != "Add" or add.domain not in ("", "ai.onnx") or not view.read_once(add.output[0]):
        return None
    return Match([add, node])


def check(view: GraphView, m: Match) -> str | None:
    add, norm = m.nodes
    a, b = view.shape(add.input[0]), view.shape(add.input[1])
    if a is None or b is None or a != b or None in a:
        return f"the Add's inputs have shapes {a} and {b}, not one known shape"
    if len(a) not in (2, 3):
        return f"the sum has rank {len(a)}; SkipLayerNormalization takes rank 2 or 3"
    if view.elem_type(add.input[0]) not in FLOATS:
        return "the sum is not float32/float16/bfloat16"
    attrs = node_attrs(norm)
    if attrs.get("axis", -1) not in (-1, len(a) - 1):
        return f"the norm's axis {attrs['axis']} is not the last"
    if attrs.get("stash_type", 1) != 1:
        return "stash_type is not 1 (float32 statistics)"
    if any(o for o in norm.output[1:]):
        return "the norm's mean / inv_std_dev outputs are used"
    return None


def rewrite(view: GraphView, m: Match) -> list[onnx.NodeProto]:
    add, norm = m.nodes
    inputs = [add.input[0], add.input[1], norm.input[1]] + ([norm.input[2]] if len(norm.input) > 2 else [])
    return [helper.make_node("SkipLayerNormalization", inputs, [norm.output[0]],
                             name=f"{norm.name or 'layer_norm'}_skip", domain=DOMAIN,
                             epsilon=float(node_attrs(norm).get("epsilon", 1e-5)))]


SKIP_LAYER_NORM = Rule("SkipLayerNorm", match, check, rewrite, domains=((DOMAIN, 1),))
