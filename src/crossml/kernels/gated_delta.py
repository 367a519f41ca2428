"""The row-wise ops around a Gated DeltaNet layer's recurrence (Qwen3.5's linear-attention layers), one Triton launch
each: on a GPU their torch paths are five to ten kernels apiece (float32 casts, the reduction, the elementwise steps,
the cast back), and a decode step of Qwen3.5-0.8B runs them 72 times.

``lp_normalize``
    ai.onnx LpNormalization with p = 2 over the last axis (the layer's query and key heads): ``x / ||x||`` in float32,
    an all-zero row left zero, rounded once.
``gated_rms_norm``
    com.microsoft GatedRMSNorm: each group of C channels RMS-normalized in float32 and scaled, times ``act(gate)``
    (SiLU or sigmoid), rounded once.
``linear_attention_gate``
    com.microsoft LinearAttentionGate: ``decay = decay_scale * softplus(a + dt_bias)`` per head and ``beta =
    sigmoid(b)``, in float32, each rounded to its input's type. softplus as torch's: ``x`` above 20, else
    ``log1p(exp(x))`` (log1p through ``log(u) * e / (u - 1)``, ``u = 1 + e``, exact to a few ulps where ``1 + e``
    rounds).

The torch paths are the references (``tests/kernels/test_gated_delta.py``): sums run in another order, so results
agree within a rounding. Under TRITON_INTERPRET=1 the kernels run in Triton's interpreter (see ``_launch``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from crossml.kernels._launch import next_power_of_2, on_device, use_interpreter

__all__ = ["gated_rms_norm", "linear_attention_gate", "lp_normalize"]


@triton.jit
def _lp_norm_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=ok, other=0.0).to(tl.float32)
    norm = tl.sqrt(tl.sum(x * x, 0))
    norm = tl.where(norm == 0.0, 1.0, norm)
    tl.store(y_ptr + row * N + cols, (x / norm).to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _gated_rms_norm_kernel(x_ptr, g_ptr, w_ptr, y_ptr, C, eps, SIGMOID: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < C
    x = tl.load(x_ptr + row * C + cols, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    y = x * (1.0 / tl.sqrt(tl.sum(x * x, 0) / C + eps)) * w
    z = tl.load(g_ptr + row * C + cols, mask=ok, other=0.0).to(tl.float32)
    if SIGMOID:
        act = tl.sigmoid(z)
    else:
        act = z * tl.sigmoid(z)
    tl.store(y_ptr + row * C + cols, (y * act).to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def softplus(x):
    """torch's softplus of float32 ``x``: ``x`` above 20, else ``log1p(exp(x))`` (see the module's docstring)."""
    e = tl.exp(tl.minimum(x, 20.0))
    u = 1.0 + e
    log1p = tl.where(u == 1.0, e, tl.log(u) * (e / tl.where(u == 1.0, 1.0, u - 1.0)))
    return tl.where(x > 20.0, x, log1p)


@triton.jit
def _gate_kernel(a_ptr, dt_ptr, ds_ptr, b_ptr, decay_ptr, beta_ptr, n, H, HAS_B: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = i < n
    h = i % H
    x = tl.load(a_ptr + i, mask=ok, other=0.0).to(tl.float32) + tl.load(dt_ptr + h, mask=ok, other=0.0).to(tl.float32)
    soft = softplus(x)
    scale = tl.load(ds_ptr + h, mask=ok, other=0.0).to(tl.float32)
    tl.store(decay_ptr + i, (scale * soft).to(decay_ptr.dtype.element_ty), mask=ok)
    if HAS_B:
        b = tl.load(b_ptr + i, mask=ok, other=0.0).to(tl.float32)
        tl.store(beta_ptr + i, tl.sigmoid(b).to(beta_ptr.dtype.element_ty), mask=ok)


def _launch(t: torch.Tensor, what: str):
    interp = use_interpreter(t, what)
    ctx = on_device(t, interp)
    return ctx, ({} if interp else {"num_warps": 4})


def lp_normalize(x: torch.Tensor) -> torch.Tensor:
    """LpNormalization (p = 2) of x over its last axis, in x's dtype."""
    N = x.shape[-1]
    xc = x.contiguous()
    y = torch.empty_like(xc)
    rows = xc.numel() // N if N else 0
    if rows:
        ctx, kw = _launch(x, "LpNormalization")
        with ctx:
            _lp_norm_kernel[(rows,)](xc, y, N, BLOCK=max(16, next_power_of_2(N)), **kw)
    return y


def gated_rms_norm(x: torch.Tensor, scale: torch.Tensor, gate: torch.Tensor, epsilon: float,
                   sigmoid: bool) -> torch.Tensor:
    """GatedRMSNorm of x (..., groups * C) with scale [C] and gate (x's shape), in x's dtype (the caller checks)."""
    C = scale.shape[0]
    xc, gc = x.contiguous(), gate.contiguous()
    y = torch.empty_like(xc)
    rows = xc.numel() // C if C else 0
    if rows:
        ctx, kw = _launch(x, "GatedRMSNorm")
        with ctx:
            _gated_rms_norm_kernel[(rows,)](xc, gc, scale.contiguous(), y, C, float(epsilon), SIGMOID=sigmoid,
                                            BLOCK=max(16, next_power_of_2(C)), **kw)
    return y


def linear_attention_gate(a: torch.Tensor, dt_bias: torch.Tensor, decay_scale: torch.Tensor,
                          b: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """LinearAttentionGate's (decay, beta) of a (..., H), dt_bias and decay_scale [H], b (a's shape) or None."""
    ac = a.contiguous()
    bc = b.contiguous() if b is not None else None
    decay = torch.empty_like(ac)
    beta = torch.empty_like(bc) if bc is not None else None
    n = ac.numel()
    if n:
        block = 256
        ctx, kw = _launch(a, "LinearAttentionGate")
        with ctx:
            _gate_kernel[(triton.cdiv(n, block),)](ac, dt_bias.contiguous(), decay_scale.contiguous(),
                                                   bc if bc is not None else ac, decay,
                                                   beta if beta is not None else decay, n, a.shape[-1],
                                                   HAS_B=bc is not None, BLOCK=block, **kw)
    return decay, beta
