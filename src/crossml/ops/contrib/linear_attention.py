"""com.microsoft ops of linear-attention layers (Gated DeltaNet, as in Qwen3.5's exports), as onnxruntime's contrib
spec defines them: LinearAttention, LinearAttentionGate and GatedRMSNorm.

LinearAttention runs the recurrence of the ONNX-domain op of opset 27 (``crossml.ops.attention.linear_recurrence``,
token by token in float32), and adds inverse GQA (more key/value heads than query heads: each query head serves a
group of them, one output head per KV head), shared-key heads (a key of H_k heads, H_k dividing kv_num_heads: each
key head serves kv_num_heads / H_k consecutive state heads; Qwen3.5's linear-attention layers) and ``state_window`` (W > 0: past and present states gain a leading axis
of W slots, slot j the state after token T - W + j, slots before the call's first token zeros; the past state is read
from slot W - 1). ``chunk_size`` is a tuning hint of the spec and changes nothing here.

LinearAttentionGate and GatedRMSNorm compute in float32 whatever their tensor type, as the spec says, and round once;
on a GPU each is one Triton launch (``crossml.kernels.gated_delta``), as LinearAttention is
(``crossml.kernels.linear_attention``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from crossml.ops._util import cpu_kernels, gpu_kernels, window_past, window_slots
from crossml.ops.attention import linear_recurrence
from crossml.ops.registry import MS_DOMAIN, OpContext, op

_LA = "LinearAttention (com.microsoft)"


@op("LinearAttention", domain=MS_DOMAIN, ctx=True)
def linear_attention_ms(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, past_state: torch.Tensor | None = None,
    decay: torch.Tensor | None = None, beta: torch.Tensor | None = None, *, q_num_heads: int,
    kv_num_heads: int, chunk_size: int = 64, scale: float = 0.0, update_rule: str = "gated_delta",
    state_window: int = 0, ctx: OpContext | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    past = window_past(past_state, state_window, _LA, "B, H_kv, d_k, d_v", rank=5)
    # the GenAI static buffers (session entry crossml.kv_cache_in_place): the new state overwrites the past one
    in_place = not state_window and ctx is not None and bool(ctx.extra.get("kv_inplace"))
    out, state, states = linear_recurrence(query, key, value, past, decay, beta, q_num_heads, kv_num_heads, scale,
                                           update_rule, keep_states=bool(state_window), op_name=_LA,
                                           shared_keys=True, in_place=in_place)
    if state_window:
        state = torch.stack(window_slots(state_window, len(states), lambda n: states[n - 1].to(state.dtype),
                                         torch.zeros_like(state)))
    return out, state


@op("LinearAttentionGate", domain=MS_DOMAIN)
def linear_attention_gate(a: torch.Tensor, dt_bias: torch.Tensor, decay_scale: torch.Tensor,
                          b: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    heads = a.shape[-1] if a.dim() else 0
    for name, t in (("dt_bias", dt_bias), ("decay_scale", decay_scale)):
        if tuple(t.shape) != (heads,):
            raise ValueError(f"LinearAttentionGate: {name} must have shape ({heads},) (one value per head of a "
                             f"{tuple(a.shape)}), got {tuple(t.shape)}")
    if b is not None and b.shape != a.shape:
        raise ValueError(f"LinearAttentionGate: b must have a's shape {tuple(a.shape)}, got {tuple(b.shape)}")
    if a.numel():  # one call: a Triton launch (crossml.kernels.gated_delta), or numba's on the CPU
        kernels = gpu_kernels("gated_delta", a, dt_bias, decay_scale, b) or cpu_kernels(
            "cpu_gated_delta", a, dt_bias, decay_scale, b)
        if kernels is not None:
            return kernels.linear_attention_gate(a, dt_bias, decay_scale, b)
    f32 = torch.float32
    decay = (decay_scale.to(f32) * F.softplus(a.to(f32) + dt_bias.to(f32))).to(a.dtype)
    beta = torch.sigmoid(b.to(f32)).to(b.dtype) if b is not None else None
    return decay, beta


@op("GatedRMSNorm", domain=MS_DOMAIN)
def gated_rms_norm(X: torch.Tensor, scale: torch.Tensor, gate: torch.Tensor, *, activation: str = "silu",
                   epsilon: float = 1e-5) -> torch.Tensor:
    if activation not in ("silu", "swish", "sigmoid"):
        raise ValueError(f"GatedRMSNorm: unsupported activation '{activation}'; expected silu, swish or sigmoid")
    if scale.dim() != 1 or X.dim() == 0 or X.shape[-1] % scale.shape[0]:
        raise ValueError(f"GatedRMSNorm: scale must be 1-D with a length C dividing X's last dimension, got scale "
                         f"{tuple(scale.shape)} and X {tuple(X.shape)}")
    if gate.shape != X.shape:
        raise ValueError(f"GatedRMSNorm: gate must have X's shape {tuple(X.shape)}, got {tuple(gate.shape)}")
    if X.numel() and scale.shape[0]:  # one call: a Triton launch (crossml.kernels.gated_delta), or numba's on the CPU
        kernels = (gpu_kernels("gated_delta", X, scale, gate) if scale.shape[0] <= 16384 else None) or cpu_kernels(
            "cpu_gated_delta", X, scale, gate)
        if kernels is not None:
            return kernels.gated_rms_norm(X, scale, gate, epsilon, activation == "sigmoid")
    f32 = torch.float32
    c = scale.shape[0]
    x = X.to(f32).reshape(*X.shape[:-1], -1, c)
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + epsilon) * scale.to(f32)
    z = gate.to(f32)
    act = torch.sigmoid(z) if activation == "sigmoid" else z * torch.sigmoid(z)
    return (y.reshape(X.shape) * act).to(X.dtype)
