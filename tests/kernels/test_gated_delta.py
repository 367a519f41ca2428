"""The Gated DeltaNet layers' row-wise ops as single Triton launches (crossml.kernels.gated_delta) against their
torch paths (the ops on the CPU, which onnxruntime checks in tests/ops): within a rounding. CPU cases run in
Triton's interpreter; ``gpu`` cases compile, and there the ops dispatch to the kernels."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before triton's first import: interpret the kernels on the CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from crossml.kernels import gated_delta  # noqa: E402
from crossml.ops.contrib.linear_attention import gated_rms_norm, linear_attention_gate  # noqa: E402
from crossml.ops.norm import lp_normalization  # noqa: E402
from tests.kernels._common import DEVICES  # noqa: E402

DTYPES = [torch.float32, torch.float16]


def _tol(dtype: torch.dtype) -> float:
    return 2e-6 if dtype == torch.float32 else 2e-3


def _rand(g: torch.Generator, *shape: int, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16"])
@pytest.mark.parametrize("shape", [(1, 1, 16, 128), (2, 3, 4, 40), (5, 1)])
def test_lp_normalize(device: str, dtype: torch.dtype, shape: tuple) -> None:
    g = torch.Generator().manual_seed(len(shape))
    x = _rand(g, *shape, dtype=dtype)
    x.view(-1, shape[-1])[0] = 0  # an all-zero row stays zero
    want = lp_normalization(x, axis=-1, p=2)
    got = gated_delta.lp_normalize(x.to(device)).cpu()
    torch.testing.assert_close(got, want, rtol=_tol(dtype), atol=_tol(dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16"])
@pytest.mark.parametrize("activation", ["silu", "sigmoid"])
@pytest.mark.parametrize("shape,c", [((1, 1, 2048), 128), ((2, 3, 96), 48), ((4, 24), 24)])
def test_gated_rms_norm(device: str, dtype: torch.dtype, activation: str, shape: tuple, c: int) -> None:
    g = torch.Generator().manual_seed(c)
    x, gate = _rand(g, *shape, dtype=dtype), _rand(g, *shape, dtype=dtype, scale=2.0)
    scale = _rand(g, c, dtype=dtype)
    want = gated_rms_norm(x, scale, gate, activation=activation, epsilon=1e-6)
    got = gated_delta.gated_rms_norm(x.to(device), scale.to(device), gate.to(device), 1e-6,
                                     activation == "sigmoid").cpu()
    torch.testing.assert_close(got, want, rtol=_tol(dtype), atol=_tol(dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16"])
@pytest.mark.parametrize("with_b", [True, False])
def test_linear_attention_gate(device: str, dtype: torch.dtype, with_b: bool) -> None:
    g = torch.Generator().manual_seed(int(with_b))
    a = _rand(g, 2, 5, 16, dtype=dtype, scale=8.0)  # softplus's linear (> 20), log1p and exp ranges
    a[0, 0, :4] = torch.tensor([25.0, -30.0, 19.5, -16.0], dtype=dtype)
    dt_bias, decay_scale = _rand(g, 16, dtype=dtype), -_rand(g, 16, dtype=dtype).abs()
    b = _rand(g, 2, 5, 16, dtype=dtype) if with_b else None
    want = linear_attention_gate(a, dt_bias, decay_scale, b)
    got = gated_delta.linear_attention_gate(*(t.to(device) if t is not None else None
                                              for t in (a, dt_bias, decay_scale, b)))
    torch.testing.assert_close(got[0].cpu(), want[0], rtol=_tol(dtype), atol=_tol(dtype))
    if with_b:
        torch.testing.assert_close(got[1].cpu(), want[1], rtol=_tol(dtype), atol=_tol(dtype))
    else:
        assert got[1] is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the ops dispatch to the kernels on a GPU only")
def test_the_ops_run_the_kernels_on_a_gpu(monkeypatch) -> None:
    calls = []
    for name in ("lp_normalize", "gated_rms_norm", "linear_attention_gate"):
        real = getattr(gated_delta, name)
        monkeypatch.setattr(gated_delta, name, lambda *a, real=real, name=name: calls.append(name) or real(*a))
    x = torch.randn(1, 1, 4, 64, device="cuda", dtype=torch.float16)
    lp_normalization(x, axis=-1, p=2)
    gated_rms_norm(x.reshape(1, 1, 256), torch.ones(64, device="cuda", dtype=torch.float16), x.reshape(1, 1, 256))
    linear_attention_gate(x[..., 0, :], torch.zeros(64, device="cuda", dtype=torch.float16),
                          torch.ones(64, device="cuda", dtype=torch.float16), x[..., 1, :])
    assert calls == ["lp_normalize", "gated_rms_norm", "linear_attention_gate"]
