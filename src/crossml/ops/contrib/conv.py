"""com.microsoft CausalConvWithState: the stateful depthwise causal convolution of hybrid LLMs (LFM2's short
convolutions, Mamba and Gated DeltaNet pre-convolutions), as onnxruntime's contrib spec defines it.

The ONNX-domain op of opset 27 (``crossml.ops.attention.causal_conv``) computes the same convolution; this one
adds ``dilation`` (taps ``dilation`` positions apart, a ``(k - 1) * dilation`` long carry state),
``channels_last`` (activations and states sequence-major, (B, L, d_1, ..., d_n) with C = d_1 * ... * d_n) and
``state_window`` (W > 0: past and present states gain a leading axis of W slots, slot j the state after position
``L - W + j``, slots before the call's first position zeros; the past state is read from slot W - 1).

Not run, with an error naming the attribute: ``ndim`` 2 or 3 (onnxruntime's CPU kernel takes only 1 too) and the
CUDA provider's extended attributes (``state_length``, ``state_channels_last``, ``input_channel_offset``,
``input_channels``, ``state_update_capacity``) at other than their defaults.
"""

from __future__ import annotations

import torch

from crossml.ops._util import window_past, window_slots
from crossml.ops.attention import causal_conv
from crossml.ops.registry import MS_DOMAIN, OpContext, op

_NAME = "CausalConvWithState (com.microsoft)"


def _channels_first(t: torch.Tensor, what: str) -> torch.Tensor:
    """(B, L, d_1, ..., d_n) -> (B, C, L)."""
    if t.dim() < 3:
        raise ValueError(f"{_NAME} with channels_last=1: {what} must be (batch, length, d_1, ..., d_n), got "
                         f"shape {tuple(t.shape)}")
    return t.reshape(t.shape[0], t.shape[1], -1).transpose(1, 2)


def _channels_last(t: torch.Tensor, trailing: tuple[int, ...]) -> torch.Tensor:
    """(B, C, L) -> (B, L, d_1, ..., d_n)."""
    return t.transpose(1, 2).reshape(t.shape[0], t.shape[2], *trailing).contiguous()


@op("CausalConvWithState", domain=MS_DOMAIN, ctx=True)
def causal_conv_with_state_ms(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
    past_state: torch.Tensor | None = None, *, activation: str = "none", ndim: int = 1, dilation: int = 1,
    channels_last: int = 0, state_window: int = 0, state_length: int = 0, state_channels_last: int = -1,
    input_channel_offset: int = 0, input_channels: int = 0, state_update_capacity: int = 0,
    ctx: OpContext | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    if ndim != 1:
        raise ValueError(f"{_NAME}: ndim={ndim} is not supported; only ndim=1 (a causal convolution along the last "
                         "axis) runs, as in onnxruntime's CPU kernel")
    for name, value, default in (("state_length", state_length, 0), ("state_channels_last", state_channels_last, -1),
                                 ("input_channel_offset", input_channel_offset, 0),
                                 ("input_channels", input_channels, 0),
                                 ("state_update_capacity", state_update_capacity, 0)):
        if value != default:
            raise ValueError(f"{_NAME}: attribute {name}={value} belongs to onnxruntime's CUDA extended path and is "
                             f"not supported; leave it at its default ({default})")
    if channels_last not in (0, 1):
        raise ValueError(f"{_NAME}: channels_last must be 0 or 1, got {channels_last}")
    trailing = tuple(x.shape[2:])
    xc = _channels_first(x, "input") if channels_last else x
    past = window_past(past_state, state_window, _NAME, "B, S, d_1, ..., d_n" if channels_last else "B, C, S")
    if past is not None and channels_last:
        past = _channels_first(past, "past_state")
    # the GenAI static buffers (session entry crossml.kv_cache_in_place): the present state overwrites the past one
    in_place = not state_window and not channels_last and ctx is not None and bool(ctx.extra.get("kv_inplace"))
    out, present, padded = causal_conv(xc, weight, bias, past, activation, dilation, _NAME, bool(state_window),
                                       in_place)
    if state_window:
        span = present.shape[2]
        slots = window_slots(state_window, xc.shape[2], lambda n: padded[:, :, n:n + span], torch.zeros_like(present))
        states = [_channels_last(s, trailing) for s in slots] if channels_last else slots
        present = torch.stack(states)
    elif channels_last:
        present = _channels_last(present, trailing)
    if channels_last:
        out = _channels_last(out, trailing)
    return out, present
