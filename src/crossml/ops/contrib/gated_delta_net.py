"""com.microsoft GatedDeltaNet and VarlenCausalConvWithState, as onnxruntime's contrib spec defines them: the ops of
the model builder's Gated DeltaNet export of Qwen3.5 (``--extra_options linear_attn_op=gated_delta_net``, and its
packed-token variant), where the default export has LinearAttention, LinearAttentionGate, LpNormalization and
CausalConvWithState (``crossml.ops.contrib.linear_attention``).

GatedDeltaNet
    Token-major heads: query and key (N, H_qk, d_k), value (N, H_v, d_v) with N the tokens, or (B, S, H, d) (the
    builder's dense export); the state (B, H_v, d_v, d_k), V-major, float32; decay and beta float32, (N, H_v) or
    (B, S, H_v) (a decay may also carry a d_k axis: one per key dimension). H_qk equal for query and key, H_v a
    multiple of it: value head h reads query / key head ``h // (H_v / H_qk)``. Per token, in float32::

        S = exp(g) S;  delta = beta (v - S^T k);  S += k delta^T;  o = scale * S^T q

    (``update_rule`` linear drops the decay and the retrieval, gated keeps the decay alone, delta the retrieval
    alone). ``gate_activation`` qwen: the decay input is the raw ``a`` of ``g = -exp(a_log) * softplus(a + dt_bias)``
    (a_log, dt_bias [H_v], float32); none: g itself. ``beta_activation`` sigmoid or none. ``qk_l2_norm``: the query
    and key heads become ``x * rsqrt(sum x^2 + 1e-12)`` first. ``scale`` 0 means ``1 / sqrt(d_k)``. ``cu_seqlens``
    (B + 1, int32) splits rank-3 tokens into sequences, sequence b advancing state row b; without it the N tokens are
    B equal sequences (B from the state). ``chunk_size`` is a tuning hint of the spec and changes nothing here.
    Transition capture (``state_update_capacity`` C > 0, with ``capture_count`` (B) and the host input
    ``state_update_active``): a third output (B, C * (H_v + H_qk * d_k + H_v * d_v)) holds each row's first
    min(capture_count, C, length) tokens' decays exp(g), normalized keys and deltas ``beta (v - S^T k)``, struct of
    arrays as onnxruntime lays it out, zeros elsewhere (all zeros where state_update_active is 0); it runs the torch
    loop. com.crossml's GatedDeltaNet (graph rule FoldGatedDeltaNetGateCasts) is this op taking half-precision gates.

    On a Triton device the whole op is one launch of LinearAttention's kernel (``crossml.kernels.linear_attention``,
    with the V-major state, the L2 norms and the gates fused); on the CPU numba's V-major kernel
    (``crossml.kernels.cpu_linear_attention``) after the norms and gates in torch; elsewhere a torch loop over the
    tokens. With the GenAI static buffers (``kv_inplace``) the kernels advance the past state in place.

VarlenCausalConvWithState
    The depthwise causal convolution of com.microsoft CausalConvWithState over packed tokens: input (N, C), weight
    (C, 1, K), ``cumulative_sequence_length`` (B + 1), bias (C) or none, the carried state (B, C, (K - 1) *
    dilation), required. Each sequence runs after its own state row and never reads another's tokens; its present
    row is the last (K - 1) * dilation positions of [state, tokens] (so a sequence shorter than that keeps the tail
    of its old state). With ``state_update_capacity`` C > 0 and ``capture_count`` (B), a third output (B, C, C_ch)
    holds each sequence's first ``min(capture_count[b], C, length)`` input tokens, zeros elsewhere.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from crossml.ops._util import cpu_kernels, gpu_kernels, inplace_target
from crossml.ops.attention import causal_conv, update_rule_inputs
from crossml.ops.registry import MS_DOMAIN, OpContext, op

#: the domain of the GatedDeltaNet graph rule FoldGatedDeltaNetGateCasts makes (``crossml.graph.passes.gate_casts``)
CROSSML_DOMAIN = "com.crossml"

_GDN = "GatedDeltaNet (com.microsoft)"
_VCC = "VarlenCausalConvWithState (com.microsoft)"
#: the L2 norm's epsilon, added to the sum of squares (onnxruntime's kernels)
L2_EPSILON = 1e-12


def _check_capture(name: str, capacity: int, capture_count: torch.Tensor | None) -> None:
    """The transition-capture attributes of both ops: a capacity within [0, 8], a capture_count exactly with one."""
    if not 0 <= capacity <= 8:
        raise ValueError(f"{name}: state_update_capacity must be within [0, 8], got {capacity}")
    if bool(capacity) != (capture_count is not None):
        raise ValueError(f"{name}: capture_count is required exactly when state_update_capacity > 0 "
                         f"(state_update_capacity={capacity}, capture_count "
                         f"{'given' if capture_count is not None else 'absent'})")


def _sequences(cu: torch.Tensor | None, tokens: int, batch: int | None, name: str) -> list[tuple[int, int]] | None:
    """The (start, end) token range of each sequence of ``cu`` (B + 1 cumulative lengths, on the host), checked."""
    if cu is None:
        return None
    if cu.dim() != 1 or cu.numel() < 2 or cu.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name}: the cumulative sequence lengths must be a 1-D int32 tensor of B + 1 >= 2 offsets, "
                         f"got shape {tuple(cu.shape)} {cu.dtype}")
    offsets = cu.tolist()
    if offsets[0] != 0 or offsets[-1] != tokens or any(a > b for a, b in zip(offsets, offsets[1:])):
        raise ValueError(f"{name}: the cumulative sequence lengths {offsets} must start at 0, never decrease and end "
                         f"at the {tokens} tokens of the input")
    if batch is not None and len(offsets) - 1 != batch:
        raise ValueError(f"{name}: {len(offsets) - 1} sequences in the cumulative sequence lengths, but the state "
                         f"holds {batch} rows")
    return list(zip(offsets, offsets[1:]))


@op("GatedDeltaNet", domain=MS_DOMAIN, ctx=True, host_inputs=(3, 9, 10))
def gated_delta_net(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seqlens: torch.Tensor | None = None,
    decay: torch.Tensor | None = None, beta: torch.Tensor | None = None, initial_state: torch.Tensor | None = None,
    a_log: torch.Tensor | None = None, dt_bias: torch.Tensor | None = None, capture_count: torch.Tensor | None = None,
    state_update_active: torch.Tensor | None = None, *, update_rule: str = "gated_delta", scale: float = 0.0,
    gate_activation: str = "none", beta_activation: str = "none", qk_l2_norm: int = 0, chunk_size: int = 64,
    state_update_capacity: int = 0, ctx: OpContext | None = None, half_gates: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    _check_capture(_GDN, state_update_capacity, capture_count)
    gating, _ = update_rule_inputs(_GDN, update_rule, decay, beta)
    if gate_activation not in ("none", "qwen"):
        raise ValueError(f"{_GDN}: unsupported gate_activation '{gate_activation}'; expected none or qwen")
    if beta_activation not in ("none", "sigmoid"):
        raise ValueError(f"{_GDN}: unsupported beta_activation '{beta_activation}'; expected none or sigmoid")
    rank = query.dim()
    if rank not in (3, 4) or key.dim() != rank or value.dim() != rank:
        raise ValueError(f"{_GDN}: query, key and value must all be (N, heads, head size) or all (B, S, heads, head "
                         f"size), got {tuple(query.shape)}, {tuple(key.shape)} and {tuple(value.shape)}")
    lead = tuple(query.shape[:-2])
    hq, dk = query.shape[-2:]
    hv, dv = value.shape[-2:]
    if tuple(key.shape) != tuple(query.shape) or tuple(value.shape[:-2]) != lead:
        raise ValueError(f"{_GDN}: key must have query's shape {tuple(query.shape)} (as many heads, the same head "
                         f"size) and value its tokens {lead}, got key {tuple(key.shape)} and value "
                         f"{tuple(value.shape)}")
    if hq <= 0 or hv % hq:
        raise ValueError(f"{_GDN}: value heads ({hv}) must be a positive multiple of the query / key heads ({hq})")
    qwen = gate_activation == "qwen"
    if qwen and not gating:
        raise ValueError(f"{_GDN}: gate_activation qwen needs a decay input (update_rule gated or gated_delta)")
    if qwen != (a_log is not None and dt_bias is not None) or (a_log is None) != (dt_bias is None):
        raise ValueError(f"{_GDN}: a_log and dt_bias are required with gate_activation qwen and forbidden otherwise "
                         f"(gate_activation '{gate_activation}', a_log {'given' if a_log is not None else 'absent'}, "
                         f"dt_bias {'given' if dt_bias is not None else 'absent'})")
    for name, t in (("a_log", a_log), ("dt_bias", dt_bias)):
        if t is not None and tuple(t.shape) != (hv,):
            raise ValueError(f"{_GDN}: {name} must be [{hv}] (one value per value head), got {tuple(t.shape)}")
    if decay is not None and tuple(decay.shape) not in (lead + (hv,), lead + (hv, dk)):
        raise ValueError(f"{_GDN}: decay must be {lead + (hv,)} or {lead + (hv, dk)} (per key dimension), got "
                         f"{tuple(decay.shape)}")
    if state_update_capacity and decay is not None and decay.shape[-1] != hv:
        raise ValueError(f"{_GDN}: transition capture (state_update_capacity > 0) does not take a decay per key "
                         f"dimension {tuple(decay.shape)}; give one decay a value head {lead + (hv,)}")
    if beta is not None and tuple(beta.shape) != lead + (hv,):
        raise ValueError(f"{_GDN}: beta must be {lead + (hv,)}, got {tuple(beta.shape)}")
    for name, t in (("decay", decay), ("beta", beta), ("initial_state", initial_state), ("a_log", a_log),
                    ("dt_bias", dt_bias)):
        if t is not None and t.dtype != torch.float32 and not (half_gates and name in ("decay", "beta")
                                                                and t.dtype in (torch.float16, torch.bfloat16)):
            raise ValueError(f"{_GDN}: {name} must be float32 (tensor(float)), got {t.dtype}")
    if cu_seqlens is not None and rank != 3:
        raise ValueError(f"{_GDN}: cu_seqlens needs rank-3 (N, heads, head size) inputs, got rank {rank}")
    if rank == 4:
        batch = lead[0]
    elif cu_seqlens is not None:
        batch = cu_seqlens.numel() - 1
    elif initial_state is None:
        raise ValueError(f"{_GDN}: with rank-3 inputs and no cu_seqlens, initial_state is required (its first "
                         "dimension is the batch size)")
    else:
        batch = initial_state.shape[0]
        if batch <= 0 or lead[0] % batch:
            raise ValueError(f"{_GDN}: {lead[0]} tokens do not split into the initial state's {batch} sequences")
    state_shape = (batch, hv, dv, dk)
    if initial_state is not None and tuple(initial_state.shape) != state_shape:
        raise ValueError(f"{_GDN}: initial_state must be [batch, value heads, value head size, key head size] = "
                         f"{state_shape} (V-major), got {tuple(initial_state.shape)}")
    spans = _sequences(cu_seqlens, lead[0], batch, _GDN)
    state = initial_state if initial_state is not None else query.new_zeros(state_shape, dtype=torch.float32)
    step = dict(hq=hq, hv=hv, scale=float(scale) if scale else 1.0 / math.sqrt(dk), qk_l2=bool(qk_l2_norm),
                gate=(a_log, dt_bias) if qwen else None, sigmoid_beta=beta_activation == "sigmoid",
                capture=state_update_capacity)

    tokens = math.prod(lead)

    def dense(rows: int, span: slice, st: torch.Tensor, into: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        def cut(t: torch.Tensor | None) -> torch.Tensor | None:  # the span's tokens, packed: (rows, T, features)
            if t is None:
                return None
            flat = t.reshape(tokens, -1)[span]
            return flat.reshape(rows, flat.shape[0] // rows, flat.shape[1])

        return _recurrence(*(cut(t) for t in (query, key, value)), st, cut(decay), cut(beta), into=into, **step)

    in_place = ctx is not None and bool(ctx.extra.get("kv_inplace"))
    if spans is None:
        out, final, *captured = dense(batch, slice(None), state, inplace_target(initial_state, in_place, torch.float32))
        out = out.reshape(*lead, hv, dv)
        lengths = [tokens // batch] * batch
    else:
        out = query.new_empty((lead[0], hv * dv))
        finals, captured = [], []
        for row, (start, end) in enumerate(spans):
            if start == end:  # an empty sequence keeps its state
                finals.append(state[row:row + 1].clone())
                captured.append(None)
                continue
            o, f, *c = dense(1, slice(start, end), state[row:row + 1], None)
            out[start:end] = o[0]
            finals.append(f)
            captured.append(c[0] if c else None)
        out, final = out.reshape(lead[0], hv, dv), torch.cat(finals)
        captured = [_rows(captured, state_update_capacity, hq, dk, hv, dv)] if state_update_capacity else []
        lengths = [end - start for start, end in spans]
    if not state_update_capacity:
        return out, final
    return out, final, _capsules(captured[0], capture_count, state_update_active, lengths, (hv, hq * dk, hv * dv))


def _rows(parts: list[torch.Tensor | None], capacity: int, hq: int, dk: int, hv: int, dv: int) -> torch.Tensor:
    """The packed sequences' captured entries (each [1, capacity, width], None for an empty sequence) as one tensor."""
    width = hv + hq * dk + hv * dv
    device = next((p.device for p in parts if p is not None), None)
    return torch.cat([p if p is not None else torch.zeros((1, capacity, width), device=device) for p in parts])


