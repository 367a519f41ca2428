"""LinearAttention's recurrence on the CPU through numba (crossml.kernels.cpu_linear_attention) against the op's torch
path (``linear_recurrence`` keeping every token's state, which takes torch): within a float32 rounding."""

from __future__ import annotations

import pytest
import torch

from crossml.kernels import load
from crossml.ops.attention import linear_recurrence
from tests.kernels.test_linear_attention import CASES, _inputs

pytestmark = pytest.mark.skipif(load("cpu_linear_attention") is None, reason="numba is not installed")


@pytest.mark.parametrize("case", sorted(CASES))
def test_numba_matches_the_torch_recurrence(case: str) -> None:
    tensors, (hq, hk, hkv, rule) = _inputs(case, torch.float32)
    want_out, want_state, _ = linear_recurrence(*tensors, hq, hkv, 0.0, rule, keep_states=True, shared_keys=True)
    calls = []
    module = load("cpu_linear_attention")
    real = module.linear_attention
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(module, "linear_attention", lambda *a: calls.append(1) or real(*a))
        out, state, _ = linear_recurrence(*tensors, hq, hkv, 0.0, rule, shared_keys=True)
    assert calls == [1]
    torch.testing.assert_close(out, want_out, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(state, want_state, rtol=2e-5, atol=2e-5)
    if tensors[3] is not None:
        assert not torch.equal(tensors[3], state)  # a new state: the past one is left as it was


@pytest.mark.parametrize("case", sorted(CASES))
def test_v_major_kernel_matches_the_k_major_one(case: str) -> None:
    """com.microsoft GatedDeltaNet's V-major states [B, H, d_v, d_k] (one pass a token, row by row): the outputs of
    the K-major kernel within a float32 rounding (its sums run in another order), and its state transposed."""
    module = load("cpu_linear_attention")
    tensors, (hq, hk, hkv, rule) = _inputs(case, torch.float32)
    q, k, v, past, decay, beta = tensors
    want_out, want_state = module.linear_attention(q, k, v, past, decay, beta, hq, hkv, hk, 0.3)
    out, state = module.linear_attention(q, k, v, past.transpose(-1, -2).contiguous() if past is not None else None,
                                         decay, beta, hq, hkv, hk, 0.3, v_major=True)
    torch.testing.assert_close(out, want_out, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(state.transpose(-1, -2), want_state, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("v_major", [False, True], ids=["k-major", "v-major"])
@pytest.mark.parametrize(("heads", "rule"), [((4, 4, 4), "gated"), ((8, 4, 4), "delta"), ((4, 8, 4), "plain"),
                                             ((4, 4, 2), "gated_delta_key")])
def test_threaded_and_serial_agree(heads: tuple[int, int, int], rule: str, v_major: bool) -> None:
    """Many tokens run the state heads on numba's threads: the same outputs and states, bit for bit, as the calling
    thread's (one head per iteration either way)."""
    module = load("cpu_linear_attention")
    qh, kvh, kh = heads
    B, T, dk, dv = 2, 9, 16, 8
    g = torch.Generator().manual_seed(sum(heads))
    q, k = torch.randn(B, T, qh * dk, generator=g), torch.randn(B, T, kh * dk, generator=g)
    v, past = torch.randn(B, T, kvh * dv, generator=g), torch.randn(B, kvh, dk, dv, generator=g)
    past = past.transpose(-1, -2).contiguous() if v_major else past
    decay = None if rule in ("plain", "delta") else -torch.rand(B, T, kvh * (dk if rule.endswith("key") else 1),
                                                                 generator=g)
    beta = torch.rand(B, T, kvh, generator=g) if "delta" in rule else None
    serial = module.linear_attention(q, k, v, past, decay, beta, qh, kvh, kh, 0.25, threads=False, v_major=v_major)
    threaded = module.linear_attention(q, k, v, past, decay, beta, qh, kvh, kh, 0.25, threads=True, v_major=v_major)
    assert all(torch.equal(a, b) for a, b in zip(serial, threaded))


def test_threaded_builds_have_their_own_cache_entries() -> None:
    """numba's on-disk cache keys a function's entries by signature alone, so a serial and a parallel build of one
    function shared one (whichever compiled first ran as both): the threaded builds are copies of their own name."""
    for name in ("cpu_linear_attention", "cpu_attention"):
        module = load(name)
        pairs = [(module._serial, module._threaded)]
        if name == "cpu_linear_attention":
            pairs.append((module._serial_v, module._threaded_v))
        for serial, threaded in pairs:
            assert threaded.py_func.__qualname__ == serial.py_func.__qualname__ + "_threaded"
            assert threaded.targetoptions.get("parallel") and not serial.targetoptions.get("parallel")
