"""ai.onnx.ml lookups: LabelEncoder (opsets 1, 2, 4), CategoryMapper, ZipMap.

Numeric -> numeric lookups run on the input's device (sorted keys + searchsorted); a string key or
value goes through numpy on the CPU, and a numeric result is put back on the node's device.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from crossml.ops.registry import ML_DOMAIN, OpContext, op


def _values_array(values: Any) -> tuple[list[Any], Any]:
    """Attribute values as a Python list and the element dtype (torch dtype, or object for strings)."""
    if isinstance(values, np.ndarray):
        return values.reshape(-1).tolist(), object
    if isinstance(values, torch.Tensor):
        return values.reshape(-1).tolist(), values.dtype
    raise TypeError(f"unexpected attribute value {type(values).__name__}")


def _lookup(x: Any, keys: list[Any], values: list[Any], out_dtype: Any, default: Any, ctx: OpContext) -> Any:
    if len(keys) != len(values):
        raise ValueError(f"{len(keys)} keys but {len(values)} values")
    if isinstance(x, torch.Tensor) and out_dtype is not object:
        return _lookup_device(x, keys, values, out_dtype, default)
    flat = x.reshape(-1).tolist() if isinstance(x, np.ndarray) else x.reshape(-1).cpu().tolist()
    table = dict(zip(keys, values))
    nan_value = next((v for k, v in zip(keys, values) if isinstance(k, float) and math.isnan(k)), default)
    out = [table.get(v, nan_value if isinstance(v, float) and math.isnan(v) else default) for v in flat]
    if out_dtype is object:
        arr = np.empty(len(out), dtype=object)
        arr[:] = out
        return arr.reshape(tuple(x.shape))
    t = torch.tensor(out, dtype=out_dtype).reshape(tuple(x.shape))
    return t if ctx.device is None else t.to(ctx.device)


def _lookup_device(x: torch.Tensor, keys: list[Any], values: list[Any], out_dtype: torch.dtype,
                   default: Any) -> torch.Tensor:
    dev = x.device
    k = torch.tensor(keys, dtype=x.dtype, device=dev) if keys else torch.empty(0, dtype=x.dtype, device=dev)
    v = torch.tensor(values, dtype=out_dtype, device=dev) if values else torch.empty(0, dtype=out_dtype, device=dev)
    fill = torch.tensor(default, dtype=out_dtype, device=dev)
    if k.numel() == 0:
        return fill.expand(x.shape).clone()
    order = torch.argsort(k)
    ks, vs = k[order], v[order]
    pos = torch.searchsorted(ks, x.contiguous()).clamp_(max=ks.numel() - 1)
    out = torch.where(ks[pos] == x, vs[pos], fill)
    if x.is_floating_point():
        nan_keys = k.isnan()
        if bool(nan_keys.any()):
            out = torch.where(x.isnan(), v[nan_keys.nonzero()[0, 0]], out)
    return out


_TYPE_DEFAULTS = {object: "_Unused", torch.float32: -0.0, torch.float64: -0.0}


@op("LabelEncoder", since=2, domain=ML_DOMAIN, ctx=True)
def label_encoder(x: Any, *, default_float: float = -0.0, default_int64: int = -1, default_string: str = "_Unused",
                  default_tensor: Any = None, keys_floats: list[float] | None = None,
                  keys_int64s: list[int] | None = None, keys_strings: list[str] | None = None,
                  keys_tensor: Any = None, values_floats: list[float] | None = None,
                  values_int64s: list[int] | None = None, values_strings: list[str] | None = None,
                  values_tensor: Any = None, ctx: OpContext) -> Any:
    given_keys = [k for k in (keys_floats, keys_int64s, keys_strings, keys_tensor) if k is not None]
    given_values = [v for v in (values_floats, values_int64s, values_strings, values_tensor) if v is not None]
    if len(given_keys) != 1 or len(given_values) != 1:
        raise ValueError("LabelEncoder needs exactly one keys_* and one values_* attribute")
    if keys_tensor is not None:
        keys, _ = _values_array(keys_tensor)
    else:
        keys = list(given_keys[0])
    if values_tensor is not None:
        values, out_dtype = _values_array(values_tensor)
        if default_tensor is not None:
            default = _values_array(default_tensor)[0][0]
        else:
            default = _TYPE_DEFAULTS.get(out_dtype, -1)
    elif values_floats is not None:
        values, out_dtype, default = list(values_floats), torch.float32, default_float
    elif values_int64s is not None:
        values, out_dtype, default = list(values_int64s), torch.int64, default_int64
    else:
        values, out_dtype, default = list(values_strings or []), object, default_string
    return _lookup(x, keys, values, out_dtype, default, ctx)


@op("LabelEncoder", since=1, domain=ML_DOMAIN, ctx=True)
def label_encoder1(x: Any, *, classes_strings: list[str] | None = None, default_int64: int = -1,
                   default_string: str = "_Unused", ctx: OpContext) -> Any:
    """Opset 1: strings -> their index in classes_strings, or int64 indices -> the class string."""
    classes = list(classes_strings or [])
    if isinstance(x, np.ndarray):
        return _lookup(x, classes, list(range(len(classes))), torch.int64, default_int64, ctx)
    return _lookup(x, list(range(len(classes))), classes, object, default_string, ctx)


@op("CategoryMapper", since=1, domain=ML_DOMAIN, ctx=True)
def category_mapper(x: Any, *, cats_int64s: list[int] | None = None, cats_strings: list[str] | None = None,
                    default_int64: int = -1, default_string: str = "_Unused", ctx: OpContext) -> Any:
    ints_, strs = list(cats_int64s or []), list(cats_strings or [])
    if len(ints_) != len(strs):
        raise ValueError(f"CategoryMapper has {len(ints_)} cats_int64s but {len(strs)} cats_strings")
    if isinstance(x, np.ndarray):
        return _lookup(x, strs, ints_, torch.int64, default_int64, ctx)
    return _lookup(x, ints_, strs, object, default_string, ctx)


@op("ZipMap", since=1, domain=ML_DOMAIN, cpu_only=True)
def zip_map(x: torch.Tensor, *, classlabels_int64s: list[int] | None = None,
            classlabels_strings: list[str] | None = None) -> list[dict[Any, float]]:
    labels: list[Any] = list(classlabels_int64s or classlabels_strings or [])
    if not labels:
        raise ValueError("ZipMap needs classlabels_int64s or classlabels_strings")
    rows = x.reshape(1, -1) if x.dim() == 1 else x
    if rows.dim() != 2 or rows.shape[1] != len(labels):
        raise ValueError(f"ZipMap input of shape {tuple(x.shape)} does not match {len(labels)} class labels")
    return [dict(zip(labels, r)) for r in rows.to(torch.float32).tolist()]
