"""com.microsoft MRotaryEmbedding and RotaryEmbedding as one Triton launch (crossml.kernels.mrope) against the ops'
torch paths (which onnxruntime checks in tests/ops/contrib/test_rotary.py): bit for bit. CPU cases run in Triton's interpreter;
``gpu`` cases compile, and there the op dispatches to the kernel."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before triton's first import: interpret the kernels on the CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import crossml.kernels.mrope as mrope_module  # noqa: E402
import crossml.ops._util as ops_util  # noqa: E402
import crossml.ops.contrib.rotary as rotary  # noqa: E402
from crossml.kernels.mrope import m_rotary  # noqa: E402
from tests.kernels._common import DEVICES  # noqa: E402

CASES = {  # name: batch, sequence, heads, head size, rotary dim, section, layout, interleaved pairs, rank
    "qwen35-decode": (1, 1, 4, 64, 16, [3, 3, 2], 1, 0, 3),
    "qwen35-prompt": (2, 5, 2, 64, 16, [3, 3, 2], 1, 0, 3),
    "qwen25vl-full": (1, 3, 2, 16, 16, [2, 3, 3], 0, 0, 3),
    "pairs": (2, 2, 3, 32, 32, [4, 6, 6], 1, 1, 3),
    "bnsh": (1, 4, 2, 32, 24, [4, 4, 4], 0, 0, 4),
}


def _case(case: str, dtype: torch.dtype, cache_dtype: torch.dtype):
    B, S, N, H, rot, section, layout, pairs, rank = CASES[case]
    g = torch.Generator().manual_seed(len(case))
    x = torch.randn(B, N, S, H, generator=g).to(dtype) if rank == 4 else torch.randn(B, S, N * H, generator=g).to(dtype)
    pos = torch.randint(0, 40, (3, B, S), generator=g)
    pos[0, 0, 0] = 99  # past the cache: clamped
    cos = torch.randn(48, rot // 2 + 2, generator=g).to(cache_dtype)
    sin = torch.randn(48, rot // 2 + 2, generator=g).to(cache_dtype)
    attrs = dict(mrope_section=section, mrope_layout=layout, interleaved=pairs, num_heads=N, rotary_embedding_dim=rot)
    return x, pos, cos, sin, attrs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16], ids=["cache32", "cache16"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_kernel_matches_the_torch_path_bit_for_bit(device: str, dtype: torch.dtype, cache_dtype: torch.dtype,
                                                   case: str) -> None:
    x, pos, cos, sin, attrs = _case(case, dtype, cache_dtype)
    want = rotary.m_rotary_embedding(x, pos, cos, sin, **attrs)  # the CPU op: its torch path
    h, _ = rotary._heads(x.to(device), attrs["num_heads"], cos.shape[-1], "MRotaryEmbedding")
    out = torch.empty(h.shape, dtype=dtype, device=device)
    m_rotary(h, pos.to(device), cos.to(device), sin.to(device), out, attrs["mrope_section"], attrs["mrope_layout"],
             bool(attrs["interleaved"]), attrs["rotary_embedding_dim"])
    got = out.transpose(1, 2) if x.dim() == 4 else out.reshape(x.shape)
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the op dispatches to the kernel on a GPU only")
def test_the_ops_run_the_kernel_on_a_gpu(monkeypatch) -> None:
    """MRotaryEmbedding, and RotaryEmbedding (one position stream), dispatch to the kernel on a GPU."""
    calls = []
    real = mrope_module.m_rotary
    monkeypatch.setattr(mrope_module, "m_rotary", lambda *a: calls.append(1) or real(*a))
    for case in ("qwen35-prompt", "bnsh"):
        x, pos, cos, sin, attrs = _case(case, torch.float16, torch.float32)
        want = rotary.m_rotary_embedding(x, pos, cos, sin, **attrs)
        got = rotary.m_rotary_embedding(x.cuda(), pos.cuda(), cos.cuda(), sin.cuda(), **attrs)
        assert got.shape == want.shape
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)
    x, pos, cos, sin, _ = _case("qwen35-prompt", torch.float16, torch.float16)
    want = rotary.rotary_embedding(x, pos[0], cos, sin, num_heads=2, rotary_embedding_dim=16)
    got = rotary.rotary_embedding(x.cuda(), pos[0].cuda(), cos.cuda(), sin.cuda(), num_heads=2, rotary_embedding_dim=16)
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)
    assert calls == [1, 1, 1]


#: RotaryEmbedding cases: batch, sequence, heads, head size, rotary dim (0: the head), interleaved pairs, rank,
#: positions ("ids": [B, S] ids; "offset": one element, the first position)
ROTARY_CASES = {
    "gemma4-global-decode": (1, 1, 4, 64, 0, 0, 3, "ids"),
    "gemma4-local-prompt": (2, 5, 2, 32, 0, 0, 3, "ids"),
    "partial": (1, 3, 2, 32, 16, 0, 3, "offset"),
    "pairs-bnsh": (2, 4, 3, 32, 32, 1, 4, "ids"),
    "offset-bnsh": (1, 4, 2, 16, 0, 0, 4, "offset"),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("case", sorted(ROTARY_CASES))
def test_rotary_embedding_on_the_kernel_matches_the_torch_path(device: str, dtype: torch.dtype, case: str,
                                                              monkeypatch) -> None:
    """RotaryEmbedding with the kernel dispatched (on a GPU as the op does; on the CPU interpreted, the op's GPU
    branch taken for CPU tensors) against its torch path on the CPU, bit for bit; positions past the cache are clamped
    as there."""
    B, S, N, H, rot, pairs, rank, positions = ROTARY_CASES[case]
    g = torch.Generator().manual_seed(len(case))
    x = torch.randn(B, N, S, H, generator=g).to(dtype) if rank == 4 else torch.randn(B, S, N * H, generator=g).to(dtype)
    half = (rot or H) // 2
    cos = torch.randn(48, half + 2, generator=g)
    sin = torch.randn(48, half + 2, generator=g)
    pos = torch.randint(0, 40, (B, S), generator=g) if positions == "ids" else torch.tensor([45])
    if positions == "ids":
        pos[0, 0] = 99
    attrs = dict(interleaved=pairs, num_heads=N, rotary_embedding_dim=rot)
    want = rotary.rotary_embedding(x, pos, cos, sin, **attrs)
    assert ops_util.gpu_kernels("mrope", x, cos, sin) is None  # CPU tensors: the torch path unless patched
    calls = []
    real = rotary.gpu_kernels
    monkeypatch.setattr(rotary, "gpu_kernels",
                        lambda name, *t: calls.append(name) or (mrope_module if device == "cpu" else real(name, *t)))
    got = rotary.rotary_embedding(*(t.to(device) for t in (x, pos, cos, sin)), **attrs)
    assert calls == ["mrope"] and got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)
