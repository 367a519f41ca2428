"""LinearAttention's recurrence as one Triton launch (crossml.kernels.linear_attention) against the op's torch path
(``crossml.ops.attention.linear_recurrence`` on the CPU, which onnxruntime checks in tests/ops/contrib): outputs and
states within a rounding. CPU cases run in Triton's interpreter; ``gpu`` cases compile, and the op dispatches to the
kernel there."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before triton's first import: interpret the kernels on the CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from crossml.kernels.linear_attention import linear_attention  # noqa: E402
from crossml.ops.attention import linear_recurrence  # noqa: E402
from tests.kernels._common import DEVICES  # noqa: E402

CASES = {  # name: batch, tokens, query heads, key heads, state heads, d_k, d_v, rule, per-key decay, past
    "qwen35-decode": (1, 1, 2, 2, 4, 16, 16, "gated_delta", False, True),
    "qwen35-prompt": (2, 6, 2, 2, 4, 16, 24, "gated_delta", False, True),
    "gqa-prompt": (1, 5, 4, 2, 2, 32, 16, "gated_delta", False, True),
    "mha-linear": (2, 3, 2, 2, 2, 8, 8, "linear", False, False),
    "gated-per-key": (1, 4, 2, 2, 2, 16, 40, "gated", True, True),
    "delta-beta-shared": (2, 3, 3, 3, 3, 8, 16, "delta", False, False),
    "inverse-one-key": (1, 4, 1, 1, 4, 16, 16, "gated_delta", False, True),
    "wide-head": (1, 2, 2, 2, 2, 160, 72, "gated_delta", False, True),
}


def _inputs(case: str, dtype: torch.dtype):
    B, T, hq, hk, hkv, dk, dv, rule, per_key, past = CASES[case]
    g = torch.Generator().manual_seed(len(case))
    keys = torch.nn.functional.normalize(torch.randn(B, T, hk, dk, generator=g), dim=-1).reshape(B, T, hk * dk)
    decay = beta = None
    if rule in ("gated", "gated_delta"):
        decay = -torch.rand(B, T, hkv * dk if per_key else hkv, generator=g)
    if rule in ("delta", "gated_delta"):
        beta = torch.rand(B, T, 1 if case == "delta-beta-shared" else hkv, generator=g)
    tensors = (torch.randn(B, T, hq * dk, generator=g), keys, torch.randn(B, T, hkv * dv, generator=g),
               torch.randn(B, hkv, dk, dv, generator=g) if past else None, decay, beta)
    return [t.to(dtype) if t is not None else None for t in tensors], (hq, hk, hkv, rule)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_kernel_matches_the_torch_recurrence(device: str, dtype: torch.dtype, case: str) -> None:
    tensors, (hq, hk, hkv, rule) = _inputs(case, dtype)
    want_out, want_state, _ = linear_recurrence(*tensors, hq, hkv, 0.0, rule, shared_keys=True)
    scale = (tensors[0].shape[2] // hq) ** -0.5  # the op's default, 1 / sqrt(d_k)
    state_dtype = tensors[3].dtype if tensors[3] is not None else dtype
    out, state = linear_attention(*(t.to(device) if t is not None else None for t in tensors), hq, hkv, hk, scale,
                                  state_dtype)
    tol = 2e-5 if dtype == torch.float32 else 4e-3
    assert out.dtype == want_out.dtype and state.dtype == want_state.dtype
    torch.testing.assert_close(out.cpu(), want_out, rtol=tol, atol=tol)
    torch.testing.assert_close(state.cpu(), want_state, rtol=tol, atol=tol)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the op dispatches to the kernel on a GPU only")
def test_the_op_runs_the_kernel_on_a_gpu(monkeypatch) -> None:
    """On a GPU the op takes the kernel (one launch), with the CPU torch path's values within a rounding."""
    import crossml.kernels.linear_attention as module

    calls = []
    real = module.linear_attention
    monkeypatch.setattr(module, "linear_attention", lambda *a: calls.append(1) or real(*a))
    tensors, (hq, hk, hkv, rule) = _inputs("qwen35-prompt", torch.float16)
    want_out, want_state, _ = linear_recurrence(*tensors, hq, hkv, 0.0, rule, shared_keys=True)
    out, state, _ = linear_recurrence(*(t.cuda() if t is not None else None for t in tensors), hq, hkv, 0.0, rule,
                                      shared_keys=True)
    assert calls == [1]
    torch.testing.assert_close(out.cpu(), want_out, rtol=4e-3, atol=4e-3)
    torch.testing.assert_close(state.cpu(), want_state, rtol=4e-3, atol=4e-3)


