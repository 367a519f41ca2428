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


def column_major_fp32_weights(device: torch.device) -> bool:
    """Whether float32 matrix products on ``device`` run faster with the constant [K, N] weight stored
    column-major (its transpose contiguous: the layout of ``nn.Linear``). cuBLAS picks much slower kernels
    for a row-major float32 weight at encoder sizes: 128 x 768 x 768 with TF32 takes 9.7 µs against 6.2 on an
    H200 (half precision runs the same either way). Measured on NVIDIA only, so only CUDA builds say yes."""
    return device.type == "cuda" and torch.version.hip is None


def strict_fp32_bias_apart(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether ``x @ w + b`` in strict fp32 (TF32 off) runs faster as a plain product and a separate bias add
    than as one call with cuBLASLt's bias epilogue, which picks split-K SIMT kernels at encoder sizes: 128 x 768
    x 768 takes 29 µs with the epilogue against 11 µs for the product alone on an H200 (3072 x 768: 64 vs 22).
    Measured on NVIDIA only."""
    return (x.is_cuda and torch.version.hip is None and x.dtype == torch.float32 and w.dtype == torch.float32
            and not torch.backends.cuda.matmul.allow_tf32)
