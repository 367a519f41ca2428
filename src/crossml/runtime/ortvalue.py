"""OrtValue: a tensor (or sequence, map, optional) owned by the runtime, on the CPU or a GPU."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.utils.dlpack

from crossml import dtypes
from crossml.runtime.errors import InvalidArgument

_GPU_NAMES = {"cuda", "gpu", "dml", "rocm", "hip", "xpu", "mps"}


def torch_device(device_type: str, device_id: int = 0) -> torch.device:
    """onnxruntime device names (``cpu``, ``cuda``, ``gpu``, ``dml``...) -> the torch device."""
    name = str(device_type).lower()
    if name == "cpu":
        return torch.device("cpu")
    if name in _GPU_NAMES:
        from crossml.device.adapter import adapters

        found = adapters()
        if not found:
            raise InvalidArgument(f"device '{device_type}' was requested but this machine has no GPU torch can use")
        if not 0 <= int(device_id) < len(found):
            raise InvalidArgument(f"device_id {device_id} is out of range: {len(found)} GPU(s) present")
        return found[int(device_id)].device
    raise InvalidArgument(f"Unsupported device type '{device_type}'; use 'cpu', 'cuda', 'gpu' or 'dml'")


def ort_device_name(device: torch.device) -> str:
    return "cpu" if device.type == "cpu" else "cuda"


class OrtValue:
    """onnxruntime.OrtValue. Wraps a torch tensor (numpy object array for strings, list for
    sequences, dict for maps, None for an empty optional)."""

    __slots__ = ("_value", "_elem_type", "_keepalive")

    def __init__(self, value: Any, elem_type: int | None = None, keepalive: Any = None) -> None:
        self._value = value
        self._elem_type = elem_type
        self._keepalive = keepalive

    # -- construction -------------------------------------------------------------------
    @staticmethod
    def ortvalue_from_numpy(numpy_obj: np.ndarray, device_type: str = "cpu", device_id: int = 0) -> OrtValue:
        """Zero-copy on the CPU (the OrtValue shares the array's memory); copied to a GPU device."""
        arr = np.asarray(numpy_obj)
        et = dtypes.onnx_type_of_numpy(arr.dtype)
        dev = torch_device(device_type, device_id)
        value = dtypes.from_numpy(arr)
        if isinstance(value, torch.Tensor) and dev.type != "cpu":
            value = value.to(dev)
        return OrtValue(value, et, keepalive=arr if dev.type == "cpu" else None)

    @staticmethod
    def ortvalue_from_numpy_with_onnx_type(data: np.ndarray, onnx_element_type: int) -> OrtValue:
        v = OrtValue.ortvalue_from_numpy(data)
        v._elem_type = int(onnx_element_type)
        return v

    @staticmethod
    def ortvalue_from_shape_and_type(shape: Sequence[int], element_type: Any, device_type: str = "cpu",
                                     device_id: int = 0) -> OrtValue:
        et = _elem_type(element_type)
        dev = torch_device(device_type, device_id)
        if et == dtypes.TP.STRING:
            return OrtValue(np.empty(tuple(shape), dtype=object), et)
        t = torch.empty(tuple(int(s) for s in shape), dtype=dtypes.torch_dtype(et), device=dev)
        return OrtValue(t, et)

    @staticmethod
    def from_dlpack(data: Any, is_bool_tensor: bool = False) -> OrtValue:
        """Wrap anything with ``__dlpack__`` (torch, CuPy, JAX, numpy) or a DLPack capsule, no copy."""
        t = torch.from_dlpack(data)
        if is_bool_tensor and t.dtype == torch.uint8:
            t = t.view(torch.bool)
        return OrtValue(t, dtypes.onnx_type_of(t), keepalive=data)

    def to_dlpack(self) -> Any:
        """A DLPack capsule sharing this value's memory."""
        return torch.utils.dlpack.to_dlpack(self.as_torch())

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> Any:
        return self.as_torch().__dlpack__(stream=stream, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.as_torch().__dlpack_device__()

    @staticmethod
    def ortvalue_from_torch(tensor: torch.Tensor) -> OrtValue:
        """crossml extension: wrap a torch tensor without a copy."""
        return OrtValue(tensor, dtypes.onnx_type_of(tensor))

    # -- queries -------------------------------------------------------------------------
    def numpy(self) -> Any:
        v = self._value
        if isinstance(v, torch.Tensor) or isinstance(v, np.ndarray):
            return dtypes.to_numpy(v, self._elem_type)
        raise InvalidArgument("numpy() is only available for tensors; this OrtValue holds a " + self._kind())

    def shape(self) -> list[int]:
        v = self._value
        if isinstance(v, (torch.Tensor, np.ndarray)):
            return [int(s) for s in v.shape]
        raise InvalidArgument("shape() is only available for tensors")

    def element_type(self) -> int:
        return self._elem_type if self._elem_type is not None else dtypes.onnx_type_of(self._value)

    def data_type(self) -> str:
        v = self._value
        if isinstance(v, list):
            inner = dtypes.tensor_type_string(dtypes.onnx_type_of(v[0])) if v else "tensor(float)"
            return f"seq({inner})"
        if isinstance(v, dict):
            return "map"
        return dtypes.tensor_type_string(self.element_type())

    def device_name(self) -> str:
        v = self._value
        return ort_device_name(v.device) if isinstance(v, torch.Tensor) else "cpu"

    def data_ptr(self) -> int:
        v = self._value
        if isinstance(v, torch.Tensor):
            return int(v.data_ptr())
        if isinstance(v, np.ndarray):
            return int(v.ctypes.data)
        raise InvalidArgument("data_ptr() is only available for tensors")

    def tensor_size_in_bytes(self) -> int:
        """Bytes of the tensor's data (strings: the sum of their UTF-8 lengths)."""
        v = self._value
        if isinstance(v, torch.Tensor):
            return v.numel() * v.element_size()
        if isinstance(v, np.ndarray):
            return sum(len(str(x).encode()) for x in v.flat) if v.dtype == object else int(v.nbytes)
        raise InvalidArgument("tensor_size_in_bytes() is only available for tensors; this OrtValue holds a "
                              + self._kind())

    def update_inplace(self, data: Any) -> None:
        """Copy ``data`` (a numpy array or an OrtValue, any device) into this tensor's memory, which keeps its
        address: how inputs of a recorded (graph-captured) run or an IOBinding get new values."""
        src = data._value if isinstance(data, OrtValue) else data
        src_type = data.element_type() if isinstance(data, OrtValue) else None
        if isinstance(src, np.ndarray) or not isinstance(src, torch.Tensor):
            arr = np.asarray(src)
            src_type = dtypes.onnx_type_of_numpy(arr.dtype)
            src = dtypes.from_numpy(arr)
        dst = self._value
        if not isinstance(dst, torch.Tensor) or not isinstance(src, torch.Tensor):
            raise InvalidArgument("update_inplace: only numeric tensors can be updated in place")
        if src_type != self.element_type():
            raise InvalidArgument(f"update_inplace: the data is {dtypes.tensor_type_string(src_type)} but the OrtValue "
                                  f"holds {self.data_type()}")
        if src.numel() != dst.numel():
            raise InvalidArgument(f"update_inplace: the input size of the data ({src.numel()} elements) does not match "
                                  f"the size of the OrtValue ({dst.numel()} elements)")
        dst.copy_(src.reshape(dst.shape))

    def is_tensor(self) -> bool:
        return isinstance(self._value, (torch.Tensor, np.ndarray))

    def is_tensor_sequence(self) -> bool:
        return isinstance(self._value, list)

    def is_sparse_tensor(self) -> bool:
        return False

    def has_value(self) -> bool:
        return self._value is not None

    def as_torch(self) -> torch.Tensor:
        """crossml extension: the underlying torch tensor (no copy)."""
        if not isinstance(self._value, torch.Tensor):
            raise InvalidArgument("this OrtValue does not hold a torch tensor")
        return self._value

    def _kind(self) -> str:
        v = self._value
        return "sequence" if isinstance(v, list) else "map" if isinstance(v, dict) else "empty optional" if v is None else "tensor"

    def __repr__(self) -> str:
        if self.is_tensor():
            return f"OrtValue({self.data_type()}, shape={self.shape()}, device={self.device_name()})"
        return f"OrtValue({self._kind()})"


def _elem_type(element_type: Any) -> int:
    if isinstance(element_type, int):
        return element_type
    try:
        return dtypes.onnx_type_of_numpy(np.dtype(element_type))
    except TypeError:
        raise InvalidArgument(f"unsupported element type {element_type!r}") from None


def to_ortvalue(value: Any, elem_type: int | None = None) -> OrtValue:
    return value if isinstance(value, OrtValue) else OrtValue(value, elem_type)


def to_user(value: Any, type_proto: Any = None) -> Any:
    """Engine value -> what ``InferenceSession.run`` returns (numpy, lists, dicts, None)."""
    if value is None:
        return None
    if isinstance(value, list):
        inner = _inner(type_proto, "sequence_type")
        return [to_user(v, inner) for v in value]
    if isinstance(value, dict):
        return {k: to_user(v) if isinstance(v, torch.Tensor) else v for k, v in value.items()}
    if isinstance(value, OrtValue):
        value = value._value
    et = None
    tp = type_proto
    while tp is not None and tp.HasField("optional_type"):
        tp = tp.optional_type.elem_type
    if tp is not None and tp.HasField("tensor_type"):
        et = tp.tensor_type.elem_type
    if isinstance(value, torch.Tensor) or isinstance(value, np.ndarray):
        out = dtypes.to_numpy(value, et)
        return out
    return value


def _inner(type_proto: Any, field: str) -> Any:
    if type_proto is None:
        return None
    tp = type_proto
    while tp.HasField("optional_type"):
        tp = tp.optional_type.elem_type
    return getattr(tp, field).elem_type if tp.HasField(field) else None
