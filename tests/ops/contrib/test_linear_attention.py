"""com.microsoft LinearAttention, LinearAttentionGate and GatedRMSNorm (Gated DeltaNet layers) against onnxruntime
CPU; LinearAttention's state window (which onnxruntime's CPU kernel does not take) against the op on each prefix."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP

import crossml
from tests.ops.contrib._ort import check, single_node_model

RNG = np.random.default_rng(11)
F32 = np.float32
OUT2 = [("out", TP.FLOAT), ("state", TP.FLOAT)]


def _la_inputs(b, t, hq, hkv, dk, dv, rule, *, past=True, per_key=False, dtype=F32, hk=None):
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    hk = hk or hkv
    keys = RNG.standard_normal((b, t, hk, dk))
    keys /= np.linalg.norm(keys, axis=-1, keepdims=True)  # the spec's L2-normalized keys for the delta rules
    return {"query": RNG.standard_normal((b, t, hq * dk)).astype(dtype),
            "key": keys.reshape(b, t, hk * dk).astype(dtype),
            "value": RNG.standard_normal((b, t, hkv * dv)).astype(dtype),
            "past_state": RNG.standard_normal((b, hkv, dk, dv)).astype(dtype) if past else None,
            "decay": (-np.abs(RNG.standard_normal((b, t, hkv * dk if per_key else hkv)))).astype(dtype)
            if gated else None,
            "beta": RNG.random((b, t, hkv)).astype(dtype) if delta else None}


@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
@pytest.mark.parametrize("heads", [(4, 2), (2, 2), (2, 4)], ids=["gqa", "mha", "inverse-gqa"])
@pytest.mark.parametrize("t", [1, 5])
def test_linear_attention_matches_onnxruntime(rule, heads, t):
    hq, hkv = heads
    check("LinearAttention", _la_inputs(2, t, hq, hkv, 8, 6, rule), OUT2, atol=1e-4, rtol=1e-4, q_num_heads=hq,
          kv_num_heads=hkv, update_rule=rule)


@pytest.mark.parametrize("rule", ["linear", "gated_delta"])
@pytest.mark.parametrize("heads", [(2, 2, 4), (1, 1, 4), (4, 2, 4), (2, 1, 4)],
                         ids=["qwen3.5", "one-key", "gqa-shared", "inverse-gqa-one-key"])
@pytest.mark.parametrize("t", [1, 4])
def test_linear_attention_shared_key_heads_match_onnxruntime(rule, heads, t):
    # Qwen3.5's linear-attention layers: query and key of H_k heads, value and state of kv_num_heads
    hq, hk, hkv = heads
    check("LinearAttention", _la_inputs(2, t, hq, hkv, 8, 6, rule, hk=hk), OUT2, atol=1e-4, rtol=1e-4,
          q_num_heads=hq, kv_num_heads=hkv, update_rule=rule)


def test_linear_attention_key_heads_must_divide_kv_heads():
    with pytest.raises(Exception, match="key heads dividing kv_num_heads"):
        _run("LinearAttention", _la_inputs(1, 2, 2, 4, 8, 8, "gated_delta", hk=3), OUT2, q_num_heads=2,
             kv_num_heads=4)


def test_linear_attention_per_key_decay_no_past_and_scale():
    inputs = _la_inputs(1, 4, 2, 2, 8, 8, "gated", past=False, per_key=True)
    check("LinearAttention", inputs, OUT2, atol=1e-4, rtol=1e-4, q_num_heads=2, kv_num_heads=2,
          update_rule="gated", scale=0.5)


def test_linear_attention_half_precision():
    inputs = _la_inputs(1, 3, 4, 2, 16, 16, "gated_delta", dtype=np.float16)
    check("LinearAttention", inputs, [("out", TP.FLOAT16), ("state", TP.FLOAT16)], atol=2e-2, rtol=2e-2,
          q_num_heads=4, kv_num_heads=2)


def _run(op_type, inputs, outputs, **attrs):
    model, feeds = single_node_model(op_type, inputs, outputs, **attrs)
    return crossml.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("t", [1, 2, 5])
def test_linear_attention_state_window_slots_are_prefix_states(t):
    w = 3
    inputs = _la_inputs(1, t, 2, 4, 8, 8, "gated_delta")
    window = np.stack([RNG.standard_normal(inputs["past_state"].shape).astype(F32) for _ in range(w)])
    attrs = {"q_num_heads": 2, "kv_num_heads": 4}
    out, state = _run("LinearAttention", {**inputs, "past_state": window}, OUT2, state_window=w, **attrs)
    plain = {**inputs, "past_state": window[w - 1]}
    want_out, _ = _run("LinearAttention", plain, OUT2, **attrs)
    # the windowed op keeps every token's state on the torch path; the plain one runs numba's kernel (other sums)
    np.testing.assert_allclose(out, want_out, rtol=1e-6, atol=1e-6)
    assert state.shape == (w, *inputs["past_state"].shape)
    for j in range(w):
        end = t - w + j + 1
        if end <= 0:
            assert not state[j].any()
            continue
        part = {k: (v[:, :end].copy() if k != "past_state" and v is not None else v) for k, v in plain.items()}
        _, want = _run("LinearAttention", part, OUT2, **attrs)
        np.testing.assert_allclose(state[j], want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("attrs,needle", [
    ({"q_num_heads": 3, "kv_num_heads": 2}, "multiple of the other"),
    ({"q_num_heads": 2, "kv_num_heads": 2, "update_rule": "fast"}, "unsupported update_rule 'fast'"),
    ({"q_num_heads": 2, "kv_num_heads": 2, "state_window": 9}, "state_window"),
])
def test_linear_attention_errors_name_the_attribute(attrs, needle):
    with pytest.raises(Exception, match=needle):
        _run("LinearAttention", _la_inputs(1, 2, 2, 2, 8, 8, "gated_delta"), OUT2, **attrs)


@pytest.mark.parametrize("dtype,t", [(F32, TP.FLOAT), (np.float16, TP.FLOAT16)])
@pytest.mark.parametrize("with_b", [True, False])
def test_linear_attention_gate_matches_onnxruntime(dtype, t, with_b):
    h = 6
    a = (RNG.standard_normal((2, 3, h)) * 4).astype(dtype)
    inputs = {"a": a, "dt_bias": RNG.standard_normal(h).astype(F32),
              "decay_scale": -np.exp(RNG.standard_normal(h)).astype(F32),
              "b": RNG.standard_normal((2, 3, h)).astype(dtype) if with_b else None}
    tol = 1e-6 if dtype == F32 else 2e-3
    check("LinearAttentionGate", inputs, [("decay", t), ("beta", t)] if with_b else [("decay", t)], atol=tol,
          rtol=tol)


@pytest.mark.parametrize("dtype,t", [(F32, TP.FLOAT), (np.float16, TP.FLOAT16)])
@pytest.mark.parametrize("activation", ["silu", "swish", "sigmoid"])
@pytest.mark.parametrize("groups", [1, 4])
def test_gated_rms_norm_matches_onnxruntime(dtype, t, activation, groups):
    c = 16
    x = RNG.standard_normal((2, 3, groups * c)).astype(dtype)
    inputs = {"X": x, "scale": RNG.standard_normal(c).astype(dtype),
              "gate": RNG.standard_normal(x.shape).astype(dtype)}
    tol = 1e-5 if dtype == F32 else 3e-3
    check("GatedRMSNorm", inputs, [("Y", t)], atol=tol, rtol=tol, activation=activation, epsilon=1e-6)


def test_gated_rms_norm_default_epsilon_and_errors():
    x = RNG.standard_normal((1, 2, 8)).astype(F32) * 1e-3  # small values: the epsilon shows
    check("GatedRMSNorm", {"X": x, "scale": np.ones(8, F32), "gate": np.ones_like(x)}, [("Y", TP.FLOAT)])
    with pytest.raises(Exception, match="length C dividing"):
        _run("GatedRMSNorm", {"X": x, "scale": np.ones(3, F32), "gate": np.ones_like(x)}, [("Y", TP.FLOAT)])
    with pytest.raises(Exception, match="unsupported activation 'relu'"):
        _run("GatedRMSNorm", {"X": x, "scale": np.ones(8, F32), "gate": np.ones_like(x)}, [("Y", TP.FLOAT)],
             activation="relu")
