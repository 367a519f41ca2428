"""LFM2's short-convolution block (com.crossml ShortConv, graph rule SHORT_CONV) as one Triton launch: on a GPU the
six nodes it replaces are about ten torch kernels a layer (transposes, the gating products, the convolution's
concatenation, taps and sum, its casts), each a launch in the recorded decode step.

h [B, L, 3C] holds b | c | x along its channels. Each program takes BLOCK_C channels of one batch row and walks
BLOCK_T of the L positions: the k taps of ``b * x`` (rounded to h's dtype, as the Mul node's output is) after the
carried state, times the channel's kernel, summed in float32 with the bias, rounded to h's dtype (the convolution's
output), times c (rounded again): y [B, L, C]; the present state [B, C, S] is the last S positions of the carried
state followed by ``b * x``. ``ACT`` applies the convolution's SiLU after its rounding, as the op does. The torch
path sums the taps in another order, so the two agree within a rounding (``tests/kernels/test_short_conv.py``).

``causal_conv`` runs the same kernel on com.microsoft CausalConvWithState's own input (Qwen3.5's Gated DeltaNet
layers: the convolution of x [B, C, L], any strides, and its SiLU, no gating): one launch for the op's seven or so
torch kernels. Under TRITON_INTERPRET=1 the kernel runs in Triton's interpreter (see ``_launch``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from crossml.kernels._launch import cdiv, next_power_of_2, on_device, use_interpreter

__all__ = ["causal_conv", "short_conv"]

#: positions one program computes (a prompt's positions split across programs)
BLOCK_T = 16


@triton.jit
def _short_conv_kernel(h_ptr, past_ptr, w_ptr, bias_ptr, y_ptr, present_ptr, L, C, S, K, dilation,
                       s_hb, s_ht, s_hc, s_pb, s_pc, s_yb, s_yt, s_yc, s_rb, s_rc,
                       HAS_BIAS: tl.constexpr, ACT: tl.constexpr, GATED: tl.constexpr, BLOCK_C: tl.constexpr,
                       BLOCK_K: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_T: tl.constexpr):
    """Program (channel block, batch row, position block): positions ``position block * BLOCK_T ..`` (each output
    position reads its own taps alone, so the positions split across programs); the position block 0 program writes
    the present state. GATED: h [B, L, 3C] holds b | c | x (channel stride 1) and the convolution takes b * x, its
    output times c; else h is the convolution's input x itself (channel stride s_hc) and y its output."""
    cs = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    b = tl.program_id(1).to(tl.int64)
    c_ok = cs < C
    ks = tl.arange(0, BLOCK_K)
    k_ok = ks < K
    w = tl.load(w_ptr + cs[:, None] * K + ks[None, :], mask=c_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
    bias = tl.zeros((BLOCK_C,), dtype=tl.float32)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + cs, mask=c_ok, other=0.0).to(tl.float32)
    h_row = h_ptr + b * s_hb
    p_row = past_ptr + b * s_pb + cs[:, None] * s_pc
    out_ty = y_ptr.dtype.element_ty
    t0 = tl.program_id(2) * BLOCK_T
    for t in range(t0, tl.minimum(t0 + BLOCK_T, L)):
        p = t + ks * dilation
        ok = c_ok[:, None] & k_ok[None, :]
        carried = ok & (p < S)[None, :]
        fresh = ok & (p >= S)[None, :]
        q = tl.maximum(p - S, 0)[None, :] * s_ht
        v_past = tl.load(p_row + tl.minimum(p, S - 1)[None, :], mask=carried, other=0.0).to(tl.float32)
        if GATED:
            bx = (tl.load(h_row + q + cs[:, None], mask=fresh, other=0.0)
                  * tl.load(h_row + q + 2 * C + cs[:, None], mask=fresh, other=0.0)).to(out_ty)
        else:
            bx = tl.load(h_row + q + cs[:, None] * s_hc, mask=fresh, other=0.0)
        v = tl.where(carried, v_past, bx.to(tl.float32))
        conv = (tl.sum(v * w, axis=1) + bias).to(out_ty)
        if ACT:
            cf = conv.to(tl.float32)
            conv = (cf * tl.sigmoid(cf)).to(out_ty)
        if GATED:
            conv = (tl.load(h_row + t * s_ht + C + cs, mask=c_ok, other=0.0) * conv).to(out_ty)
        tl.store(y_ptr + b * s_yb + t * s_yt + cs * s_yc, conv, mask=c_ok)
    ss = tl.arange(0, BLOCK_S)
    s_ok = (ss < S) & (tl.program_id(2) == 0)
    p = L + ss
    carried = c_ok[:, None] & (s_ok & (p < S))[None, :]
    fresh = c_ok[:, None] & (s_ok & (p >= S))[None, :]
    q = tl.maximum(p - S, 0)[None, :] * s_ht
    v_past = tl.load(p_row + tl.minimum(p, S - 1)[None, :], mask=carried, other=0.0)
    if GATED:
        bx = (tl.load(h_row + q + cs[:, None], mask=fresh, other=0.0)
              * tl.load(h_row + q + 2 * C + cs[:, None], mask=fresh, other=0.0)).to(present_ptr.dtype.element_ty)
    else:
        bx = tl.load(h_row + q + cs[:, None] * s_hc, mask=fresh, other=0.0).to(present_ptr.dtype.element_ty)
    state = tl.where(carried, v_past.to(present_ptr.dtype.element_ty), bx)
    tl.store(present_ptr + b * s_rb + cs[:, None] * s_rc + ss[None, :], state, mask=c_ok[:, None] & s_ok[None, :])


