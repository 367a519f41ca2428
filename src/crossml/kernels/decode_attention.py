"""Triton decode step of GroupQueryAttention (one new token per sequence, static shared KV cache).

Three functions replace the ~40 torch kernels of ``group_query_attention``'s decode step:

``rotary_cache_write``
    One launch: rotates the new tokens' query and key heads (``apply_rotary`` / ``gather_cos_sin``
    of ``ops/contrib/rotary.py``: same formula, computed in float32, products rounded separately
    (no FMA contraction) so the result is bit-identical to the torch code), writes the rotated keys
    and the values into row ``write_pos[b]`` of the ``[B, Nk, L, H]`` caches and returns the
    rotated queries. The op's first prompt uses it for all of its tokens.
``decode_attention``
    ``out[b, h] = softmax(scale * q[b, h] . k[j]) v[j]`` over key rows ``j <= total_len[b] - 1``
    (and ``j > total_len[b] - 1 - local_window`` with a window), key head ``h // (N // Nk)``; with
    ``softcap > 0`` the scores are ``softcap * tanh(scale * q . k / softcap)`` (Gemma-2), tanh built from
    ``exp2`` (no tanh in Triton's language, and the same code in its interpreter). One
    program holds all query heads of a KV head (padded to a 16-row ``tl.dot`` tile), so each key
    and value row is read once per group. Online softmax in float32 over ``BLOCK_L``-row chunks.
    Each program requests its first key/value chunk as soon as it knows the length, before the new token's
    rotation (whose cos/sin rows wait for its position), and each next chunk one ahead of its use: on an H200
    that took a Qwen2.5-0.5B int4 decode step from 0.541 to 0.490 ms and a Llama-3.2-1B int4 one from 0.551 to
    0.517 ms (back-to-back replays, one machine; the fp16 steps moved by less than their noise).
    When ``B * Nk`` programs cannot fill the GPU the key range is split (flash-decoding): each
    split writes a partial result and its log-sum-exp, and a second kernel combines them, so the
    call is one launch or two (one with clusters, below). (Combining in the last split to arrive, counted with an
    atomic, was measured slower on an H200: the arrival's fence and round trip cost more than a launch. So were fewer
    splits, in the GenAI benchmark's captured decode steps: half, a quarter, or one split and no combine
    launch took Qwen2.5-0.5B fp16 from 0.575-0.592 to 0.604-0.616, 0.629-0.645 and 0.781 ms; twice as many
    changed nothing. On an H100, 1 or 4 programs per SM instead of 2 (``SPLIT_PROGRAMS_PER_UNIT``) left every fp16 and
    int4 decode step of both benchmark models within the rounds' drift: results/decode_tiles.md, run 17.)

    On NVIDIA GPUs with thread-block clusters (compute capability 9.x and 10.x), with 2 to 16 splits, the splits of
    one KV head run as one cluster of up to 16 programs instead (``launch_clustered``; the splits padded to a power of
    two): each stores its partial result, all meet at the cluster barrier, and each combines its share of the head
    dimension (``_cluster_combine``), so the combine launch goes. A cluster starts only when one GPU processing
    cluster has room for all of its programs at once, so the attention starts later beside the product before it
    and its early key loads overlap less (after Qwen2.5-0.5B's fp16 GEMV 0.9 instead of 2.1 us before the product's
    end). The rule (``_cluster_size``) therefore takes clusters after a 4-bit QKV product (``CLUSTER_AFTER``) or
    with 4 clusters or more (``CLUSTER_MIN``: batch entries x KV heads), which leaves the one-row Qwen2.5-0.5B fp16
    step, 2 clusters after the fp16 GEMV, to the combine kernel: with clusters it took 0.606-0.627 ms against
    0.597-0.604. In the GenAI benchmark's captured decode steps on an H100 (``decode_replay.py --variants
    cols,set:crossml.kernels.decode_attention.CLUSTER_COMBINE=False``, alternated rounds; results/cluster_combine.md)
    the rule took Qwen2.5-0.5B int4 from 0.469 to 0.461-0.464 ms, Llama-3.2-1B int4 from 0.542-0.543 to 0.532-0.534
    and Llama-3.2-1B fp16 from 1.051-1.052 to 1.048-1.051; on an H200 Qwen2.5-0.5B int4 from 0.456-0.458 to
    0.445-0.447 and Llama-3.2-1B int4 from 0.500-0.502 to 0.491-0.492, Llama-3.2-1B fp16 0.827-0.829 -> 0.830-0.831.
    Batched (``genai_batch.py``, prompt 128, clusters always against never) Qwen2.5-0.5B fp16 gained 1-3 % from 2
    rows on the H200 and from 4 on the H100, int4 1-2.5 % at most rows of both models on both GPUs; Llama-3.2-1B fp16
    moved by -0.9 to +0.8 %. Clusters of 8 or 4 programs (fewer splits, each over more keys) were slower on every
    step, and so was handing the partial results over in the programs' shared memory (``mapa`` /
    ``st.shared::cluster``) instead of L2, both with 5 KB more shared memory a program, which delayed the start
    further (H100, Llama-3.2-1B int4 0.562-0.564 ms), and reusing Triton's scratch bytes between two cluster
    barriers (H200: Qwen2.5-0.5B int4 0.458-0.461, Llama-3.2-1B fp16 0.850-0.856 ms; commit ccab888 holds it).
``combine_product``
    With ``rotary_decode_attention(..., partials=True)`` the split step hands back its partial results instead
    of launching the combine kernel; this one launch combines them and multiplies them with the output
    projection's rows (each program some heads' rows, 128 output columns, its weight tile loaded before the PDL
    wait), writing split-K partial sums over groups of heads that ``crossml.kernels.gemv.partials_skip_norm`` (the
    skip-norm kernel of ``gemv_skip_norm``) adds: the combine kernel and the projection's GEMV become one launch
    (graph rule AttentionSkipNorm, ``crossml.ops.fused.attention_skip_norm``, for one batch row: each program loads
    its weight tile for each row, and batched steps from 4 rows were slower). In the GenAI benchmark's captured
    fp16 decode steps, alternated with the rule off (results/attention_product.md): Qwen2.5-0.5B 0.597-0.603 ->
    0.582 ms on an H100 and 0.512-0.537 -> 0.501-0.513 on an H200, Llama-3.2-1B 1.049-1.052 -> 1.044-1.045 and
    0.828-0.833 -> 0.818-0.821 ms. With the weight row-major (its rows' 256-byte runs) Llama-3.2-1B's step was
    slower instead (0.826-0.832 -> 0.858-0.862 ms, H200), so plans store it column-major as for the GEMV; 64 or 256
    columns a program were slower too.
``rotary_decode_attention``
    The op's decode step: the two above with one launch less. The attention programs rotate their
    own query heads, take the new key and value from registers for the new row, and one program per
    KV head writes them to the caches. (Handing it the QKV product's split-K partial sums instead, so that
    the programs add the ones they read and the product's reduce launch goes, was measured slower on an H200:
    each key-range split re-adds its heads' sums, and the fp16 decode replays went from 0.645 to 0.673 ms
    (Qwen2.5-0.5B) and from 0.893 to 0.915 ms (Llama-3.2-1B), alternating with the unfused step in one call.)

Lengths and positions stay device tensors; nothing syncs with the host, so the step can be captured
in a CUDA graph. ``*_reference`` are the torch definitions the tests compare against. Under
TRITON_INTERPRET=1 the kernels run in Triton's interpreter (see ``_launch``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from crossml.kernels._launch import (
    GRID_YZ_MAX,
    cdiv,
    cluster_barrier,
    cluster_capable,
    launch_clustered,
    next_power_of_2,
    on_device,
    pdl,
    pdl_wait,
    processors,
    use_interpreter,
)

__all__ = ["SUPPORTED_DTYPES", "combine_partials", "combine_product", "decode_attention",
           "decode_attention_reference", "evict_rows", "rotary_cache_write", "rotary_cache_write_reference",
           "rotary_decode_attention", "rotary_decode_attention_reference", "supported_head_size"]

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_LOG2E = 1.4426950408889634
_LOG2E_C = tl.constexpr(_LOG2E)
#: most query heads one attention program holds (more heads per KV head: several programs)
_MAX_BLOCK_G = 64
#: most key-range splits of one (batch entry, KV head)
_MAX_SPLITS = 64
#: programs per compute unit the key range is split to reach (``_num_splits``)
SPLIT_PROGRAMS_PER_UNIT = 2
#: combine the key-range splits inside the attention launch, its programs grouped in thread-block clusters
#: (``_cluster_size``): None by the rule (after the products of CLUSTER_AFTER, or with CLUSTER_MIN clusters or
#: more), True always, False never (the second kernel)
CLUSTER_COMBINE: bool | None = None
#: op types of the products (the QKV projection) after which the splits are combined in clusters
CLUSTER_AFTER = frozenset({"MatMulNBits", "NormMatMulNBits"})
#: clusters (batch entries x KV heads x head blocks) from which they combine the splits after any product
CLUSTER_MIN = 4
#: most splits combined in one cluster (16: a non-portable cluster size, which H100, H200 and B200 run)
_MAX_CLUSTER = 16
#: programs of one cluster at most: fewer splits, each over more of the key range
CLUSTER_SPLITS = 16


def supported_head_size(h: int) -> bool:
    """Head sizes the kernels take: 16..512 (tiles are padded to a power of two; 512: Gemma 4's global layers, whose
    decode steps ran PyTorch's memory-efficient attention, 77 µs a layer in a Gemma-4-shaped H200 step)."""
    return 16 <= h <= 512


# ---------------------------------------------------------------------------------------------- rotary + cache write


@triton.jit
def _rotate(x_ptr, s_xh, s_xd, n_heads, cos_row, sin_row, s_cd, s_sd, HEAD_DIM, HALF, ROTARY: tl.constexpr,
            INTERLEAVED: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """Rows ``0 .. n_heads`` of one token's heads in float32 ``[BLOCK_H, BLOCK_D]``, the first ``2 * HALF``
    channels rotated as ``apply_rotary`` does; also the in-bounds mask."""
    d = tl.arange(0, BLOCK_D)
    h = tl.arange(0, BLOCK_H)
    ok = (h < n_heads)[:, None] & (d < HEAD_DIM)[None, :]
    rows = x_ptr + h.to(tl.int64)[:, None] * s_xh
    x = tl.load(rows + d[None, :] * s_xd, mask=ok, other=0.0).to(tl.float32)
    if ROTARY:
        in_rot = d < 2 * HALF
        if INTERLEAVED:  # pairs (2i, 2i + 1) share angle i
            ci = d // 2
            partner = d ^ 1
            first = (d % 2) == 0
        else:  # halves: channel i pairs with i + HALF
            first = d < HALF
            ci = tl.where(first, d, d - HALF)
            partner = tl.where(first, d + HALF, d - HALF)
        c = tl.load(cos_row + ci * s_cd, mask=in_rot, other=0.0).to(tl.float32)[None, :]
        s = tl.load(sin_row + ci * s_sd, mask=in_rot, other=0.0).to(tl.float32)[None, :]
        xp = tl.load(rows + partner[None, :] * s_xd, mask=ok & in_rot[None, :], other=0.0).to(tl.float32)
        # torch: first x1*c - x2*s, second x1*s + x2*c (x1 the first of the pair); fp add commutes
        y = tl.where(first[None, :], x * c - xp * s, xp * s + x * c)
        x = tl.where(in_rot[None, :], y, x)
    return x, ok


@triton.jit
def _cos_sin_rows(cos_ptr, sin_ptr, at_ptr, MAX_POS, s_cp, s_sp, ROTARY: tl.constexpr):
    """The cos/sin cache rows of the position at ``at_ptr``, clamped to ``0 .. MAX_POS-1`` as gather_cos_sin
    clamps (the caches' first rows, unread, without ROTARY)."""
    cos_row = cos_ptr
    sin_row = sin_ptr
    if ROTARY:
        at = tl.load(at_ptr).to(tl.int64)
        at = tl.minimum(tl.maximum(at, 0), MAX_POS - 1)
        cos_row = cos_ptr + at * s_cp
        sin_row = sin_ptr + at * s_sp
    return cos_row, sin_row


@triton.jit
def _rotary_cache_kernel(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, pos_ptr, kc_ptr, vc_ptr, wpos_ptr, qo_ptr,
                         N, NK, Q_BLOCKS, L, MAX_POS, HEAD_DIM, HALF, TOKENS,
                         s_qb, s_qh, s_qd, s_kb, s_kh, s_kd, s_vb, s_vh, s_vd, s_cp, s_cd, s_sp, s_sd,
                         s_kcb, s_kch, s_kcl, s_kcd, s_vcb, s_vch, s_vcl, s_vcd, s_ob, s_oh, s_od,
                         ROTARY: tl.constexpr, INTERLEAVED: tl.constexpr, BLOCK_H: tl.constexpr,
                         BLOCK_D: tl.constexpr):
    """Program (block, b): blocks ``0 .. Q_BLOCKS`` rotate BLOCK_H query heads of token b each, the rest rotate
    BLOCK_H key heads and write them and their values into the caches of batch entry b // TOKENS."""
    blk = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    d = tl.arange(0, BLOCK_D)[None, :]
    cos_row, sin_row = _cos_sin_rows(cos_ptr, sin_ptr, pos_ptr + b, MAX_POS, s_cp, s_sp, ROTARY)
    if blk < Q_BLOCKS:
        h0 = blk * BLOCK_H
        y, ok = _rotate(q_ptr + b * s_qb + h0.to(tl.int64) * s_qh, s_qh, s_qd, N - h0, cos_row, sin_row, s_cd, s_sd,
                        HEAD_DIM, HALF, ROTARY, INTERLEAVED, BLOCK_H, BLOCK_D)
        h = (h0 + tl.arange(0, BLOCK_H)).to(tl.int64)[:, None]
        tl.store(qo_ptr + b * s_ob + h * s_oh + d * s_od, y.to(qo_ptr.dtype.element_ty), mask=ok)
    else:
        h0 = (blk - Q_BLOCKS) * BLOCK_H
        row = tl.load(wpos_ptr + b).to(tl.int64)
        row = tl.minimum(tl.maximum(row, 0), L - 1)
        y, ok = _rotate(k_ptr + b * s_kb + h0.to(tl.int64) * s_kh, s_kh, s_kd, NK - h0, cos_row, sin_row, s_cd, s_sd,
                        HEAD_DIM, HALF, ROTARY, INTERLEAVED, BLOCK_H, BLOCK_D)
        h = (h0 + tl.arange(0, BLOCK_H)).to(tl.int64)[:, None]
        cb = b // TOKENS
        tl.store(kc_ptr + cb * s_kcb + h * s_kch + row * s_kcl + d * s_kcd, y.to(kc_ptr.dtype.element_ty), mask=ok)
        val = tl.load(v_ptr + b * s_vb + h * s_vh + d * s_vd, mask=ok, other=0.0)
        tl.store(vc_ptr + cb * s_vcb + h * s_vch + row * s_vcl + d * s_vcd, val.to(vc_ptr.dtype.element_ty), mask=ok)


def _rotary_half(cos_cache: torch.Tensor | None, sin_cache: torch.Tensor | None, pos: torch.Tensor | None, H: int,
                 what: str) -> int:
    """Check a do_rotary call's cos/sin caches ``[max_pos, rot/2]`` (rot <= H) and positions; returns rot/2."""
    if cos_cache is None or sin_cache is None or pos is None:
        raise ValueError(f"{what}: do_rotary needs cos_cache, sin_cache and pos")
    half = cos_cache.shape[1]
    if 2 * half > H or sin_cache.shape != cos_cache.shape:
        raise ValueError(f"{what}: cos/sin caches {tuple(cos_cache.shape)} / {tuple(sin_cache.shape)} need equal "
                         f"shapes [max_pos, rot/2] with rot <= {H}")
    return half


def rotary_cache_write(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos_cache: torch.Tensor | None,
                       sin_cache: torch.Tensor | None, pos: torch.Tensor | None, k_cache: torch.Tensor,
                       v_cache: torch.Tensor, write_pos: torch.Tensor, interleaved: bool,
                       do_rotary: bool, tokens: int = 1) -> torch.Tensor:
    """Rotate ``q [R, N, H]`` and ``k [R, Nk, H]`` (R = B * tokens new tokens, ``tokens`` per batch entry) at
    positions ``pos [R]``, write ``k`` and ``v`` of token r into row ``write_pos[r]`` (clamped to ``0 .. L-1``)
    of batch entry ``r // tokens`` of ``k_cache`` / ``v_cache [B, Nk, L, H]``; return the rotated queries as a
    new ``[R, N, H]`` tensor (``q`` itself when ``do_rotary`` is false). A decode step has one token per
    entry; a prompt passes its [B, S] tokens flattened.

    ``cos_cache`` / ``sin_cache`` are ``[max_pos, rot/2]``; positions are clamped to ``0 .. max_pos-1`` and
    channels past ``rot`` pass through, as in ``gather_cos_sin`` / ``apply_rotary``. All operands are read
    and written through their strides (the split views of a packed QKV need no copy).
    """
    B, N, H = q.shape  # B: tokens (batch entries x tokens)
    Nk, L = k_cache.shape[1], k_cache.shape[2]
    if tokens < 1 or B % tokens or k.shape != (B, Nk, H) or v.shape != (B, Nk, H) or \
            k_cache.shape != (B // tokens, Nk, L, H) or v_cache.shape != k_cache.shape:
        raise ValueError(f"rotary_cache_write: shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
                         f"caches {tuple(k_cache.shape)} / {tuple(v_cache.shape)} do not match [R, N|Nk, H] with "
                         f"R = {tokens} tokens x the caches' [R / {tokens}, Nk, L, H]")
    if do_rotary:
        half = _rotary_half(cos_cache, sin_cache, pos, H, "rotary_cache_write")
        q_out = torch.empty((B, N, H), dtype=q.dtype, device=q.device)
        cos, sin, p = cos_cache, sin_cache, pos
        max_pos, s_c, s_s = cos_cache.shape[0], cos_cache.stride(), sin_cache.stride()
    else:
        half, q_out, cos, sin, p = 0, q, k_cache, k_cache, write_pos
        max_pos, s_c, s_s = 1, (0, 0), (0, 0)
    if B == 0 or N + Nk == 0:
        return q_out
    block_d = next_power_of_2(H)
    block_h = max(1, min(16, 2048 // block_d, next_power_of_2(max(N, Nk))))  # about 2K elements a program
    q_blocks = cdiv(N, block_h) if do_rotary else 0
    grid = (q_blocks + cdiv(Nk, block_h), B)
    if B > GRID_YZ_MAX:
        raise ValueError(f"rotary_cache_write: {B} tokens in one call; at most {GRID_YZ_MAX}")
    args = (q, k, v, cos, sin, p, k_cache, v_cache, write_pos, q_out, N, Nk, q_blocks, L, max_pos, H, half, tokens,
            *q.stride(), *k.stride(), *v.stride(), *s_c, *s_s, *k_cache.stride(), *v_cache.stride(), *q_out.stride())
    meta = {"ROTARY": bool(do_rotary), "INTERLEAVED": bool(interleaved), "BLOCK_H": block_h, "BLOCK_D": block_d}
    interp = use_interpreter(q, "GroupQueryAttention rotary/cache write")
    with on_device(q, interp):
        # no FMA contraction: x*c - xp*s rounds each product like torch does
        _rotary_cache_kernel[grid](*args, **meta, num_warps=4 if block_h * block_d >= 1024 else 2,
                                   enable_fp_fusion=False)
    return q_out


def rotary_cache_write_reference(q, k, v, cos_cache, sin_cache, pos, k_cache, v_cache, write_pos, interleaved,
                                 do_rotary, tokens=1):
    """What ``rotary_cache_write`` computes, with the torch helpers GroupQueryAttention uses (in place on the caches)."""
    from crossml.ops.contrib.rotary import apply_rotary, gather_cos_sin

    B = q.shape[0]
    if do_rotary:
        cos, sin = gather_cos_sin(cos_cache, sin_cache, pos.reshape(B, 1))
        q = apply_rotary(q.unsqueeze(1), cos, sin, bool(interleaved)).squeeze(1)
        k = apply_rotary(k.unsqueeze(1), cos, sin, bool(interleaved)).squeeze(1)
    rows = write_pos.long().clamp(0, k_cache.shape[2] - 1)
    for b in range(B):
        k_cache[b // tokens, :, rows[b]] = k[b].to(k_cache.dtype)
        v_cache[b // tokens, :, rows[b]] = v[b].to(v_cache.dtype)
    return q


# ---------------------------------------------------------------------------------------------- attention


@triton.jit
def _softcap(s, softcap):
    """``softcap * tanh(x / softcap)`` of the scores ``s = x * LOG2E`` (log2 units), in log2 units. tanh from
    ``e = exp(-2 |x| / softcap) = exp2(-2 |s| / softcap)`` in (0, 1] as ``sign(x) (1 - e) / (1 + e)``: no
    overflow, +-1 for large |x|."""
    e = tl.exp2(-2.0 * tl.abs(s) / softcap)
    t = (1.0 - e) / (1.0 + e)
    return tl.where(s < 0.0, -t, t) * (softcap * _LOG2E_C)


@triton.jit
def _decode_attn_kernel(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, pos_ptr, kc_ptr, vc_ptr, len_ptr, o_ptr, mo_ptr,
                        ml_ptr, sink_ptr,
                        NK, HB, G, L, MAX_POS, HEAD_DIM, HALF, LEN_OFFSET, WINDOW, qk_scale, softcap,
                        s_qb, s_qh, s_qd, s_kb, s_kh, s_kd, s_vb, s_vh, s_vd, s_cp, s_cd, s_sp, s_sd,
                        s_kcb, s_kch, s_kcl, s_kcd, s_vcb, s_vch, s_vcl, s_vcd, s_ob, s_oh, s_od,
                        s_mb, s_mh, s_ms, s_lb, s_lh,
                        NEW: tl.constexpr, ROTARY: tl.constexpr, INTERLEAVED: tl.constexpr, SPLIT: tl.constexpr,
                        SOFTCAP: tl.constexpr, SINK: tl.constexpr, DOT_FP32: tl.constexpr, PRECISION: tl.constexpr, BLOCK_G: tl.constexpr,
                        BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr, EARLY: tl.constexpr = False,
                        CLUSTER: tl.constexpr = 0, PDL: tl.constexpr = False):
    """Program (b * NK * HB + kv_head * HB + head block, split): BLOCK_G query heads of one KV head over
    split ``program_id(1)`` of batch entry b's key range.

    NEW: the step's own token is part of the launch. Its query heads are rotated here (ROTARY), and its key
    (rotated) and value go to cache row ``w = clamp(len[b], 0, L - 1)``, written by the (split 0, head block
    0) program of each KV head; every program reads row w from its registers, never from the cache, so no
    program waits for that write. SPLIT: each split stores its partial output and log-sum-exp for
    ``_combine_kernel``. SOFTCAP: the scores are capped (``_softcap``) before the mask. SINK: each head's
    ``sink_ptr[h]`` is one more logit in its softmax denominator (attention sinks), which split 0 starts from: its
    running max is the sink and its denominator 1, so the combine counts the sink once.

    EARLY (with NEW; ignored without): the lengths, positions, cos/sin rows and the first key/value chunk are read
    before the PDL wait, which then guards only the new token's q, k and v (``rotary_decode_attention``'s
    ``early``).

    CLUSTER (with SPLIT; a launch by ``launch_clustered``): the grid is one-dimensional, CLUSTER consecutive
    programs the CLUSTER splits of one (entry, KV head, head block), launched as one thread-block cluster. The
    programs store their partial results, meet at the cluster's barrier, and each combines a 1 / CLUSTER share of
    the head dimension for the block's heads (``_cluster_combine``): no second launch."""
    if not (EARLY and NEW):
        pdl_wait(PDL)
    if CLUSTER > 0:
        pid = tl.program_id(0) // CLUSTER
        split = tl.program_id(0) % CLUSTER
        num_splits = CLUSTER
    else:
        pid = tl.program_id(0)
        split = tl.program_id(1)
        num_splits = tl.num_programs(1)
    hb = pid % HB
    kvh = (pid // HB) % NK
    b = (pid // (HB * NK)).to(tl.int64)
    # key rows lo .. hi of entry b: j <= last (j < L), and j > last - WINDOW with a window
    length = tl.load(len_ptr + b).to(tl.int32)
    last = length + LEN_OFFSET - 1
    hi = tl.minimum(last + 1, L)
    lo = tl.where(WINDOW > 0, tl.maximum(last - WINDOW + 1, 0), 0)
    n_blocks = tl.cdiv(tl.maximum(hi - lo, 0), BLOCK_L)
    per_split = tl.cdiv(n_blocks, num_splits)
    start = lo + split * per_split * BLOCK_L
    end = tl.minimum(start + per_split * BLOCK_L, hi)

    g0 = hb * BLOCK_G
    g = g0 + tl.arange(0, BLOCK_G)
    g_ok = g < G
    heads = (kvh * G + tl.minimum(g, G - 1)).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    k_base = kc_ptr + b * s_kcb + kvh.to(tl.int64) * s_kch + d[None, :] * s_kcd
    v_base = vc_ptr + b * s_vcb + kvh.to(tl.int64) * s_vch + d[None, :] * s_vcd
    # the first key/value chunk is requested before the new token's rotation (whose cos/sin rows wait for its
    # position), each next one a chunk ahead of its use: the chunk loads need only the length
    j = start + tl.arange(0, BLOCK_L)
    kv_ok = (j < end)[:, None] & d_ok[None, :]
    kt_nxt = tl.load(k_base + j.to(tl.int64)[:, None] * s_kcl, mask=kv_ok, other=0.0)
    vt_nxt = tl.load(v_base + j.to(tl.int64)[:, None] * s_vcl, mask=kv_ok, other=0.0)
    if NEW:
        cos_row, sin_row = _cos_sin_rows(cos_ptr, sin_ptr, pos_ptr + b, MAX_POS, s_cp, s_sp, ROTARY)
        if EARLY:
            pdl_wait(PDL)
        # rounded to q's dtype, as rotary_cache_write stores the rotated queries
        qf, _ = _rotate(q_ptr + b * s_qb + (kvh * G + g0).to(tl.int64) * s_qh, s_qh, s_qd, G - g0, cos_row, sin_row,
                        s_cd, s_sd, HEAD_DIM, HALF, ROTARY, INTERLEAVED, BLOCK_G, BLOCK_D)
        q = qf.to(q_ptr.dtype.element_ty)
        kn, kn_ok = _rotate(k_ptr + b * s_kb + kvh.to(tl.int64) * s_kh, s_kh, s_kd, 1, cos_row, sin_row, s_cd, s_sd,
                            HEAD_DIM, HALF, ROTARY, INTERLEAVED, 1, BLOCK_D)  # [1, BLOCK_D]
        kn = kn.to(kc_ptr.dtype.element_ty)
        vn = tl.load(v_ptr + b * s_vb + kvh.to(tl.int64) * s_vh + d[None, :] * s_vd, mask=kn_ok,
                     other=0.0).to(vc_ptr.dtype.element_ty)
        w_row = tl.minimum(tl.maximum(length, 0), L - 1)
        if (split == 0) & (hb == 0):
            tl.store(k_base + w_row.to(tl.int64) * s_kcl, kn, mask=kn_ok)
            tl.store(v_base + w_row.to(tl.int64) * s_vcl, vn, mask=kn_ok)
    else:
        q = tl.load(q_ptr + b * s_qb + heads[:, None] * s_qh + d[None, :] * s_qd, mask=d_ok[None, :], other=0.0)
    if DOT_FP32:
        q = q.to(tl.float32)

    m = tl.full((BLOCK_G,), float("-inf"), tl.float32)
    den = tl.zeros((BLOCK_G,), tl.float32)
    if SINK:
        if split == 0:
            m = tl.load(sink_ptr + heads).to(tl.float32) * _LOG2E_C
            den = tl.full((BLOCK_G,), 1.0, tl.float32)
    acc = tl.zeros((BLOCK_G, BLOCK_D), tl.float32)
    # every chunk holds at least one allowed key, so the running max is finite after the first
    for j0 in range(start, end, BLOCK_L):
        j = j0 + tl.arange(0, BLOCK_L)
        j_ok = j < end
        kt = kt_nxt
        vt = vt_nxt
        rows = (j + BLOCK_L).to(tl.int64)[:, None]
        kv_ok = (j + BLOCK_L < end)[:, None] & d_ok[None, :]
        kt_nxt = tl.load(k_base + rows * s_kcl, mask=kv_ok, other=0.0)
        vt_nxt = tl.load(v_base + rows * s_vcl, mask=kv_ok, other=0.0)
        if NEW:
            mine = (j == w_row)[:, None]
            kt = tl.where(mine, kn, kt)
            vt = tl.where(mine, vn, vt)
        if DOT_FP32:
            kt = kt.to(tl.float32)
            vt = vt.to(tl.float32)
        s = tl.dot(q, tl.trans(kt), input_precision=PRECISION) * qk_scale  # log2 units
        if SOFTCAP:
            s = _softcap(s, softcap)
        s = tl.where(j_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        den = den * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt, input_precision=PRECISION)
        m = m_new

    has = den > 0.0
    out = acc / tl.where(has, den, 1.0)[:, None]
    if SPLIT:
        tl.store(mo_ptr + b * s_mb + heads[:, None] * s_mh + split * s_ms + d[None, :], out,
                 mask=g_ok[:, None] & d_ok[None, :])
        lse = tl.where(has, m + tl.log2(tl.where(has, den, 1.0)), float("-inf"))
        tl.store(ml_ptr + b * s_lb + heads * s_lh + split, lse, mask=g_ok)
        if CLUSTER > 0:
            cluster_barrier()
            _cluster_combine(mo_ptr, ml_ptr, o_ptr, b, heads, g_ok, split, HEAD_DIM, s_mb, s_mh, s_ms, s_lb, s_lh,
                             s_ob, s_oh, s_od, CLUSTER, BLOCK_G, BLOCK_D)
    else:
        tl.store(o_ptr + b * s_ob + heads[:, None] * s_oh + d[None, :] * s_od, out.to(o_ptr.dtype.element_ty),
                 mask=g_ok[:, None] & d_ok[None, :])


@triton.jit
def _split_weights(lse):
    """The weights of the key-range splits' partial outputs in their log-sum-exp weighted mean, ``lse`` their
    base-2 log-sum-exps along axis 0 (the split): ``exp2(lse - max)`` (the max taken as 0 where every split is
    empty, -inf), and their sum over the splits (1 where it is 0), which the weighted sum is divided by."""
    mx = tl.max(lse, 0, keep_dims=True)
    mx = tl.where(mx == float("-inf"), 0.0, mx)
    w = tl.exp2(lse - mx)
    total = tl.sum(w, 0)
    return w, tl.where(total > 0.0, total, 1.0)


@triton.jit
def _cluster_combine(mo_ptr, ml_ptr, o_ptr, b, heads, g_ok, rank, HEAD_DIM, s_mb, s_mh, s_ms, s_lb, s_lh, s_ob, s_oh,
                     s_od, CLUSTER: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr):
    """``_combine_kernel``'s log-sum-exp weighted mean of the CLUSTER splits' partial outputs, for channels
    ``rank * BLOCK_D / CLUSTER ..`` of the heads ``heads``, past the cluster barrier that made the partials visible
    (read from L2, ``.cg``)."""
    s = tl.arange(0, CLUSTER)
    d = rank * (BLOCK_D // CLUSTER) + tl.arange(0, BLOCK_D // CLUSTER)
    d_ok = d < HEAD_DIM
    lse = tl.load(ml_ptr + b * s_lb + heads[None, :] * s_lh + s[:, None], mask=g_ok[None, :], other=float("-inf"),
                  cache_modifier=".cg")  # [CLUSTER, BLOCK_G]
    w, total = _split_weights(lse)
    ok = g_ok[None, :, None] & d_ok[None, None, :]
    part = tl.load(mo_ptr + b * s_mb + heads[None, :, None] * s_mh + s[:, None, None] * s_ms + d[None, None, :],
                   mask=ok, other=0.0, cache_modifier=".cg")  # [CLUSTER, BLOCK_G, BLOCK_D / CLUSTER]
    out = tl.sum(part * w[:, :, None], 0) / total[:, None]
    tl.store(o_ptr + b * s_ob + heads[:, None] * s_oh + d[None, :] * s_od, out.to(o_ptr.dtype.element_ty),
             mask=g_ok[:, None] & d_ok[None, :])


@triton.jit
def _combine_kernel(mo_ptr, ml_ptr, o_ptr, N, NUM_SPLITS, HEAD_DIM, s_mb, s_mh, s_ms, s_lb, s_lh, s_ob, s_oh, s_od,
                    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = False):
    """Program (b * N + h): the log-sum-exp weighted mean of the splits' partial outputs."""
    pdl_wait(PDL)
    pid = tl.program_id(0)
    h = (pid % N).to(tl.int64)
    b = (pid // N).to(tl.int64)
    sp = tl.arange(0, BLOCK_S)
    sp_ok = sp < NUM_SPLITS
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    lse = tl.load(ml_ptr + b * s_lb + h * s_lh + sp, mask=sp_ok, other=float("-inf"))
    w, total = _split_weights(lse)
    part = tl.load(mo_ptr + b * s_mb + h * s_mh + sp[:, None] * s_ms + d[None, :],
                   mask=sp_ok[:, None] & d_ok[None, :], other=0.0)
    out = tl.sum(part * w[:, None], 0) / total
    tl.store(o_ptr + b * s_ob + h * s_oh + d * s_od, out.to(o_ptr.dtype.element_ty), mask=d_ok)


@triton.jit
def _combine_product_kernel(mo_ptr, ml_ptr, w_ptr, ws_ptr, N, NUM_SPLITS, HEAD_DIM, NOUT, MN,
                            s_mb, s_mh, s_ms, s_lb, s_lh, s_wk, s_wn,
                            HP: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                            PDL: tl.constexpr = False):
    """Program (b * cdiv(N, HP) + p, n block): combine the splits of query heads ``p * HP ..`` of entry b as
    ``_combine_kernel`` does (rounded to the weight's dtype, the attention output's), and multiply them with their
    rows of the output projection ``w [N * HEAD_DIM, NOUT]`` (K = head * HEAD_DIM + channel, any strides): float32
    partial sums over those K rows for columns ``n block * BLOCK_N ..``, stored to ``ws [cdiv(N, HP), B, NOUT]`` (the
    split-K workspace of ``crossml.kernels.gemv``'s skip-norm kernel). The weight rows, a constant, are loaded before
    the PDL wait. Row r of the program's [HP * BLOCK_D] activations is channel r % BLOCK_D of head r // BLOCK_D."""
    pid = tl.program_id(0)
    groups = tl.cdiv(N, HP)
    p = pid % groups
    b = (pid // groups).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < NOUT
    r = tl.arange(0, HP * BLOCK_D)
    h = p * HP + r // BLOCK_D
    d = r % BLOCK_D
    r_ok = (h < N) & (d < HEAD_DIM)
    k = (h * HEAD_DIM + d).to(tl.int64)
    w = tl.load(w_ptr + k[:, None] * s_wk + n[None, :] * s_wn, mask=r_ok[:, None] & n_ok[None, :], other=0.0)
    pdl_wait(PDL)
    sp = tl.arange(0, BLOCK_S)
    ok = (sp < NUM_SPLITS)[:, None] & r_ok[None, :]
    hh = tl.minimum(h, N - 1).to(tl.int64)
    lse = tl.load(ml_ptr + b * s_lb + hh[None, :] * s_lh + sp[:, None], mask=ok, other=float("-inf"))
    part = tl.load(mo_ptr + b * s_mb + hh[None, :] * s_mh + sp[:, None] * s_ms + d[None, :], mask=ok, other=0.0)
    wt, total = _split_weights(lse)
    o = tl.sum(part * wt, 0) / total
    o = tl.where(r_ok, o.to(w_ptr.dtype.element_ty).to(tl.float32), 0.0)
    acc = tl.sum(o[:, None] * w.to(tl.float32), 0)
    tl.store(ws_ptr + p.to(tl.int64) * MN + b * NOUT + n, acc, mask=n_ok)


def combine_product(parts: tuple[torch.Tensor, torch.Tensor], w: torch.Tensor, heads_per_program: int = 4,
                    block_n: int = 128) -> torch.Tensor:
    """The split decode attention's partial results ``parts`` (``rotary_decode_attention(..., partials=True)``:
    ``mid_o [B, N, S, H]`` float32 and ``mid_l [B, N, S]``) combined and multiplied with the output projection
    ``w [N * H, NOUT]`` (any strides): float32 partial sums ``[cdiv(N, heads_per_program), B, NOUT]`` over
    ``heads_per_program`` heads' rows of w each, for ``crossml.kernels.gemv.partials_skip_norm``. One launch
    replaces the combine kernel and the projection's GEMV."""
    mid_o, mid_l = parts
    B, N, S, H = mid_o.shape
    K, NOUT = w.shape
    if K != N * H:
        raise ValueError(f"combine_product: w {tuple(w.shape)} needs {N} heads x {H} = {N * H} rows")
    groups = cdiv(N, heads_per_program)
    ws = torch.empty((groups, B, NOUT), dtype=torch.float32, device=mid_o.device)
    interp = use_interpreter(mid_o, "combine_product")
    with on_device(mid_o, interp):
        _combine_product_kernel[(B * groups, cdiv(NOUT, block_n))](
            mid_o, mid_l, w, ws, N, S, H, NOUT, B * NOUT, mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
            mid_l.stride(0), mid_l.stride(1), w.stride(0), w.stride(1), HP=heads_per_program,
            BLOCK_S=next_power_of_2(S), BLOCK_D=max(16, next_power_of_2(H)), BLOCK_N=block_n,
            num_warps=4, **pdl(mid_o))
    return ws


def _combine_into(parts: tuple[torch.Tensor, torch.Tensor], out: torch.Tensor) -> None:
    """Launch ``_combine_kernel``: the splits' partial results ``parts`` (``mid_o [B, N, S, H]``, ``mid_l [B, N, S]``)
    combined into ``out [B, N, H]`` (the caller's device context)."""
    mid_o, mid_l = parts
    B, N, S, H = mid_o.shape
    _combine_kernel[(B * N,)](mid_o, mid_l, out, N, S, H, mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
                              mid_l.stride(0), mid_l.stride(1), *out.stride(), BLOCK_S=next_power_of_2(S),
                              BLOCK_D=max(16, next_power_of_2(H)), num_warps=4, **pdl(mid_o))


def combine_partials(parts: tuple[torch.Tensor, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """The attention output ``[B, N, H]`` in ``dtype`` of ``rotary_decode_attention(..., partials=True)``'s partial
    results (what its combine kernel launch would have made)."""
    B, N, _, H = parts[0].shape
    out = torch.empty((B, N, H), dtype=dtype, device=parts[0].device)
    if out.numel() == 0:
        return out
    with on_device(parts[0], use_interpreter(parts[0], "combine_partials")):
        _combine_into(parts, out)
    return out


def _num_splits(t: torch.Tensor, programs: int, L: int, block_l: int, interp: bool) -> int:
    """Key-range splits so that about SPLIT_PROGRAMS_PER_UNIT programs run per compute unit (1 when the batch fills
    the device)."""
    if interp:
        return 1
    units = processors(t)
    if programs >= units:
        return 1
    return max(1, min(cdiv(SPLIT_PROGRAMS_PER_UNIT * units, programs), cdiv(L, block_l), _MAX_SPLITS))


def _cluster_size(t: torch.Tensor, splits: int, block_d: int, after: str = "", groups: int = 1) -> int:
    """Programs per cluster for ``splits`` key-range splits of each of ``groups`` (entry, KV head, head block)
    combined in the attention launch: where CLUSTER_COMBINE (None: the launch follows a product of CLUSTER_AFTER,
    ``after``, or groups >= CLUSTER_MIN) and the device launches clusters (``cluster_capable``), for
    1 < splits <= _MAX_CLUSTER, the next power of two (at most CLUSTER_SPLITS) if the head dimension's tile spreads
    over it; else 0 (the combine kernel)."""
    wanted = (after in CLUSTER_AFTER or groups >= CLUSTER_MIN) if CLUSTER_COMBINE is None else CLUSTER_COMBINE
    if not wanted or not 1 < splits <= _MAX_CLUSTER or not cluster_capable(t, _MAX_CLUSTER):
        return 0
    size = min(next_power_of_2(splits), CLUSTER_SPLITS)
    return size if 1 < size <= block_d else 0



def _check_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, what: str) -> None:
    B, N, H = q.shape
    Nk, L = k_cache.shape[1], k_cache.shape[2]
    if k_cache.shape != (B, Nk, L, H) or v_cache.shape != k_cache.shape or Nk == 0 or N % Nk:
        raise ValueError(f"{what}: q {tuple(q.shape)} and caches {tuple(k_cache.shape)} / "
                         f"{tuple(v_cache.shape)} need [B, N, H] and [B, Nk, L, H] with N a multiple of Nk")
    if q.dtype not in SUPPORTED_DTYPES or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise TypeError(f"{what} takes float16/bfloat16/float32 tensors of one type, got q {q.dtype}, "
                        f"caches {k_cache.dtype} / {v_cache.dtype}")
    if not supported_head_size(H):
        raise ValueError(f"{what}: head size {H} is outside 16..512")


def _attend(q, k_cache, v_cache, total_len, scale, local_window, len_offset, num_splits, new,
            softcap: float = 0.0, sink: torch.Tensor | None = None, early: bool = False,
            after: str = "", partials: bool = False) -> Any:
    """Launch the attention kernel (``softcap > 0``: capped scores; ``sink [N]``: one more logit per head in the
    softmax denominator); ``new`` None (the caches hold every key) or
    (k, v, cos, sin, pos, half, max_pos, rotary, interleaved) of the step's own token (see
    ``rotary_decode_attention``, also for ``early``)."""
    B, N, H = q.shape
    Nk, L = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty((B, N, H), dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        return out
    interp = use_interpreter(q, "GroupQueryAttention decode")
    G = N // Nk
    block_g = min(max(16, next_power_of_2(G)), _MAX_BLOCK_G)
    hb = cdiv(G, block_g)
    block_d = max(16, next_power_of_2(H))
    # one key/value chunk about 16 KiB: 64 rows of fp16 H=128, 32 of fp32 H=128
    block_l = max(16, min(64, 16384 // (block_d * q.element_size())))
    programs = B * Nk * hb
    splits = num_splits if num_splits is not None else _num_splits(q, programs, L, block_l, interp)
    splits = max(1, min(int(splits), L, GRID_YZ_MAX))
    cluster = 0 if partials else _cluster_size(q, splits, block_d, after, programs)
    if cluster:  # the splits past the key range's blocks find no key: a zero weight in the combine
        splits = cluster
    dot_fp32 = q.dtype == torch.float32 or (interp and q.dtype == torch.bfloat16)  # numpy has no bf16 matmul
    meta = {"DOT_FP32": dot_fp32, "PRECISION": "ieee", "BLOCK_G": block_g, "BLOCK_L": block_l, "BLOCK_D": block_d}
    if new is None:
        k = v = cos = sin = pos = k_cache
        half, max_pos, rotary, interleaved = 0, 1, False, False
        s_k = s_v = (0, 0, 0)
        s_c = s_s = (0, 0)
    else:
        k, v, cos, sin, pos, half, max_pos, rotary, interleaved = new
        s_k, s_v = k.stride(), v.stride()
        s_c, s_s = (cos.stride(), sin.stride()) if rotary else ((0, 0), (0, 0))
    if splits > 1:
        mid_o = torch.empty((B, N, splits, H), dtype=torch.float32, device=q.device)
        mid_l = torch.empty((B, N, splits), dtype=torch.float32, device=q.device)
        s_mid = (mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_l.stride(0), mid_l.stride(1))
    else:
        mid_o = mid_l = out
        s_mid = (0, 0, 0, 0, 0)
    if sink is not None and (sink.shape != (N,) or sink.device != q.device or not sink.is_floating_point()):
        raise ValueError(f"decode attention: sink {tuple(sink.shape)} {sink.dtype} on {sink.device} must be one float "
                         f"per query head, [{N}], on {q.device}")
    args = (q, k, v, cos, sin, pos, k_cache, v_cache, total_len, out, mid_o, mid_l,
            sink if sink is not None else out,
            Nk, hb, G, L, max_pos, H, half, int(len_offset), int(local_window), float(scale) * _LOG2E,
            float(softcap) if softcap > 0.0 else 1.0,
            *q.stride(), *s_k, *s_v, *s_c, *s_s, *k_cache.stride(), *v_cache.stride(), *out.stride(), *s_mid)
    warps = 4 if block_d * block_l >= 64 * 64 else 2
    kwargs = {"NEW": new is not None, "ROTARY": bool(rotary), "INTERLEAVED": bool(interleaved), "SPLIT": splits > 1,
              "SOFTCAP": softcap > 0.0, "SINK": sink is not None, "EARLY": early and not interp, **meta,
              # no FMA contraction with a new token: its rotation rounds each product as the torch code does
              "num_warps": warps, "enable_fp_fusion": new is None, **pdl(q)}
    with on_device(q, interp):
        if cluster:
            launch_clustered(_decode_attn_kernel, (programs * cluster,), cluster, args, {**kwargs, "CLUSTER": cluster})
            return out
        _decode_attn_kernel[(programs, splits)](*args, **kwargs)
        if partials:
            return (mid_o, mid_l) if splits > 1 else out
        if splits > 1:
            _combine_into((mid_o, mid_l), out)
    return out


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, total_len: torch.Tensor,
                     scale: float, local_window: int = -1, *, len_offset: int = 0,
                     num_splits: int | None = None, softcap: float = 0.0,
                     sink: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of one query token per sequence over a KV cache: ``q [B, N, H]``, caches ``[B, Nk, L, H]``,
    ``total_len [B]`` (device ints; ``total_len[b] + len_offset`` keys of entry b count, so onnxruntime's
    ``seqlens_k`` goes in with ``len_offset=1``). Key rows ``j`` with ``j <= total - 1`` (and ``j < L``) are
    attended, with ``local_window > 0`` only ``j > total - 1 - local_window``. ``softcap > 0``: the scores are
    ``softcap * tanh(scale * q . k / softcap)`` (GroupQueryAttention's softcap). ``sink [N]``: attention sinks,
    one more logit per head in the softmax denominator (GroupQueryAttention's head_sink). Returns ``[B, N, H]`` in q's
    dtype. ``num_splits`` None: chosen from the shapes (flash-decoding when ``B * Nk`` programs are few)."""
    _check_attention(q, k_cache, v_cache, "decode_attention")
    return _attend(q, k_cache, v_cache, total_len, scale, local_window, len_offset, num_splits, None, softcap, sink)


def rotary_decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos_cache: torch.Tensor | None,
                            sin_cache: torch.Tensor | None, pos: torch.Tensor | None, k_cache: torch.Tensor,
                            v_cache: torch.Tensor, seqlens: torch.Tensor, scale: float, local_window: int = -1, *,
                            interleaved: bool = False, do_rotary: bool = True,
                            num_splits: int | None = None, softcap: float = 0.0,
                            sink: torch.Tensor | None = None, early: bool = False, after: str = "",
                            partials: bool = False) -> Any:
    """A whole GroupQueryAttention decode step in one launch: ``rotary_cache_write(q, k, v, cos_cache,
    sin_cache, pos, k_cache, v_cache, seqlens, interleaved, do_rotary)`` followed by ``decode_attention(
    rotated q, k_cache, v_cache, seqlens, scale, local_window, len_offset=1, softcap=softcap, sink=sink)``, with the same
    cache contents and attention output. ``q [B, N, H]``, ``k`` / ``v [B, Nk, H]`` (one new token per entry, read
    through their strides), ``seqlens [B]`` device ints: entry b's new row is ``seqlens[b]`` (clamped to the
    buffer) and keys ``j <= seqlens[b]`` are attended.

    ``early``: everything but q, k and v (seqlens, pos, the cos/sin caches, the KV caches, sink) was written
    before the kernel that precedes this launch in the stream started (``OpContext.settled``: a plan says so when
    the previous step is a product that wrote q, k or v), so under programmatic dependent launch the programs read
    them, and their first key/value chunk, before waiting for that kernel. On an H200 the GenAI benchmark's int4
    decode steps went from 0.489-0.490 to 0.471-0.472 ms (Qwen2.5-0.5B) and from 0.508-0.509 to 0.496 ms
    (Llama-3.2-1B) (``benchmarks/decode_replay.py``, the trees before and after alternated three times).

    ``after``: the op type of the product whose kernel precedes this launch (``OpContext.settled_by``; "" unknown),
    which with the number of KV heads decides whether the key-range splits are combined in this launch, its
    programs in thread-block clusters, where the device has them (``_cluster_size``; the module docstring says
    why)."""
    _check_attention(q, k_cache, v_cache, "rotary_decode_attention")
    B, N, H = q.shape
    Nk = k_cache.shape[1]
    if k.shape != (B, Nk, H) or v.shape != (B, Nk, H):
        raise ValueError(f"rotary_decode_attention: k {tuple(k.shape)} / v {tuple(v.shape)} need [B, Nk, H] = "
                         f"{(B, Nk, H)}")
    if do_rotary:
        half = _rotary_half(cos_cache, sin_cache, pos, H, "rotary_decode_attention")
        new = (k, v, cos_cache, sin_cache, pos, half, cos_cache.shape[0], True, interleaved)
    else:
        new = (k, v, k_cache, k_cache, seqlens, 0, 1, False, False)
    return _attend(q, k_cache, v_cache, seqlens, scale, local_window, 1, num_splits, new, softcap, sink, early, after,
                   partials)


@triton.jit
def _resident(t, L, WINDOW):
    """Positions a window-sized cache of L rows holds after t tokens (``ops.contrib.attention.resident_length``)."""
    g = L - WINDOW + 1
    return t - g * ((tl.maximum(t - L, 0) + g - 1) // g)


@triton.jit
def _evict_kernel(kc_ptr, vc_ptr, seqlens_ptr, row_ptr, NK, L, WINDOW, HEAD_DIM, s_b, s_h, s_l,
                  BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr):
    """Entry b's decode step on a window-sized cache, for (entry, KV head) ``pid``: T = seqlens[b] + 1 tokens after
    it; when it evicts (L(T) < L(T - 1) + 1) rows ``shift .. L`` of both caches move to rows ``0 .. L - shift``,
    else nothing moves. One program walks its rows upwards, loading each block before storing it, so the
    overlapping move never overwrites a row it has yet to read. Head 0 stores the new token's row L(T) - 1."""
    pid = tl.program_id(0)
    b = pid // NK
    t = tl.load(seqlens_ptr + b).to(tl.int32) + 1
    now = _resident(t, L, WINDOW)
    shift = _resident(t - 1, L, WINDOW) + 1 - now
    if pid % NK == 0:
        tl.store(row_ptr + b, now - 1)
    if shift > 0:
        base = b.to(tl.int64) * s_b + (pid % NK).to(tl.int64) * s_h
        d = tl.arange(0, BLOCK_D)
        rows = tl.arange(0, BLOCK_L)
        for r0 in range(0, L, BLOCK_L):
            r = r0 + rows
            ok = (r + shift < L)[:, None] & (d < HEAD_DIM)[None, :]
            src = base + (r + shift).to(tl.int64)[:, None] * s_l + d[None, :]
            dst = base + r.to(tl.int64)[:, None] * s_l + d[None, :]
            kx = tl.load(kc_ptr + src, mask=ok)
            vx = tl.load(vc_ptr + src, mask=ok)
            tl.store(kc_ptr + dst, kx, mask=ok)
            tl.store(vc_ptr + dst, vx, mask=ok)


def evict_rows(k_cache: torch.Tensor, v_cache: torch.Tensor, seqlens: torch.Tensor, window: int) -> torch.Tensor:
    """The cache side of a decode step on window-sized caches (GroupQueryAttention ``sliding_window_cache=1``):
    ``k_cache`` / ``v_cache`` ``[B, Nk, L, H]`` (contiguous rows) hold entry b's most recent positions at rows
    ``0 .. L(T - 1)``, T = ``seqlens[b] + 1``; when the step evicts, the rows kept move down to row 0 in place (the
    rows after them keep their old values). Returns the rows ``L(T) - 1`` [B] int32 where the new token goes.
    Nothing syncs with the host."""
    B, Nk, L, H = k_cache.shape
    if v_cache.shape != k_cache.shape or v_cache.stride() != k_cache.stride() or k_cache.stride(3) != 1:
        raise ValueError(f"evict_rows: caches {tuple(k_cache.shape)} / {tuple(v_cache.shape)} need one shape and "
                         "contiguous rows")
    if not 0 < window <= L:
        raise ValueError(f"evict_rows: window {window} must be in 1 .. the capacity {L}")
    interp = use_interpreter(k_cache, "GroupQueryAttention eviction")
    rows = torch.empty(B, dtype=torch.int32, device=k_cache.device)
    block_d = next_power_of_2(H)
    with on_device(k_cache, interp):
        _evict_kernel[(B * Nk,)](k_cache, v_cache, seqlens, rows, Nk, L, window, H, k_cache.stride(0),
                                 k_cache.stride(1), k_cache.stride(2), BLOCK_L=max(1, 4096 // block_d),
                                 BLOCK_D=block_d)
    return rows


def rotary_decode_attention_reference(q, k, v, cos_cache, sin_cache, pos, k_cache, v_cache, seqlens, scale,
                                      local_window=-1, *, interleaved=False, do_rotary=True,
                                      softcap=0.0, sink=None) -> torch.Tensor:
    """What ``rotary_decode_attention`` computes: the two reference steps (caches written in place)."""
    qr = rotary_cache_write_reference(q, k, v, cos_cache, sin_cache, pos, k_cache, v_cache, seqlens, interleaved,
                                      do_rotary)
    return decode_attention_reference(qr, k_cache, v_cache, seqlens, scale, local_window, len_offset=1,
                                      softcap=softcap, sink=sink)


def decode_attention_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               total_len: torch.Tensor, scale: float, local_window: int = -1, *,
                               len_offset: int = 0, softcap: float = 0.0,
                               sink: torch.Tensor | None = None) -> torch.Tensor:
    """What ``decode_attention`` computes, in float64 on the CPU (SDPA; with a softcap or sinks the scores
    explicitly, capped as ``_attend`` of ``ops/contrib/attention.py`` caps them: after the scale, before the mask;
    a sink adds ``exp(sink[h])`` to head h's denominator)."""
    B, N, H = q.shape
    Nk, L = k_cache.shape[1], k_cache.shape[2]
    last = total_len.reshape(B).long().cpu() + len_offset - 1
    j = torch.arange(L).reshape(1, L)
    allowed = j <= last.reshape(B, 1)
    if local_window > 0:
        allowed &= j > last.reshape(B, 1) - local_window
    groups = N // Nk
    kh = k_cache.double().cpu().repeat_interleave(groups, dim=1)
    vh = v_cache.double().cpu().repeat_interleave(groups, dim=1)
    qd = q.double().cpu().unsqueeze(2)  # [B, N, 1, H]
    allowed = allowed.reshape(B, 1, 1, L)
    if softcap > 0.0 or sink is not None:
        s = (qd @ kh.transpose(-1, -2)) * scale
        if softcap > 0.0:
            s = softcap * torch.tanh(s / softcap)
        s = s.masked_fill(~allowed, float("-inf"))
        if sink is not None:
            snk = sink.double().cpu().reshape(1, N, 1, 1).expand(B, N, 1, 1)
            m = torch.maximum(s.amax(-1, keepdim=True), snk)
            e = torch.exp(s - m)
            p = e / (e.sum(-1, keepdim=True) + torch.exp(snk - m))
        else:
            p = torch.softmax(s, dim=-1).masked_fill(~allowed.any(-1, keepdim=True), 0.0)  # no key: 0, as SDPA
        return (p @ vh).squeeze(2)
    return F.scaled_dot_product_attention(qd, kh, vh, attn_mask=allowed, scale=scale).squeeze(2)
