"""LFM2's short-convolution block, as the model builder writes it:

    Transpose(h, perm [0, 2, 1]) → t;  Split(t, axis 1, three equal parts) → (b, c, x);
    Mul(b, x) → bx;  com.microsoft CausalConvWithState(bx, weight, bias, past) → (conv, present);
    Mul(c, conv) → y;  Transpose(y, perm [0, 2, 1]) → out

=>  com.crossml ShortConv(h, weight, bias, past) → (out, present).

Six nodes become one (a decode step of a CPU session spends 25-80 us in each op's call, whatever its size). The
fused op computes the same products and sums in the same order (``crossml.ops.fused.short_conv``), so its values are
the six nodes' bit for bit. The rule needs every intermediate read by the next node of the block alone, the
convolution at its defaults but for ``activation`` and ``dilation`` (channels first, no state window, ndim 1) and a
Split into three equal parts along the channels.
"""

from __future__ import annotations

import onnx
from onnx import helper

from crossml.graph import external
from crossml.graph.passes import GraphView, Match, Rule, node_attrs
from crossml.graph.passes._consts import constant, other_input

DOMAIN = "com.crossml"
MS_DOMAIN = "com.microsoft"
#: the convolution's attributes the fused op takes (the others must be at their defaults)
CONV_ATTRS = ("activation", "dilation")
CONV_DEFAULTS = {"ndim": 1, "channels_last": 0, "state_window": 0, "state_length": 0, "state_channels_last": -1,
                 "input_channel_offset": 0, "input_channels": 0, "state_update_capacity": 0}


def _is(node: onnx.NodeProto | None, op_type: str, domains: tuple[str, ...] = ("", "ai.onnx")) -> bool:
    return node is not None and node.op_type == op_type and node.domain in domains


def match(view: GraphView, node: onnx.NodeProto) -> Match | None:
    if not _is(node, "Transpose") or len(node.input) != 1:
        return None
    gated = view.producer.get(node.input[0])
    if not _is(gated, "Mul") or len(gated.input) != 2:
        return None
    conv = next((view.producer.get(i) for i in gated.input
                 if _is(view.producer.get(i), "CausalConvWithState", (MS_DOMAIN,))), None)
    if conv is None or len(conv.input) < 2 or not conv.input[0]:
        return None
    c_name = other_input(gated, conv.output[0])
    mixed = view.producer.get(conv.input[0])
    if not _is(mixed, "Mul") or len(mixed.input) != 2:
        return None
    split = view.producer.get(mixed.input[0])
    if not _is(split, "Split") or len(split.output) != 3 or view.producer.get(mixed.input[1]) is not split:
        return None
    if (mixed.input[0], mixed.input[1]) not in ((split.output[0], split.output[2]), (split.output[2], split.output[0])):
        return None
    if c_name != split.output[1]:
        return None
    first = view.producer.get(split.input[0])
    if not _is(first, "Transpose") or len(first.input) != 1:
        return None
    # graph order; the last Transpose last: apply_rules puts the replacement where the last node was
    return Match([first, split, mixed, conv, gated, node])


def check(view: GraphView, m: Match) -> str | None:
    first, split, mixed, conv, gated, last = m.nodes
    for t in (first, last):
        if list(node_attrs(t).get("perm", [])) != [0, 2, 1]:
            return f"'{t.name}' has perm {list(node_attrs(t).get('perm', []))} (needs [0, 2, 1])"
    sa = node_attrs(split)
    if sa.get("axis", 0) != 1:
        return f"'{split.name}' splits axis {sa.get('axis', 0)} (needs 1)"
    parts = sa.get("split")
    if parts is None and len(split.input) > 1 and split.input[1]:
        t = constant(view, split.input[1])
        if t is None:
            return f"'{split.name}' has split sizes ('{split.input[1]}') that are not constants"
        parts = [int(v) for v in external.array(t).reshape(-1)]
    if parts is not None and (len(parts) != 3 or len(set(parts)) != 1):
        return f"'{split.name}' splits into {parts} (needs three equal parts)"
    ca = node_attrs(conv)
    for key, default in CONV_DEFAULTS.items():
        if ca.get(key, default) != default:
            return f"'{conv.name}' has {key}={ca[key]} (the fused op takes the default, {default})"
    for name in (first.output[0], *split.output, mixed.output[0], conv.output[0], gated.output[0]):
        if not view.read_once(name):
            return f"'{name}' is read outside the block"
    return None


def rewrite(view: GraphView, m: Match) -> list[onnx.NodeProto]:
    first, split, mixed, conv, gated, last = m.nodes
    ca = node_attrs(conv)
    attrs = {k: (ca[k].decode() if isinstance(ca[k], bytes) else ca[k]) for k in CONV_ATTRS if k in ca}
    inputs = [first.input[0], *list(conv.input[1:])]
    outputs = [last.output[0], conv.output[1] if len(conv.output) > 1 else ""]
    while outputs and not outputs[-1]:
        outputs.pop()
    return [helper.make_node("ShortConv", inputs, outputs, name=f"{conv.name}_block", domain=DOMAIN, **attrs)]


SHORT_CONV = Rule("ShortConv", match, check, rewrite, domains=((DOMAIN, 1),))
