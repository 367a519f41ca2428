"""Cast(a → float32), Cast(b → float32) → com.microsoft GatedDeltaNet(q, k, v, cu, decay, beta, ...)  =>
com.crossml GatedDeltaNet(q, k, v, cu, a, b, ...): the float32 Casts of a GatedDeltaNet's decay and beta inputs go.

The builder's Gated DeltaNet export of Qwen3.5 (fp16 and int4 CUDA) casts each layer's half-precision ``a`` and ``b``
projections to float32 for the op (which takes float32 gates): two elementwise launches a layer in a decode step, 36
for Qwen3.5-0.8B. The op computes its gates in float32 from whatever it loads, and half precision widens to float32
exactly, so the fused node reading the half-precision tensors gives the same values bit for bit. It is com.crossml's
GatedDeltaNet (``crossml.ops.contrib.gated_delta_net``), the same op but for its float32 requirement on the gates.
The rule folds each Cast whose input is float16 or bfloat16 (its type known), casting to float32, read by this node
alone; a gate without such a Cast stays as it is. It runs off the CPU only, with the other fusions of the GPU plans.
"""

from __future__ import annotations

import onnx
from onnx import helper

from crossml.graph.passes import GraphView, Match, Rule, node_attrs

_MS = "com.microsoft"
DOMAIN = "com.crossml"
_HALF = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
#: GatedDeltaNet's decay and beta input positions
GATES = (4, 5)


def _foldable(view: GraphView, name: str) -> onnx.NodeProto | None:
    """The Cast producing gate input ``name`` where the rule can fold it, else None."""
    cast = view.producer.get(name) if name else None
    if (cast is None or cast.op_type != "Cast" or cast.domain not in ("", "ai.onnx")
            or node_attrs(cast).get("to") != onnx.TensorProto.FLOAT or view.elem_type(cast.input[0]) not in _HALF
            or not view.read_once(name)):
        return None
    return cast


def match(view: GraphView, node: onnx.NodeProto) -> Match | None:
    if node.op_type != "GatedDeltaNet" or node.domain != _MS:
        return None
    casts = {i: c for i in GATES if i < len(node.input) and (c := _foldable(view, node.input[i])) is not None}
    if not casts:
        return None
    return Match([*casts.values(), node], {"casts": casts})


def check(view: GraphView, m: Match) -> str | None:
    return None  # match() takes only the Casts it can fold


def rewrite(view: GraphView, m: Match) -> list[onnx.NodeProto]:
    node = m.nodes[-1]
    inputs = list(node.input)
    for i, cast in m.info["casts"].items():
        inputs[i] = cast.input[0]
    return [helper.make_node(node.op_type, inputs, list(node.output), name=node.name, domain=DOMAIN,
                             **node_attrs(node))]


GATE_CASTS = Rule("FoldGatedDeltaNetGateCasts", match, check, rewrite, domains=((DOMAIN, 1),))
