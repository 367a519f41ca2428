"""Element types: ONNX TensorProto codes, torch dtypes, numpy dtypes and onnxruntime type strings.

crossml keeps every tensor as a ``torch.Tensor``. ONNX types that torch cannot hold natively are
stored in a wider torch dtype and restored at the API boundary:

* int4 / uint4 / int2 / uint2 are held unpacked, one value per int8 / uint8 element;
* float4e2m1 is held as its 4-bit code in a uint8 element;
* string tensors are numpy ``object`` arrays (they never reach a GPU).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import onnx
import torch

TP = onnx.TensorProto

#: ONNX element type -> torch dtype used to hold it (None: not a torch type).
ONNX_TO_TORCH: dict[int, torch.dtype | None] = {
    TP.FLOAT: torch.float32,
    TP.UINT8: torch.uint8,
    TP.INT8: torch.int8,
    TP.UINT16: torch.uint16,
    TP.INT16: torch.int16,
    TP.INT32: torch.int32,
    TP.INT64: torch.int64,
    TP.STRING: None,
    TP.BOOL: torch.bool,
    TP.FLOAT16: torch.float16,
    TP.DOUBLE: torch.float64,
    TP.UINT32: torch.uint32,
    TP.UINT64: torch.uint64,
    TP.COMPLEX64: torch.complex64,
    TP.COMPLEX128: torch.complex128,
    TP.BFLOAT16: torch.bfloat16,
    TP.FLOAT8E4M3FN: torch.float8_e4m3fn,
    TP.FLOAT8E4M3FNUZ: torch.float8_e4m3fnuz,
    TP.FLOAT8E5M2: torch.float8_e5m2,
    TP.FLOAT8E5M2FNUZ: torch.float8_e5m2fnuz,
    TP.UINT4: torch.uint8,
    TP.INT4: torch.int8,
    TP.FLOAT4E2M1: torch.uint8,
}
if hasattr(TP, "FLOAT8E8M0"):
    ONNX_TO_TORCH[TP.FLOAT8E8M0] = torch.float8_e8m0fnu
if hasattr(TP, "UINT2"):
    ONNX_TO_TORCH[TP.UINT2] = torch.uint8
    ONNX_TO_TORCH[TP.INT2] = torch.int8

#: torch dtype -> the ONNX element type it natively represents.
TORCH_TO_ONNX: dict[torch.dtype, int] = {
    torch.float32: TP.FLOAT,
    torch.uint8: TP.UINT8,
    torch.int8: TP.INT8,
    torch.uint16: TP.UINT16,
    torch.int16: TP.INT16,
    torch.int32: TP.INT32,
    torch.int64: TP.INT64,
    torch.bool: TP.BOOL,
    torch.float16: TP.FLOAT16,
    torch.float64: TP.DOUBLE,
    torch.uint32: TP.UINT32,
    torch.uint64: TP.UINT64,
    torch.complex64: TP.COMPLEX64,
    torch.complex128: TP.COMPLEX128,
    torch.bfloat16: TP.BFLOAT16,
    torch.float8_e4m3fn: TP.FLOAT8E4M3FN,
    torch.float8_e4m3fnuz: TP.FLOAT8E4M3FNUZ,
    torch.float8_e5m2: TP.FLOAT8E5M2,
    torch.float8_e5m2fnuz: TP.FLOAT8E5M2FNUZ,
}
if hasattr(TP, "FLOAT8E8M0"):
    TORCH_TO_ONNX[torch.float8_e8m0fnu] = TP.FLOAT8E8M0

#: ONNX types held in a wider torch dtype (see module docstring).
PACKED_SUBBYTE = {TP.INT4, TP.UINT4, TP.FLOAT4E2M1} | (
    {TP.INT2, TP.UINT2} if hasattr(TP, "INT2") else set()
)

_ORT_NAMES = {
    TP.FLOAT: "float",
    TP.UINT8: "uint8",
    TP.INT8: "int8",
    TP.UINT16: "uint16",
    TP.INT16: "int16",
    TP.INT32: "int32",
    TP.INT64: "int64",
    TP.STRING: "string",
    TP.BOOL: "bool",
    TP.FLOAT16: "float16",
    TP.DOUBLE: "double",
    TP.UINT32: "uint32",
    TP.UINT64: "uint64",
    TP.COMPLEX64: "complex64",
    TP.COMPLEX128: "complex128",
    TP.BFLOAT16: "bfloat16",
    TP.FLOAT8E4M3FN: "float8e4m3fn",
    TP.FLOAT8E4M3FNUZ: "float8e4m3fnuz",
    TP.FLOAT8E5M2: "float8e5m2",
    TP.FLOAT8E5M2FNUZ: "float8e5m2fnuz",
    TP.UINT4: "uint4",
    TP.INT4: "int4",
    TP.FLOAT4E2M1: "float4e2m1",
}

_TORCH_VIEW_INT = {1: torch.uint8, 2: torch.int16}


def ort_type_name(elem_type: int) -> str:
    """The onnxruntime element name, e.g. ``float`` for TensorProto.FLOAT."""
    return _ORT_NAMES.get(elem_type, onnx.TensorProto.DataType.Name(elem_type).lower())


def tensor_type_string(elem_type: int) -> str:
    """onnxruntime's NodeArg.type string: ``tensor(float)``."""
    return f"tensor({ort_type_name(elem_type)})"


