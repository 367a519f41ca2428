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


def _chunk_options(qwen, gdn: bool, device: str) -> dict:
    """linear_attention's options for the op ``_chunk_reference`` runs: GatedDeltaNet's fused steps, or none."""
    return dict(v_major=True, qk_l2=True, qwen_gate=tuple(t.to(device) for t in qwen) if qwen else None,
                sigmoid_beta=True) if gdn else {}


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


CHUNK_CASES = {  # name: batch, tokens, query/key heads, state heads, d_k, d_v, GatedDeltaNet's steps, gate, beta shared
    "gdn-ragged-chunks": (2, 37, 2, 4, 16, 24, True, "qwen", False),
    "gdn-mixed-decay": (1, 40, 1, 2, 16, 16, True, "mixed", False),
    "linear-attention-k-major": (1, 40, 2, 2, 32, 16, False, "log", False),
    "delta-shared-beta": (2, 33, 3, 3, 16, 16, False, None, True),
    "inverse-one-key": (1, 20, 1, 4, 16, 16, False, "log", False),
}


def _chunk_inputs(case: str, dtype: torch.dtype, past: bool):
    B, T, hq, hv, dk, dv, gdn, gate, shared = CHUNK_CASES[case]
    g = torch.Generator().manual_seed(len(case) + 3 * past)
    q, k = (torch.randn(B, T, hq, dk, generator=g) for _ in range(2))
    if not gdn:  # LinearAttention's exports feed normalized keys
        k = torch.nn.functional.normalize(k, dim=-1)
    v = torch.randn(B, T, hv * dv, generator=g)
    state = 0.3 * torch.randn((B, hv, dv, dk) if gdn else (B, hv, dk, dv), generator=g) if past else None
    decay = qwen = None
    if gate in ("qwen", "mixed"):  # the raw a of Qwen's gate
        decay = torch.randn(B, T, hv, generator=g)
        if gate == "mixed":  # every fifth token forgets (log decays of -3000 and more) between ones that keep (about -1)
            decay[:, ::5] += 3000.0
        qwen = (0.5 * torch.randn(hv, generator=g), torch.randn(hv, generator=g))
    elif gate == "log":
        decay = -torch.rand(B, T, hv, generator=g)
    beta = torch.randn(B, T, 1 if shared else hv, generator=g)
    if not gdn:
        beta = torch.sigmoid(beta)
    tensors = [q.reshape(B, T, -1).to(dtype), k.reshape(B, T, -1).to(dtype), v.to(dtype), state, decay, beta]
    return tensors, qwen, (hq, hv, gdn)


