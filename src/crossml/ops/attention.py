"""Attention family: Attention (23/24/25), RotaryEmbedding (23), LinearAttention (27),
CausalConvWithState (27) and SwiGLU (28).

Attention runs on ``torch.nn.functional.scaled_dot_product_attention`` whenever its semantics match
(no softcap, no ``qk_matmul_output``, softmax at least as precise as the input); the mask, causal
frontier, sliding window and padding are folded into one device-side bias or boolean mask, so the
op never reads a device value on the host. Everything else takes an explicit
matmul-softmax-matmul path that follows the ONNX reference step by step.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from crossml.dtypes import torch_dtype
from crossml.ops._util import cpu_kernels, gpu_kernels, inplace_target, sdpa, sdpa_heads
from crossml.ops.registry import OpContext, op

_SDPA_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


# --------------------------------------------------------------------------------------------
# Attention


def _to_heads(x: torch.Tensor, num_heads: int | None, name: str) -> torch.Tensor:
    """(B, S, H*D) -> (B, H, S, D); 4-D inputs pass through."""
    if x.dim() == 4:
        return x
    if x.dim() != 3:
        raise ValueError(f"Attention input {name} must be 3-D or 4-D, got shape {tuple(x.shape)}")
    if not num_heads:
        raise ValueError(f"Attention with 3-D input {name} needs the q_num_heads and kv_num_heads attributes")
    b, s, hidden = x.shape
    if hidden % num_heads:
        raise ValueError(f"Attention input {name}: hidden size {hidden} is not divisible by {num_heads} heads")
    return x.reshape(b, s, num_heads, hidden // num_heads).transpose(1, 2)


def _structural_mask(
    q_len: int, kv_len: int, offset: int | torch.Tensor, is_causal: bool, left: int, right: int,
    nonpad: torch.Tensor | None, device: torch.device,
) -> torch.Tensor | None:
    """Boolean "may attend" mask from the causal frontier, the sliding window and the padding.

    Shape (q, kv) for a scalar offset, (B, 1, q, kv) when ``nonpad`` gives a per-batch one.
    None when nothing restricts attention.
    """
    window = left >= 0 or right >= 0
    if not (is_causal or window or nonpad is not None):
        return None
    i = torch.arange(q_len, device=device).unsqueeze(-1)
    j = torch.arange(kv_len, device=device)
    if isinstance(offset, torch.Tensor):
        pos = i + offset.reshape(-1, 1, 1, 1).to(device)  # (B, 1, q, 1)
    else:
        pos = i + offset  # (q, 1)
    allowed = torch.ones((), dtype=torch.bool, device=device)
    if is_causal:
        allowed = allowed & (j <= pos)
    if left >= 0:
        allowed = allowed & (j >= pos - left)
    if right >= 0:
        allowed = allowed & (j <= pos + right)
    if nonpad is not None:
        pad = j < nonpad.reshape(-1, 1, 1, 1).to(device)  # (B, 1, 1, kv)
        allowed = allowed & pad
    return allowed.expand(*allowed.shape[:-2], q_len, kv_len) if allowed.dim() >= 2 else None


def _combine_masks(
    user: torch.Tensor | None, structural: torch.Tensor | None, kv_len: int, dtype: torch.dtype
) -> torch.Tensor | None:
    """One mask: boolean (True = attend) when every part is boolean, else an additive bias."""
    if user is not None and user.shape[-1] < kv_len:  # pad a short mask with "masked"
        fill = False if user.dtype == torch.bool else float("-inf")
        user = F.pad(user, (0, kv_len - user.shape[-1]), value=fill)
    if user is None:
        return structural
    if user.dim() < 2:  # a rank-1 mask broadcasts over the query rows
        user = user.reshape(1, -1)
    if user.dtype == torch.bool:
        return user if structural is None else user & structural
    bias = user.to(dtype)
    return bias if structural is None else bias.masked_fill(~structural, float("-inf"))


def _fully_masked_rows(mask: torch.Tensor) -> torch.Tensor:
    """(..., q, 1) True where no key may be attended: those rows output zeros, not NaN."""
    if mask.dtype == torch.bool:
        return ~mask.any(dim=-1, keepdim=True)
    return torch.isneginf(mask.amax(dim=-1, keepdim=True))


def _sdpa_ok(q: torch.Tensor, softcap: float, want_qk: bool, softmax_dtype: torch.dtype | None) -> bool:
    if q.dtype not in _SDPA_DTYPES or softcap > 0 or want_qk:
        return False
    # SDPA kernels compute the softmax in at least float32 (float64 for double inputs).
    return softmax_dtype is None or softmax_dtype == q.dtype or (
        softmax_dtype == torch.float32 and q.dtype != torch.float64)


def _grouped_matmul(a: torch.Tensor, b: torch.Tensor, groups: int) -> torch.Tensor:
    """a (B, Hq, L, X) @ b (B, Hkv, X, Y) where query head h uses kv head h // groups."""
    if groups == 1:
        return a @ b
    bsz, hq, L, x = a.shape
    out = a.reshape(bsz, hq // groups, groups * L, x) @ b
    return out.reshape(bsz, hq, L, out.shape[-1])


def _explicit_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
    softcap: float, softmax_dtype: torch.dtype | None, qk_mode: int, groups: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference pattern: (Q*sqrt(s)) @ (K*sqrt(s))^T -> softcap -> + mask -> softmax -> @ V."""
    # The reference rounds sqrt(scale) to the input type before scaling Q and K.
    s = torch.tensor(math.sqrt(scale), dtype=q.dtype).item()
    qk = _grouped_matmul(q * s, (k * s).transpose(-1, -2), groups)
    if softcap > 0:
        qk = torch.tanh(qk / softcap) * softcap
    if mask is None:
        scores = qk
    elif mask.dtype == torch.bool:
        scores = qk.masked_fill(~mask, float("-inf"))
    else:
        scores = qk + mask
    probs = torch.softmax(scores.to(softmax_dtype) if softmax_dtype is not None else scores, dim=-1)
    if mask is not None:
        probs = torch.where(_fully_masked_rows(mask), torch.zeros((), dtype=probs.dtype, device=probs.device), probs)
    probs = probs.to(q.dtype)
    y = _grouped_matmul(probs, v, groups)
    qk_out = {2: scores, 3: probs}.get(qk_mode, qk)
    return y, qk_out.to(q.dtype)


@op("Attention", since=23, ctx=True)
@op("Attention", since=24, ctx=True)
@op("Attention", since=25, ctx=True)
def attention(
    Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, attn_mask: torch.Tensor | None = None,
    past_key: torch.Tensor | None = None, past_value: torch.Tensor | None = None,
    nonpad_kv_seqlen: torch.Tensor | None = None, *, is_causal: int = 0, kv_num_heads: int | None = None,
    q_num_heads: int | None = None, qk_matmul_output_mode: int = 0, scale: float | None = None,
    softcap: float = 0.0, softmax_precision: int | None = None, left_window_size: int = -1,
    right_window_size: int = -1, ctx: OpContext,
) -> tuple[Any, ...]:
    if not (Q.dim() == K.dim() == V.dim()):
        raise ValueError(f"Attention expects Q, K, V of one rank, got {Q.dim()}-D, {K.dim()}-D, {V.dim()}-D")
    if (past_key is None) != (past_value is None):
        raise ValueError("Attention: past_key and past_value must be given together")
    if nonpad_kv_seqlen is not None and past_key is not None:
        raise ValueError("Attention: nonpad_kv_seqlen cannot be combined with past_key/past_value")
    if left_window_size < -1 or right_window_size < -1:
        raise ValueError("Attention: left_window_size and right_window_size must be -1 or nonnegative")
    if qk_matmul_output_mode not in (0, 1, 2, 3):
        raise ValueError(f"Attention: qk_matmul_output_mode must be 0, 1, 2 or 3, got {qk_matmul_output_mode}")
    three_d = Q.dim() == 3
    q = _to_heads(Q, q_num_heads, "Q")
    k = _to_heads(K, kv_num_heads, "K")
    v = _to_heads(V, kv_num_heads, "V")
    if past_key is not None:
        k = torch.cat((past_key, k), dim=2)
        v = torch.cat((past_value, v), dim=2)
    bsz, hq, q_len, head = q.shape
    hkv, kv_len = k.shape[1], k.shape[2]
    if hq % hkv or v.shape[1] != hkv:
        raise ValueError(f"Attention: {hq} query heads are not a multiple of {hkv} key/value heads "
                         f"(K has {hkv}, V has {v.shape[1]})")
    groups = hq // hkv
    scale_v = 1.0 / math.sqrt(head) if scale is None else float(scale)
    softmax_dtype = torch_dtype(softmax_precision) if softmax_precision is not None else None

    if past_key is not None:
        offset: int | torch.Tensor = past_key.shape[2]
    elif nonpad_kv_seqlen is not None:
        offset = nonpad_kv_seqlen - q_len
    else:
        offset = 0
    causal = bool(is_causal)
    wants = ctx.outputs_wanted
    want_qk = len(wants) > 3 and wants[3]

    # Causal alone with top-left alignment is SDPA's is_causal; with a cache offset that already
    # shows every key (decode) it is no restriction at all.
    plain_causal = causal and attn_mask is None and nonpad_kv_seqlen is None and \
        left_window_size < 0 and right_window_size < 0
    if plain_causal and isinstance(offset, int) and offset >= kv_len - 1:
        causal = plain_causal = False
    use_sdpa = _sdpa_ok(q, softcap, want_qk, softmax_dtype)
    if use_sdpa and plain_causal and offset == 0:
        kh, vh, gqa = sdpa_heads(q, k, v, groups, masked=False)
        y = sdpa(q, kh, vh, is_causal=True, scale=scale_v, enable_gqa=gqa)
    else:
        structural = _structural_mask(q_len, kv_len, offset, causal, left_window_size, right_window_size,
                                      nonpad_kv_seqlen, q.device)
        mask = _combine_masks(attn_mask, structural, kv_len, q.dtype)
        if use_sdpa:
            kh, vh, gqa = sdpa_heads(q, k, v, groups, masked=mask is not None)
            y = sdpa(q, kh, vh, attn_mask=mask, scale=scale_v, enable_gqa=gqa)
            if mask is not None:
                y = torch.where(_fully_masked_rows(mask), torch.zeros((), dtype=y.dtype, device=y.device), y)
            qk_out = None
        else:
            y, qk_out = _explicit_attention(q, k, v, mask, scale_v, softcap, softmax_dtype,
                                            qk_matmul_output_mode, groups)
    if three_d:
        y = y.transpose(1, 2).reshape(bsz, q_len, -1)
    if len(wants) == 1:
        return y
    return y, k, v, (qk_out if want_qk else None)


# --------------------------------------------------------------------------------------------
# RotaryEmbedding


@op("RotaryEmbedding", since=23)
def rotary_embedding(
    X: torch.Tensor, cos_cache: torch.Tensor, sin_cache: torch.Tensor, position_ids: torch.Tensor | None = None,
    *, interleaved: int = 0, num_heads: int = 0, rotary_embedding_dim: int = 0,
) -> torch.Tensor:
    if X.dim() == 4:
        x = X.transpose(1, 2)  # (B, S, H, D)
    elif X.dim() == 3:
        if not num_heads:
            raise ValueError("RotaryEmbedding with a 3-D input needs the num_heads attribute")
        b, s, hidden = X.shape
        if hidden % num_heads:
            raise ValueError(f"RotaryEmbedding: hidden size {hidden} is not divisible by num_heads={num_heads}")
        x = X.reshape(b, s, num_heads, hidden // num_heads)
    else:
        raise ValueError(f"RotaryEmbedding expects a 3-D or 4-D input, got shape {tuple(X.shape)}")
    head = x.shape[-1]
    rot = rotary_embedding_dim or head
    if rot % 2 or rot > head:
        raise ValueError(f"RotaryEmbedding: rotary_embedding_dim {rot} must be even and <= head size {head}")
    if position_ids is not None:
        cos, sin = cos_cache[position_ids], sin_cache[position_ids]  # (B, S, rot/2)
    else:
        cos, sin = cos_cache, sin_cache
    if cos.shape[-1] != rot // 2 or sin.shape[-1] != rot // 2:
        raise ValueError(f"RotaryEmbedding: cos/sin caches have last dimension {cos.shape[-1]}/{sin.shape[-1]}, "
                         f"expected rotary_embedding_dim/2 = {rot // 2}")
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)  # (B, S, 1, rot/2)
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    if interleaved:
        x1, x2 = x_rot[..., 0::2], x_rot[..., 1::2]
    else:
        x1, x2 = x_rot[..., : rot // 2], x_rot[..., rot // 2:]
    real = cos * x1 - sin * x2
    imag = sin * x1 + cos * x2
    if interleaved:
        rotated = torch.stack((real, imag), dim=-1).reshape(x_rot.shape)
    else:
        rotated = torch.cat((real, imag), dim=-1)
    out = torch.cat((rotated, x_pass), dim=-1)
    return out.reshape(X.shape) if X.dim() == 3 else out.transpose(1, 2)


# --------------------------------------------------------------------------------------------
# LinearAttention, CausalConvWithState, SwiGLU


def _unpack(x: torch.Tensor, heads: int, name: str) -> torch.Tensor:
    if x.dim() != 3:
        raise ValueError(f"LinearAttention input {name} must be rank 3 (B, T, H*D), got shape {tuple(x.shape)}")
    b, t, hd = x.shape
    if hd % heads:
        raise ValueError(f"LinearAttention input {name}: last dimension {hd} is not divisible by {heads} heads")
    return x.reshape(b, t, heads, hd // heads).transpose(1, 2)


@op("LinearAttention", since=27)
def linear_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, past_state: torch.Tensor | None = None,
    decay: torch.Tensor | None = None, beta: torch.Tensor | None = None, *, q_num_heads: int,
    kv_num_heads: int, chunk_size: int = 64, scale: float = 0.0, update_rule: str = "gated_delta",
) -> tuple[torch.Tensor, torch.Tensor]:
    if q_num_heads <= 0 or kv_num_heads <= 0 or q_num_heads % kv_num_heads:
        raise ValueError(f"LinearAttention: q_num_heads ({q_num_heads}) must be a positive multiple "
                         f"of kv_num_heads ({kv_num_heads})")
    out, state, _ = linear_recurrence(query, key, value, past_state, decay, beta, q_num_heads, kv_num_heads, scale,
                                      update_rule)
    return out, state


def update_rule_inputs(op_name: str, update_rule: str, decay: torch.Tensor | None,
                       beta: torch.Tensor | None) -> tuple[bool, bool]:
    """(gating, delta) of a linear-attention ``update_rule`` (LinearAttention's, GatedDeltaNet's), checked: a known
    rule, and the decay input exactly with the gated rules, the beta input exactly with the delta rules."""
    if update_rule not in ("linear", "gated", "delta", "gated_delta"):
        raise ValueError(f"{op_name}: unsupported update_rule '{update_rule}'; "
                         "expected linear, gated, delta or gated_delta")
    gating, delta = update_rule in ("gated", "gated_delta"), update_rule in ("delta", "gated_delta")
    for name, t, wanted in (("decay", decay, gating), ("beta", beta, delta)):
        if (t is not None) != wanted:
            raise ValueError(f"{op_name}: update_rule '{update_rule}' {'requires' if wanted else 'forbids'} the "
                             f"{name} input")
    return gating, delta


def linear_recurrence(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, past_state: torch.Tensor | None,
    decay: torch.Tensor | None, beta: torch.Tensor | None, q_num_heads: int, kv_num_heads: int, scale: float,
    update_rule: str, keep_states: bool = False, op_name: str = "LinearAttention", shared_keys: bool = False,
    in_place: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """LinearAttention's recurrence, token by token in float32 (the spec's sequential semantics). Query heads share
    a KV head in groups (GQA), or with more KV heads than query heads each query head serves a group of KV heads
    (inverse GQA: output head h of KV head h reads query head h // (kv_num_heads / q_num_heads)). Returns the
    output, the final state (in the past state's dtype, else the query's) and, with ``keep_states``, the state
    after each token (float32). ``shared_keys`` (com.microsoft's op): the key may hold fewer heads H_k than
    kv_num_heads, H_k dividing it, each key head shared by kv_num_heads / H_k consecutive KV-state heads.
    ``in_place``: where the Triton kernel runs, it writes the final state into ``past_state`` and returns that tensor
    (the GenAI static buffers, ``kv_inplace``); elsewhere the state is a new tensor as always."""
    gating, delta = update_rule_inputs(op_name, update_rule, decay, beta)
    if q_num_heads <= 0 or kv_num_heads <= 0 or (q_num_heads % kv_num_heads and kv_num_heads % q_num_heads):
        raise ValueError(f"{op_name}: one of q_num_heads ({q_num_heads}) and kv_num_heads ({kv_num_heads}) must be "
                         "a positive multiple of the other")
    f32 = torch.float32
    q = _unpack(query, q_num_heads, "query")
    key_heads = kv_num_heads
    if shared_keys and key.dim() == 3 and key.shape[-1] % q.shape[-1] == 0:
        found = key.shape[-1] // q.shape[-1]
        if 0 < found < kv_num_heads and kv_num_heads % found == 0:
            key_heads = found
    k = _unpack(key, key_heads, "key")
    v = _unpack(value, kv_num_heads, "value")
    b, _, t, d_k = q.shape
    d_v = v.shape[-1]
    if k.shape[-1] != d_k or k.shape[:3] != (b, key_heads, t) or v.shape[:3] != (b, kv_num_heads, t):
        raise ValueError(f"{op_name}: query {tuple(query.shape)}, key {tuple(key.shape)} and value "
                         f"{tuple(value.shape)} do not agree on batch, length and head size for {q_num_heads} query "
                         f"and {kv_num_heads} key/value heads" + (" (or key heads dividing kv_num_heads)" if shared_keys
                                                                   else ""))
    if decay is not None and (decay.dim() != 3 or decay.shape[:2] != (b, t)
                              or decay.shape[-1] not in (kv_num_heads, kv_num_heads * d_k)):
        raise ValueError(f"{op_name}: decay must be (B, T, {kv_num_heads}) or "
                         f"(B, T, {kv_num_heads * d_k}), got {tuple(decay.shape)}")
    if beta is not None and (beta.dim() != 3 or beta.shape[:2] != (b, t) or beta.shape[-1] not in (kv_num_heads, 1)):
        raise ValueError(f"{op_name}: beta must be (B, T, {kv_num_heads}) or (B, T, 1), "
                         f"got {tuple(beta.shape)}")
    if past_state is not None and tuple(past_state.shape) != (b, kv_num_heads, d_k, d_v):
        raise ValueError(f"{op_name}: past_state has shape {tuple(past_state.shape)}, "
                         f"expected {(b, kv_num_heads, d_k, d_v)}")
    state_dtype = past_state.dtype if past_state is not None else query.dtype
    scale_v = float(scale) if scale else 1.0 / math.sqrt(d_k)
    tensors = (query, key, value, past_state, decay, beta)
    # one Triton launch for the whole recurrence on a GPU (crossml.kernels.linear_attention)
    if (not keep_states and d_k <= 256 and d_v <= 256
            and (kernels := gpu_kernels("linear_attention", *tensors)) is not None):
        into = inplace_target(past_state, in_place)
        out, state = kernels.linear_attention(query, key, value, past_state, decay, beta, q_num_heads, kv_num_heads,
                                              key_heads, scale_v, state_dtype, into)
        return out, state, []
    if not keep_states and (cpu := cpu_kernels("cpu_linear_attention", *tensors)) is not None:
        # numba's kernel: two passes over each state a token (crossml.kernels.cpu_linear_attention)
        out, state = cpu.linear_attention(query, key, value, past_state, decay, beta, q_num_heads, kv_num_heads,
                                          key_heads, scale_v)
        return out, state, []
    q, k, v = q.to(f32), k.to(f32), v.to(f32)
    if key_heads != kv_num_heads:
        k = k.repeat_interleave(kv_num_heads // key_heads, dim=1)
    g = None
    if decay is not None:
        g = torch.exp(decay.reshape(b, t, kv_num_heads, -1).transpose(1, 2).to(f32))  # (B, Hkv, T, 1|d_k)
    bt = None
    if beta is not None:
        bt = beta.reshape(b, t, beta.shape[-1], 1).transpose(1, 2).to(f32)  # (B, Hkv|1, T, 1)
    if past_state is not None:
        state = past_state.to(f32)
    else:
        state = torch.zeros((b, kv_num_heads, d_k, d_v), dtype=f32, device=query.device)
    if kv_num_heads > q_num_heads:
        q = q.repeat_interleave(kv_num_heads // q_num_heads, dim=1)
    groups = max(q_num_heads // kv_num_heads, 1)
    outs, states = [], []
    for i in range(t):
        k_t, v_t = k[:, :, i], v[:, :, i]  # (B, Hkv, d_k), (B, Hkv, d_v)
        if g is not None:
            state = state * g[:, :, i].unsqueeze(-1)
        if bt is not None:
            retrieved = torch.einsum("bhdm,bhd->bhm", state, k_t)
            v_t = bt[:, :, i] * (v_t - retrieved)
        state = state + k_t.unsqueeze(-1) * v_t.unsqueeze(-2)
        if keep_states:
            states.append(state)
        read = state.repeat_interleave(groups, dim=1) if groups > 1 else state
        outs.append(scale_v * torch.einsum("bhd,bhdm->bhm", q[:, :, i], read))
    heads = max(q_num_heads, kv_num_heads)
    out = torch.stack(outs, dim=2) if outs else q.new_zeros((b, heads, 0, d_v))
    out = out.transpose(1, 2).reshape(b, t, heads * d_v).to(query.dtype)
    return out, state.to(state_dtype), states


def causal_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, past_state: torch.Tensor | None,
                activation: str, dilation: int = 1, op_name: str = "CausalConvWithState", keep_padded: bool = False,
                in_place: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Depthwise causal 1-D convolution of channels-first ``x`` (B, C, L) with ``weight`` (C, 1, k) after the
    carried ``past_state`` (B, C, (k - 1) * dilation; zeros when None), in float32 (float64 for float64 input);
    returns (output, present_state, the carried-and-new sequence ``padded`` the state is cut from, with
    ``keep_padded``, else None where a kernel ran: numba's ``crossml.kernels.cpu_conv`` for float32 CPU tensors, the
    Triton ``crossml.kernels.short_conv.causal_conv`` on a GPU). ``in_place``: where the Triton kernel runs, the
    present state is written into ``past_state`` (of x's dtype) and returned (the GenAI static buffers)."""
    if activation not in ("none", "silu", "swish"):
        raise ValueError(f"{op_name}: unsupported activation '{activation}'; expected none, silu or swish")
    if x.dim() != 3 or weight.dim() != 3 or weight.shape[1] != 1 or weight.shape[0] != x.shape[1]:
        raise ValueError(f"{op_name} expects input (B, C, L) and weight (C, 1, k), got "
                         f"{tuple(x.shape)} and {tuple(weight.shape)}")
    if dilation < 1:
        raise ValueError(f"{op_name}: dilation must be >= 1, got {dilation}")
    bsz, channels, _ = x.shape
    span = (weight.shape[2] - 1) * dilation
    if past_state is None:
        past_state = torch.zeros((bsz, channels, span), dtype=x.dtype, device=x.device)
    elif tuple(past_state.shape) != (bsz, channels, span):
        raise ValueError(f"{op_name}: past_state must have shape {(bsz, channels, span)} (batch, channels, "
                         f"(k - 1) * dilation), got {tuple(past_state.shape)}")
    if bias is not None and tuple(bias.shape) != (channels,):
        raise ValueError(f"{op_name}: bias must have shape ({channels},), got {tuple(bias.shape)}")
    if not keep_padded and (kernels := cpu_kernels("cpu_conv", x, weight, past_state, bias)) is not None:
        out, present = kernels.causal_conv(x, weight, bias, past_state, dilation)
        if activation != "none":
            out = out * torch.sigmoid(out)
        return out, present, None
    if not keep_padded and (triton_kernels := gpu_kernels("short_conv", x, weight, past_state, bias)) is not None:
        # one launch for the torch path's concatenation, taps, sum, casts and SiLU (crossml.kernels.short_conv)
        into = inplace_target(past_state, in_place, x.dtype)
        out, present = triton_kernels.causal_conv(x, weight, bias, past_state.to(x.dtype), dilation,
                                                  activation != "none", into)
        return out, present, None
    padded = torch.cat((past_state.to(x.dtype), x), dim=2)
    wide = torch.float64 if x.dtype == torch.float64 else torch.float32
    # each output position's k taps (a strided view of the padded sequence), times the channel's kernel, summed: a
    # depthwise convolution as elementwise work (torch's grouped conv1d took about 210 us on the CPU for one decode
    # position of 1024 channels, mostly its setup; this about 25)
    taps = padded.to(wide).unfold(2, span + 1, 1)[..., ::dilation]  # [B, C, L, k]
    out = (taps * weight.to(wide)[:, 0].unsqueeze(1)).sum(-1)
    if bias is not None:
        out = out + bias.to(wide).unsqueeze(1)
    out = out.to(x.dtype)
    if activation != "none":
        w = out.to(torch.float32)
        out = (w * torch.sigmoid(w)).to(x.dtype)
    return out, padded[:, :, padded.shape[2] - span:], padded


@op("CausalConvWithState", since=27)
def causal_conv_with_state(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
    past_state: torch.Tensor | None = None, *, activation: str = "none",
) -> tuple[torch.Tensor, torch.Tensor]:
    out, present, _ = causal_conv(x, weight, bias, past_state, activation)
    return out, present


@op("SwiGLU", since=28)
def swiglu(A: torch.Tensor, B: torch.Tensor, *, alpha: float = 1.0) -> torch.Tensor:
    if A.shape != B.shape or A.dtype != B.dtype:
        raise ValueError(f"SwiGLU needs A and B of one shape and dtype (no broadcasting), got "
                         f"{tuple(A.shape)} {A.dtype} and {tuple(B.shape)} {B.dtype}")
    return A * torch.sigmoid(A * alpha) * B
