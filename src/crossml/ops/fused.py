"""Fused ops made by crossml's graph rewrites (domain com.crossml), e.g. Conv+Add+Relu.

On a CUDA/ROCm GPU with cuDNN (MIOpen), FusedConv is one library call; elsewhere it composes the
library's Conv, Add and Relu, so results are the same on every provider.
"""

from __future__ import annotations

import torch

from crossml.ops.conv import conv
from crossml.ops.registry import op

DOMAIN = "com.crossml"


@op("FusedConv", since=1, domain=DOMAIN)
def fused_conv(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, z: torch.Tensor | None = None, *,
               activation: str = "Relu", dilations: list[int] | None = None, group: int = 1,
               kernel_shape: list[int] | None = None, pads: list[int] | None = None,
               strides: list[int] | None = None) -> torch.Tensor:
    """relu(conv(x, w, b) + z), z optional."""
    if activation != "Relu":
        raise ValueError(f"FusedConv supports activation 'Relu', got '{activation}'")
    if x.is_cuda and x.dim() == 4 and x.dtype in (torch.float16, torch.float32) and torch.backends.cudnn.is_available():
        stride = list(strides or [1, 1])
        pad = list(pads[:2]) if pads else [0, 0]
        dil = list(dilations or [1, 1])
        if z is None:
            return torch.cudnn_convolution_relu(x, w, b, stride, pad, dil, group)
        return torch.cudnn_convolution_add_relu(x, w, z, 1.0, b, stride, pad, dil, group)
    y = conv(x, w, b, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads, strides=strides)
    if z is not None:
        y = y + z
    return torch.relu(y)
