"""com.microsoft activations that onnxruntime's transformer fusions and the GenAI builder emit.

Gelu (exact, erf), BiasGelu (Gelu of A + B), FastGelu (tanh approximation, optional bias) and
QuickGelu (x * sigmoid(alpha * x)). Half-precision inputs are computed in float32 and cast back,
as onnxruntime's CPU kernels do.
"""

from __future__ import annotations

import math

import torch

from crossml.ops.registry import MS_DOMAIN, op

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _wide(x: torch.Tensor) -> torch.Tensor:
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _gelu_erf(x: torch.Tensor) -> torch.Tensor:
    w = _wide(x)
    return (0.5 * w * (1.0 + torch.erf(w * math.sqrt(0.5)))).to(x.dtype)


@op("Gelu", domain=MS_DOMAIN)
def gelu(X: torch.Tensor) -> torch.Tensor:
    return _gelu_erf(X)


@op("BiasGelu", domain=MS_DOMAIN)
def bias_gelu(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    return _gelu_erf(_wide(A) + _wide(B)).to(A.dtype)


@op("FastGelu", domain=MS_DOMAIN)
def fast_gelu(X: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    w = _wide(X)
    if bias is not None:
        w = w + _wide(bias)
    y = 0.5 * w * (1.0 + torch.tanh(_SQRT_2_OVER_PI * w + (_SQRT_2_OVER_PI * 0.044715) * w * w * w))
    return y.to(X.dtype)


@op("QuickGelu", domain=MS_DOMAIN)
def quick_gelu(X: torch.Tensor, *, alpha: float = 1.702) -> torch.Tensor:
    w = _wide(X)
    return (w * torch.sigmoid(alpha * w)).to(X.dtype)
