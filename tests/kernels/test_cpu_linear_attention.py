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
