"""Attention with a KV cache: GroupQueryAttention and MultiHeadAttention (com.microsoft).

GroupQueryAttention follows onnxruntime's CPU kernel:

* ``seqlens_k[b]`` is batch entry b's total length minus one; the host scalar
  ``total_sequence_length`` tells the first prompt (``S == total``) from token generation (``S == 1``)
  and from a later prompt chunk (``S > 1``, batch 1). Entry b's past length is 0 in the first prompt
  and ``seqlens_k[b] + 1 - S`` otherwise, so a batch of right-padded prompts works.
* The new keys/values are written at rows ``past_b .. past_b + S`` of the BNSH present buffers,
  whose length is ``max(total_sequence_length, past_key.shape[2])``. When ``past_key`` is already
  that long (``past_present_share_buffer``: a static max-length cache) the present tensors are the
  past buffers updated with the new rows. They are copies, since ops never write into their
  inputs, unless the caller sets ``ctx.extra["kv_inplace"] = True`` (the GenAI static cache), in
  which case the rows are written into ``past_key`` / ``past_value`` and those are returned.
  Rows past a batch entry's length are zeros in a grown cache and untouched in a shared one.
* Query row s of entry b sees keys ``j <= past_b + s`` (and ``j > past_b + s - local_window_size``:
  ``local_window_size`` keys with a local window); rows of right padding in the first prompt are unspecified in onnxruntime.
* ``sliding_window_cache=1`` (``_windowed``): ``past_key`` / ``past_value`` are window-sized buffers of
  capacity C >= ``local_window_size`` holding each entry's most recent positions at rows ``0 .. L(T)``
  (``resident_length``: onnxruntime's eviction rule, which frees ``C - window + 1`` rows at once). A ragged first
  prompt is taken with the right-padding convention above (onnxruntime refuses it).
* A token-generation step on a CUDA/XPU device with a shared buffer and plain softmax attention (softcap
  included) runs one Triton kernel (``kernels/decode_attention.py``: rotary, cache write and attention)
  instead of the torch code below; a causal first prompt without a window or softcap there runs the rotary +
  cache write kernel for all its tokens, then causal SDPA over the new rows. ``_fast_ok`` lists the conditions.
* On the CPU, a plain float32 token-generation step over a shared buffer runs numba's kernel
  (``kernels/cpu_attention.py``; ``_cpu_decode_ok``): Qwen2.5-0.5B's shape (14 query heads over 2, 200 keys) took
  130-145 us a call against 430-720 us for the torch code below on a 2-core host. The torch code on the CPU attends
  only the rows up to the longest sequence, so neither path's cost grows with the length of a max-length buffer.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from crossml.kernels import TRITON_DEVICES, load
from crossml.ops._util import gpu_kernels, scalar, sdpa, sdpa_heads
from crossml.ops.contrib.rotary import apply_rotary, gather_cos_sin
from crossml.ops.registry import MS_DOMAIN, OpContext, op

_HALF = (torch.float16, torch.bfloat16)
_DECODE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: most (chunk tokens x KV heads) of a later prompt chunk (chat turn) whose attention runs on the decode kernel, a
#: token per batch entry (``_fast_continue``); larger ones take masked SDPA, whose query tiles read each key once
#: per tile, not once per token. On an H200, fp16, head size 64, context 700 / 2000 (GPU us, decode kernel vs
#: SDPA; benchmarks/chat_turns.py): 2 KV heads (Qwen2.5-0.5B) 60 tokens 10 / 21 vs 58 / 133, 512 tokens 34 / 108
#: vs 59 / 136; 8 KV heads (Llama-3.2-1B) 128 tokens 42 / 117 vs 62 / 144, 256 tokens 74 / 224 vs 62 / 144.
CHUNK_DECODE_ROWS = 1024


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    w = x.float()
    y = w * torch.rsqrt(w.square().mean(-1, keepdim=True) + eps) * weight.float()
    return y.to(x.dtype)


def _head_rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``_rms`` of each head (x [B, S, heads, H], weight of H elements): one Triton launch on a GPU
    (``crossml.kernels.rmsnorm``, float32 arithmetic in the same order), torch's ops elsewhere."""
    if weight.numel() == x.shape[-1] and (kernels := gpu_kernels("rmsnorm", x, weight)) is not None:
        y, _ = kernels.rms_norm(x, weight.reshape(-1), eps)
        return y if y.dtype == x.dtype else y.to(x.dtype)
    return _rms(x, weight, eps)


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor | None,
    scale: float,
    *,
    bias: torch.Tensor | None = None,
    softcap: float = 0.0,
    sink: torch.Tensor | None = None,
    masked_value: float | None = None,
    want_qk: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """softmax(scale * q k^T [+ bias], masked) v for q [B, N, S, H], k/v [B, N, L, H] (heads already matched).

    ``allowed`` [B|1, 1|N, S, L] bool. ``masked_value`` None: masked keys get no weight; a float: it
    is added to their scores (onnxruntime's mask_filter_value). ``sink`` [N]: an extra logit per head
    in the softmax denominator. ``want_qk`` 1/2: also return the scores before/after softmax.
    """
    plain = softcap == 0.0 and sink is None and not want_qk and masked_value is None
    if plain:
        mask = allowed
        if bias is not None:
            neg = torch.finfo(q.dtype).min if q.dtype != torch.float32 else float("-inf")
            mask = bias.to(q.dtype) if allowed is None else bias.to(q.dtype).masked_fill(~allowed, neg)
        return sdpa(q, k, v, attn_mask=mask, scale=scale), None
    qf, kf, vf = q.float(), k.float(), v.float()
    s = (qf @ kf.transpose(-1, -2)) * scale
    if bias is not None:
        s = s + bias.float()
    if softcap > 0.0:
        s = softcap * torch.tanh(s / softcap)
    qk_pre = None
    if want_qk == 1:  # onnxruntime reports masked scores as 0
        qk_pre = s if allowed is None or masked_value is not None else s.masked_fill(~allowed, 0.0)
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf")) if masked_value is None else s + (~allowed) * masked_value
        if want_qk == 1 and masked_value is not None:
            qk_pre = s
    if sink is not None:
        snk = sink.float().reshape(1, -1, 1, 1).expand(s.shape[0], -1, s.shape[2], 1)
        m = torch.maximum(s.amax(-1, keepdim=True), snk)
        e = torch.exp(s - m)
        p = e / (e.sum(-1, keepdim=True) + torch.exp(snk - m))
    else:
        p = torch.softmax(s, dim=-1)
    out = (p @ vf).to(q.dtype)
    qk = qk_pre if want_qk == 1 else (p if want_qk == 2 else None)
    return out, qk


