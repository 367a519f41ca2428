"""ai.onnx.preview.training optimizers: Adagrad, Adam, Momentum.

Inputs are ``R`` (learning rate), ``T`` (update count, read on the host), then one group per
optimized tensor: X..., G..., and the optimizer states. Outputs are the new X... then the new states.
"""

from __future__ import annotations

import math

import torch

from crossml.ops._util import scalar
from crossml.ops.registry import op

TRAINING_DOMAIN = "ai.onnx.preview.training"


def _groups(data: tuple[torch.Tensor, ...], per_tensor: int, name: str) -> list[list[torch.Tensor]]:
    """Split X..., G..., S1..., S2... into one list per optimized tensor: [x, g, s1, s2]."""
    if not data or len(data) % per_tensor:
        raise ValueError(f"{name} takes R, T and {per_tensor} inputs per optimized tensor; got {len(data) + 2} inputs")
    n = len(data) // per_tensor
    return [[data[k * n + i] for k in range(per_tensor)] for i in range(n)]


def _rate(r: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return r.reshape(()).to(like.dtype)


@op("Adagrad", since=1, domain=TRAINING_DOMAIN, host_inputs=(1,))
def adagrad(r: torch.Tensor, t: torch.Tensor, *data: torch.Tensor, decay_factor: float = 0.0,
            epsilon: float = 1e-6, norm_coefficient: float = 0.0) -> tuple[torch.Tensor, ...]:
    step = int(scalar(t))
    xs, hs = [], []
    for x, g, h in _groups(data, 3, "Adagrad"):
        lr = _rate(r, x) / (1 + step * decay_factor)
        g = norm_coefficient * x + g
        h_new = h + g * g
        xs.append(x - lr * g / (h_new.sqrt() + epsilon))
        hs.append(h_new)
    return tuple(xs + hs)


@op("Adam", since=1, domain=TRAINING_DOMAIN, host_inputs=(1,))
def adam(r: torch.Tensor, t: torch.Tensor, *data: torch.Tensor, alpha: float = 0.9, beta: float = 0.999,
         epsilon: float = 1e-6, norm_coefficient: float = 0.0,
         norm_coefficient_post: float = 0.0) -> tuple[torch.Tensor, ...]:
    step = int(scalar(t))
    correction = math.sqrt(1 - beta ** step) / (1 - alpha ** step) if step > 0 else 1.0
    xs, vs, hs = [], [], []
    for x, g, v, h in _groups(data, 4, "Adam"):
        g = norm_coefficient * x + g
        v_new = alpha * v + (1 - alpha) * g
        h_new = beta * h + (1 - beta) * (g * g)
        x_new = x - _rate(r, x) * correction * (v_new / (h_new.sqrt() + epsilon))
        xs.append((1 - norm_coefficient_post) * x_new)
        vs.append(v_new)
        hs.append(h_new)
    return tuple(xs + vs + hs)


@op("Momentum", since=1, domain=TRAINING_DOMAIN, host_inputs=(1,))
def momentum(r: torch.Tensor, t: torch.Tensor, *data: torch.Tensor, alpha: float, beta: float, mode: str,
             norm_coefficient: float) -> tuple[torch.Tensor, ...]:
    if mode not in ("standard", "nesterov"):
        raise ValueError(f"Momentum mode must be 'standard' or 'nesterov', got {mode!r}")
    b = beta if int(scalar(t)) > 0 else 1.0
    xs, vs = [], []
    for x, g, v in _groups(data, 3, "Momentum"):
        g = norm_coefficient * x + g
        v_new = alpha * v + b * g
        step = g + alpha * v_new if mode == "nesterov" else v_new
        xs.append(x - _rate(r, x) * step)
        vs.append(v_new)
    return tuple(xs + vs)