def _run(h, L: int, C: int, gated: bool, s_h: tuple, weight, bias, past, dilation: int, activation: bool,
         y: torch.Tensor, s_y: tuple, into: torch.Tensor | None = None) -> torch.Tensor:
    """Launch the kernel over L positions of h (strides ``s_h``: batch, time, channel) into y (``s_y``); returns the
    present state [B, C, S] in h's dtype: ``into`` (the past itself, overwritten: only position block 0 reads the
    past where S <= BLOCK_T, and each of its programs reads its channels' past before writing them), else new."""
    B, K, S = h.shape[0], weight.shape[-1], past.shape[2]
    if into is not None and S > BLOCK_T:
        into = None
    past = past.contiguous() if into is None else into
    w = weight.reshape(C, K).contiguous()
    present = into if into is not None else torch.empty((B, C, S), dtype=h.dtype, device=h.device)
    interpret = use_interpreter(h, "ShortConv" if gated else "CausalConvWithState")
    block_c = 64 if interpret else 128
    launch = on_device(h, interpret)
    with launch:
        _short_conv_kernel[(cdiv(C, block_c), B, cdiv(max(L, 1), BLOCK_T))](
            h, past, w, bias if bias is not None else w, y, present, L, C, S, K,
            dilation, *s_h, past.stride(0), past.stride(1), *s_y, present.stride(0), present.stride(1),
            HAS_BIAS=bias is not None, ACT=activation, GATED=gated, BLOCK_C=block_c,
            BLOCK_K=max(2, next_power_of_2(K)), BLOCK_S=max(2, next_power_of_2(max(S, 1))), BLOCK_T=BLOCK_T,
            **({} if interpret else {"num_warps": 4}))
    return present


def short_conv(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, past: torch.Tensor, dilation: int,
               activation: bool, into: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(y [B, L, C], present [B, C, S]) of h [B, L, 3C] with weight [C, 1, k], bias [C] or None and the carried
    state past [B, C, S = (k - 1) * dilation], all on h's device (the caller checks shapes; past in h's dtype).
    ``into``: past itself (contiguous), which the present overwrites where the kernel allows it (``_run``)."""
    B, L, C3 = h.shape
    C = C3 // 3
    h = h if h.stride(2) == 1 else h.contiguous()
    y = torch.empty((B, L, C), dtype=h.dtype, device=h.device)
    present = _run(h, L, C, True, (h.stride(0), h.stride(1), 1), weight, bias, past, dilation, activation, y,
                   (y.stride(0), y.stride(1), 1), into)
    return y, present


def causal_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, past: torch.Tensor, dilation: int,
                activation: bool, into: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """com.microsoft CausalConvWithState's convolution (``crossml.ops.attention.causal_conv``) of channels-first x
    [B, C, L] (any strides) with weight [C, 1, k], bias [C] or None and the carried state past [B, C, S = (k - 1) *
    dilation] in x's dtype: (y [B, C, L], present [B, C, S]), both in x's dtype (the caller checks shapes).
    ``into``: past itself (contiguous), which the present overwrites where the kernel allows it (``_run``)."""
    B, C, L = x.shape
    y = torch.empty((B, C, L), dtype=x.dtype, device=x.device)
    present = _run(x, L, C, False, (x.stride(0), x.stride(2), x.stride(1)), weight, bias, past, dilation, activation,
                   y, (y.stride(0), y.stride(2), y.stride(1)), into)
    return y, present
