"""Random generators and dropout: RandomNormal, RandomUniform, RandomNormalLike,
RandomUniformLike, Bernoulli, Multinomial, Dropout.

A ``seed`` attribute gives a generator seeded once per node call, so a seeded node yields the
same values on every run (on a given device); without it torch's global generator is used.
The planner never folds these ops (they are listed as nondeterministic). Values are drawn in
float32 and cast, so float16 / bfloat16 outputs work on every device.

Dropout is the identity at inference (mask all true); with ``training_mode`` (opset 12+) it
zeroes elements with probability ``ratio`` and scales the rest by ``1 / (1 - ratio)``.
"""

from __future__ import annotations

from typing import Any

import torch

from crossml import dtypes
from crossml.ops._util import scalar
from crossml.ops.registry import OpContext, op

_FLOAT_TYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _generator(seed: float | None, device: torch.device) -> torch.Generator | None:
    if seed is None:
        return None
    g = torch.Generator(device=device)
    g.manual_seed(int(seed) & 0xFFFFFFFFFFFFFFFF)
    return g


def _float_dtype(elem_type: int | None, default: torch.dtype, opname: str) -> torch.dtype:
    dt = dtypes.torch_dtype(elem_type) if elem_type else default
    if dt not in _FLOAT_TYPES:
        raise TypeError(f"{opname} produces float16, bfloat16, float or double, got {dt}")
    return dt


def _device(ctx: OpContext | None, like: Any = None) -> torch.device:
    if isinstance(like, torch.Tensor):
        return like.device
    if ctx is not None and ctx.device is not None:
        return torch.device(ctx.device)
    return torch.device("cpu")


def _normal(shape: list[int], dtype: torch.dtype, mean: float, scale: float, seed: float | None,
            device: torch.device) -> torch.Tensor:
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    y = torch.randn(shape, dtype=wide, device=device, generator=_generator(seed, device))
    return (y * scale + mean).to(dtype)


def _uniform(shape: list[int], dtype: torch.dtype, low: float, high: float, seed: float | None,
             device: torch.device) -> torch.Tensor:
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    y = torch.rand(shape, dtype=wide, device=device, generator=_generator(seed, device))
    return (y * (high - low) + low).to(dtype)


@op("RandomNormal", since=1, ctx=True)
def random_normal(*, shape: list[int], dtype: int = 1, mean: float = 0.0, scale: float = 1.0,
                  seed: float | None = None, ctx: OpContext | None = None) -> torch.Tensor:
    return _normal(shape, _float_dtype(dtype, torch.float32, "RandomNormal"), mean, scale, seed, _device(ctx))


@op("RandomUniform", since=1, ctx=True)
def random_uniform(*, shape: list[int], dtype: int = 1, low: float = 0.0, high: float = 1.0,
                   seed: float | None = None, ctx: OpContext | None = None) -> torch.Tensor:
    return _uniform(shape, _float_dtype(dtype, torch.float32, "RandomUniform"), low, high, seed, _device(ctx))


@op("RandomNormalLike", since=1)
def random_normal_like(x: Any, *, dtype: int | None = None, mean: float = 0.0, scale: float = 1.0,
                       seed: float | None = None) -> torch.Tensor:
    dt = _float_dtype(dtype, x.dtype if isinstance(x, torch.Tensor) else torch.float32, "RandomNormalLike")
    return _normal(list(x.shape), dt, mean, scale, seed, _device(None, x))


@op("RandomUniformLike", since=1)
def random_uniform_like(x: Any, *, dtype: int | None = None, low: float = 0.0, high: float = 1.0,
                        seed: float | None = None) -> torch.Tensor:
    dt = _float_dtype(dtype, x.dtype if isinstance(x, torch.Tensor) else torch.float32, "RandomUniformLike")
    return _uniform(list(x.shape), dt, low, high, seed, _device(None, x))


