"""Rotary position embedding, com.microsoft version, and the rotation helper GroupQueryAttention shares.

``RotaryEmbedding`` (com.microsoft): input ``[B, S, hidden]`` or ``[B, N, S, H]``; ``position_ids``
``[B, S]``, or one element holding the first position (positions ``p0 + s``), with
``is_packed_batching`` a 1-D ``[num_tokens]`` position per token of a ``[num_tokens, hidden]``
input. The first ``rotary_embedding_dim`` channels of every head are rotated (halves, or
interleaved pairs); the rest pass through.

``MRotaryEmbedding`` (com.microsoft, Qwen2-VL ... Qwen3.5's multimodal RoPE): ``position_ids`` ``[3, B, S]`` holds
a temporal, a height and a width position per token; each picks its cos/sin rows, and ``mrope_section`` says which
of the ``rot/2`` frequencies come from which stream: in three contiguous chunks (``mrope_layout`` 0) or interleaved
(1: the temporal stream everywhere, then height at every third frequency from 1 for ``3 * section[1]`` of them,
width from 2 for ``3 * section[2]``). The rotation is RotaryEmbedding's. On a GPU it is one Triton launch
(``crossml.kernels.mrope``), the torch path's values bit for bit.
"""

from __future__ import annotations

import math

import torch

from crossml.ops._util import cpu_kernels, gpu_kernels
from crossml.ops.registry import MS_DOMAIN, op


def apply_rotary(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool
) -> torch.Tensor:
    """Rotate ``x [B, S, N, H]`` with ``cos``/``sin [B, S, rot/2]``; channels past ``rot`` are kept.

    Computed in float32 for half-precision inputs and cast back to ``x.dtype``.
    """
    half = cos.shape[-1]
    rot = 2 * half
    w = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    c = cos.to(w.dtype).unsqueeze(2)
    s = sin.to(w.dtype).unsqueeze(2)
    xr = w[..., :rot]
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        y = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    else:
        x1, x2 = xr[..., :half], xr[..., half:]
        y = torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)
    if rot < x.shape[-1]:
        y = torch.cat((y, w[..., rot:]), dim=-1)
    return y.to(x.dtype)


def gather_cos_sin(cos_cache: torch.Tensor, sin_cache: torch.Tensor, pos: torch.Tensor):
    """cos/sin rows for positions ``pos [B, S]`` (int64), each ``[B, S, rot/2]``."""
    p = pos.long().clamp(0, cos_cache.shape[0] - 1)
    return cos_cache[p], sin_cache[p]