def _capsules(entries: torch.Tensor, capture_count: torch.Tensor, active: torch.Tensor | None, lengths: list[int],
              widths: tuple[int, int, int]) -> torch.Tensor:
    """GatedDeltaNet's state_update output (B, capacity * (H_v + H_qk * d_k + H_v * d_v)) from each row's captured
    entries [B, capacity, sum(widths)] (entry n: the decay exp(g) a value head, the key a query / key head after its
    L2 norm, the delta ``beta (v - S^T k)`` a value head, of the row's token n). Entries from min(capture_count,
    capacity, length) on are zeros, and all of them where state_update_active is 0. Struct of arrays, as onnxruntime
    lays it out: the capacity's decays, then its keys, then its deltas."""
    rows, capacity, _ = entries.shape
    counts = capture_count.reshape(-1).tolist()
    if len(counts) != rows:
        raise ValueError(f"{_GDN}: capture_count must hold one count per sequence ({rows}), got {len(counts)}")
    on = active is None or bool(active.reshape(-1)[0].item())
    keep = torch.tensor([[on and n < min(int(c), capacity, length) for n in range(capacity)]
                         for c, length in zip(counts, lengths)], device=entries.device)
    parts = (entries * keep.unsqueeze(-1)).split(list(widths), dim=2)
    return torch.cat([p.reshape(rows, -1) for p in parts], dim=1)