@op("Bernoulli", since=15)
def bernoulli(x: torch.Tensor, *, dtype: int | None = None, seed: float | None = None) -> torch.Tensor:
    out = dtypes.torch_dtype(dtype) if dtype else x.dtype
    wide = torch.float64 if x.dtype == torch.float64 else torch.float32
    u = torch.rand(x.shape, dtype=wide, device=x.device, generator=_generator(seed, x.device))
    return (u < x.to(wide)).to(out)


@op("Multinomial", since=7)
def multinomial(x: torch.Tensor, *, dtype: int = 6, sample_size: int = 1, seed: float | None = None) -> torch.Tensor:
    if x.dim() != 2:
        raise ValueError(f"Multinomial takes [batch_size, class_size] log-probabilities, got shape {tuple(x.shape)}")
    out = dtypes.torch_dtype(dtype)
    if out not in (torch.int32, torch.int64):
        raise TypeError(f"Multinomial produces int32 or int64, got {out}")
    probs = torch.softmax(x.to(torch.float64 if x.dtype == torch.float64 else torch.float32), dim=-1)
    y = torch.multinomial(probs, sample_size, replacement=True, generator=_generator(seed, x.device))
    return y.to(out)


# --- dropout ---------------------------------------------------------------------------------


def _dropout(x: torch.Tensor, ratio: float, training: bool, seed: float | None, mask_dtype: torch.dtype,
             want_mask: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    if not training or ratio == 0.0:
        mask = torch.ones(x.shape, dtype=mask_dtype, device=x.device) if want_mask else None
        return x, mask
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"Dropout ratio must be in [0, 1), got {ratio}")
    keep = torch.rand(x.shape, device=x.device, generator=_generator(seed, x.device)) >= ratio
    y = torch.where(keep, x / (1.0 - ratio), torch.zeros((), dtype=x.dtype, device=x.device)).to(x.dtype)
    return y, (keep.to(mask_dtype) if want_mask else None)


@op("Dropout", since=1, ctx=True)
@op("Dropout", since=6, ctx=True)
@op("Dropout", since=7, ctx=True)
def dropout_7(x: torch.Tensor, *, ratio: float = 0.5, is_test: int = 0, consumed_inputs: list[int] | None = None,
              ctx: OpContext | None = None) -> Any:
    """Opsets 1-9: an inference runtime runs Dropout as the identity (as onnxruntime does)."""
    want = ctx is not None and ctx.num_outputs > 1 and ctx.outputs_wanted[1]
    mask_dtype = torch.bool if ctx is not None and ctx.opset >= 10 else x.dtype
    y, mask = _dropout(x, ratio, False, None, mask_dtype, want)
    return (y, mask) if ctx is not None and ctx.num_outputs > 1 else y


@op("Dropout", since=10, ctx=True)
def dropout_10(x: torch.Tensor, *, ratio: float = 0.5, ctx: OpContext | None = None) -> Any:
    want = ctx is not None and ctx.num_outputs > 1 and ctx.outputs_wanted[1]
    y, mask = _dropout(x, ratio, False, None, torch.bool, want)
    return (y, mask) if ctx is not None and ctx.num_outputs > 1 else y


@op("Dropout", since=12, ctx=True, host_inputs=(1, 2))
@op("Dropout", since=13, ctx=True, host_inputs=(1, 2))
@op("Dropout", since=22, ctx=True, host_inputs=(1, 2))
def dropout_12(x: torch.Tensor, ratio: Any = None, training_mode: Any = None, *, seed: int | None = None,
               ctx: OpContext | None = None) -> Any:
    r = float(scalar(ratio)) if ratio is not None else 0.5
    training = bool(scalar(training_mode)) if training_mode is not None else False
    want = ctx is not None and ctx.num_outputs > 1 and ctx.outputs_wanted[1]
    y, mask = _dropout(x, r, training, seed, torch.bool, want)
    return (y, mask) if ctx is not None and ctx.num_outputs > 1 else y