def _chunk_reference(tensors, qwen, hq: int, hv: int, gdn: bool):
    """The op's CPU path: GatedDeltaNet's (V-major state, its fused steps) or LinearAttention's (K-major)."""
    if gdn:
        from crossml.ops.contrib.gated_delta_net import _recurrence

        state = tensors[3] if tensors[3] is not None else torch.zeros(tensors[0].shape[0], hv, tensors[2].shape[2] // hv,
                                                                      tensors[0].shape[2] // hq)
        return _recurrence(*tensors[:3], state, *tensors[4:], hq=hq, hv=hv, scale=0.25, qk_l2=True, gate=qwen,
                           sigmoid_beta=True, into=None)
    rule = "gated_delta" if tensors[4] is not None else "delta"
    out, state, _ = linear_recurrence(*tensors, hq, hv, 0.25, rule, shared_keys=True)
    return out, state


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("past", [True, False], ids=["past", "no-past"])
@pytest.mark.parametrize("case", sorted(CHUNK_CASES))
def test_chunked_prompt_matches_the_recurrence(device: str, dtype: torch.dtype, past: bool, case: str) -> None:
    """A prompt in chunks of 16 tokens (crossml.kernels.chunked_delta: the last chunk ragged, or one chunk shorter
    than 16) against the op's token-by-token CPU path: outputs and float32 states within a rounding."""
    tensors, qwen, (hq, hv, gdn) = _chunk_inputs(case, dtype, past)
    want_out, want_state = _chunk_reference(tensors, qwen, hq, hv, gdn)
    on = [t.to(device) if t is not None else None for t in tensors]
    out, state = linear_attention(*on, hq, hv, hq, 0.25, torch.float32, chunk=16, **_chunk_options(qwen, gdn, device))
    # the interpreter's products are float32; a GPU's TF32x3 (float32 activations) or TF32 (half: see PRECISION)
    tol = (1e-5 if device == "cpu" else 1e-4) if dtype == torch.float32 else 4e-3
    assert out.dtype == dtype and state.dtype == torch.float32 and state.shape == want_state.shape
    torch.testing.assert_close(out.cpu(), want_out.to(dtype), rtol=tol, atol=tol)
    stol = 1e-5 if device == "cpu" else 1e-4 if dtype == torch.float32 else 2e-3
    stol = stol if want_state.dtype == torch.float32 else 4e-3  # LinearAttention's without a past: the query's type
    torch.testing.assert_close(state.cpu(), want_state.float(), rtol=stol, atol=stol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("in_place", [False, True], ids=["new-state", "in-place"])
@pytest.mark.parametrize("segment", [None, 32], ids=["one-segment", "segments-of-32"])
def test_chunked_prompt_state_in_place_and_in_segments(device: str, in_place: bool, segment: int | None,
                                                       monkeypatch) -> None:
    """``into``: the chunked form reads each program's tile of the past state before it writes the final one. A
    prompt longer than SEGMENT (here 32 tokens: two chunks, then a ragged segment of 5) runs in segments, each from
    the state the last one left, reusing one scratch. Both against the op's CPU values within a rounding."""
    from crossml.kernels import chunked_delta

    if segment is not None:
        monkeypatch.setattr(chunked_delta, "SEGMENT", segment)
    tensors, qwen, (hq, hv, _) = _chunk_inputs("gdn-ragged-chunks", torch.float32, True)
    want_out, want_state = _chunk_reference(tensors, qwen, hq, hv, True)
    on = [t.to(device) for t in tensors]
    out, state = linear_attention(*on, hq, hv, hq, 0.25, torch.float32, on[3] if in_place else None, chunk=16,
                                  **_chunk_options(qwen, True, device))
    assert (state is on[3]) == in_place
    tol = 1e-5 if device == "cpu" else 1e-4  # float32 products in the interpreter, TF32x3 on a GPU
    torch.testing.assert_close(out.cpu(), want_out, rtol=tol, atol=tol)
    torch.testing.assert_close(state.cpu(), want_state, rtol=tol, atol=tol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ["gdn-mixed-decay", "linear-attention-k-major"])
def test_the_default_takes_chunks_from_the_layouts_bound(device: str, case: str, monkeypatch) -> None:
    """chunk=None: prompts of the state layout's bound or more (CHUNKED_FROM_V_MAJOR for GatedDeltaNet's V-major
    state, CHUNKED_FROM for LinearAttention's K-major one; here 32, the other layout's bound out of reach) go in chunks
    of CHUNK (here 16), shorter ones and cases the chunked form does not cover (a per-key decay) walk their tokens;
    each gives the op's CPU values."""
    import crossml.kernels.linear_attention as module

    tensors, qwen, (hq, hv, gdn) = _chunk_inputs(case, torch.float32, True)
    monkeypatch.setattr(module, "CHUNK", 16)
    monkeypatch.setattr(module, "CHUNKED_FROM_V_MAJOR", 32 if gdn else 1 << 30)
    monkeypatch.setattr(module, "CHUNKED_FROM", 1 << 30 if gdn else 32)
    calls = []
    real = module.chunked_delta_rule
    monkeypatch.setattr(module, "chunked_delta_rule", lambda *a, **kw: calls.append(kw["chunk"]) or real(*a, **kw))
    options = _chunk_options(qwen, gdn, device)
    for tokens, per_key, want in ((37, False, [16]), (31, False, []), (37, True, [])):
        cut = [t[:, :tokens] for t in tensors[:3]] + [tensors[3], tensors[4][:, :tokens], tensors[5][:, :tokens]]
        if per_key:  # one decay a key dimension: the walk alone takes it
            cut[4] = cut[4].repeat_interleave(tensors[0].shape[2] // hq, dim=2)
        want_out, want_state = _chunk_reference(cut, qwen, hq, hv, gdn)
        calls.clear()
        out, state = linear_attention(*(t.to(device) for t in cut), hq, hv, hq, 0.25, torch.float32, **options)
        assert calls == want
        tol = 1e-5 if device == "cpu" else 1e-4
        torch.testing.assert_close(out.cpu(), want_out, rtol=tol, atol=tol)
        torch.testing.assert_close(state.cpu(), want_state, rtol=tol, atol=tol)


def test_chunks_refuse_what_they_do_not_cover() -> None:
    """Chunks of a size that is no power of two >= 16, per-key decays, no delta rule, several query heads a state
    head, heads wider than 128: ValueError naming what the chunked form needs (the default keeps the token walk
    there)."""
    z = torch.zeros(1, 4, 16)
    beta = torch.zeros(1, 4, 1)
    with pytest.raises(ValueError, match="power of two >= 16"):
        linear_attention(z, z, z, None, None, beta, 1, 1, 1, 1.0, torch.float32, chunk=24)
    with pytest.raises(ValueError, match="one decay per head"):
        linear_attention(z, z, z, None, torch.zeros(1, 4, 16), beta, 1, 1, 1, 1.0, torch.float32, chunk=16)
    with pytest.raises(ValueError, match="a delta rule"):
        linear_attention(z, z, z, None, None, None, 1, 1, 1, 1.0, torch.float32, chunk=16)
    with pytest.raises(ValueError, match=r"one query head per state head \(here 2\)"):
        linear_attention(torch.zeros(1, 4, 32), z, z, None, None, beta, 2, 1, 1, 1.0, torch.float32, chunk=16)
    wide = torch.zeros(1, 4, 160)
    with pytest.raises(ValueError, match=r"head sizes up to 128 \(here 160 and 160\)"):
        linear_attention(wide, wide, wide, None, None, beta, 1, 1, 1, 1.0, torch.float32, chunk=16)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled chunks of 64 at Qwen3.5's head sizes need a GPU")
@pytest.mark.parametrize("tokens", [64, 300, 1000])
def test_default_chunks_at_qwen35_sizes_match_the_walk(tokens: int, monkeypatch) -> None:
    """Chunks of 64 (TF32 products) at Qwen3.5-0.8B's layer (16 heads of 128), fp16 activations, against the token
    walk on the same GPU: GatedDeltaNet's V-major float32 state; the default choice takes chunks from
    CHUNKED_FROM_V_MAJOR."""
    import crossml.kernels.linear_attention as module

    g = torch.Generator(device="cuda").manual_seed(tokens)
    H, D = 16, 128
    q, k, v = (torch.randn(1, tokens, H * D, device="cuda", generator=g).half() for _ in range(3))
    a, b = (torch.randn(1, tokens, H, device="cuda", generator=g) for _ in range(2))
    state = 0.1 * torch.randn(1, H, D, D, device="cuda", generator=g)
    gate = (0.5 * torch.randn(H, device="cuda", generator=g), torch.randn(H, device="cuda", generator=g))
    options = dict(v_major=True, qk_l2=True, qwen_gate=gate, sigmoid_beta=True)
    want_out, want_state = linear_attention(q, k, v, state, a, b, H, H, H, D ** -0.5, torch.float32, chunk=0, **options)
    out, got_state = linear_attention(q, k, v, state, a, b, H, H, H, D ** -0.5, torch.float32, chunk=module.CHUNK,
                                      **options)
    torch.testing.assert_close(out, want_out, rtol=4e-3, atol=4e-3)
    torch.testing.assert_close(got_state, want_state, rtol=2e-3, atol=2e-3)
    calls = []
    real = module.chunked_delta_rule
    monkeypatch.setattr(module, "chunked_delta_rule", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    linear_attention(q, k, v, state, a, b, H, H, H, D ** -0.5, torch.float32, **options)
    assert calls == ([1] if tokens >= module.CHUNKED_FROM_V_MAJOR else [])
