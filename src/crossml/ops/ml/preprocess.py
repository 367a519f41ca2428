"""ai.onnx.ml feature preprocessing: ArrayFeatureExtractor, Binarizer, Normalizer, Scaler, Imputer,
OneHotEncoder, FeatureVectorizer. Numeric work is torch on the input's device."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from crossml.ops._util import ints
from crossml.ops.registry import ML_DOMAIN, OpContext, op


def _as_float(x: torch.Tensor) -> torch.Tensor:
    """ml ops compute float inputs in their type and everything else (ints) in float32."""
    return x if x.dtype in (torch.float32, torch.float64) else x.to(torch.float32)


def _on(t: torch.Tensor, ctx: OpContext) -> torch.Tensor:
    return t if ctx.device is None else t.to(ctx.device)


@op("ArrayFeatureExtractor", since=1, domain=ML_DOMAIN, host_inputs=(1,))
def array_feature_extractor(x: Any, y: Any) -> Any:
    """Columns ``y`` of the last axis of ``x`` (a 1-D ``x`` gives shape [1, len(y)])."""
    idx = ints(y)
    width = int(x.shape[-1]) if x.ndim else 0
    bad = [i for i in idx if not 0 <= i < width]
    if bad or not idx:
        raise ValueError(f"ArrayFeatureExtractor indices {bad or idx} are out of range for a last axis of size {width}")
    if isinstance(x, np.ndarray):  # strings
        out = x[..., idx]
    else:
        out = x.index_select(-1, torch.tensor(idx, dtype=torch.int64, device=x.device))
    return out.reshape(1, -1) if x.ndim == 1 else out


@op("Binarizer", since=1, domain=ML_DOMAIN)
def binarizer(x: torch.Tensor, *, threshold: float = 0.0) -> torch.Tensor:
    return (x > threshold).to(x.dtype)


@op("Normalizer", since=1, domain=ML_DOMAIN)
def normalizer(x: torch.Tensor, *, norm: str = "MAX") -> torch.Tensor:
    x = x.to(torch.float32)
    if norm == "MAX":
        div = x.amax(dim=-1, keepdim=True)  # onnxruntime: the largest value, not |x|
    elif norm == "L1":
        div = x.abs().sum(dim=-1, keepdim=True)
    elif norm == "L2":
        div = x.square().sum(dim=-1, keepdim=True).sqrt()
    else:
        raise ValueError(f"norm must be MAX, L1 or L2, got {norm!r}")
    return x / div


@op("Scaler", since=1, domain=ML_DOMAIN)
def scaler(x: torch.Tensor, *, offset: list[float] | None = None, scale: list[float] | None = None) -> torch.Tensor:
    x = x.to(torch.float32)
    width = int(x.shape[-1]) if x.dim() else 1
    for name, v in (("offset", offset), ("scale", scale)):
        if v and len(v) not in (1, width):
            raise ValueError(f"Scaler {name} has {len(v)} values; expected 1 or {width} (the last axis)")
    off = torch.tensor(offset or [0.0], dtype=torch.float32, device=x.device)
    sc = torch.tensor(scale or [1.0], dtype=torch.float32, device=x.device)
    return (x - off) * sc


@op("Imputer", since=1, domain=ML_DOMAIN)
def imputer(x: torch.Tensor, *, imputed_value_floats: list[float] | None = None,
            imputed_value_int64s: list[int] | None = None, replaced_value_float: float = 0.0,
            replaced_value_int64: int = 0) -> torch.Tensor:
    if x.is_floating_point():
        if not imputed_value_floats:
            raise ValueError("Imputer on a float tensor needs imputed_value_floats")
        values, replaced = imputed_value_floats, replaced_value_float
    else:
        if not imputed_value_int64s:
            raise ValueError("Imputer on an integer tensor needs imputed_value_int64s")
        values, replaced = imputed_value_int64s, replaced_value_int64
    width = int(x.shape[-1]) if x.dim() else 1
    if len(values) not in (1, width):
        raise ValueError(f"Imputer has {len(values)} imputed values; expected 1 or {width} (the last axis)")
    fill = torch.tensor(values, dtype=x.dtype, device=x.device)
    hit = x.isnan() if x.is_floating_point() and math.isnan(replaced) else x == replaced
    return torch.where(hit, fill, x)


@op("OneHotEncoder", since=1, domain=ML_DOMAIN, ctx=True)
def one_hot_encoder(x: Any, *, cats_int64s: list[int] | None = None, cats_strings: list[str] | None = None,
                    zeros: int = 1, ctx: OpContext) -> torch.Tensor:
    if isinstance(x, np.ndarray):
        if not cats_strings:
            raise ValueError("OneHotEncoder on strings needs cats_strings")
        pos = {c: i for i, c in enumerate(cats_strings)}
        codes = torch.tensor([pos.get(s, -1) for s in x.reshape(-1).tolist()], dtype=torch.int64)
        codes = _on(codes.reshape(x.shape), ctx)
        n = len(cats_strings)
        hot = codes.unsqueeze(-1) == torch.arange(n, device=codes.device)
    else:
        if not cats_int64s:
            raise ValueError("OneHotEncoder on numbers needs cats_int64s")
        cats = torch.tensor(cats_int64s, dtype=torch.int64, device=x.device)
        vals = x.to(torch.int64) if x.is_floating_point() else x.to(torch.int64)
        hot = vals.unsqueeze(-1) == cats
    if not zeros and not bool(hot.any(dim=-1).all()):
        raise ValueError("OneHotEncoder: an input value is not one of the categories and zeros=0")
    return hot.to(torch.float32)


@op("FeatureVectorizer", since=1, domain=ML_DOMAIN)
def feature_vectorizer(*inputs: torch.Tensor, inputdimensions: list[int] | None = None) -> torch.Tensor:
    dims = inputdimensions or []
    if len(dims) != len(inputs):
        raise ValueError(f"FeatureVectorizer has {len(inputs)} inputs but {len(dims)} inputdimensions")
    cols = []
    for x, d in zip(inputs, dims):
        x = x.to(torch.float32)
        x = x.reshape(1, -1) if x.dim() == 1 else x.reshape(x.shape[0], -1)
        if x.shape[1] > d:
            x = x[:, :d]
        elif x.shape[1] < d:
            x = torch.nn.functional.pad(x, (0, d - x.shape[1]))
        cols.append(x)
    return torch.cat(cols, dim=1)