def _recurrence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: torch.Tensor, g: torch.Tensor | None,
                beta: torch.Tensor | None, *, hq: int, hv: int, scale: float, qk_l2: bool,
                gate: tuple[torch.Tensor, torch.Tensor] | None, sigmoid_beta: bool, into: torch.Tensor | None,
                capture: int = 0) -> tuple[torch.Tensor, ...]:
    """(output [B, T, hv * d_v] in q's dtype, float32 state [B, hv, d_v, d_k]) of checked packed q, k [B, T, hq *
    d_k], v [B, T, hv * d_v], the V-major float32 state, raw decay [B, T, hv | hv * d_k] and beta [B, T, hv] (or
    None). ``into``: the past state, advanced in place where the Triton kernel runs (the GenAI static buffers).
    ``capture`` > 0 (the torch loop): a third result [B, capture, hv + hq * d_k + hv * d_v], the first ``capture``
    tokens' decays exp(g), keys and deltas (zeros past the last token)."""
    dk = q.shape[2] // hq
    dv = v.shape[2] // hv
    if (not capture and dk <= 256 and dv <= 256
            and (kernels := gpu_kernels("linear_attention", q, k, v, state, g, beta)) is not None):
        return kernels.linear_attention(q, k, v, state, g, beta, hq, hv, hq, scale, torch.float32, into, v_major=True,
                                        qk_l2=qk_l2, qwen_gate=gate, sigmoid_beta=sigmoid_beta)
    f32 = torch.float32
    B, T, _ = q.shape
    qf, kf, vf = q.to(f32), k.to(f32), v.to(f32)
    g, beta = (t.to(f32) if t is not None else None for t in (g, beta))  # (com.crossml's: half-precision gates)
    if qk_l2:
        qf, kf = (x.reshape(B, T, hq, dk) for x in (qf, kf))
        qf, kf = (x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + L2_EPSILON) for x in (qf, kf))
        qf, kf = (x.reshape(B, T, hq * dk) for x in (qf, kf))
    if g is not None and gate is not None:  # the log-space decay, -exp(a_log) * softplus(a + dt_bias)
        a_log, dt_bias = gate
        a = g.reshape(B, T, hv, -1) + dt_bias.reshape(hv, 1)
        g = (-torch.exp(a_log).reshape(hv, 1) * F.softplus(a)).reshape(B, T, -1)
    if beta is not None and sigmoid_beta:
        beta = torch.sigmoid(beta)
    if not capture and (cpu := cpu_kernels("cpu_linear_attention", qf, kf, vf, state, g, beta)) is not None:
        out, final = cpu.linear_attention(qf, kf, vf, state, g, beta, hq, hv, hq, scale, v_major=True)
        return out.to(q.dtype), final
    inv = hv // hq
    qh = qf.reshape(B, T, hq, dk).repeat_interleave(inv, dim=2)
    kh = kf.reshape(B, T, hq, dk).repeat_interleave(inv, dim=2)
    vh = vf.reshape(B, T, hv, dv)
    s = state.to(f32).clone()
    outs = []
    entries = vf.new_zeros((B, capture, hv + hq * dk + hv * dv))
    for t in range(T):
        d = torch.exp(g[:, t].reshape(B, hv, 1, -1)) if g is not None else None
        if d is not None:
            s = s * d
        kt = kh[:, t]
        u = vh[:, t]
        if beta is not None:
            u = beta[:, t].unsqueeze(-1) * (u - torch.einsum("bhvk,bhk->bhv", s, kt))
        s = s + u.unsqueeze(-1) * kt.unsqueeze(-2)
        outs.append(scale * torch.einsum("bhvk,bhk->bhv", s, qh[:, t]))
        if t < capture:  # (capture takes one decay a value head)
            entries[:, t] = torch.cat([d.reshape(B, hv) if d is not None else vf.new_ones((B, hv)),
                                       kf[:, t].reshape(B, -1), u.reshape(B, -1)], dim=1)
    out = torch.stack(outs, dim=1) if outs else vf.new_zeros((B, 0, hv, dv))
    out = out.reshape(B, T, hv * dv).to(q.dtype)
    return (out, s, entries) if capture else (out, s)