def _softmax_scale(scale: float, H: int) -> float:
    """GroupQueryAttention's ``scale`` attribute: 0 means 1/sqrt(head_size)."""
    return scale if scale != 0.0 else 1.0 / math.sqrt(H)


def _shared_caches(past_key: torch.Tensor, past_value: torch.Tensor, inplace: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The present buffers of a shared cache: the past buffers themselves (``kv_inplace``), else copies (ops never
    write into their inputs)."""
    return (past_key, past_value) if inplace else (past_key.clone(), past_value.clone())


def _sinks(head_sink: torch.Tensor | None, smooth_softmax: int, N: int, device: torch.device) -> torch.Tensor | None:
    """GroupQueryAttention's extra softmax logit per head [N]: ``head_sink``, zeros for ``smooth_softmax``, or None."""
    if head_sink is not None:
        return head_sink.reshape(N)
    return torch.zeros(N, dtype=torch.float32, device=device) if smooth_softmax else None


def _attend_groups(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, allowed: torch.Tensor, scale: float, *,
                   bias: torch.Tensor | None, softcap: float, head_sink: torch.Tensor | None, smooth_softmax: int,
                   want_qk: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """GroupQueryAttention's attention for q [B, S, N, H] over caches kc / vc [B, Nk, L, H]: key heads shared by
    query groups, scale 0 meaning 1/sqrt(H), smooth_softmax as a zero sink per head; ``_attend`` for the rest.
    Returns the output [B, N, S, H] and the scores ``want_qk`` asks for."""
    N, H = q.shape[2], q.shape[3]
    groups = N // kc.shape[1]
    sc = _softmax_scale(scale, H)
    qt = q.transpose(1, 2)
    if bias is None and softcap == 0.0 and head_sink is None and not smooth_softmax and not want_qk:
        # plain attention: SDPA broadcasts the key / value heads itself where that is fast (``sdpa_heads``); a CPU
        # decode step of Qwen2.5-0.5B's shape (14 query heads over 2) took 77 us against 190 us with the heads
        # repeated first, the same output bit for bit
        kh, vh, gqa = sdpa_heads(qt, kc, vc, groups, masked=allowed is not None)
        return sdpa(qt, kh, vh, attn_mask=allowed, scale=sc, enable_gqa=gqa), None
    kh = kc.repeat_interleave(groups, dim=1) if groups > 1 else kc
    vh = vc.repeat_interleave(groups, dim=1) if groups > 1 else vc
    return _attend(qt, kh, vh, allowed, sc, bias=bias, softcap=softcap,
                   sink=_sinks(head_sink, smooth_softmax, N, q.device), want_qk=want_qk)


def _cache_inputs_ok(query, key, value, past_key, past_value, seqlens_k, cos_cache, sin_cache, position_ids,
                     attention_bias, q_norm_weight, k_norm_weight, N, Nk, H, total, do_rotary, dtypes) -> bool:
    """The inputs GroupQueryAttention's kernels (Triton's and numba's) take: every tensor on query's device, query of
    one of ``dtypes`` with key, value and the past caches of its dtype and shapes, a shared max-length cache (at
    least ``total`` rows), integer lengths and positions, no attention bias or q / k norms, cos / sin caches of one
    float dtype and at most H / 2 columns."""
    dev = query.device
    if past_key is None or past_value is None or attention_bias is not None:
        return False
    if q_norm_weight is not None or k_norm_weight is not None:
        return False
    B, S, D = query.shape
    dt = query.dtype
    if dt not in dtypes or D != H * (N if key is not None else N + 2 * Nk):
        return False
    if key is not None and (key.dtype != dt or value.dtype != dt or key.shape != (B, S, Nk * H)
                            or value.shape != (B, S, Nk * H) or key.device != dev or value.device != dev):
        return False
    P = past_key.shape[2] if past_key.dim() == 4 else -1
    if P < max(total, 1) or past_key.shape != (B, Nk, P, H) or past_value.shape != past_key.shape:
        return False
    if past_key.dtype != dt or past_value.dtype != dt or past_key.device != dev or past_value.device != dev:
        return False
    if seqlens_k.numel() != B or seqlens_k.device != dev or seqlens_k.dtype.is_floating_point:
        return False
    if do_rotary:
        if cos_cache is None or sin_cache is None or cos_cache.dim() != 2 or sin_cache.shape != cos_cache.shape:
            return False
        if not cos_cache.dtype.is_floating_point or cos_cache.dtype != sin_cache.dtype:
            return False
        if cos_cache.device != dev or sin_cache.device != dev or not 0 < 2 * cos_cache.shape[1] <= H:
            return False
        if position_ids is not None and (position_ids.numel() != B * S or position_ids.device != dev
                                         or position_ids.dtype.is_floating_point):
            return False
    return True


def _fast_ok(query, key, value, past_key, past_value, seqlens_k, cos_cache, sin_cache, position_ids,
             attention_bias, head_sink, q_norm_weight, k_norm_weight, N, Nk, H, total, do_rotary,
             qk_output) -> bool:
    """Whether a token-generation step (S == 1, past given) or a first prompt may run the Triton kernels: a
    shared max-length cache (P == L), plain softmax attention, a supported dtype / head size, on a Triton
    device (``_cache_inputs_ok``). A softcap and sinks are not looked at: the decode kernel caps the scores and takes
    sinks, the prompt's SDPA does neither (its caller checks)."""
    if query.device.type not in TRITON_DEVICES or qk_output:
        return False
    if head_sink is not None and (head_sink.numel() != N or head_sink.device != query.device
                                  or not head_sink.is_floating_point()):
        return False
    if not _cache_inputs_ok(query, key, value, past_key, past_value, seqlens_k, cos_cache, sin_cache, position_ids,
                            attention_bias, q_norm_weight, k_norm_weight, N, Nk, H, total, do_rotary, _DECODE_DTYPES):
        return False
    kernels = load("decode_attention")
    return kernels is not None and kernels.supported_head_size(H)


def _cpu_decode_ok(query, key, value, past_key, past_value, seqlens_k, cos_cache, sin_cache, position_ids,
                   attention_bias, q_norm_weight, k_norm_weight, N, Nk, H, total, do_rotary) -> bool:
    """Whether a plain decode step (one token a row, causal, no sinks or scores out: the caller checks those)
    runs numba's CPU kernel (``crossml.kernels.cpu_attention``): the kernels' inputs (``_cache_inputs_ok``) in
    float32 on the CPU, contiguous caches; numba installed. (The kernel itself declines seqlens_k rows outside the
    caches.)"""
    if query.device.type != "cpu" or not _cache_inputs_ok(
            query, key, value, past_key, past_value, seqlens_k, cos_cache, sin_cache, position_ids, attention_bias,
            q_norm_weight, k_norm_weight, N, Nk, H, total, do_rotary, (torch.float32,)):
        return False
    if not past_key.is_contiguous() or not past_value.is_contiguous():
        return False
    if do_rotary and cos_cache.dtype != torch.float32:
        return False
    return load("cpu_attention") is not None


def _cpu_step(query, key, value, past_key, past_value, seqlens_k, total_sequence_length, cos_cache, sin_cache,
              position_ids, attention_bias, q_norm_weight, k_norm_weight, N, Nk, *, scale, do_rotary,
              rotary_interleaved, local_window, inplace, softcap=0.0) -> tuple | None:
    """A decode step (one token a row after the first prompt, a softcap taken; the caller checks the rest) on numba's
    CPU kernel (``_cpu_decode_ok``), its outputs; None where the kernel does not take it, or a seqlens_k row is outside the
    caches (the kernel then writes nothing): the torch path runs. Called before the op's general preparation, which
    cost more than the kernel's 40-50 us at Qwen2.5-0.5B's shape."""
    B, _, D = query.shape
    H = D // (N + 2 * Nk) if key is None else D // N
    total = int(scalar(total_sequence_length))
    if total == 1 or not _cpu_decode_ok(query, key, value, past_key, past_value, seqlens_k, cos_cache, sin_cache,
                                        position_ids, attention_bias, q_norm_weight, k_norm_weight, N, Nk, H, total,
                                        do_rotary):
        return None
    kc, vc = _shared_caches(past_key, past_value, inplace)
    pos = (seqlens_k if position_ids is None else position_ids) if do_rotary else None
    kernels = load("cpu_attention")
    kw = {"interleaved": bool(rotary_interleaved), "scale": _softmax_scale(scale, H), "window": local_window,
          "keys": total, "softcap": softcap}
    if key is None:
        out = kernels.decode_packed(query, N, Nk, kc, vc, seqlens_k, pos, cos_cache, sin_cache, **kw)
    else:
        out = kernels.decode(query.reshape(B, N * H), key.reshape(B, Nk * H), value.reshape(B, Nk * H), kc, vc,
                             seqlens_k, pos, cos_cache, sin_cache, **kw)
    return None if out is None else (out, kc, vc, None)


def _cpu_windowed_step(query, key, value, past_key, past_value, seqlens_k, cos_cache, sin_cache, position_ids,
                       attention_bias, N, Nk, *, scale, do_rotary, rotary_interleaved, window, inplace,
                       softcap=0.0) -> tuple | None:
    """A decode step on window-sized caches (``sliding_window_cache=1``) on numba's CPU kernel, as the GPU's
    ``_fast_decode(windowed=True)``: where the step evicts (``resident_length``), the rows kept move down to row 0 in
    place, then the kernel writes the new token at row ``L(T) - 1`` and attends the ``window`` rows ending there;
    rotary positions stay absolute (``position_ids``, else ``seqlens_k``). What ``_windowed`` computes, without its
    joined copies of both caches (a Gemma-4-shaped CPU step spent 10-13 ms a local layer there); softcap taken (Gemma 2).
    None where the kernel
    does not take the inputs (``_cpu_decode_ok``: float32, contiguous caches): the torch path runs."""
    B, _, D = query.shape
    H = D // (N + 2 * Nk) if key is None else D // N
    C = past_key.shape[2] if past_key is not None and past_key.dim() == 4 else 0
    if not 0 < window <= C or not _cpu_decode_ok(query, key, value, past_key, past_value, seqlens_k, cos_cache,
                                                 sin_cache, position_ids, attention_bias, None, None, N, Nk, H, 1,
                                                 do_rotary):
        return None
    kc, vc = _shared_caches(past_key, past_value, inplace)
    total = seqlens_k.reshape(B).long() + 1
    now = resident_length(total, C, window)
    shift = resident_length(total - 1, C, window) + 1 - now
    for b in shift.nonzero().reshape(-1).tolist():
        s = int(shift[b])
        kc[b, :, :C - s] = kc[b, :, s:].clone()
        vc[b, :, :C - s] = vc[b, :, s:].clone()
    rows = (now - 1).to(seqlens_k.dtype)
    pos = (seqlens_k if position_ids is None else position_ids) if do_rotary else None
    kernels = load("cpu_attention")
    kw = {"interleaved": bool(rotary_interleaved), "scale": _softmax_scale(scale, H), "window": window, "keys": window,
          "softcap": softcap}
    if key is None:
        out = kernels.decode_packed(query, N, Nk, kc, vc, rows, pos, cos_cache, sin_cache, **kw)
    else:
        out = kernels.decode(query.reshape(B, N * H), key.reshape(B, Nk * H), value.reshape(B, Nk * H), kc, vc, rows,
                             pos, cos_cache, sin_cache, **kw)
    return out, kc, vc, None


def _fast_decode(q, k, v, past_key, past_value, seqlens_k, cos_cache, sin_cache, position_ids, *, scale, softcap,
                 head_sink, smooth_softmax, do_rotary, rotary_interleaved, local_window, inplace,
                 windowed: bool = False, early: bool = False, after: str = "", partials: bool = False) -> tuple:
    """The decode step on the Triton kernels: what the torch code below computes for S == 1 and a shared
    buffer. q [B, 1, N, H], k/v [B, 1, Nk, H]. The new row goes to ``seqlens_k[b]`` (clamped to the buffer),
    rotary positions are ``position_ids`` or else ``seqlens_k``; keys ``j <= seqlens_k[b]`` are attended, their
    scores capped with ``softcap > 0``, with ``head_sink`` (or zeros for ``smooth_softmax``) as one more logit per
    head in the softmax denominator.

    ``windowed``: a window-sized cache (``sliding_window_cache=1``, what ``_windowed`` computes): ``evict_rows``
    first moves the rows kept down to row 0 when this step evicts (``L(T) < L(T-1) + 1``; otherwise its launch
    moves nothing) and gives the new token's row ``L(T) - 1``, where the new row goes and the ``local_window``
    attended rows end; rotary positions stay absolute.

    ``early``: all inputs but q, k and v are settled (``OpContext.settled``), so the attention kernel reads them
    before its PDL wait (``rotary_decode_attention``); never with ``windowed``, whose eviction kernel writes the
    caches just before. ``after``: the op type of the product whose kernel this step follows
    (``OpContext.settled_by``), which says where the key-range splits are combined (``rotary_decode_attention``).
    ``partials``: where the key range is split, the first result is the splits' partial results (``mid_o``,
    ``mid_l``) instead of the output, for the fused AttentionSkipNorm op (``crossml.ops.fused``) to combine."""
    kernels = load("decode_attention")
    B, _, N, H = q.shape
    kc, vc = _shared_caches(past_key, past_value, inplace)
    rows = kernels.evict_rows(kc, vc, seqlens_k.reshape(B), local_window) if windowed else seqlens_k.reshape(B)
    pos = None
    if do_rotary:
        pos = seqlens_k.reshape(B) if position_ids is None else position_ids.reshape(B)
    sc = _softmax_scale(scale, H)
    sink = _sinks(head_sink, smooth_softmax, N, q.device)
    out = kernels.rotary_decode_attention(q[:, 0], k[:, 0], v[:, 0], cos_cache, sin_cache, pos, kc, vc,
                                          rows, sc, local_window, interleaved=bool(rotary_interleaved),
                                          do_rotary=bool(do_rotary), softcap=float(softcap), sink=sink,
                                          early=early and not windowed, after="" if windowed else after,
                                          partials=partials)
    if isinstance(out, tuple):
        return out, kc, vc, None
    return out.reshape(B, 1, N * H), kc, vc, None


def _fast_prompt(q, k, v, past_key, past_value, cos_cache, sin_cache, position_ids, *, scale, do_rotary,
                 rotary_interleaved, inplace) -> tuple:
    """A first prompt (S > 1, causal, no window) on a shared buffer: one Triton launch rotates every token's
    query and key heads and writes keys and values into rows 0 .. S-1 of the caches, then causal SDPA over
    those S rows (key heads shared by query groups without copies). The torch code below computes the same
    (rotary bit for bit; its mask over all L rows gives the same attention). q [B, S, N, H], k/v [B, S, Nk, H];
    rotary positions start at ``position_ids``' first element (onnxruntime reads only that one) or 0."""
    kernels = load("decode_attention")
    B, S, N, H = q.shape
    Nk = k.shape[2]
    kc, vc = _shared_caches(past_key, past_value, inplace)
    steps = torch.arange(S, device=q.device)
    pos = None
    if do_rotary:
        pos = (steps + position_ids.reshape(-1)[:1] if position_ids is not None else steps).repeat(B)
    qr = kernels.rotary_cache_write(q.reshape(B * S, N, H), k.reshape(B * S, Nk, H), v.reshape(B * S, Nk, H),
                                    cos_cache, sin_cache, pos, kc, vc, steps.repeat(B), bool(rotary_interleaved),
                                    bool(do_rotary), tokens=S)
    sc = _softmax_scale(scale, H)
    out = sdpa(qr.reshape(B, S, N, H).transpose(1, 2), kc[:, :, :S], vc[:, :, :S], is_causal=True, scale=sc,
               enable_gqa=N != Nk)
    return out.transpose(1, 2).reshape(B, S, N * H), kc, vc, None


def _fast_continue(q, k, v, past_key, past_value, seqlens_k, cos_cache, sin_cache, position_ids, total, *, scale,
                   do_rotary, rotary_interleaved, local_window, inplace) -> tuple:
    """A later prompt chunk of one sequence (B == 1, 1 < S != total: a chat turn appended to a generator) on a
    shared buffer: one Triton launch rotates the chunk's queries and keys at their positions and writes keys and
    values into rows ``past .. past + S - 1`` of the caches (``past = seqlens_k + 1 - S``, on the device), then
    the chunk attends causally (and within a local window) from those positions. The torch code below computes
    the same over all the buffer's rows (the rows from ``total`` on are masked for every query,
    ``seqlens_k < total``), with some 40 launches a layer. q [1, S, N, H], k/v [1, S, Nk, H]; rotary positions are
    ``position_ids`` or the rows.

    Chunks of up to CHUNK_DECODE_ROWS tokens x KV heads take the decode kernel (``decode_attention``) with each
    token as a batch entry of its own over one cache (a batch stride of 0) and its own length: one or two launches
    and no mask. Larger chunks take SDPA over the first ``total`` rows with a boolean mask (about a dozen launches: the
    mask, the key heads repeated for their groups, the attention), which costs the host about 0.45 ms a layer on
    an H200 host (SDPA's own call about 0.15 ms) against tens of microseconds of GPU work for a chat turn."""
    kernels = load("decode_attention")
    _, S, N, H = q.shape
    Nk = k.shape[2]
    kc, vc = _shared_caches(past_key, past_value, inplace)
    rows = seqlens_k.reshape(1).long() + (1 - S) + torch.arange(S, device=q.device)  # absolute positions [S]
    pos = None
    if do_rotary:
        pos = rows if position_ids is None else position_ids.reshape(S)
    qr = kernels.rotary_cache_write(q.reshape(S, N, H), k.reshape(S, Nk, H), v.reshape(S, Nk, H), cos_cache,
                                    sin_cache, pos, kc, vc, rows, bool(rotary_interleaved), bool(do_rotary), tokens=S)
    sc = _softmax_scale(scale, H)
    if S * Nk <= CHUNK_DECODE_ROWS:
        out = kernels.decode_attention(qr, kc.expand(S, Nk, kc.shape[2], H), vc.expand(S, Nk, vc.shape[2], H), rows,
                                       sc, local_window, len_offset=1)
        return out.reshape(1, S, N * H), kc, vc, None
    kpos = torch.arange(total, device=q.device)
    allowed = kpos <= rows.unsqueeze(1)
    if local_window > 0:
        allowed &= kpos > rows.unsqueeze(1) - local_window
    qh = qr.reshape(1, S, N, H).transpose(1, 2)
    keys, values, gqa = sdpa_heads(qh, kc[:, :, :total], vc[:, :, :total], N // Nk, masked=True)
    out = sdpa(qh, keys, values, attn_mask=allowed.reshape(1, 1, S, total), scale=sc, enable_gqa=gqa)
    return out.transpose(1, 2).reshape(1, S, N * H), kc, vc, None


#: ``OpContext.extra`` key: True asks the decode step (on the Triton kernels, key range split) for the splits' partial
#: results in place of output 0 (the fused AttentionSkipNorm op, which combines them with the output projection)
PARTIALS = "attention_partials"
#: GroupQueryAttention inputs the decode kernel reads before its PDL wait when settled: past key and value,
#: seqlens_k, cos and sin caches, position_ids, head_sink
_READ_EARLY = (3, 4, 5, 7, 8, 9, 11)


@op("GroupQueryAttention", domain=MS_DOMAIN, host_inputs=(6,), ctx=True)
def group_query_attention(
    query: torch.Tensor,
    key: torch.Tensor | None,
    value: torch.Tensor | None,
    past_key: torch.Tensor | None,
    past_value: torch.Tensor | None,
    seqlens_k: torch.Tensor,
    total_sequence_length: torch.Tensor,
    cos_cache: torch.Tensor | None = None,
    sin_cache: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    attention_bias: torch.Tensor | None = None,
    head_sink: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    q_norm_weight: torch.Tensor | None = None,
    k_norm_weight: torch.Tensor | None = None,
    *,
    num_heads: int,
    kv_num_heads: int,
    scale: float = 0.0,
    softcap: float = 0.0,
    do_rotary: int = 0,
    rotary_interleaved: int = 0,
    local_window_size: int = -1,
    smooth_softmax: int = 0,
    causal: int = 1,
    qk_output: int = 0,
    qk_norm_epsilon: float = 1e-6,
    sliding_window_cache: int = 0,
    kv_cache_bit_width: int = 0,
    k_quant_type: str = "NONE",
    v_quant_type: str = "NONE",
    ctx: OpContext,
) -> tuple:
    if query.dim() != 3:
        raise ValueError(f"GroupQueryAttention: query must be [batch, sequence, hidden], got {tuple(query.shape)}")
    if num_heads % kv_num_heads:
        raise ValueError(f"GroupQueryAttention: num_heads {num_heads} is not a multiple of kv_num_heads {kv_num_heads}")
    if sliding_window_cache:
        _check_windowed(past_key, past_value, local_window_size, causal, qk_output)
    if k_scale is not None or (past_key is not None and not past_key.dtype.is_floating_point) or \
            (past_key is not None and past_key.dtype.itemsize == 1):
        raise ValueError("GroupQueryAttention: quantized KV caches (int8/int4/float8 past_key) are not supported")
    B, S, D = query.shape
    N, Nk = num_heads, kv_num_heads
    # the CPU's numba decode step first (the Triton tests' interpreter runs take "cpu" as a Triton device instead)
    cpu_step = (S == 1 and query.device.type == "cpu" and "cpu" not in TRITON_DEVICES and not sliding_window_cache
                and not qk_output and causal and head_sink is None and not smooth_softmax
                and (key is None) == (value is None))
    step_kw = dict(scale=scale, do_rotary=do_rotary, rotary_interleaved=rotary_interleaved,
                   local_window=local_window_size, inplace=bool(ctx.extra.get("kv_inplace")),
                   softcap=float(softcap)) if cpu_step else {}
    norms = q_norm_weight is not None and k_norm_weight is not None
    if (sliding_window_cache and S == 1 and query.device.type == "cpu" and "cpu" not in TRITON_DEVICES and not norms
            and causal and head_sink is None and not smooth_softmax and (key is None) == (value is None)
            and int(scalar(total_sequence_length)) > 1):
        out = _cpu_windowed_step(query, key, value, past_key, past_value, seqlens_k, cos_cache, sin_cache,
                                 position_ids, attention_bias, N, Nk, scale=scale, do_rotary=do_rotary,
                                 rotary_interleaved=rotary_interleaved, window=local_window_size,
                                 inplace=bool(ctx.extra.get("kv_inplace")), softcap=float(softcap))
        if out is not None:
            return out
    if cpu_step and not norms:
        out = _cpu_step(query, key, value, past_key, past_value, seqlens_k, total_sequence_length, cos_cache,
                        sin_cache, position_ids, attention_bias, q_norm_weight, k_norm_weight, N, Nk, **step_kw)
        if out is not None:
            return out
    if key is None:
        H = D // (N + 2 * Nk)
        q, k, v = query.split([N * H, Nk * H, Nk * H], dim=-1)
    else:
        H = D // N
        q, k, v = query, key, value
        if value is None:
            raise ValueError("GroupQueryAttention: key and value must both be given, or both omitted (packed QKV)")
    q = q.reshape(B, S, N, H)
    k = k.reshape(B, S, Nk, H)
    v = v.reshape(B, S, Nk, H)
    if norms:
        # per-head query / key norms (LFM2's), before rotary: applied here, so the decode and prompt kernels below
        # (and numba's CPU step), which take no norms, run on the normalized heads
        q = _head_rms(q, q_norm_weight, qk_norm_epsilon)
        k = _head_rms(k, k_norm_weight, qk_norm_epsilon)
        q_norm_weight = k_norm_weight = None
        if cpu_step:
            out = _cpu_step(q.reshape(B, S, N * H), k.reshape(B, S, Nk * H), v.reshape(B, S, Nk * H), past_key,
                            past_value, seqlens_k, total_sequence_length, cos_cache, sin_cache, position_ids,
                            attention_bias, None, None, N, Nk, **step_kw)
            if out is not None:
                return out
    total = int(scalar(total_sequence_length))
    subsequent = S > 1 and S != total
    if subsequent and B != 1:
        raise ValueError("GroupQueryAttention: batch_size must be 1 when sequence_length > 1 and past context is given")
    first_prompt = not subsequent and S == total
    if not first_prompt and not subsequent and S != 1:
        raise ValueError("GroupQueryAttention: sequence_length must be 1 when it is not a prompt")

    # the decode kernel caps the scores and takes sinks, the prompt's SDPA does neither
    plain = causal and softcap == 0.0 and head_sink is None and not smooth_softmax  # what SDPA computes
    fast_prompt = first_prompt and S > 1 and local_window_size <= 0 and plain
    fast_chunk = subsequent and plain and S < total  # a later prompt chunk (batch 1)
    fast = not sliding_window_cache and ((S == 1 and not first_prompt) or fast_prompt or fast_chunk)
    if fast and _fast_ok(query, key, value, past_key, past_value, seqlens_k, cos_cache, sin_cache, position_ids,
                         attention_bias, head_sink, q_norm_weight, k_norm_weight, N, Nk, H, total, do_rotary,
                         qk_output):
        inplace = bool(ctx.extra.get("kv_inplace"))
        if S == 1:
            return _fast_decode(q, k, v, past_key, past_value, seqlens_k, cos_cache, sin_cache, position_ids,
                                scale=scale, softcap=softcap, head_sink=head_sink, smooth_softmax=smooth_softmax,
                                do_rotary=do_rotary, rotary_interleaved=rotary_interleaved,
                                local_window=local_window_size if causal else -1, inplace=inplace,
                                early=ctx.settled(*_READ_EARLY), after=ctx.settled_by,
                                partials=bool(ctx.extra.get(PARTIALS)))
        if subsequent:
            return _fast_continue(q, k, v, past_key, past_value, seqlens_k, cos_cache, sin_cache, position_ids,
                                  total, scale=scale, do_rotary=do_rotary, rotary_interleaved=rotary_interleaved,
                                  local_window=local_window_size, inplace=inplace)
        return _fast_prompt(q, k, v, past_key, past_value, cos_cache, sin_cache, position_ids, scale=scale,
                            do_rotary=do_rotary, rotary_interleaved=rotary_interleaved, inplace=inplace)

    if (sliding_window_cache and first_prompt and 1 < S <= min(local_window_size, past_key.shape[2]) and plain
            and _fast_ok(query, key, value, past_key, past_value, seqlens_k, cos_cache, sin_cache, position_ids,
                         attention_bias, head_sink, q_norm_weight, k_norm_weight, N, Nk, H, S, do_rotary, qk_output)):
        # a first prompt no longer than the window nor the window-sized cache: the window binds on no query, and
        # the cache's resident rows are the prompt's rows 0 .. S-1 (``_windowed`` gives the same; rows past an
        # entry's length are unspecified there, as in onnxruntime): the full-length cache's first prompt
        return _fast_prompt(q, k, v, past_key, past_value, cos_cache, sin_cache, position_ids, scale=scale,
                            do_rotary=do_rotary, rotary_interleaved=rotary_interleaved,
                            inplace=bool(ctx.extra.get("kv_inplace")))

    if sliding_window_cache and S == 1 and not first_prompt and past_key.stride(3) == 1 and \
            past_value.stride() == past_key.stride() and \
            _fast_ok(query, key, value, past_key, past_value, seqlens_k, cos_cache, sin_cache, position_ids,
                     attention_bias, head_sink, q_norm_weight, k_norm_weight, N, Nk, H,
                     1,  # total: a window-sized cache is shorter than the sequence by design (capacity >= window is checked)
                     do_rotary, qk_output):
        return _fast_decode(q, k, v, past_key, past_value, seqlens_k, cos_cache, sin_cache, position_ids,
                            scale=scale, softcap=softcap, head_sink=head_sink, smooth_softmax=smooth_softmax,
                            do_rotary=do_rotary, rotary_interleaved=rotary_interleaved, local_window=local_window_size,
                            inplace=bool(ctx.extra.get("kv_inplace")), windowed=True)

    total_b = seqlens_k.reshape(B).long() + 1
    past_b = torch.zeros_like(total_b) if first_prompt else total_b - S
    steps = torch.arange(S, device=query.device)
    qpos = past_b.unsqueeze(1) + steps  # [B, S] absolute position of each new token

    if do_rotary:
        if cos_cache is None or sin_cache is None:
            raise ValueError("GroupQueryAttention: do_rotary=1 needs cos_cache and sin_cache")
        if position_ids is None:
            pos = qpos
        elif first_prompt:  # onnxruntime reads only the first element in the first prompt
            pos = (position_ids.reshape(-1)[:1] + steps).expand(B, S)
        else:
            pos = position_ids.reshape(B, S)
        cos, sin = gather_cos_sin(cos_cache, sin_cache, pos)
        q = apply_rotary(q, cos, sin, bool(rotary_interleaved))
        k = apply_rotary(k, cos, sin, bool(rotary_interleaved))

    if sliding_window_cache:
        return _windowed(q, k, v, past_key, past_value, total_b, past_b, first_prompt, attention_bias, head_sink,
                         scale=scale, softcap=softcap, smooth_softmax=smooth_softmax, window=local_window_size,
                         inplace=bool(ctx.extra.get("kv_inplace")))

    # ---- KV cache: write the new rows at past_b .. past_b + S
    P = past_key.shape[2] if past_key is not None else 0
    L = max(total, P)
    shared = past_key is not None and P == L
    inplace = shared and bool(ctx.extra.get("kv_inplace"))
    presents = []
    for past, new in ((past_key, k), (past_value, v)):
        new = new.transpose(1, 2).to(query.dtype)  # [B, Nk, S, H]
        if shared:
            buf = past if inplace else past.clone()
        else:
            buf = torch.zeros(B, Nk, L, H, dtype=query.dtype, device=query.device)
            if past is not None and P:
                keep = (torch.arange(P, device=query.device) < past_b.unsqueeze(1)).reshape(B, 1, P, 1)
                buf[:, :, :P] = torch.where(keep, past, torch.zeros((), dtype=past.dtype, device=past.device))
        rows = qpos.clamp(max=L - 1).reshape(B, 1, S, 1).expand(B, Nk, S, H)
        buf.scatter_(2, rows, new)
        presents.append(buf)
    kc, vc = presents

    # ---- masks over key positions 0 .. A-1: every row a query may attend (A = L on accelerators, where reading
    # the lengths would sync). On the CPU the rows past the longest sequence's end (``total``, unless seqlens_k says
    # more), a max_length buffer's unused tail, are cut first: a Qwen2.5-0.5B-shaped int4 decode step with the builder's
    # max_length of 32768 took 735 ms against 99 ms at max_length 192, the attention over the whole buffer 23 ms a
    # layer
    A = L
    if query.device.type == "cpu" and qpos.numel():
        A = min(L, max(total, int(qpos.max()) + 1, int(total_b.max())))
    kpos = torch.arange(A, device=query.device).reshape(1, 1, A)
    if causal:
        allowed = kpos <= qpos.unsqueeze(-1)
        if local_window_size > 0:
            allowed = allowed & (kpos > qpos.unsqueeze(-1) - local_window_size)
    else:
        allowed = (kpos < total_b.reshape(B, 1, 1)).expand(B, S, A)
    allowed = allowed.unsqueeze(1)  # [B, 1, S, A]
    bias = None
    if attention_bias is not None:
        bias = attention_bias
        if bias.shape[-1] < A:
            bias = F.pad(bias, (0, A - bias.shape[-1]))
        bias = bias[..., :A]

    out, qk = _attend_groups(q, kc[:, :, :A], vc[:, :, :A], allowed, scale, bias=bias, softcap=softcap,
                             head_sink=head_sink, smooth_softmax=smooth_softmax, want_qk=qk_output)
    out = out.transpose(1, 2).reshape(B, S, N * H)
    if qk is not None:
        qk = qk[..., :total].to(query.dtype)
    return out, kc, vc, qk


def _check_windowed(past_key, past_value, window: int, causal: int, qk_output: int) -> None:
    """The inputs and attributes ``sliding_window_cache=1`` needs (onnxruntime's conditions and wording)."""
    if window <= 0 or not causal:
        raise ValueError("GroupQueryAttention: sliding_window_cache=1 needs a causal local window "
                         f"(local_window_size > 0 and causal=1), got local_window_size={window}, causal={causal}")
    if qk_output:
        raise ValueError("GroupQueryAttention: qk_output is not supported with sliding_window_cache=1 "
                         "(the scores of a window-sized cache have no full-length layout); set qk_output=0")
    if past_key is None or past_value is None or past_key.dim() != 4 or past_value.shape != past_key.shape:
        got = "absent" if past_key is None or past_value is None else f"{tuple(past_key.shape)} / {tuple(past_value.shape)}"
        raise ValueError("GroupQueryAttention: sliding_window_cache=1 needs past_key and past_value of the same "
                         f"shape [batch, kv_num_heads, capacity, head_size] (the window-sized buffers), got {got}; "
                         f"KV cache capacity (0) must be at least local_window_size ({window})")
    if past_key.shape[2] < window:
        raise ValueError(f"GroupQueryAttention: sliding_window_cache: KV cache capacity ({past_key.shape[2]}) must be "
                         f"at least local_window_size ({window})")


def resident_length(total: torch.Tensor, capacity: int, window: int) -> torch.Tensor:
    """How many of the most recent positions a window-sized cache of ``capacity`` rows holds after ``total``
    tokens (``sliding_window_cache=1``): all of them until it is full, then eviction frees
    ``G = capacity - window + 1`` rows at once, so ``L = T - G * ceil((T - capacity) / G)``."""
    g = capacity - window + 1
    over = (total - capacity).clamp(min=0)
    return total - g * torch.div(over + g - 1, g, rounding_mode="floor")


def _windowed(q, k, v, past_key, past_value, total_b, past_b, first_prompt, attention_bias, head_sink, *, scale,
              softcap, smooth_softmax, window, inplace) -> tuple:
    """GroupQueryAttention with ``sliding_window_cache=1``: ``past_key`` / ``past_value`` [B, Nk, C, H] hold,
    at rows ``0 .. L(T_prev)``, entry b's most recent positions in increasing order (``resident_length``).

    The resident rows and the new ones are joined into one sequence whose absolute positions are known per
    entry; queries attend the keys of their local window there, and the present buffers take the last
    ``L(T)`` positions of it at rows ``0 .. L(T)`` (the rows after them are unspecified, as in onnxruntime: here
    old resident rows, or zeros). In a first prompt entry b's real tokens are its first ``seqlens_k[b] + 1`` rows
    (right padding, as without the window). Everything stays on the device: the step can be captured."""
    B, S, N, H = q.shape
    Nk = k.shape[2]
    C = past_key.shape[2]
    dev = q.device
    new_b = total_b if first_prompt else torch.full_like(total_b, S)  # real new rows per entry
    prev = total_b - new_b  # positions processed before this step
    lp, ln = resident_length(prev, C, window), resident_length(total_b, C, window)
    rc, rs = torch.arange(C, device=dev), torch.arange(S, device=dev)
    # absolute position of every row of [resident rows | new rows], and whether it holds a key
    xpos = torch.cat([(prev - lp).unsqueeze(1) + rc, prev.unsqueeze(1) + rs], dim=1)  # [B, C + S]
    # new padding rows stay visible to the padding queries after them (never to a real token), as without the window
    held = torch.cat([rc < lp.unsqueeze(1), torch.ones(B, S, dtype=torch.bool, device=dev)], dim=1)
    qpos = past_b.unsqueeze(1) + rs  # [B, S]
    d = qpos.unsqueeze(2) - xpos.unsqueeze(1)  # [B, S, C + S]
    allowed = (held.unsqueeze(1) & (d >= 0) & (d < window)).unsqueeze(1)
    xk = torch.cat([past_key.to(q.dtype), k.transpose(1, 2).to(q.dtype)], dim=2)  # [B, Nk, C + S, H]
    xv = torch.cat([past_value.to(q.dtype), v.transpose(1, 2).to(q.dtype)], dim=2)
    # rows that hold no position are unspecified (anything, NaN included): zero them, or a masked key's value
    # would still reach the output as 0 * NaN
    keep = held.reshape(B, 1, C + S, 1)
    xk = torch.where(keep, xk, torch.zeros((), dtype=xk.dtype, device=dev))
    xv = torch.where(keep, xv, torch.zeros((), dtype=xv.dtype, device=dev))
    bias = None
    if attention_bias is not None:  # its columns are absolute positions
        cols = xpos.clamp(0, attention_bias.shape[-1] - 1)
        bias = torch.gather(attention_bias.expand(B, -1, S, -1), 3,
                            cols.reshape(B, 1, 1, -1).expand(B, attention_bias.shape[1], S, -1))
    out, _ = _attend_groups(q, xk, xv, allowed, scale, bias=bias, softcap=softcap, head_sink=head_sink,
                            smooth_softmax=smooth_softmax)
    # present row i holds position total - L(total) + i: a resident row or a new one; rows >= L take row i of
    # the joined sequence
    apos = (total_b - ln).unsqueeze(1) + rc  # [B, C]
    src = torch.where(apos < prev.unsqueeze(1), apos - (prev - lp).unsqueeze(1), C + apos - prev.unsqueeze(1))
    src = torch.where(rc < ln.unsqueeze(1), src, rc).clamp(0, C + S - 1)
    idx = src.reshape(B, 1, C, 1).expand(B, Nk, C, H)
    kc, vc = torch.gather(xk, 2, idx), torch.gather(xv, 2, idx)
    if inplace:
        past_key.copy_(kc)
        past_value.copy_(vc)
        kc, vc = past_key, past_value
    return out.transpose(1, 2).reshape(B, S, N * H), kc, vc, None


def _split_heads(x: torch.Tensor, n: int) -> torch.Tensor:
    """[B, L, n*H] -> [B, n, L, H]."""
    B, L, D = x.shape
    return x.reshape(B, L, n, D // n).transpose(1, 2)


@op("MultiHeadAttention", domain=MS_DOMAIN, ctx=True)
def multi_head_attention(
    query: torch.Tensor,
    key: torch.Tensor | None = None,
    value: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
    attention_bias: torch.Tensor | None = None,
    past_key: torch.Tensor | None = None,
    past_value: torch.Tensor | None = None,
    past_sequence_length: torch.Tensor | None = None,
    cache_indirection: torch.Tensor | None = None,
    *,
    num_heads: int,
    unidirectional: int = 0,
    scale: float = 0.0,
    mask_filter_value: float = -10000.0,
    ctx: OpContext,
) -> tuple:
    if past_sequence_length is not None or cache_indirection is not None:
        raise ValueError("MultiHeadAttention: past_sequence_length / cache_indirection (beam search buffers) "
                         "are not supported")
    N = num_heads
    if query.dim() == 5:  # packed QKV [B, S, N, 3, H]
        q, k, v = query.unbind(3)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    else:
        B, S, D = query.shape
        q = query
        if key is not None and key.dim() == 5:  # packed KV [B, L, N, 2, H]
            k, v = (t.transpose(1, 2) for t in key.unbind(3))
        else:
            k, v = key, value
        if bias is not None:
            Dq = q.shape[-1]
            Dk = k.shape[-1] if k is not None and k.dim() == 3 else Dq
            bq, bk, bv = bias.split([Dq, Dk, bias.shape[0] - Dq - Dk])
            q = q + bq
            if k is not None and k.dim() == 3:
                k = k + bk
                v = v + bv
        q = _split_heads(q, N)
        if k is not None and k.dim() == 3:
            k, v = _split_heads(k, N), _split_heads(v, N)
    B, _, S, H = q.shape
    if past_key is not None:
        k = torch.cat((past_key, k), dim=2)
        v = torch.cat((past_value, v), dim=2)
    present_k, present_v = (k, v) if past_key is not None or key is None or key.dim() != 4 else (None, None)
    L = k.shape[2]
    P = L - S if unidirectional else 0
    allowed = None
    if unidirectional:
        allowed = (torch.arange(L, device=q.device).reshape(1, L) <= torch.arange(S, device=q.device).reshape(S, 1) + P)
        allowed = allowed.reshape(1, 1, S, L)
    if key_padding_mask is not None:
        m = key_padding_mask
        if m.dim() == 1 and m.shape[0] == B:  # actual key lengths
            km = torch.arange(L, device=q.device).reshape(1, L) < m.reshape(B, 1).long()
            km = km.reshape(B, 1, 1, L)
        elif m.dim() == 2:
            km = (m != 0).reshape(B, 1, 1, L)
        elif m.dim() == 3:
            km = (m != 0).reshape(B, 1, S, L)
        else:
            raise ValueError(f"MultiHeadAttention: key_padding_mask of shape {tuple(m.shape)} is not supported")
        allowed = km if allowed is None else allowed & km
    sc = _softmax_scale(scale, H)
    out, qk = _attend(q, k, v, allowed, sc, bias=attention_bias, masked_value=mask_filter_value,
                      want_qk=2 if len(ctx.outputs_wanted) > 3 and ctx.outputs_wanted[3] else 0)
    out = out.transpose(1, 2).reshape(B, S, -1)
    return out, present_k, present_v, None if qk is None else qk.to(query.dtype)
