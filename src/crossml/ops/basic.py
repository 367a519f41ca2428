"""Constants and identity: Constant, ConstantOfShape, Identity."""

from __future__ import annotations

from typing import Any

import torch

from crossml.ops._util import ints
from crossml.ops.registry import op


@op("Identity", since=1)
def identity(x: Any) -> Any:
    return x


@op("Constant", since=1)
def constant(*, value: Any = None, value_float: float | None = None, value_floats: list[float] | None = None,
             value_int: int | None = None, value_ints: list[int] | None = None, value_string: str | None = None,
             value_strings: list[str] | None = None, sparse_value: Any = None) -> Any:
    import numpy as np

    if value is not None:
        return value
    if sparse_value is not None:
        return sparse_value
    if value_float is not None:
        return torch.tensor(value_float, dtype=torch.float32)
    if value_floats is not None:
        return torch.tensor(value_floats, dtype=torch.float32)
    if value_int is not None:
        return torch.tensor(value_int, dtype=torch.int64)
    if value_ints is not None:
        return torch.tensor(value_ints, dtype=torch.int64)
    if value_string is not None:
        return np.array(value_string, dtype=object)
    if value_strings is not None:
        return np.array(value_strings, dtype=object)
    raise ValueError("Constant node has none of its value attributes set")


@op("ConstantOfShape", since=9, host_inputs=(0,))
def constant_of_shape(shape: Any, *, value: torch.Tensor | None = None) -> torch.Tensor:
    dims = ints(shape)
    if value is None:
        return torch.zeros(dims, dtype=torch.float32)
    return value.reshape(()).expand(dims).clone() if dims else value.reshape(()).clone()