@op("VarlenCausalConvWithState", domain=MS_DOMAIN, host_inputs=(2, 5))
def varlen_causal_conv_with_state(
    x: torch.Tensor, weight: torch.Tensor, cumulative_sequence_length: torch.Tensor,
    bias: torch.Tensor | None = None, initial_state: torch.Tensor | None = None,
    capture_count: torch.Tensor | None = None, *, activation: str = "none", dilation: int = 1,
    state_update_capacity: int = 0,
) -> tuple[torch.Tensor, ...]:
    if x.dim() != 2:
        raise ValueError(f"{_VCC}: input must be (N, channels), got {tuple(x.shape)}")
    if initial_state is None:
        raise ValueError(f"{_VCC}: initial_state (B, channels, (K - 1) * dilation) is required")
    _check_capture(_VCC, state_update_capacity, capture_count)
    spans = _sequences(cumulative_sequence_length, x.shape[0], initial_state.shape[0], _VCC)
    channels = x.shape[1]
    out = x.new_empty(x.shape)
    finals = []
    for row, (start, end) in enumerate(spans):
        seq = x[start:end].t().unsqueeze(0)  # (1, C, L)
        o, present, _ = causal_conv(seq, weight, bias, initial_state[row:row + 1], activation, dilation, _VCC)
        out[start:end] = o[0].t()
        finals.append(present.to(initial_state.dtype))
    final = torch.cat(finals)
    if not state_update_capacity:
        return out, final
    counts = capture_count.reshape(-1).tolist()
    if len(counts) != len(spans):
        raise ValueError(f"{_VCC}: capture_count must hold one count per sequence ({len(spans)}), got "
                         f"{len(counts)}")
    captured = x.new_zeros((len(spans), state_update_capacity, channels))
    for row, ((start, end), count) in enumerate(zip(spans, counts)):
        n = max(0, min(int(count), state_update_capacity, end - start))
        captured[row, :n] = x[start:start + n]
    return out, final, captured


@op("GatedDeltaNet", domain=CROSSML_DOMAIN, ctx=True, host_inputs=(3, 9, 10))
def gated_delta_net_half_gates(*inputs: torch.Tensor | None, ctx: OpContext | None = None,
                               **attrs: object) -> tuple[torch.Tensor, ...]:
    """com.microsoft GatedDeltaNet whose decay and beta may also be float16 / bfloat16 (read as float32, exactly):
    what graph rule FoldGatedDeltaNetGateCasts makes of the op and the float32 Casts feeding its gates."""
    return gated_delta_net(*inputs, ctx=ctx, half_gates=True, **attrs)
