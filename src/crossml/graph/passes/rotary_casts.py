"""Cast(x → float32) → MRotaryEmbedding → Cast(→ x's type)  =>  MRotaryEmbedding(x): the casts around a com.microsoft
MRotaryEmbedding of a half-precision input go.

Qwen3.5's full-attention layers (the builder's fp16 and int4 CUDA exports) rotate their query and key in float32
between two Casts: four elementwise launches a layer in a decode step. MRotaryEmbedding computes in float32 whatever
its input's type (the Triton kernel and the torch path load half-precision values as float32, and the cos / sin caches
stay float32) and rounds once to its input's type, so the folded node gives the three nodes' values bit for bit:
fp16 → fp32 is exact, and the one rounding is the second Cast's. The rule needs the inner Cast's input to be float16
or bfloat16 (its type known), the outer Cast to go back to that type, and each intermediate value to be read by the
next node alone. It runs off the CPU only, with the other fusions of the GPU plans (CPU models are float32).
"""

from __future__ import annotations

import onnx
from onnx import helper

from crossml.graph.passes import GraphView, Match, Rule, node_attrs

_MS = "com.microsoft"
_HALF = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)


def _is_cast(node: onnx.NodeProto | None) -> bool:
    return node is not None and node.op_type == "Cast" and node.domain in ("", "ai.onnx")


def match(view: GraphView, node: onnx.NodeProto) -> Match | None:
    if node.op_type != "MRotaryEmbedding" or node.domain != _MS or not node.input or not node.input[0]:
        return None
    inner = view.producer.get(node.input[0])
    outer = view.only_consumer(node.output[0])
    if not _is_cast(inner) or not _is_cast(outer):
        return None
    return Match([inner, node, outer])


def check(view: GraphView, m: Match) -> str | None:
    inner, rope, outer = m.nodes
    src = view.elem_type(inner.input[0])
    if src not in _HALF:
        return f"the input of '{inner.name}' is not known to be float16 / bfloat16 (type {src})"
    if node_attrs(inner).get("to") != onnx.TensorProto.FLOAT:
        return f"'{inner.name}' does not cast to float32"
    if node_attrs(outer).get("to") != src:
        return f"'{outer.name}' does not cast back to the input's type"
    if not view.read_once(inner.output[0]):
        return f"the output of '{inner.name}' is read by more than '{rope.name}'"
    if not view.read_once(rope.output[0]):
        return f"the output of '{rope.name}' is read by more than '{outer.name}'"
    return None


def rewrite(view: GraphView, m: Match) -> list[onnx.NodeProto]:
    inner, rope, outer = m.nodes
    return [helper.make_node(rope.op_type, [inner.input[0], *rope.input[1:]], [outer.output[0]], name=rope.name,
                             domain=rope.domain, **node_attrs(rope))]


ROTARY_CASTS = Rule("FoldRotaryCasts", match, check, rewrite)
