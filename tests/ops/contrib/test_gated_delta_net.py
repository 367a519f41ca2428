"""com.microsoft GatedDeltaNet and VarlenCausalConvWithState (the builder's Gated DeltaNet export of Qwen3.5) against
onnxruntime CPU, GatedDeltaNet also against transformers' Qwen3.5 recurrence, and their errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto as TP

import crossml
from tests.ops.contrib._ort import check, single_node_model

RNG = np.random.default_rng(23)
F32 = np.float32
OUT2 = [("out", TP.FLOAT), ("state", TP.FLOAT)]
OUT2_16 = [("out", TP.FLOAT16), ("state", TP.FLOAT)]
RULES = ["linear", "gated", "delta", "gated_delta"]
#: layout -> (the tokens' leading shape, rows of the state, cumulative sequence lengths or None)
LAYOUTS = {"dense": ((2, 5), 2, None), "packed": ((7,), 3, [0, 3, 3, 7]), "equal-rows": ((6,), 2, None)}


def _gdn_inputs(layout, rule, *, heads=(2, 4), dk=16, dv=8, gate="none", per_key=False, dtype=F32, state=True):
    lead, rows, cu = LAYOUTS[layout]
    hq, hv = heads
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    decay_shape = (*lead, hv, dk) if per_key else (*lead, hv)
    if gate == "qwen":  # the raw ``a`` of -exp(a_log) * softplus(a + dt_bias)
        decay = RNG.standard_normal(decay_shape)
    else:
        decay = -RNG.random(decay_shape)
    inputs = {"query": RNG.standard_normal((*lead, hq, dk)).astype(dtype),
              "key": RNG.standard_normal((*lead, hq, dk)).astype(dtype),
              "value": RNG.standard_normal((*lead, hv, dv)).astype(dtype),
              "cu_seqlens": np.array(cu, np.int32) if cu is not None else None,
              "decay": decay.astype(F32) if gated else None,
              "beta": RNG.standard_normal((*lead, hv)).astype(F32) if delta else None,
              "initial_state": (0.3 * RNG.standard_normal((rows, hv, dv, dk))).astype(F32) if state else None,
              "a_log": None, "dt_bias": None}
    if gate == "qwen":
        inputs["a_log"] = (0.5 * RNG.standard_normal(hv)).astype(F32)
        inputs["dt_bias"] = RNG.standard_normal(hv).astype(F32)
    return inputs


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("dtype", [F32, np.float16], ids=["fp32", "fp16"])
def test_gated_delta_net_matches_onnxruntime(layout, rule, dtype):
    """Each update rule over the three token layouts (B, S, H, d; packed with cu_seqlens, an empty sequence among
    them; N tokens as equal rows), L2-normalized query / key heads and sigmoid beta as the builder emits them."""
    check("GatedDeltaNet", _gdn_inputs(layout, rule, dtype=dtype), OUT2 if dtype == F32 else OUT2_16,
          atol=1e-5 if dtype == F32 else 4e-3, rtol=1e-5 if dtype == F32 else 4e-3, update_rule=rule,
          qk_l2_norm=1, beta_activation="sigmoid" if "delta" in rule else "none")


@pytest.mark.parametrize("layout", ["dense", "packed"])
@pytest.mark.parametrize("rule", ["gated", "gated_delta"])
@pytest.mark.parametrize("per_key", [False, True], ids=["per-head", "per-key"])
def test_gated_delta_net_qwen_gate_matches_onnxruntime(layout, rule, per_key):
    """gate_activation qwen (the builder's export: the raw ``a`` projection, a_log and dt_bias), one decay a head or
    one a key dimension."""
    check("GatedDeltaNet", _gdn_inputs(layout, rule, gate="qwen", per_key=per_key), OUT2, atol=1e-5, rtol=1e-5,
          update_rule=rule, gate_activation="qwen", beta_activation="sigmoid" if "delta" in rule else "none",
          qk_l2_norm=1)


@pytest.mark.parametrize("heads", [(2, 2), (1, 4), (2, 6)], ids=["equal", "one-key-head", "three-per-key-head"])
@pytest.mark.parametrize("options", [dict(scale=0.25), dict(qk_l2_norm=0)], ids=["scale", "no-l2-norm"])
def test_gated_delta_net_heads_and_options_match_onnxruntime(heads, options):
    inputs = _gdn_inputs("dense", "gated_delta", heads=heads, dk=8, dv=12)
    if not options.get("qk_l2_norm", 1):  # unnormalized keys: keep the delta rule's state bounded
        inputs["key"] /= np.linalg.norm(inputs["key"], axis=-1, keepdims=True)
    check("GatedDeltaNet", inputs, OUT2, atol=1e-5, rtol=1e-5, **{"qk_l2_norm": 1, **options})


def test_gated_delta_net_without_initial_state_matches_onnxruntime():
    check("GatedDeltaNet", _gdn_inputs("dense", "gated_delta", state=False), OUT2, atol=1e-5, rtol=1e-5,
          qk_l2_norm=1)


def test_gated_delta_net_matches_transformers_qwen35_recurrence():
    """transformers' Qwen3.5 layer (``torch_recurrent_gated_delta_rule``, K-major states, its own L2 norm with eps
    1e-6) on the gates the Qwen3.5 layer computes from a, b, A_log and dt_bias: the op with the builder's attributes
    gives the same outputs and the transposed state."""
    modeling = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    inputs = _gdn_inputs("dense", "gated_delta", gate="qwen", heads=(2, 4), dk=16, dv=8)
    model, feeds = single_node_model("GatedDeltaNet", inputs, OUT2, update_rule="gated_delta", gate_activation="qwen",
                                     beta_activation="sigmoid", qk_l2_norm=1)
    out, state = crossml.InferenceSession(model.SerializeToString()).run(None, feeds)
    t = {k: torch.from_numpy(v) for k, v in inputs.items() if v is not None}
    g = -t["a_log"].exp() * torch.nn.functional.softplus(t["decay"] + t["dt_bias"])
    # the layer repeats each query/key head for its value heads before the rule (transformers 5.24's rule takes them
    # so; 5.17's repeated them itself, a no-op once they are)
    rep = t["value"].shape[2] // t["key"].shape[2]
    q, k = (t[n].repeat_interleave(rep, dim=2) for n in ("query", "key"))
    want, want_state = modeling.torch_recurrent_gated_delta_rule(
        q, k, t["value"], g=g, beta=torch.sigmoid(t["beta"]),
        initial_state=t["initial_state"].transpose(-1, -2), output_final_state=True, use_qk_l2norm_in_kernel=True)
    np.testing.assert_allclose(out, want.numpy(), atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(state, want_state.transpose(-1, -2).numpy(), atol=2e-5, rtol=1e-5)


OUT3 = [*OUT2, ("update", TP.FLOAT)]


@pytest.mark.parametrize(("layout", "rule", "counts", "active"), [
    ("packed", "gated_delta", [2, 3, 9], 1), ("dense", "gated_delta", [0, 4], 1), ("packed", "delta", [3, 1, 2], 1),
    ("packed", "gated_delta", [2, 3, 9], 0), ("equal-rows", "linear", [1, 8], None)],
    ids=["packed", "dense", "delta-rule", "inactive", "linear-rule"])
def test_gated_delta_net_transition_capture_matches_onnxruntime(layout, rule, counts, active):
    """state_update_capacity 3 (the packed export's rollback for speculative decoding): each row's first
    min(capture_count, 3, length) tokens' decays, normalized keys and deltas, struct of arrays, zeros elsewhere;
    all zeros where state_update_active is 0."""
    gate = "qwen" if "gated" in rule else "none"
    inputs = {**_gdn_inputs(layout, rule, gate=gate), "capture_count": np.array(counts, np.int32),
              "state_update_active": np.array([active], np.int32) if active is not None else None}
    worst = check("GatedDeltaNet", inputs, OUT3, atol=1e-5, rtol=1e-5, update_rule=rule, gate_activation=gate,
                  beta_activation="sigmoid" if "delta" in rule else "none", qk_l2_norm=1, state_update_capacity=3)
    assert worst < 1e-5


def _run(op_type, inputs, outputs, **attrs):
    model, feeds = single_node_model(op_type, inputs, outputs, **attrs)
    return crossml.InferenceSession(model.SerializeToString()).run(None, feeds)


@pytest.mark.parametrize(("change", "attrs", "message"), [
    (dict(a_log=None, dt_bias=None), dict(gate_activation="qwen"), "a_log and dt_bias are required"),
    ({}, dict(state_update_capacity=2), "capture_count is required"),
    ({}, dict(gate_activation="mamba"), "unsupported gate_activation 'mamba'"),
    (dict(beta=None), {}, "requires the beta input"),
    (dict(initial_state=np.zeros((2, 4, 16, 8), F32)), {}, "V-major"),
    (dict(value=np.zeros((2, 5, 3, 8), F32), beta=np.zeros((2, 5, 3), F32), decay=np.zeros((2, 5, 3), F32),
          initial_state=None), {}, "positive multiple"),
], ids=["qwen-without-a_log", "capture", "gate-activation", "missing-beta", "k-major-state", "heads"])
def test_gated_delta_net_errors_name_the_problem(change, attrs, message):
    inputs = {**_gdn_inputs("dense", "gated_delta", gate="qwen" if "a_log" in change else "none"), **change}
    with pytest.raises(Exception, match="GatedDeltaNet") as info:
        _run("GatedDeltaNet", inputs, OUT2, **{"qk_l2_norm": 1, **attrs})
    assert message in str(info.value)


def test_gated_delta_net_packed_lengths_are_checked():
    inputs = _gdn_inputs("packed", "gated_delta")
    inputs["cu_seqlens"] = np.array([0, 3, 2, 7], np.int32)
    with pytest.raises(Exception, match=r"never decrease"):
        _run("GatedDeltaNet", inputs, OUT2, qk_l2_norm=1)


def _vcc_inputs(lengths, channels=6, k=4, dilation=1, bias=True, dtype=F32):
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return {"input": RNG.standard_normal((int(cu[-1]), channels)).astype(dtype),
            "weight": RNG.standard_normal((channels, 1, k)).astype(dtype),
            "cumulative_sequence_length": cu,
            "bias": RNG.standard_normal(channels).astype(dtype) if bias else None,
            "initial_state": RNG.standard_normal((len(lengths), channels, (k - 1) * dilation)).astype(dtype)}


@pytest.mark.parametrize("lengths", [[5], [1, 6, 2], [4, 1]], ids=["one", "short-and-long", "decode-rows"])
@pytest.mark.parametrize("activation", ["none", "silu"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_varlen_causal_conv_matches_onnxruntime(lengths, activation, bias):
    """Sequences shorter than the kernel's reach keep the tail of their old state; one sequence never reads another's
    tokens."""
    check("VarlenCausalConvWithState", _vcc_inputs(lengths, bias=bias), [("out", TP.FLOAT), ("state", TP.FLOAT)],
          atol=1e-5, rtol=1e-5, activation=activation)


def test_varlen_causal_conv_float16_matches_onnxruntime():
    check("VarlenCausalConvWithState", _vcc_inputs([3, 5], dtype=np.float16),
          [("out", TP.FLOAT16), ("state", TP.FLOAT16)], atol=4e-3, rtol=4e-3, activation="silu")


def test_varlen_causal_conv_dilation_matches_onnxruntime():
    check("VarlenCausalConvWithState", _vcc_inputs([4, 1, 6], dilation=2), [("out", TP.FLOAT), ("state", TP.FLOAT)],
          atol=1e-5, rtol=1e-5, activation="silu", dilation=2)


def test_varlen_causal_conv_captures_each_sequences_first_tokens():
    """state_update_capacity 3: each sequence's first min(capture_count, 3, length) input tokens, zeros after (as
    onnxruntime gives them)."""
    inputs = {**_vcc_inputs([4, 2, 5]), "capture_count": np.array([2, 3, 9], np.int32)}
    check("VarlenCausalConvWithState", inputs, [("out", TP.FLOAT), ("state", TP.FLOAT), ("update", TP.FLOAT)],
          atol=1e-5, rtol=1e-5, activation="silu", state_update_capacity=3)
    out = _run("VarlenCausalConvWithState", inputs, [("out", TP.FLOAT), ("state", TP.FLOAT), ("update", TP.FLOAT)],
               activation="silu", state_update_capacity=3)
    x = inputs["input"]
    want = np.zeros((3, 3, 6), F32)
    want[0, :2], want[1, :2], want[2, :3] = x[0:2], x[4:6], x[6:9]
    np.testing.assert_array_equal(out[2], want)
    alone = _run("VarlenCausalConvWithState", {k: v for k, v in inputs.items() if k != "capture_count"},
                 [("out", TP.FLOAT), ("state", TP.FLOAT)], activation="silu")
    for a, b in zip(out[:2], alone):
        np.testing.assert_array_equal(a, b)


def test_varlen_causal_conv_errors_name_the_problem():
    inputs = _vcc_inputs([2, 3])
    inputs["cumulative_sequence_length"] = np.array([0, 2, 4], np.int32)
    with pytest.raises(Exception, match=r"VarlenCausalConvWithState.*end at the 5 tokens"):
        _run("VarlenCausalConvWithState", inputs, [("out", TP.FLOAT), ("state", TP.FLOAT)])
    inputs = {**_vcc_inputs([2, 3]), "initial_state": None}
    with pytest.raises(Exception, match=r"initial_state .* is required"):
        _run("VarlenCausalConvWithState", inputs, [("out", TP.FLOAT), ("state", TP.FLOAT)])
