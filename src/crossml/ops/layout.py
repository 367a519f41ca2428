"""How a constant weight is pre-packed for the device it runs on: the one rule that session plans
(``graph/plan.py``) and the device API's compiled operators (``device/operator.py``) both apply.

``"nhwc"``: 4-D float convolution weights channels-last (``ops.conv.CHANNELS_LAST_OPS``), so activations stay
NHWC; ``"colmajor"``: float32 matrix weights stored transposed in memory where the device's BLAS multiplies
them faster with TF32 (``ops.matmul.column_major_weight``). Values and shapes never change, only strides.
"""

from __future__ import annotations

from typing import Any

import torch

from crossml.ops.conv import CHANNELS_LAST_OPS
from crossml.ops.matmul import column_major_weight


def weight_input(op_type: str, attrs: dict[str, Any]) -> int:
    """Which input of a node is the weight ``weight_layout`` packs: 1, or for com.crossml AttentionSkipNorm the one
    after its attention inputs (``gqa_inputs``)."""
    return int(attrs.get("gqa_inputs", 1)) if op_type == "AttentionSkipNorm" else 1


def weight_layout(domain: str, op_type: str, w: Any, device: torch.device, attrs: dict[str, Any], *,
                  channels_last: bool = True, tf32: bool = True, own_kernels: bool = False) -> str | None:
    """The layout of the constant weight (input ``weight_input``) of a ``domain:op_type`` node on ``device``: "nhwc",
    "colmajor" or None (as given). ``channels_last``: the provider's prefer_nhwc; ``tf32``: its use_tf32;
    ``own_kernels``: disable_metacommands (crossml's Triton GEMM reads row-major weights faster)."""
    if device.type == "cpu" or not isinstance(w, torch.Tensor):
        return None
    if op_type in CHANNELS_LAST_OPS:
        return "nhwc" if channels_last and w.dim() == 4 and w.dtype.is_floating_point else None
    if not own_kernels and column_major_weight(domain, op_type, w, device, attrs, tf32):
        return "colmajor"
    return None


def pack_weight(w: torch.Tensor, layout: str) -> torch.Tensor:
    """``w`` in ``layout`` (a result of ``weight_layout``): same values and shape, other strides."""
    if layout == "nhwc":
        return w.contiguous(memory_format=torch.channels_last)
    if layout == "colmajor":
        return w.t().contiguous().t()
    raise ValueError(f"unknown weight layout {layout!r}; expected 'nhwc' or 'colmajor'")
