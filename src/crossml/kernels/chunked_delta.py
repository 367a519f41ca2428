"""A prompt's delta-rule recurrence in chunks (the WY form of Gated DeltaNet's prefill), two Triton launches.

``crossml.kernels.linear_attention`` walks a prompt token by token: each token is a chain of two reductions over the
key axis, so a 512-token prompt is 1024 dependent steps per program whatever the card. Here the tokens go in chunks
of C (64), and only the chunks are walked in turn, each step three small matrix products.

Per state head, with the log decays ``l_t`` (per head; zero without a gate), ``γ_i = l_1 + .. + l_i`` counted from the
chunk's start, the chunk's start state ``S`` [d_k, d_v], and the token rule of the walk (``S_t = g_t S_{t-1}``, ``u_t =
β_t (v_t - S_t^T k_t)``, ``S_t += k_t u_t^T``, ``o_t = scale q_t^T S_t``):

- the deltas solve ``(I + A) U = diag(β) V - diag(β e^γ) K S`` with ``A_ij = β_i e^(γ_i - γ_j) k_i·k_j`` below the
  diagonal, so ``U = U' - W S`` with ``Tinv = (I + A)^-1``, ``U' = Tinv diag(β) V`` and ``W = Tinv diag(β e^γ) K``;
- the outputs are ``O = scale diag(e^γ) Q S + P U`` with ``P_ij = scale e^(γ_i - γ_j) q_i·k_j`` for j <= i;
- the state leaving the chunk is ``e^(γ_C) S + (diag(e^(γ_C - γ)) K)^T U``.

``_prepare`` (one program per head and chunk, all in parallel) computes everything that does not depend on the state:
``W``, ``U'``, ``scale diag(e^γ) Q``, ``P``, ``diag(e^(γ_C - γ)) K`` and ``e^(γ_C)``. The unit lower-triangular
inverse is block elimination with blocks doubling from 1 to C tokens, two products a level (exact elimination: no
powers of A, whose entries grow combinatorially; row-by-row substitution took 63 dependent steps of two block-wide
reductions, about 0.1 ms a 64-token chunk on an H200).
``_walk`` (one program per head and block of value columns) then carries the float32 state through the chunks.
The products run on tensor cores (TF32 for half-precision activations, TF32x3 for float32 ones: see PRECISION), the
inverse's in TF32x3, the exponents in float32. Each exponent is summed over its own span of tokens (``l_(j+1) + .. +
l_i``, from the chunk's start, or to its end), never taken as the difference of two prefix sums: with decays of at
most 1 nothing overflows, and strong decays (prefix sums in the thousands) cost the weak ones beside them no
precision (``test_chunked_prompt_matches_the_recurrence[gdn-mixed-decay-*]``).

Covered: the delta rules (``delta``, ``gated_delta``) with one decay per head, beta per head or shared, each state head
read by one query head (``G`` = 1: GatedDeltaNet, Qwen3.5's LinearAttention), key heads shared by state heads, both
state layouts, and GatedDeltaNet's fused steps (the L2 norms, Qwen's gate, sigmoid beta). The other cases (per-key
decays, no delta rule, GQA readers) keep the token walk. The result equals the walk's within a rounding
(``tests/kernels/test_linear_attention.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from crossml.kernels._launch import cdiv, next_power_of_2, on_device
from crossml.kernels.gated_delta import softplus

__all__ = ["PRECISION", "SEGMENT", "TILES", "chunked_delta_rule"]

#: (value columns of a walking program, its warps, its pipeline stages, the preparing program's warps, the products'
#: input precision, None: by the activations' type). The walk's chunk loads are float32 tiles of up to 64 x 128:
#: deeper pipelines overflow shared memory (two stages of Qwen3.5's 64 x 128 need 240-288 KB). Qwen3.5-0.8B's layer,
#: 512 tokens, on an H200 (benchmarks/chunked_delta.py, with the row-by-row inverse of the first form): 0.19 ms
#: (GatedDeltaNet) and 0.18 ms (LinearAttention) with TF32 products and 8 preparing warps, against the token walk's
#: 0.32 and 0.24; 16-64 value columns and 4 or 8 walking warps within 10 %; 4 preparing warps 0.21; TF32x3 0.28 and
#: 0.30; IEEE float32 (no tensor cores) 3.0 and 2.9.
TILES = (32, 4, 1, 8, None)
#: the longest span of tokens one pair of launches takes (a multiple of the chunk): the scratch is about 2.3 KB a token
#: and state head of 128 x 128, so about 9.4 MB a head
SEGMENT = 4096
#: the products' precision by the activations' type: TF32 (a 10-bit mantissa, half precision's) for half-precision
#: activations, TF32x3 (about float32's) for float32 ones
PRECISION = {torch.float16: "tf32", torch.bfloat16: "tf32"}


@triton.jit
def _prepare_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, alog_ptr, dtb_ptr, w_ptr, u_ptr, qg_ptr, kd_ptr, p_ptr,
                    gc_ptr, T, NC, HKV, DK, DV, INV, KDIV, scale, s_qb, s_qt, s_kb, s_kt, s_vb, s_vt, s_gb, s_gt,
                    s_bb, s_bt, GATED: tl.constexpr, BETA_PER_HEAD: tl.constexpr, QK_L2: tl.constexpr,
                    QWEN_GATE: tl.constexpr, SIGMOID_BETA: tl.constexpr, C: tl.constexpr, BLOCK_K: tl.constexpr,
                    BLOCK_V: tl.constexpr, PREC: tl.constexpr, SOLVE: tl.constexpr, LOG_C: tl.constexpr):
    """Program (b * HKV + h, chunk c): the chunk's state-free pieces for state head h of entry b (see the module's
    docstring), into rows ``c * C ..`` of the head's scratch (tokens past T give zero rows)."""
    bh = tl.program_id(0)
    c = tl.program_id(1)
    h = bh % HKV
    b = (bh // HKV).to(tl.int64)
    rows = c * C + tl.arange(0, C)
    r_ok = rows < T
    ks = tl.arange(0, BLOCK_K)
    k_ok = ks < DK
    vs = tl.arange(0, BLOCK_V)
    v_ok = vs < DV
    rk = r_ok[:, None] & k_ok[None, :]
    kt = tl.load(k_ptr + b * s_kb + rows[:, None] * s_kt + (h // KDIV) * DK + ks[None, :], mask=rk,
                 other=0.0).to(tl.float32)
    qt = tl.load(q_ptr + b * s_qb + rows[:, None] * s_qt + (h // INV) * DK + ks[None, :], mask=rk,
                 other=0.0).to(tl.float32)
    vt = tl.load(v_ptr + b * s_vb + rows[:, None] * s_vt + h * DV + vs[None, :], mask=r_ok[:, None] & v_ok[None, :],
                 other=0.0).to(tl.float32)
    if QK_L2:
        kt = kt * (1.0 / tl.sqrt(tl.sum(kt * kt, 1) + 1e-12))[:, None]
        qt = qt * (1.0 / tl.sqrt(tl.sum(qt * qt, 1) + 1e-12))[:, None]
    if GATED:
        lg = tl.load(g_ptr + b * s_gb + rows * s_gt + h, mask=r_ok, other=0.0).to(tl.float32)
        if QWEN_GATE:
            neg_a = -tl.exp(tl.load(alog_ptr + h).to(tl.float32))
            lg = neg_a * softplus(lg + tl.load(dtb_ptr + h).to(tl.float32))
        lg = tl.where(r_ok, lg, 0.0)
    else:
        lg = tl.zeros((C,), tl.float32)
    gam = tl.cumsum(lg, 0)  # a prefix sum: γ_i, e^(γ_i)
    beta = tl.load(beta_ptr + b * s_bb + rows * s_bt + (h if BETA_PER_HEAD else 0), mask=r_ok,
                   other=0.0).to(tl.float32)
    if SIGMOID_BETA:
        beta = tl.sigmoid(beta)
    beta = tl.where(r_ok, beta, 0.0)
    i = tl.arange(0, C)[:, None]
    j = tl.arange(0, C)[None, :]
    # e^(γ_i - γ_j) on and below the diagonal, 0 above. Each exponent is summed over its own tokens, l_(j+1) + .. +
    # l_i (a product of the lower-triangular ones and the decays above the diagonal), never taken as the difference
    # of two prefix sums: those grow large under strong decays, and their difference would lose the small exponents
    # of the tokens between them (the last-row sums give the suffixes γ_C - γ_j the same way).
    span = tl.dot(tl.where(j <= i, 1.0, 0.0), tl.where(i > j, lg[:, None], 0.0), input_precision=PREC)
    dec = tl.where(i >= j, tl.exp(span), 0.0)
    kk = tl.dot(kt, tl.trans(kt), input_precision=PREC)
    a = tl.where(i > j, beta[:, None] * dec * kk, 0.0)
    # Tinv = (I + A)^-1 by block elimination, doubling the blocks: with T the inverses of the diagonal blocks of n
    # tokens and O the parts of A below them in blocks of 2n, [[T11, 0], [-T22 A21 T11, T22]] is T - T O T
    tinv = tl.where(i == j, 1.0, 0.0) - tl.where(i // 2 == j // 2, a, 0.0)
    for s in tl.static_range(1, LOG_C):
        below = (i // (2 << s) == j // (2 << s)) & (i // (1 << s) != j // (1 << s))
        tinv -= tl.dot(tl.dot(tinv, tl.where(below, a, 0.0), input_precision=SOLVE), tinv, input_precision=SOLVE)
    eg = tl.exp(gam)
    w = tl.dot(tinv, kt * (beta * eg)[:, None], input_precision=PREC)
    u = tl.dot(tinv, vt * beta[:, None], input_precision=PREC)
    qk = tl.dot(qt, tl.trans(kt), input_precision=PREC)
    p = scale * dec * qk
    g_last = tl.sum(tl.where(tl.arange(0, C) == C - 1, gam, 0.0), 0)  # γ_C (tokens past T add nothing)
    tail = tl.sum(tl.where(j == C - 1, tl.trans(span), 0.0), 1)  # γ_C - γ_j along the rows axis
    base = bh.to(tl.int64) * NC * C
    ok_k = k_ok[None, :] & (i >= 0)
    tl.store(w_ptr + (base + rows[:, None]) * DK + ks[None, :], w, mask=ok_k)
    tl.store(qg_ptr + (base + rows[:, None]) * DK + ks[None, :], qt * (scale * eg)[:, None], mask=ok_k)
    tl.store(kd_ptr + (base + rows[:, None]) * DK + ks[None, :], kt * tl.exp(tail)[:, None], mask=ok_k)
    tl.store(u_ptr + (base + rows[:, None]) * DV + vs[None, :], u, mask=v_ok[None, :] & (i >= 0))
    tl.store(p_ptr + (base + c * C + i) * C + j, p)
    tl.store(gc_ptr + bh.to(tl.int64) * NC + c, tl.exp(g_last))


@triton.jit
def _walk_kernel(w_ptr, u_ptr, qg_ptr, kd_ptr, p_ptr, gc_ptr, s_ptr, o_ptr, so_ptr, T, NC, CHUNKS, HKV, DK, DV, s_ob, s_ot,
                 SK, SV, HAS_PAST: tl.constexpr, C: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
                 PREC: tl.constexpr):
    """Program (b * HKV + h, value block): state head h of entry b, value columns ``value block * BLOCK_V ..``,
    carried through the segment's CHUNKS chunks (the scratch holds NC a head; state element (key row i, value column
    j) at ``i * SK + j * SV``)."""
    bh = tl.program_id(0)
    h = bh % HKV
    b = (bh // HKV).to(tl.int64)
    vs = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    v_ok = vs < DV
    ks = tl.arange(0, BLOCK_K)
    k_ok = ks < DK
    tile = k_ok[:, None] & v_ok[None, :]
    s_off = bh.to(tl.int64) * DK * DV + ks[:, None] * SK + vs[None, :] * SV
    if HAS_PAST:
        state = tl.load(s_ptr + s_off, mask=tile, other=0.0).to(tl.float32)
    else:
        state = tl.zeros((BLOCK_K, BLOCK_V), tl.float32)
    base = bh.to(tl.int64) * NC * C
    i = tl.arange(0, C)
    ob = o_ptr + b * s_ob + h * DV + vs[None, :]
    for c in range(CHUNKS):
        rows = base + c * C + i
        rk = (rows[:, None] >= 0) & k_ok[None, :]
        w = tl.load(w_ptr + rows[:, None] * DK + ks[None, :], mask=rk, other=0.0)
        u = tl.load(u_ptr + rows[:, None] * DV + vs[None, :], mask=(rows[:, None] >= 0) & v_ok[None, :], other=0.0)
        u = u - tl.dot(w, state, input_precision=PREC)
        qg = tl.load(qg_ptr + rows[:, None] * DK + ks[None, :], mask=rk, other=0.0)
        p = tl.load(p_ptr + rows[:, None] * C + i[None, :])
        out = tl.dot(qg, state, input_precision=PREC) + tl.dot(p, u, input_precision=PREC)
        t = c * C + i
        tl.store(ob + t[:, None] * s_ot, out.to(o_ptr.dtype.element_ty), mask=(t < T)[:, None] & v_ok[None, :])
        kd = tl.load(kd_ptr + rows[:, None] * DK + ks[None, :], mask=rk, other=0.0)
        state = tl.load(gc_ptr + bh.to(tl.int64) * NC + c) * state + tl.dot(tl.trans(kd), u, input_precision=PREC)
    tl.store(so_ptr + s_off, state.to(so_ptr.dtype.element_ty), mask=tile)


def chunked_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s: torch.Tensor, g: torch.Tensor,
                       bt: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor, out: torch.Tensor,
                       state: torch.Tensor, *, kv_heads: int, dk: int, dv: int, inv: int, kdiv: int, scale: float,
                       has_past: bool, gated: bool, beta_per_head: bool, qk_l2: bool, qwen_gate: bool,
                       sigmoid_beta: bool, v_major: bool, chunk: int, interpret: bool,
                       tiles: tuple | None = None) -> None:
    """Fill ``out`` [B, T, kv_heads * d_v] and ``state`` (from the past state ``s``, which may be ``state`` itself) by
    the chunked delta rule; the arguments as ``linear_attention`` prepares them for its walk (``g`` and ``bt`` stand
    in for missing decay and beta, ``a_log`` / ``dt_bias`` for a missing Qwen gate). ``chunk``: tokens a chunk, a
    power of two >= 16; ``tiles``: TILES's five in place of them (for benchmarks' sweeps)."""
    B, T = q.shape[:2]
    # the scratch holds float32 W, U', the gated queries and keys and P: a long prompt runs in segments of SEGMENT
    # tokens, each from the state the last one left
    span = min(T, max(chunk, SEGMENT // chunk * chunk))
    nc = cdiv(span, chunk)
    rows = B * kv_heads
    f32 = dict(dtype=torch.float32, device=q.device)
    w, qg, kd = (torch.empty((rows, nc * chunk, dk), **f32) for _ in range(3))
    u = torch.empty((rows, nc * chunk, dv), **f32)
    p = torch.empty((rows, nc, chunk, chunk), **f32)
    gc = torch.empty((rows, nc), **f32)
    block_k = max(16, next_power_of_2(dk))
    block_dv = max(16, next_power_of_2(dv))
    columns, walk_warps, stages, prepare_warps, precision = tiles if tiles is not None else TILES
    precision = precision or PRECISION.get(q.dtype, "tf32x3")
    block_v = min(block_dv, columns)
    prepare_launch = {} if interpret else {"num_warps": prepare_warps, "num_stages": 1}
    walk_launch = {} if interpret else {"num_warps": walk_warps, "num_stages": stages}
    with on_device(q, interpret):
        for start in range(0, T, span):
            qs, ks, vs, gs, bs, os_ = (x[:, start:start + span] for x in (q, k, v, g, bt, out))
            n = qs.shape[1]
            _prepare_kernel[(rows, cdiv(n, chunk))](
                qs, ks, vs, gs, bs, a_log, dt_bias, w, u, qg, kd, p, gc, n, nc, kv_heads, dk, dv, inv, kdiv,
                float(scale), qs.stride(0), qs.stride(1), ks.stride(0), ks.stride(1), vs.stride(0), vs.stride(1),
                gs.stride(0), gs.stride(1), bs.stride(0), bs.stride(1), GATED=gated, BETA_PER_HEAD=beta_per_head,
                QK_L2=qk_l2, QWEN_GATE=qwen_gate, SIGMOID_BETA=sigmoid_beta, C=chunk, BLOCK_K=block_k,
                BLOCK_V=block_dv, PREC=precision, SOLVE="ieee" if precision == "ieee" else "tf32x3",
                LOG_C=chunk.bit_length() - 1, **prepare_launch)
            _walk_kernel[(rows, cdiv(dv, block_v))](
                w, u, qg, kd, p, gc, s if start == 0 else state, os_, state, n, nc, cdiv(n, chunk), kv_heads, dk, dv,
                os_.stride(0), os_.stride(1), 1 if v_major else dv, dk if v_major else 1,
                HAS_PAST=has_past or start > 0, C=chunk, BLOCK_K=block_k, BLOCK_V=block_v, PREC=precision,
                **walk_launch)
