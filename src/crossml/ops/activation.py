"""Activation ops of ai.onnx: the Relu family, sigmoids, Gelu/Mish/Swish, Shrink, and
Softmax / LogSoftmax / Hardmax.

Opset 1-12 Softmax, LogSoftmax and Hardmax coerce the input to 2-D ``[prod(shape[:axis]),
prod(shape[axis:])]`` and normalize each row; opset 13 normalizes along the one ``axis``.
Every op keeps the input dtype (integer Relu/PRelu/Shrink included).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from crossml.ops._util import broadcast_shapes, norm_axis
from crossml.ops.registry import op

Tensor = torch.Tensor

SELU_ALPHA = 1.67326319217681884765625
SELU_GAMMA = 1.05070102214813232421875


def _unsigned(x: Tensor) -> bool:
    return not x.dtype.is_signed and not x.dtype.is_floating_point and x.dtype != torch.bool


# --------------------------------------------------------------------------------------------
# the Relu family


@op("Relu", since=1)
def relu(x: Tensor) -> Tensor:
    return x if _unsigned(x) else torch.relu(x)


@op("LeakyRelu", since=1)
def leaky_relu(x: Tensor, *, alpha: float = 0.01) -> Tensor:
    return F.leaky_relu(x, alpha)


@op("Elu", since=1)
def elu(x: Tensor, *, alpha: float = 1.0) -> Tensor:
    return torch.where(x > 0, x, alpha * torch.expm1(x))


@op("Selu", since=1)
def selu(x: Tensor, *, alpha: float = SELU_ALPHA, gamma: float = SELU_GAMMA) -> Tensor:
    return gamma * torch.where(x > 0, x, alpha * torch.expm1(x))


@op("Celu", since=12)
def celu(x: Tensor, *, alpha: float = 1.0) -> Tensor:
    return F.celu(x, alpha)


@op("ThresholdedRelu", since=10)
def thresholded_relu(x: Tensor, *, alpha: float = 1.0) -> Tensor:
    return torch.where(x > alpha, x, torch.zeros_like(x))


@op("PRelu", since=1)
def prelu_channels(x: Tensor, slope: Tensor) -> Tensor:
    """Opset 1-6: a 1-D slope of C values applies per channel (axis 1)."""
    if slope.dim() == 1 and slope.numel() > 1 and x.dim() > 2:
        slope = slope.reshape((-1,) + (1,) * (x.dim() - 2))
    return prelu(x, slope)


@op("PRelu", since=7)
def prelu(x: Tensor, slope: Tensor) -> Tensor:
    """``slope`` broadcasts to ``x`` (unidirectional); integer types keep their dtype."""
    if slope.dtype != x.dtype:
        raise TypeError(f"PRelu expects slope of the input's type {x.dtype}, got {slope.dtype}")
    if _unsigned(x):
        return x
    if broadcast_shapes(x.shape, slope.shape) != x.shape:
        raise ValueError(f"PRelu slope of shape {tuple(slope.shape)} does not broadcast to input shape "
                         f"{tuple(x.shape)}")
    return torch.where(x < 0, x * slope, x)


# --------------------------------------------------------------------------------------------
# smooth activations


@op("Sigmoid", since=1)
def sigmoid(x: Tensor) -> Tensor:
    return torch.sigmoid(x)


@op("Tanh", since=1)
def tanh(x: Tensor) -> Tensor:
    return torch.tanh(x)


@op("HardSigmoid", since=1)
def hard_sigmoid(x: Tensor, *, alpha: float = 0.2, beta: float = 0.5) -> Tensor:
    return torch.clamp(alpha * x + beta, 0, 1)


@op("HardSwish", since=14)
def hard_swish(x: Tensor) -> Tensor:
    return x * torch.clamp(x * (1 / 6) + 0.5, 0, 1)


@op("Softplus", since=1)
def softplus(x: Tensor) -> Tensor:
    return F.softplus(x)


@op("Softsign", since=1)
def softsign(x: Tensor) -> Tensor:
    return x / (1 + torch.abs(x))


@op("Gelu", since=20)
def gelu(x: Tensor, *, approximate: str = "none") -> Tensor:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"Gelu attribute approximate must be 'none' or 'tanh', got '{approximate}'")
    return F.gelu(x, approximate=approximate)


@op("Mish", since=18)
def mish(x: Tensor) -> Tensor:
    return F.mish(x)


@op("Swish", since=24)
def swish(x: Tensor, *, alpha: float = 1.0) -> Tensor:
    return x * torch.sigmoid(alpha * x)


@op("Shrink", since=9)
def shrink(x: Tensor, *, bias: float = 0.0, lambd: float = 0.5) -> Tensor:
    """``x + bias`` below ``-lambd``, ``x - bias`` above ``lambd``, 0 between; integers computed in double."""
    xf = x if x.dtype.is_floating_point else x.double()
    y = torch.where(xf < -lambd, xf + bias, torch.where(xf > lambd, xf - bias, torch.zeros_like(xf)))
    return y.to(x.dtype)


# --------------------------------------------------------------------------------------------
# Softmax, LogSoftmax, Hardmax


def _hardmax(x: Tensor, dim: int) -> Tensor:
    """1 at the first maximum along ``dim``, 0 elsewhere."""
    if x.numel() == 0:
        return torch.zeros_like(x)
    idx = torch.argmax(x, dim=dim, keepdim=True)
    return torch.zeros_like(x).scatter(dim, idx, 1)


def _as_2d(fn: Callable[[Tensor, int], Tensor], x: Tensor, axis: int) -> Tensor:
    """Opset < 13: apply ``fn`` to the rows of ``x`` coerced to 2-D at ``axis``."""
    ax = norm_axis(axis, x.dim())
    flat = x.reshape(math.prod(x.shape[:ax]), math.prod(x.shape[ax:]))
    return fn(flat, 1).reshape(x.shape)


def _on_axis(fn: Callable[[Tensor, int], Tensor], x: Tensor, axis: int) -> Tensor:
    return fn(x, norm_axis(axis, x.dim()))


@op("Softmax", since=1)
def softmax_2d(x: Tensor, *, axis: int = 1) -> Tensor:
    return _as_2d(torch.softmax, x, axis)


@op("Softmax", since=13)
def softmax(x: Tensor, *, axis: int = -1) -> Tensor:
    return _on_axis(torch.softmax, x, axis)


@op("LogSoftmax", since=1)
def log_softmax_2d(x: Tensor, *, axis: int = 1) -> Tensor:
    return _as_2d(torch.log_softmax, x, axis)


@op("LogSoftmax", since=13)
def log_softmax(x: Tensor, *, axis: int = -1) -> Tensor:
    return _on_axis(torch.log_softmax, x, axis)


@op("Hardmax", since=1)
def hardmax_2d(x: Tensor, *, axis: int = 1) -> Tensor:
    return _as_2d(_hardmax, x, axis)


@op("Hardmax", since=13)
def hardmax(x: Tensor, *, axis: int = -1) -> Tensor:
    return _on_axis(_hardmax, x, axis)
