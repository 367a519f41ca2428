"""Wrapping memory the user owns (raw pointers, DLPack, array interfaces) as torch tensors, no copy."""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence

import numpy as np
import torch


class _CudaArray:
    """A minimal ``__cuda_array_interface__`` provider for a raw device pointer."""

    def __init__(self, ptr: int, shape: tuple[int, ...], typestr: str) -> None:
        self.__cuda_array_interface__ = {"data": (int(ptr), False), "shape": shape, "typestr": typestr,
                                         "strides": None, "version": 3}


def tensor_from_pointer(ptr: int, shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A tensor viewing ``prod(shape)`` elements at address ``ptr`` on ``device`` (no copy).

    The caller keeps the memory alive for as long as the tensor is used, as with onnxruntime's
    ``bind_input(..., buffer_ptr)``.
    """
    shape = tuple(int(s) for s in shape)
    n = math.prod(shape)
    itemsize = torch.empty((), dtype=dtype).element_size()
    if device.type == "cpu":
        buf = (ctypes.c_uint8 * (n * itemsize)).from_address(int(ptr)) if n else bytearray(0)
        raw = np.frombuffer(buf, dtype=np.uint8)
        return torch.from_numpy(raw).view(dtype).reshape(shape)
    if device.type == "cuda":
        holder = _CudaArray(ptr, (n * itemsize,), "|u1")
        raw = torch.as_tensor(holder, device=device)
        return raw.view(dtype).reshape(shape)
    raise NotImplementedError(f"raw pointers on {device.type} devices are not supported; pass a DLPack object")