def _gdn_inputs(per_key: bool, dtype: torch.dtype):
    """GatedDeltaNet's raw inputs as the builder's Qwen3.5 export feeds them: unnormalized query / key heads (2 of them
    serving 4 value heads), the raw ``a`` and ``b`` projections, a_log and dt_bias, a V-major float32 state."""
    B, T, hq, hv, dk, dv = 2, 5, 2, 4, 16, 24
    g = torch.Generator().manual_seed(7 + per_key)
    q, k = (torch.randn(B, T, hq * dk, generator=g).to(dtype) for _ in range(2))
    v = torch.randn(B, T, hv * dv, generator=g).to(dtype)
    # the gates in the activations' type (fp16: com.crossml's GatedDeltaNet, the float32 Casts folded)
    a = torch.randn(B, T, hv * dk if per_key else hv, generator=g).to(dtype)
    b = torch.randn(B, T, hv, generator=g).to(dtype)
    state = 0.3 * torch.randn(B, hv, dv, dk, generator=g)
    return (q, k, v, state, a, b), (0.5 * torch.randn(hv, generator=g), torch.randn(hv, generator=g)), (hq, hv)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("per_key", [False, True], ids=["per-head", "per-key"])
def test_kernel_gated_delta_net_steps_match_the_op(device: str, dtype: torch.dtype, per_key: bool) -> None:
    """The kernel's com.microsoft GatedDeltaNet steps (V-major state, the query / key L2 norms, Qwen's gate, sigmoid
    beta) against the op's CPU path (checked against onnxruntime in tests/ops/contrib/test_gated_delta_net.py)."""
    from crossml.ops.contrib.gated_delta_net import _recurrence

    tensors, gate, (hq, hv) = _gdn_inputs(per_key, dtype)
    want_out, want_state = _recurrence(*tensors, hq=hq, hv=hv, scale=0.25, qk_l2=True, gate=gate, sigmoid_beta=True,
                                       into=None)
    q, k, v, state, a, b = (t.to(device) for t in tensors)
    out, got_state = linear_attention(q, k, v, state, a, b, hq, hv, hq, 0.25, torch.float32, v_major=True, qk_l2=True,
                                      qwen_gate=tuple(t.to(device) for t in gate), sigmoid_beta=True)
    tol = 2e-5 if dtype == torch.float32 else 4e-3
    assert out.dtype == dtype and got_state.dtype == torch.float32 and got_state.shape == state.shape
    torch.testing.assert_close(out.cpu(), want_out, rtol=tol, atol=tol)
    torch.testing.assert_close(got_state.cpu(), want_state, rtol=2e-5, atol=2e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the op dispatches to the kernel on a GPU only")
def test_gated_delta_net_runs_the_kernel_on_a_gpu_in_place(monkeypatch) -> None:
    """On a GPU com.microsoft GatedDeltaNet is one launch of the kernel, and with the GenAI static buffers
    (``kv_inplace``) it advances the past state in place: the CPU path's values within a rounding."""
    import crossml.kernels.linear_attention as module
    from crossml.ops.contrib.gated_delta_net import gated_delta_net
    from crossml.ops.registry import OpContext

    calls = []
    real = module.linear_attention
    monkeypatch.setattr(module, "linear_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    (q, k, v, state, a, b), (a_log, dt_bias), (hq, hv) = _gdn_inputs(False, torch.float16)
    B, T = q.shape[:2]
    # com.microsoft's op takes float32 gates (as onnxruntime's does); fp16 ones are com.crossml's half_gates variant
    args = [q.reshape(B, T, hq, -1), k.reshape(B, T, hq, -1), v.reshape(B, T, hv, -1), None, a.float(), b.float(),
            state, a_log, dt_bias]
    attrs = dict(gate_activation="qwen", beta_activation="sigmoid", qk_l2_norm=1)
    want_out, want_state = gated_delta_net(*args, **attrs)
    ctx = OpContext("gdn", "GatedDeltaNet", 1, 2, (None, None), (True, True), extra={"kv_inplace": True})
    past = state.cuda()
    out, present = gated_delta_net(*(t.cuda() if t is not None else None for t in args[:6]), past,
                                   a_log.cuda(), dt_bias.cuda(), **attrs, ctx=ctx)
    assert calls == [1] and present is past
    torch.testing.assert_close(out.cpu(), want_out, rtol=4e-3, atol=4e-3)
    torch.testing.assert_close(present.cpu(), want_state, rtol=1e-4, atol=1e-4)
