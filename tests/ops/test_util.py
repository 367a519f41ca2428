"""Helpers of the op library (crossml.ops._util)."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from crossml.ops import _util
from crossml.ops._util import broadcast_shapes, sdpa

SHAPES = [(), (0,), (1,), (3,), (2, 1), (1, 3), (2, 3), (0, 3), (4, 1, 1), (4, 2, 3), (2, 0)]


@pytest.mark.parametrize(("a", "b"), list(itertools.product(SHAPES, repeat=2)))
def test_broadcast_shapes_is_torchs(a: tuple[int, ...], b: tuple[int, ...]) -> None:
    try:
        want = torch.broadcast_shapes(a, b)
    except RuntimeError:
        with pytest.raises(RuntimeError, match="cannot be broadcast"):
            broadcast_shapes(a, b)
        return
    assert broadcast_shapes(a, b) == want and broadcast_shapes(a, b, (1,) * len(want)) == want


def test_broadcast_shapes_imports_no_sympy() -> None:
    """torch.broadcast_shapes imports torch's symbolic shapes (and sympy) on its first call; ours does not."""
    code = ("import sys; from crossml.ops._util import broadcast_shapes; broadcast_shapes((2, 1), (3,)); "
            "print('sympy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_sdpa_on_the_cpu_is_torchs() -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 5, 8, generator=g) for _ in range(3))
    mask = torch.rand(5, 5, generator=g) > 0.3
    mask[:, 0] = True
    for kw in ({"is_causal": True}, {"attn_mask": mask, "scale": 0.5}):
        assert torch.equal(sdpa(q, k, v, **kw), F.scaled_dot_product_attention(q, k, v, **kw))


@pytest.mark.gpu
@pytest.mark.parametrize("user_off", [False, True])
def test_sdpa_on_cuda_keeps_cudnn_out_and_puts_the_switch_back(monkeypatch: pytest.MonkeyPatch, user_off: bool) -> None:
    """The call runs with torch's cuDNN attention switched off, and the process-wide switch is as the user left it
    afterwards, also when many threads call at once."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import threading

    seen: list[bool] = []
    original = F.scaled_dot_product_attention

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return original(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    monkeypatch.setattr(_util, "_CUDNN_SDPA", False)
    before = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(not user_off)
    try:
        q, k, v = (torch.randn(1, 4, 64, 64, device="cuda", dtype=torch.float16) for _ in range(3))
        want = original(q, k, v, is_causal=True)
        outs = []
        threads = [threading.Thread(target=lambda: outs.append(sdpa(q, k, v, is_causal=True))) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(outs) == 8 and seen == [False] * 8
        for out in outs:
            torch.testing.assert_close(out, want, atol=2e-3, rtol=2e-3)
        assert torch.backends.cuda.cudnn_sdp_enabled() == (not user_off)
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


def test_inplace_target() -> None:
    """A state op's present goes into its past buffer only where the session allows it and the buffer takes it
    as it is (contiguous, of the present's dtype when one is asked for)."""
    from crossml.ops._util import inplace_target

    past = torch.zeros(2, 3, 4)
    assert inplace_target(past, True) is past
    assert inplace_target(past, True, torch.float32) is past
    assert inplace_target(past, False) is None
    assert inplace_target(None, True) is None
    assert inplace_target(past, True, torch.float16) is None
    assert inplace_target(past.transpose(1, 2), True) is None
