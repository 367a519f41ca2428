"""LFM2's short-convolution block as one Triton launch (crossml.kernels.short_conv) against the fused op's torch path
(the six nodes' ops): outputs within a rounding, the present state equal. CPU cases run in Triton's interpreter;
``gpu`` cases compile."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before triton's first import: interpret the kernels on the CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from crossml.kernels.short_conv import causal_conv, short_conv  # noqa: E402
from tests.kernels._common import DEVICES  # noqa: E402


def _torch_block(h, weight, bias, past, dilation, activation):
    """The six nodes' ops (the fused op's torch path, as crossml.ops.fused.short_conv runs it off the kernels)."""
    from crossml.ops.attention import causal_conv

    C = h.shape[2] // 3
    b, c, x = h.transpose(1, 2).split(C, dim=1)
    out, present, _ = causal_conv(b * x, weight, bias, past, activation, dilation, keep_padded=True)
    return (c * out).transpose(1, 2), present


CASES = {  # name: batch, length, channels, k, dilation, bias, activation
    "decode": (1, 1, 96, 3, 1, True, "none"),
    "decode-batch": (3, 1, 40, 3, 1, False, "none"),
    "prompt": (2, 7, 70, 3, 1, True, "none"),
    "dilated-silu": (1, 5, 33, 4, 2, True, "silu"),
    "k1": (2, 3, 16, 1, 1, True, "none"),
    "prompt-blocks": (2, 40, 24, 4, 1, True, "silu"),  # three position blocks of 16
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("in_place", [False, True], ids=["new", "in-place"])
def test_kernel_matches_the_six_nodes(device: str, dtype: torch.dtype, case: str, in_place: bool) -> None:
    """``in-place``: the present state overwrites the past buffer (the GenAI static buffers), which is returned."""
    B, L, C, K, dil, has_bias, act = CASES[case]
    g = torch.Generator().manual_seed(len(case))
    h = torch.randn(B, L, 3 * C, generator=g).to(dtype)
    weight = torch.randn(C, 1, K, generator=g).to(dtype)
    bias = torch.randn(C, generator=g).to(dtype) if has_bias else None
    past = torch.randn(B, C, (K - 1) * dil, generator=g).to(dtype)
    want_y, want_present = _torch_block(h, weight, bias, past, dil, act)
    args = [t.to(device) if t is not None else None for t in (h, weight, bias, past)]
    y, present = short_conv(*args, dil, act != "none", into=args[3] if in_place else None)
    if past.numel():  # (k = 1 carries no state: both empty)
        assert (present.data_ptr() == args[3].data_ptr()) == in_place
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(y.cpu(), want_y, rtol=tol, atol=tol)
    torch.testing.assert_close(present.cpu(), want_present, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_causal_conv_kernel_matches_the_op(device: str, dtype: torch.dtype, case: str, layout: str) -> None:
    """com.microsoft CausalConvWithState's convolution (Qwen3.5's layers: x [B, C, L], no gating) on the same kernel,
    against the op's torch path; x contiguous, or the transposed view of a [B, L, C] tensor the builder's graphs
    feed it."""
    from crossml.ops.attention import causal_conv as torch_conv

    B, L, C, K, dil, has_bias, act = CASES[case]
    g = torch.Generator().manual_seed(len(case) + 1)
    x = torch.randn(B, L, C, generator=g).to(dtype).transpose(1, 2)
    x = x.contiguous() if layout == "contiguous" else x
    weight = torch.randn(C, 1, K, generator=g).to(dtype)
    bias = torch.randn(C, generator=g).to(dtype) if has_bias else None
    past = torch.randn(B, C, (K - 1) * dil, generator=g).to(dtype)
    want_y, want_present, _ = torch_conv(x, weight, bias, past, act, dil, keep_padded=True)
    y, present = causal_conv(*(t.to(device) if t is not None else None for t in (x, weight, bias, past)), dil,
                             act != "none")
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(y.cpu(), want_y, rtol=tol, atol=tol)
    torch.testing.assert_close(present.cpu(), want_present, rtol=0, atol=0)
