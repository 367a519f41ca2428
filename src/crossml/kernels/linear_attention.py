"""LinearAttention's recurrence (Gated DeltaNet layers: Qwen3.5) as one Triton launch.

The torch path (``crossml.ops.attention.linear_recurrence``) walks the tokens in Python, about fifteen torch kernels a
token (the float32 casts, the decay's exp, the retrieval and update einsums, the output einsum, the stack): a decode
step of one layer is that many launches in the recorded graph, and a prompt of T tokens T times as many.

Here each program holds BLOCK_V value columns of one (batch entry, state head)'s float32 state [d_k, d_v] in registers
and walks the T tokens: the columns of the state evolve independently (the retrieval ``S^T k`` of column j reads
column j alone), so the value axis splits across programs. Per token, as the torch path: the state times
``exp(decay)`` (per head, or per key row), with the delta rules the retrieval ``S^T k`` and ``v = beta (v - S^T k)``,
then ``S += k v^T``, and each query head reading the state ``scale * q^T S``. Query heads share a state head in groups
(GQA), or one query head serves several state heads (inverse GQA), and a key head may serve several state heads
(``key_heads`` dividing the state heads). Sums run in another order than torch's einsums, so the two agree within a
rounding (``tests/kernels/test_linear_attention.py``). Under TRITON_INTERPRET=1 the kernel runs in Triton's
interpreter (see ``_launch``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from crossml.kernels._launch import cdiv, next_power_of_2, on_device, use_interpreter
from crossml.kernels.chunked_delta import chunked_delta_rule
from crossml.kernels.gated_delta import softplus

__all__ = ["CHUNK", "CHUNKED_FROM", "CHUNKED_FROM_V_MAJOR", "CHUNK_HEAD_MAX", "linear_attention"]

#: tokens a chunk of the chunked prompt form, and the prompt length from which it replaces the token walk of
#: LinearAttention's K-major state (CHUNKED_FROM) and of GatedDeltaNet's V-major one (CHUNKED_FROM_V_MAJOR). On an
#: H200 (benchmarks/chunked_delta.py, Qwen3.5-0.8B's layer, each form's GPU work replayed from a CUDA graph, as in a
#: recorded prompt) the walk's time over the chunks' was, K-major: 0.80 at 128 tokens, 0.99 at 192, 1.03 at 256,
#: 1.48 at 512; V-major: 0.66 at 64, 1.07 at 128, 1.39 at 192, 2.06 at 512.
CHUNK, CHUNKED_FROM, CHUNKED_FROM_V_MAJOR = 64, 256, 128
#: the largest key / value head size the chunked form takes (Qwen3.5's is 128)
CHUNK_HEAD_MAX = 128


@triton.jit
def _linear_attention_kernel(q_ptr, k_ptr, v_ptr, s_ptr, g_ptr, beta_ptr, o_ptr, so_ptr, alog_ptr, dtb_ptr, T, HKV,
                             DK, DV, G, INV, KDIV, scale, s_qb, s_qt, s_kb, s_kt, s_vb, s_vt, s_gb, s_gt, s_bb, s_bt,
                             s_ob, s_ot, SK, SV, HAS_PAST: tl.constexpr, GATED: tl.constexpr, PER_KEY: tl.constexpr,
                             DELTA: tl.constexpr, BETA_PER_HEAD: tl.constexpr, QK_L2: tl.constexpr,
                             QWEN_GATE: tl.constexpr, SIGMOID_BETA: tl.constexpr, BLOCK_G: tl.constexpr,
                             BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    """Program (b * HKV + h, value block): state head h of entry b, value columns ``value block * BLOCK_V ..``. Query
    heads ``(h * G) // INV + 0 .. G - 1`` read it (G > 1: GQA; INV > 1: inverse GQA, G = 1), and write output heads
    ``h * G + 0 .. G - 1``; key head ``h // KDIV``. A head's state element (key row i, value column j) is at
    ``i * SK + j * SV`` (LinearAttention's [d_k, d_v]: SK = DV, SV = 1; GatedDeltaNet's V-major [d_v, d_k]: SK = 1,
    SV = DK). com.microsoft GatedDeltaNet's fused steps: QK_L2 (the query and key heads L2-normalized, ``x *
    rsqrt(sum x^2 + 1e-12)``), QWEN_GATE (the decay input ``a`` becomes ``-exp(a_log[h]) * softplus(a + dt_bias[h])``)
    and SIGMOID_BETA."""
    pid = tl.program_id(0)
    h = pid % HKV
    b = (pid // HKV).to(tl.int64)
    vs = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    v_ok = vs < DV
    ks = tl.arange(0, BLOCK_K)
    k_ok = ks < DK
    tile = k_ok[:, None] & v_ok[None, :]
    s_off = (b * HKV + h) * DK * DV + ks[:, None] * SK + vs[None, :] * SV
    if HAS_PAST:
        state = tl.load(s_ptr + s_off, mask=tile, other=0.0).to(tl.float32)
    else:
        state = tl.zeros((BLOCK_K, BLOCK_V), tl.float32)
    q_head = (h * G) // INV
    # each token's query, key, value, decay and beta are requested one token ahead of their use (the loop is a chain of
    # dependent reductions; the loads need only the token index)
    kb = k_ptr + b * s_kb + (h // KDIV) * DK + ks
    vb = v_ptr + b * s_vb + h * DV + vs
    any_t = T > 0
    kt_n = tl.load(kb, mask=k_ok & any_t, other=0.0)
    vt_n = tl.load(vb, mask=v_ok & any_t, other=0.0)
    if GATED:
        if PER_KEY:
            gb = g_ptr + b * s_gb + h * DK + ks
            g_n = tl.load(gb, mask=k_ok & any_t, other=0.0)
        else:
            gb = g_ptr + b * s_gb + h
            g_n = tl.load(gb, mask=any_t, other=0.0)
        if QWEN_GATE:
            neg_a = -tl.exp(tl.load(alog_ptr + h).to(tl.float32))
            dt_h = tl.load(dtb_ptr + h).to(tl.float32)
    if DELTA:
        bb = beta_ptr + b * s_bb + (h if BETA_PER_HEAD else 0)
        beta_n = tl.load(bb, mask=any_t, other=0.0)
    gs = tl.arange(0, BLOCK_G)
    g_ok = gs < G
    qb = q_ptr + b * s_qb + (q_head + gs[:, None]) * DK + ks[None, :]
    q_ok = g_ok[:, None] & k_ok[None, :]
    qt_n = tl.load(qb, mask=q_ok & any_t, other=0.0)
    ob = o_ptr + b * s_ob + (h * G + gs[:, None]) * DV + vs[None, :]
    o_ok = g_ok[:, None] & v_ok[None, :]
    for t in range(T):
        kt = kt_n.to(tl.float32)
        if QK_L2:
            kt = kt * (1.0 / tl.sqrt(tl.sum(kt * kt, 0) + 1e-12))
        vt = vt_n.to(tl.float32)
        nxt = t + 1 < T
        kt_n = tl.load(kb + (t + 1) * s_kt, mask=k_ok & nxt, other=0.0)
        vt_n = tl.load(vb + (t + 1) * s_vt, mask=v_ok & nxt, other=0.0)
        if GATED:
            if QWEN_GATE:
                g = tl.exp(neg_a * softplus(g_n.to(tl.float32) + dt_h))
            else:
                g = tl.exp(g_n.to(tl.float32))
            if PER_KEY:
                g_n = tl.load(gb + (t + 1) * s_gt, mask=k_ok & nxt, other=0.0)
                state = state * g[:, None]
            else:
                g_n = tl.load(gb + (t + 1) * s_gt, mask=nxt, other=0.0)
                state = state * g
        if DELTA:
            beta = beta_n.to(tl.float32)
            if SIGMOID_BETA:
                beta = tl.sigmoid(beta)
            beta_n = tl.load(bb + (t + 1) * s_bt, mask=nxt, other=0.0)
            vt = beta * (vt - tl.sum(state * kt[:, None], 0))
        qt = qt_n.to(tl.float32)
        if QK_L2:
            qt = qt * (1.0 / tl.sqrt(tl.sum(qt * qt, 1) + 1e-12))[:, None]
        qt_n = tl.load(qb + (t + 1) * s_qt, mask=q_ok & nxt, other=0.0)
        state = state + kt[:, None] * vt[None, :]
        out = scale * tl.sum(qt[:, :, None] * state[None, :, :], 1)  # [BLOCK_G, BLOCK_V]
        tl.store(ob + t * s_ot, out.to(o_ptr.dtype.element_ty), mask=o_ok)
    tl.store(so_ptr + s_off, state.to(so_ptr.dtype.element_ty), mask=tile)


def linear_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, past: torch.Tensor | None,
                     decay: torch.Tensor | None, beta: torch.Tensor | None, q_heads: int, kv_heads: int,
                     key_heads: int, scale: float, state_dtype: torch.dtype, into: torch.Tensor | None = None, *,
                     v_major: bool = False, qk_l2: bool = False, qwen_gate: tuple[torch.Tensor, torch.Tensor] | None = None,
                     sigmoid_beta: bool = False, tiles: tuple | None = None,
                     chunk: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(output [B, T, max(q_heads, kv_heads) * d_v] in query's dtype, state [B, kv_heads, d_k, d_v] in state_dtype)
    of LinearAttention's packed query [B, T, q_heads * d_k], key [B, T, key_heads * d_k], value
    [B, T, kv_heads * d_v], the past state (None: zeros), decay [B, T, kv_heads] or [B, T, kv_heads * d_k] (log space;
    None: no gate) and beta [B, T, kv_heads] or [B, T, 1] (None: no delta rule). The caller has checked the shapes
    (``linear_recurrence``). ``into``: the past state itself (contiguous, state_dtype), which the final state
    overwrites (each program reads its tile of it before writing it), and which is returned.

    com.microsoft GatedDeltaNet's options (``crossml.ops.contrib.gated_delta_net``): ``v_major``, past and returned
    states [B, kv_heads, d_v, d_k]; ``qk_l2``, the query and key heads L2-normalized first; ``qwen_gate`` = (a_log,
    dt_bias), each [kv_heads], the decay input being the raw ``a`` of ``-exp(a_log) * softplus(a + dt_bias)``;
    ``sigmoid_beta``, beta taken through a sigmoid. ``tiles``: (value columns a program, warps) of the token walk in
    place of the chosen ones, or for chunks ``crossml.kernels.chunked_delta.TILES``'s five (for benchmarks' sweeps).

    A prompt of CHUNKED_FROM tokens or more (CHUNKED_FROM_V_MAJOR for a V-major state) under a delta rule with one
    decay per head and one query head per state head runs in chunks of CHUNK tokens (``crossml.kernels.chunked_delta``)
    in place of the token walk. ``chunk``: 0,
    the walk always; a power of two >= 16, chunks of that many tokens (ValueError where the chunked form does not
    cover the case); None, the default choice."""
    B, T, _ = query.shape
    dk = query.shape[2] // q_heads
    dv = value.shape[2] // kv_heads
    G = max(q_heads // kv_heads, 1)
    inv = max(kv_heads // q_heads, 1)
    out = torch.empty((B, T, max(q_heads, kv_heads) * dv), dtype=query.dtype, device=query.device)
    shape = (B, kv_heads, dv, dk) if v_major else (B, kv_heads, dk, dv)
    state = into if into is not None else torch.empty(shape, dtype=state_dtype, device=query.device)
    if B == 0:
        return out, state.zero_()
    q, k, v = (x if x.stride(2) == 1 else x.contiguous() for x in (query, key, value))
    g = decay.contiguous() if decay is not None else q
    bt = beta.contiguous() if beta is not None else q
    s = state if into is not None else past.contiguous() if past is not None else state
    a_log, dt_bias = (t.contiguous() for t in qwen_gate) if qwen_gate is not None else (q, q)
    per_key = decay is not None and decay.shape[2] == kv_heads * dk
    beta_per_head = beta is not None and beta.shape[2] == kv_heads
    # (head sizes past 128: the chunk walk's float32 tiles of 64 x 256 would outgrow shared memory; not measured)
    chunkable = beta is not None and not per_key and G == 1 and dk <= CHUNK_HEAD_MAX and dv <= CHUNK_HEAD_MAX
    if chunk is None:
        chunk = CHUNK if chunkable and T >= (CHUNKED_FROM_V_MAJOR if v_major else CHUNKED_FROM) else 0
    elif chunk and not (chunkable and chunk >= 16 and chunk & (chunk - 1) == 0):
        raise ValueError(f"linear_attention: chunks of {chunk} tokens need a power of two >= 16, a delta rule (beta), "
                         f"one decay per head, one query head per state head (here {G}) and head sizes up to "
                         f"{CHUNK_HEAD_MAX} (here {dk} and {dv})")
    interpret = use_interpreter(query, "GatedDeltaNet" if v_major else "LinearAttention")
    if chunk and T:
        chunked_delta_rule(q, k, v, s, g, bt, a_log, dt_bias, out, state, kv_heads=kv_heads, dk=dk, dv=dv, inv=inv,
                           kdiv=kv_heads // key_heads, scale=scale, has_past=past is not None,
                           gated=decay is not None, beta_per_head=beta_per_head, qk_l2=qk_l2,
                           qwen_gate=qwen_gate is not None, sigmoid_beta=sigmoid_beta, v_major=v_major, chunk=chunk,
                           interpret=interpret, tiles=tiles)
        return out, state
    block_k = max(16, next_power_of_2(dk))
    if T > 1:
        # a prompt walks its tokens in turn, each a chain of two reductions over the key axis: one warp each (warp
        # shuffles, no block barrier) over 4 value columns, more programs with shorter chains (Qwen3.5's 512-token
        # prompt layer on an H200, the kernel alone in a sweep of 8-64 columns x 1-8 warps: 0.35 ms, against 0.62 ms
        # at 16 columns of 4 warps; a later sweep of 2-8 columns, the minimum of four interleaved medians: 0.245 ms
        # at 4 columns against 0.269 at 8, GatedDeltaNet's V-major walk 0.333 against 0.354:
        # benchmarks/linear_attention_tiles.py). Longer prompts mostly go in chunks instead (CHUNKED_FROM).
        block_v, warps = min(4, next_power_of_2(dv)), 1
    else:  # a decode step: one token, 2.7 µs at 32 columns of 4 warps (Qwen3.5's layer, in a graph)
        block_v, warps = min(max(16, next_power_of_2(dv)), 32 if block_k <= 128 else 16), 4
    if tiles is not None:
        block_v, warps = tiles
    launch = on_device(query, interpret)
    with launch:
        _linear_attention_kernel[(B * kv_heads, cdiv(dv, block_v))](
            q, k, v, s, g, bt, out, state, a_log, dt_bias, T, kv_heads, dk, dv, G, inv, kv_heads // key_heads,
            float(scale), q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.stride(0),
            g.stride(1), bt.stride(0), bt.stride(1), out.stride(0), out.stride(1), 1 if v_major else dv,
            dk if v_major else 1, HAS_PAST=past is not None, GATED=decay is not None,
            PER_KEY=per_key, DELTA=beta is not None,
            BETA_PER_HEAD=beta_per_head, QK_L2=qk_l2, QWEN_GATE=qwen_gate is not None,
            SIGMOID_BETA=sigmoid_beta, BLOCK_G=next_power_of_2(G), BLOCK_K=block_k, BLOCK_V=block_v,
            **({} if interpret else {"num_warps": warps}))
    return out, state

