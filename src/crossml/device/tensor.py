"""Tensor descriptions and device tensors, and wrapping memory the user already owns (no copy).

A :class:`TensorDesc` is DirectML's DML_BUFFER_TENSOR_DESC: element type, sizes, optional strides.
A :class:`DeviceTensor` is a buffer on a device described by one; it is a torch tensor underneath,
so it moves across libraries through DLPack without a copy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import torch

from crossml import dtypes
from crossml.device.interop import tensor_from_pointer
from crossml.runtime.errors import InvalidArgument


def _torch_dtype(dtype: Any) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, int):
        return dtypes.torch_dtype(dtype)
    if isinstance(dtype, str) and dtype in _ONNX_NAMES:
        return dtypes.torch_dtype(_ONNX_NAMES[dtype])
    try:
        return dtypes.torch_dtype(dtypes.onnx_type_of_numpy(np.dtype(dtype)))
    except TypeError:
        raise InvalidArgument(f"unknown element type {dtype!r}; use e.g. 'float32', 'float16', 'int64'") from None


_ONNX_NAMES = {"float": onnx.TensorProto.FLOAT, "float32": onnx.TensorProto.FLOAT, "float16": onnx.TensorProto.FLOAT16,
               "bfloat16": onnx.TensorProto.BFLOAT16, "double": onnx.TensorProto.DOUBLE}


@dataclass(frozen=True)
class TensorDesc:
    """Element type, sizes and (optional, in elements) strides of a tensor."""

    dtype: torch.dtype
    sizes: tuple[int, ...]
    strides: tuple[int, ...] | None = None

    def __init__(self, dtype: Any, sizes: Sequence[int], strides: Sequence[int] | None = None) -> None:
        object.__setattr__(self, "dtype", _torch_dtype(dtype))
        object.__setattr__(self, "sizes", tuple(int(s) for s in sizes))
        if strides is not None and len(strides) != len(sizes):
            raise InvalidArgument(f"TensorDesc: {len(strides)} strides for {len(sizes)} sizes")
        object.__setattr__(self, "strides", None if strides is None else tuple(int(s) for s in strides))

    @staticmethod
    def of(t: torch.Tensor) -> TensorDesc:
        return TensorDesc(t.dtype, tuple(t.shape), None if t.is_contiguous() else tuple(t.stride()))

    @property
    def onnx_type(self) -> int:
        return dtypes.TORCH_TO_ONNX[self.dtype]

    @property
    def numel(self) -> int:
        return math.prod(self.sizes)

    @property
    def nbytes(self) -> int:
        if self.strides is None:
            return self.numel * self.element_size
        span = 1 + sum((s - 1) * st for s, st in zip(self.sizes, self.strides)) if self.numel else 0
        return span * self.element_size

    @property
    def element_size(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    def check(self, t: torch.Tensor, what: str) -> None:
        """Raise InvalidArgument unless ``t`` fits this description."""
        if t.dtype != self.dtype or tuple(t.shape) != self.sizes:
            raise InvalidArgument(
                f"{what}: bound tensor is {_fmt(t.dtype, tuple(t.shape))}, the description says "
                f"{_fmt(self.dtype, self.sizes)}"
            )
        if self.strides is not None and tuple(t.stride()) != self.strides:
            raise InvalidArgument(f"{what}: bound tensor has strides {tuple(t.stride())}, the description says {self.strides}")

    def __str__(self) -> str:
        return _fmt(self.dtype, self.sizes)


def _fmt(dt: torch.dtype, sizes: tuple[int, ...]) -> str:
    return f"{str(dt).replace('torch.', '')}{list(sizes)}"


class DeviceTensor:
    """A buffer on a device, described by a TensorDesc (a torch tensor underneath)."""

    __slots__ = ("torch", "desc", "_owner")

    def __init__(self, t: torch.Tensor, owner: Any = None) -> None:
        self.torch = t
        self.desc = TensorDesc.of(t)
        self._owner = owner  # keeps wrapped foreign memory alive

    @property
    def device(self) -> torch.device:
        return self.torch.device

    def data_ptr(self) -> int:
        return int(self.torch.data_ptr())

    def __dlpack__(self, stream: Any = None, **kw: Any) -> Any:
        return self.torch.__dlpack__(stream=stream, **kw)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.torch.__dlpack_device__()

    def to_ortvalue(self) -> Any:
        from crossml.runtime.ortvalue import OrtValue

        return OrtValue.ortvalue_from_torch(self.torch)

    def __repr__(self) -> str:
        return f"DeviceTensor({self.desc}, device={self.torch.device})"


def wrap(obj: Any) -> DeviceTensor:
    """Wrap memory the user owns as a DeviceTensor, without a copy.

    Accepts a torch tensor, an OrtValue, anything with ``__dlpack__`` (CuPy, JAX, numpy...) or
    ``__cuda_array_interface__`` (Numba, older CuPy), or a DeviceTensor.
    """
    from crossml.runtime.ortvalue import OrtValue

    if isinstance(obj, DeviceTensor):
        return obj
    if isinstance(obj, torch.Tensor):
        return DeviceTensor(obj)
    if isinstance(obj, OrtValue):
        return DeviceTensor(obj.as_torch(), owner=obj)
    if hasattr(obj, "__dlpack__"):
        return DeviceTensor(torch.from_dlpack(obj), owner=obj)
    if hasattr(obj, "__cuda_array_interface__"):
        return DeviceTensor(torch.as_tensor(obj, device="cuda"), owner=obj)
    raise InvalidArgument(
        f"cannot wrap a {type(obj).__name__}: pass a torch tensor, an OrtValue, or an object with "
        "__dlpack__ or __cuda_array_interface__ (or use wrap_pointer for a raw address)"
    )


def wrap_pointer(ptr: int, desc: TensorDesc, device: Any = "cuda", owner: Any = None) -> DeviceTensor:
    """Wrap ``desc.numel`` elements at address ``ptr`` on ``device`` (no copy; keep the memory alive)."""
    dev = torch.device(device) if not isinstance(device, torch.device) else device
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    t = tensor_from_pointer(ptr, desc.sizes, desc.dtype, dev)
    if desc.strides is not None:
        t = torch.as_strided(t.reshape(-1), desc.sizes, desc.strides)
    return DeviceTensor(t, owner=owner)
