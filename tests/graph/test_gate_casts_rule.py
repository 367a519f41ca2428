"""FoldGatedDeltaNetGateCasts: the float32 Casts of a com.microsoft GatedDeltaNet's half-precision decay and beta (the
builder's Gated DeltaNet export of Qwen3.5 at fp16 / int4) go, the node becoming com.crossml's GatedDeltaNet. What it
folds, what it leaves (each gate alone), and the folded model's values against the unfolded one's (bit for bit)."""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from crossml.graph.passes.gate_casts import GATE_CASTS
from crossml.runtime.session import fusion_rules
from tests.graph._rules import contrib_model, fold_copy, unfused_session

RNG = np.random.default_rng(31)
B, S, HQ, HV, D = 1, 3, 2, 4, 8


def gdn_model(*, half: int = T.FLOAT16, cast_beta: bool = True, second_reader: bool = False) -> onnx.ModelProto:
    """q, k, v (fp16) and the raw a, b (``half``) through Casts to float32 into a GatedDeltaNet (qwen gate)."""
    inputs = [h.make_tensor_value_info(n, T.FLOAT16, [B, S, heads, D]) for n, heads in (("q", HQ), ("k", HQ), ("v", HV))]
    inputs += [h.make_tensor_value_info("a", half, [B, S, HV]),
               h.make_tensor_value_info("b", half if cast_beta else T.FLOAT, [B, S, HV]),
               h.make_tensor_value_info("state", T.FLOAT, [B, HV, D, D])]
    inits = [numpy_helper.from_array((0.5 * RNG.standard_normal(HV)).astype(np.float32), "a_log"),
             numpy_helper.from_array(RNG.standard_normal(HV).astype(np.float32), "dt_bias")]
    nodes = [h.make_node("Cast", ["a"], ["a32"], name="a_cast", to=T.FLOAT)]
    beta = "b"
    if cast_beta:
        nodes.append(h.make_node("Cast", ["b"], ["b32"], name="b_cast", to=T.FLOAT))
        beta = "b32"
    nodes.append(h.make_node("GatedDeltaNet", ["q", "k", "v", "", "a32", beta, "state", "a_log", "dt_bias"],
                             ["out", "present"], name="gdn", domain="com.microsoft", gate_activation="qwen",
                             beta_activation="sigmoid", qk_l2_norm=1))
    outputs = [h.make_tensor_value_info("out", T.FLOAT16, None), h.make_tensor_value_info("present", T.FLOAT, None)]
    if second_reader:
        nodes.append(h.make_node("Neg", ["a32"], ["n"], name="other"))
        outputs.append(h.make_tensor_value_info("n", T.FLOAT, None))
    return contrib_model(nodes, inputs, outputs, inits)


def _feeds(beta_type=np.float16) -> dict[str, np.ndarray]:
    return {"q": RNG.standard_normal((B, S, HQ, D)).astype(np.float16),
            "k": RNG.standard_normal((B, S, HQ, D)).astype(np.float16),
            "v": RNG.standard_normal((B, S, HV, D)).astype(np.float16),
            "a": RNG.standard_normal((B, S, HV)).astype(np.float16),
            "b": RNG.standard_normal((B, S, HV)).astype(beta_type),
            "state": (0.3 * RNG.standard_normal((B, HV, D, D))).astype(np.float32)}


def test_folds_both_casts_with_the_same_values() -> None:
    m = gdn_model()
    folded, counts = fold_copy(m, GATE_CASTS)
    assert counts == {"FoldGatedDeltaNetGateCasts": 1}
    (node,) = folded.graph.node
    assert node.domain == "com.crossml" and list(node.input[4:6]) == ["a", "b"]
    feeds = _feeds()
    got = unfused_session(folded).run(None, feeds)
    want = unfused_session(m).run(None, feeds)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


def test_folds_each_gate_alone() -> None:
    """A float32 beta (no Cast) stays; the decay's Cast goes. A Cast read elsewhere too stays."""
    m = gdn_model(cast_beta=False)
    folded, counts = fold_copy(m, GATE_CASTS)
    assert counts == {"FoldGatedDeltaNetGateCasts": 1}
    (node,) = folded.graph.node
    assert list(node.input[4:6]) == ["a", "b"]
    feeds = _feeds(np.float32)
    for g, w in zip(unfused_session(folded).run(None, feeds), unfused_session(m).run(None, feeds)):
        np.testing.assert_array_equal(g, w)
    folded, counts = fold_copy(gdn_model(second_reader=True), GATE_CASTS)
    gdn = next(n for n in folded.graph.node if n.op_type == "GatedDeltaNet")
    assert counts == {"FoldGatedDeltaNetGateCasts": 1} and list(gdn.input[4:6]) == ["a32", "b"]
    assert fold_copy(gdn_model(half=T.FLOAT), GATE_CASTS)[1] == {}  # float32 inputs: no Cast to fold (a float->float Cast stays)


def test_the_microsoft_op_keeps_its_float32_gates() -> None:
    """com.microsoft GatedDeltaNet fed half-precision gates directly is refused, as onnxruntime's type constraint has
    it; only the rule's com.crossml node takes them."""
    m = gdn_model()
    for node in m.graph.node:
        if node.op_type == "GatedDeltaNet":
            node.input[4] = "a"
    try:
        unfused_session(m).run(None, _feeds())
    except Exception as exc:  # noqa: BLE001 - the message is what is checked
        assert "decay must be float32" in str(exc)
    else:
        raise AssertionError("half-precision decay accepted by com.microsoft GatedDeltaNet")


def test_runs_off_the_cpu_only() -> None:
    assert GATE_CASTS in fusion_rules(None, torch.device("cuda"))
    assert GATE_CASTS not in fusion_rules(None, torch.device("cpu"))
