"""Vendor math-library entry points (DirectML's "metacommands") that torch exposes directly.

Ops ask here for a vendor-fused kernel; None means "not available for these tensors", and the op
composes the library's plain ops instead. This is the one place crossml names a vendor library.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def fused_conv_add_relu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, z: torch.Tensor | None,
                        strides: Sequence[int], pads: Sequence[int], dilations: Sequence[int],
                        group: int) -> torch.Tensor | None:
    """relu(conv2d(x, w, b) + z) as one cuDNN (MIOpen on ROCm) call, or None where it does not apply."""
    if not (x.is_cuda and x.dim() == 4 and x.dtype in (torch.float16, torch.float32)
            and torch.backends.cudnn.is_available()):
        return None
    if group > 1:  # cuDNN runs fused grouped convolutions with a direct kernel ~4x slower than conv, bias, ReLU
        return None
    if z is None:
        return torch.cudnn_convolution_relu(x, w, b, list(strides), list(pads), list(dilations), group)
    return torch.cudnn_convolution_add_relu(x, w, z, 1.0, b, list(strides), list(pads), list(dilations), group)