def _heads(x: torch.Tensor, num_heads: int, half: int, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [B, S, hidden] or [B, N, S, H] as [B, S, N, H] (and the [B, S, ...] view it came from)."""
    if x.dim() == 4:
        x3 = x.transpose(1, 2)  # BNSH -> BSNH
    elif x.dim() == 3:
        x3 = x
    else:
        raise ValueError(f"{name}: input must have rank 3 or 4, got shape {tuple(x.shape)}")
    if x3.dim() == 4:
        return x3, x3
    B, S, hidden = x3.shape
    head = hidden // num_heads if num_heads else 2 * half
    if head <= 0 or hidden % head:
        raise ValueError(f"{name}: hidden size {hidden} is not a whole number of heads of {head}")
    return x3.reshape(B, S, hidden // head, head), x3


@op("RotaryEmbedding", domain=MS_DOMAIN)
def rotary_embedding(
    x: torch.Tensor,
    position_ids: torch.Tensor,
    cos_cache: torch.Tensor,
    sin_cache: torch.Tensor,
    *,
    interleaved: int = 0,
    is_packed_batching: int = 0,
    num_heads: int = 0,
    rotary_embedding_dim: int = 0,
    scale: float = 1.0,
) -> torch.Tensor:
    return _rotary_embedding(x, position_ids, cos_cache, sin_cache, interleaved, is_packed_batching, num_heads,
                             rotary_embedding_dim)


def _rotary_embedding(x: torch.Tensor, position_ids: torch.Tensor, cos_cache: torch.Tensor, sin_cache: torch.Tensor,
                      interleaved: int, is_packed_batching: int, num_heads: int, rotary_embedding_dim: int,
                      norm: tuple[torch.Tensor, float] | None = None) -> torch.Tensor:
    """com.microsoft RotaryEmbedding; ``norm`` (weight, epsilon): each head RMS-normalized first (in the kernel where
    the heads are the weight's size, else by ``_norm_heads`` before)."""
    if rotary_embedding_dim > 0 and num_heads == 0:
        raise ValueError("RotaryEmbedding: num_heads must be given with rotary_embedding_dim")
    packed_tokens = x.dim() == 2
    h, x3 = _heads(x.unsqueeze(0) if packed_tokens else x, num_heads, cos_cache.shape[1], "RotaryEmbedding")
    B, S = h.shape[0], h.shape[1]
    rot = rotary_embedding_dim or h.shape[-1]
    if cos_cache.shape[-1] * 2 < rot:
        raise ValueError(f"RotaryEmbedding: cos_cache has {cos_cache.shape[-1]} columns, need rotary_embedding_dim/2={rot // 2}")
    if position_ids.numel() == 1 and not (packed_tokens or is_packed_batching and S == 1):
        if S == 1:  # p0 itself (a decode step's: on a GPU no arange and add kernels, two a call)
            pos = position_ids.reshape(1, 1).expand(B, 1)
        else:
            pos = position_ids.reshape(1, 1) + torch.arange(S, device=x.device).reshape(1, S)
            pos = pos.expand(B, S)
    else:
        pos = position_ids.reshape(B, S)
    kernels = None
    if not pos.is_floating_point() and sin_cache.dtype == cos_cache.dtype and pos.device == x.device:
        kernels = gpu_kernels("mrope", x, cos_cache, sin_cache)
    if norm is not None and (kernels is None or norm[0].numel() != h.shape[-1] or h.shape[-1] > kernels.NORM_MAX_HEAD
                             or norm[0].device != x.device or not norm[0].is_floating_point()):
        # the kernel does not normalize these heads: the norm's op first, then the rotation
        return _rotary_embedding(_norm_heads(x, *norm), position_ids, cos_cache, sin_cache, interleaved,
                                 is_packed_batching, num_heads, rotary_embedding_dim)
    if kernels is not None:  # one launch
        y = torch.empty(x3.shape, dtype=x.dtype, device=x.device)
        weight = norm[0].reshape(-1).contiguous() if norm is not None else None
        kernels.rotary(h, pos, cos_cache, sin_cache, y.view(h.shape), bool(interleaved), rot, weight,
                       norm[1] if norm is not None else 0.0)
    else:
        cos, sin = gather_cos_sin(cos_cache[:, : rot // 2], sin_cache[:, : rot // 2], pos)
        y = apply_rotary(h, cos, sin, bool(interleaved)).reshape(x3.shape)
    if packed_tokens:
        return y.squeeze(0)
    return y.transpose(1, 2) if x.dim() == 4 else y


def _norm_heads(x: torch.Tensor, weight: torch.Tensor, epsilon: float) -> torch.Tensor:
    """What Reshape(x, [0, -1, n]), SimplifiedLayerNormalization(weight, epsilon) of x's type, Reshape back compute
    (n = weight's size)."""
    from crossml import dtypes
    from crossml.ops.contrib.norm import simplified_layer_normalization_cast

    n = weight.numel()  # x has rank 2 to 4 (checked by _heads)
    if math.prod(x.shape[1:]) % max(n, 1):
        raise ValueError(f"RotaryEmbedding: the input of shape {tuple(x.shape)} is not a whole number of heads of the "
                         f"norm weight's {n} values")
    rows = x.reshape(x.shape[0], -1, n)
    return simplified_layer_normalization_cast(rows, weight, epsilon=epsilon, to=dtypes.onnx_type_of(x)).reshape(x.shape)


@op("RotaryEmbedding", since=1, domain="com.crossml")
def norm_rotary_embedding(
    x: torch.Tensor,
    position_ids: torch.Tensor,
    cos_cache: torch.Tensor,
    sin_cache: torch.Tensor,
    norm_weight: torch.Tensor,
    *,
    norm_epsilon: float = 1e-6,
    interleaved: int = 0,
    is_packed_batching: int = 0,
    num_heads: int = 0,
    rotary_embedding_dim: int = 0,
    scale: float = 1.0,
) -> torch.Tensor:
    """com.crossml RotaryEmbedding (graph rule NormRotary, ``crossml.graph.passes.norm_rotary``): com.microsoft
    RotaryEmbedding of x whose heads are RMS-normalized first, standing for Reshape(x, [0, -1, n]),
    SimplifiedLayerNormalization(norm_weight, norm_epsilon) of x's type, Reshape back (Gemma 3/4's query and key
    norms; n = norm_weight's size). On a GPU, where the rotary heads are of n channels, one launch of the rotary
    kernel, which normalizes each head first (its sum of squares in another order than the norm kernel's, so within
    an ulp of the nodes'); elsewhere the ops."""
    return _rotary_embedding(x, position_ids, cos_cache, sin_cache, interleaved, is_packed_batching, num_heads,
                             rotary_embedding_dim, (norm_weight, norm_epsilon))


@op("MRotaryEmbedding", domain=MS_DOMAIN)
def m_rotary_embedding(
    x: torch.Tensor,
    position_ids: torch.Tensor,
    cos_cache: torch.Tensor,
    sin_cache: torch.Tensor,
    *,
    mrope_section: list[int],
    mrope_layout: int = 0,
    interleaved: int = 0,
    is_packed_batching: int = 0,
    num_heads: int = 0,
    rotary_embedding_dim: int = 0,
    scale: float = 1.0,
) -> torch.Tensor:
    name = "MRotaryEmbedding"
    if is_packed_batching:
        raise ValueError(f"{name}: is_packed_batching=1 (ragged packed tokens) is not supported; give [B, S, hidden] "
                         "or [B, N, S, H] input")
    if rotary_embedding_dim > 0 and num_heads == 0:
        raise ValueError(f"{name}: num_heads must be given with rotary_embedding_dim")
    h, x3 = _heads(x, num_heads, cos_cache.shape[-1], name)
    B, S = h.shape[0], h.shape[1]
    rot = rotary_embedding_dim or h.shape[-1]
    half = rot // 2
    section = [int(v) for v in mrope_section]
    if len(section) != 3 or min(section) < 0 or sum(section) != half:
        raise ValueError(f"{name}: mrope_section must be 3 non-negative integers adding up to rotary_embedding_dim / 2 "
                         f"= {half}, got {section}")
    if mrope_layout not in (0, 1):
        raise ValueError(f"{name}: mrope_layout must be 0 (sectioned) or 1 (interleaved), got {mrope_layout}")
    if cos_cache.shape[-1] < half:
        raise ValueError(f"{name}: cos_cache has {cos_cache.shape[-1]} columns, need rotary_embedding_dim/2={half}")
    if tuple(position_ids.shape) != (3, B, S):
        raise ValueError(f"{name}: position_ids must have shape (3, batch, sequence) = {(3, B, S)}, got "
                         f"{tuple(position_ids.shape)}")
    integer_positions = not position_ids.is_floating_point()
    if (integer_positions and sin_cache.dtype == cos_cache.dtype and position_ids.device == x.device
            and (kernels := gpu_kernels("mrope", x, cos_cache, sin_cache)) is not None):  # one launch
        out = torch.empty(x3.shape, dtype=x.dtype, device=x.device)
        kernels.m_rotary(h, position_ids, cos_cache, sin_cache, out.view(h.shape), section, mrope_layout,
                         bool(interleaved), rot)
        return out.transpose(1, 2) if x.dim() == 4 else out
    if (integer_positions and x.dim() == 3 and x.numel()
            and (cpu := cpu_kernels("cpu_gated_delta", x, cos_cache, sin_cache)) is not None):
        # numba's one call, these values bit for bit
        return cpu.m_rotary(x, h.shape[2], position_ids, cos_cache, sin_cache, section, mrope_layout,
                            bool(interleaved), rot)
    # [3, B, S, half]; the streams' frequencies are picked by slicing (no index tensor made on the host, which a
    # recorded GPU graph could not take)
    cos3, sin3 = gather_cos_sin(cos_cache[:, :half], sin_cache[:, :half], position_ids)
    t_end, h_end = section[0], section[0] + section[1]
    if mrope_layout == 0:
        cos = torch.cat((cos3[0, ..., :t_end], cos3[1, ..., t_end:h_end], cos3[2, ..., h_end:]), dim=-1)
        sin = torch.cat((sin3[0, ..., :t_end], sin3[1, ..., t_end:h_end], sin3[2, ..., h_end:]), dim=-1)
    else:
        cos, sin = cos3[0].clone(), sin3[0].clone()
        for stream, offset in ((1, 1), (2, 2)):
            picked = slice(offset, 3 * section[stream], 3)
            cos[..., picked] = cos3[stream, ..., picked]
            sin[..., picked] = sin3[stream, ..., picked]
    y = apply_rotary(h, cos, sin, bool(interleaved)).reshape(x3.shape)
    return y.transpose(1, 2) if x.dim() == 4 else y