def np_dtype(elem_type: int) -> np.dtype:
    """The numpy dtype onnxruntime uses for an ONNX element type."""
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))


def onnx_type_of_numpy(dtype: np.dtype) -> int:
    """ONNX element type of a numpy dtype (ml_dtypes types included)."""
    if dtype.kind in ("U", "S", "O"):
        return TP.STRING
    return onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def torch_dtype(elem_type: int) -> torch.dtype:
    """The torch dtype that holds an ONNX element type."""
    dt = ONNX_TO_TORCH.get(elem_type)
    if dt is None:
        raise TypeError(f"ONNX element type {ort_type_name(elem_type)} has no torch representation")
    return dt


def onnx_type_of(value: Any) -> int:
    """ONNX element type of a torch tensor or numpy array held by the engine."""
    if isinstance(value, torch.Tensor):
        return TORCH_TO_ONNX[value.dtype]
    return onnx_type_of_numpy(value.dtype)


def from_numpy(arr: np.ndarray, device: torch.device | str | None = None) -> Any:
    """numpy array -> engine value (zero-copy on the CPU where the layout allows).

    String arrays stay numpy object arrays. ml_dtypes arrays are reinterpreted bit for bit.
    """
    if not isinstance(arr, np.ndarray):
        arr = np.asarray(arr)
    kind = arr.dtype.kind
    if kind in ("U", "S", "O"):
        return arr.astype(object)
    if any(s < 0 for s in arr.strides) or not (arr.flags.c_contiguous or arr.ndim == 0):
        arr = np.ascontiguousarray(arr)
    et = onnx_type_of_numpy(arr.dtype)
    if et in PACKED_SUBBYTE:
        if et == TP.FLOAT4E2M1:
            t = _torch_from_np(arr.view(np.uint8))
        else:
            t = _torch_from_np(arr.astype(np.int8 if et in _SIGNED_SUBBYTE else np.uint8))
    elif arr.dtype.itemsize in _TORCH_VIEW_INT and arr.dtype.type.__module__.startswith("ml_dtypes"):
        raw = arr.view(np.uint8 if arr.dtype.itemsize == 1 else np.int16)
        t = _torch_from_np(raw).view(ONNX_TO_TORCH[et])
    else:
        t = _torch_from_np(arr)
    return t if device is None else t.to(device)


_SIGNED_SUBBYTE = {TP.INT4} | ({TP.INT2} if hasattr(TP, "INT2") else set())


def _torch_from_np(arr: np.ndarray) -> torch.Tensor:
    if not arr.flags.writeable:
        # torch warns on read-only memory; crossml never writes into inputs, so sharing is safe.
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.from_numpy(arr)
    return torch.from_numpy(arr)


def to_numpy(value: Any, elem_type: int | None = None) -> np.ndarray:
    """Engine value -> numpy array, restoring the ONNX element type ``elem_type`` when given."""
    if isinstance(value, np.ndarray):
        return value
    t = value.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.is_conj():
        t = t.resolve_conj()
    if elem_type is not None and elem_type in PACKED_SUBBYTE:
        target = np_dtype(elem_type)
        raw = t.contiguous().numpy()
        if elem_type == TP.FLOAT4E2M1:
            return raw.astype(np.uint8).view(target)
        return raw.astype(target)
    if t.dtype in TORCH_TO_ONNX and t.dtype.itemsize in _TORCH_VIEW_INT and not _numpy_native(t.dtype):
        et = TORCH_TO_ONNX[t.dtype]
        raw = t.contiguous().view(_TORCH_VIEW_INT[t.dtype.itemsize]).numpy()
        return raw.view(np_dtype(et))
    return t.numpy()


def _numpy_native(dt: torch.dtype) -> bool:
    return dt in (torch.uint8, torch.int8, torch.int16, torch.uint16, torch.float16, torch.bool)


_ = ml_dtypes  # ml_dtypes registers bfloat16 / float8 / int4 with numpy
