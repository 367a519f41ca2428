"""numba's kernels for Qwen3.5's small ops on the CPU (crossml.kernels.cpu_gated_delta) against the ops' torch paths
(the same op with the kernel module disabled): MRotaryEmbedding bit for bit, the norms and the gate within a float32
rounding."""

from __future__ import annotations

import pytest
import torch

import crossml.kernels as kernels
from crossml.ops.contrib.linear_attention import gated_rms_norm, linear_attention_gate
from crossml.ops.contrib.rotary import m_rotary_embedding
from crossml.ops.norm import lp_normalization

pytestmark = pytest.mark.skipif(kernels.load("cpu_gated_delta") is None, reason="numba is not installed")


def _both(fn, *args, **kw):
    """(fn on numba's kernel, fn on the torch path), checking the kernel ran."""
    module = kernels.load("cpu_gated_delta")
    calls = []
    with pytest.MonkeyPatch.context() as mp:
        for name in ("lp_normalize", "gated_rms_norm", "linear_attention_gate", "m_rotary"):
            real = getattr(module, name)
            mp.setattr(module, name, lambda *a, real=real: calls.append(1) or real(*a))
        got = fn(*args, **kw)
        assert calls == [1]
        mp.setattr(kernels, "_DISABLED", kernels._DISABLED | {"cpu_gated_delta"})
        want = fn(*args, **kw)
        assert calls == [1]  # the torch path this time
    return got, want


def _close(got, want, tol: float) -> None:
    for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        if b is None:
            assert a is None
        else:
            torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("shape", [(1, 1, 16, 128), (2, 3, 4, 40), (5, 1)])
def test_lp_normalize(shape) -> None:
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    x.view(-1, shape[-1])[0] = 0  # an all-zero row stays zero
    _close(*_both(lp_normalization, x, axis=-1, p=2), 2e-6)


@pytest.mark.parametrize("activation", ["silu", "sigmoid"])
@pytest.mark.parametrize("shape,c", [((1, 1, 2048), 128), ((2, 3, 96), 48)])
def test_gated_rms_norm(activation: str, shape: tuple, c: int) -> None:
    g = torch.Generator().manual_seed(c)
    x, gate, scale = torch.randn(*shape, generator=g), 2 * torch.randn(*shape, generator=g), torch.randn(c, generator=g)
    _close(*_both(gated_rms_norm, x, scale, gate, activation=activation, epsilon=1e-6), 2e-6)


@pytest.mark.parametrize("with_b", [True, False])
def test_linear_attention_gate(with_b: bool) -> None:
    g = torch.Generator().manual_seed(3)
    a = 8 * torch.randn(2, 5, 16, generator=g)
    a[0, 0, :4] = torch.tensor([25.0, -30.0, 19.5, -16.0])  # softplus's linear, log1p and exp ranges
    b = torch.randn(2, 5, 16, generator=g) if with_b else None
    _close(*_both(linear_attention_gate, a, torch.randn(16, generator=g), -torch.rand(16, generator=g), b), 2e-6)


@pytest.mark.parametrize("layout,pairs,section,rot", [(1, 0, [3, 3, 2], 16), (0, 0, [2, 3, 3], 16),
                                                      (1, 1, [4, 6, 6], 32), (0, 1, [2, 3, 3], 16)])
def test_m_rotary_bit_for_bit(layout: int, pairs: int, section: list, rot: int) -> None:
    g = torch.Generator().manual_seed(rot + layout)
    B, S, N, H = 2, 3, 4, 40
    x = torch.randn(B, S, N * H, generator=g)
    pos = torch.randint(0, 40, (3, B, S), generator=g)
    pos[1, 0, 0] = 90  # past the cache: clamped
    cos, sin = torch.randn(48, rot // 2, generator=g), torch.randn(48, rot // 2, generator=g)
    got, want = _both(m_rotary_embedding, x, pos, cos, sin, mrope_section=section, mrope_layout=layout,
                      interleaved=pairs, num_heads=N, rotary_embedding_dim=rot)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
