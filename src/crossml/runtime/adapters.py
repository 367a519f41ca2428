"""LoRA adapters as onnxruntime has them: ``AdapterFormat`` (read / write ``.onnx_adapter`` files),
``LoraAdapter`` (a loaded file) and ``RunOptions.add_active_adapter``.

An adapter file holds named tensors (onnxruntime's flatbuffers schema ``onnxruntime.adapters.Adapter``,
file identifier ``TORT``: format, adapter and model versions, then per parameter its name, dims, ONNX
element type and raw bytes). A run with active adapters feeds each adapter parameter as the model input
of that name, usually an overridable initializer (a LoRA A/B matrix whose default is empty or zero);
as in onnxruntime, the first active adapter naming a parameter wins, and adapters win over the
run's own feed.

Files are memory-mapped (copy-on-write: nothing written to a parameter reaches the file); a
``LoraAdapter`` uploads its parameters to a device once, on the first run there, and keeps them.
"""

from __future__ import annotations

import math
import os
import struct
import threading
from collections.abc import Mapping
from typing import Any

import flatbuffers
import numpy as np
import onnx
import torch
from flatbuffers import number_types as N
from flatbuffers.table import Table

from crossml import dtypes
from crossml.runtime.errors import Fail, InvalidArgument, NoSuchFile
from crossml.runtime.ortvalue import OrtValue

#: onnxruntime's adapter file identifier and the one format version it reads and writes
IDENTIFIER = b"TORT"
FORMAT_VERSION = 1

# vtable slots (byte offsets) of the schema's fields
_A_FORMAT, _A_ADAPTER, _A_MODEL, _A_PARAMS = 4, 6, 8, 10
_P_NAME, _P_DIMS, _P_TYPE, _P_DATA = 4, 6, 8, 10


class AdapterFormat:
    """onnxruntime.AdapterFormat: an adapter file's contents, to read (``read_adapter``) or to write
    (``set_parameters`` + ``export_adapter``)."""

    def __init__(self, adapter: Any = None) -> None:
        self._format_version = FORMAT_VERSION
        self._adapter_version = 0
        self._model_version = 0
        self._params: dict[str, np.ndarray] = {}
        if adapter is not None:
            if not isinstance(adapter, AdapterFormat):
                raise TypeError(f"AdapterFormat(adapter): expected an AdapterFormat or None, got {type(adapter).__name__}")
            self.__dict__.update(adapter.__dict__)
            self._params = dict(adapter._params)

    @staticmethod
    def read_adapter(file_path: str | os.PathLike[str]) -> AdapterFormat:
        out = AdapterFormat()
        out._format_version, out._adapter_version, out._model_version, out._params = _read(file_path)
        return out

    def export_adapter(self, file_path: str | os.PathLike[str]) -> None:
        """Write the parameters in onnxruntime's adapter format (readable by onnxruntime.LoraAdapter)."""
        data = _build(self._params, self._adapter_version, self._model_version)
        try:
            with open(file_path, "wb") as f:
                f.write(data)
        except OSError as exc:
            raise Fail(f"export_adapter: cannot write '{os.fspath(file_path)}': {exc.strerror}") from None

    def get_format_version(self) -> int:
        return self._format_version

    def get_adapter_version(self) -> int:
        return self._adapter_version

    def get_model_version(self) -> int:
        return self._model_version

    def set_adapter_version(self, adapter_version: int) -> None:
        self._adapter_version = _int32(adapter_version, "set_adapter_version")

    def set_model_version(self, model_version: int) -> None:
        self._model_version = _int32(model_version, "set_model_version")

    def set_parameters(self, params: Mapping[str, Any]) -> None:
        """Parameters to export: name -> OrtValue (or numpy array) of a numeric type, on any device."""
        if not isinstance(params, Mapping):
            raise TypeError(f"set_parameters: expected a dict of name -> OrtValue, got {type(params).__name__}")
        out = {}
        for name, value in params.items():
            if not isinstance(name, str) or not name:
                raise InvalidArgument(f"set_parameters: parameter names must be non-empty strings, got {name!r}")
            out[name] = _host_array(name, value)
        self._params = out

    def get_parameters(self) -> dict[str, OrtValue]:
        """name -> OrtValue on the CPU (views of the file's map for a read adapter)."""
        return {name: OrtValue.ortvalue_from_numpy_with_onnx_type(arr, _elem_type(arr)) for name, arr in
                self._params.items()}


class LoraAdapter:
    """onnxruntime.LoraAdapter: an adapter file, memory-mapped by ``Load``, to activate on runs with
    ``RunOptions.add_active_adapter``."""

    def __init__(self) -> None:
        self._path: str | None = None
        self._params: dict[str, np.ndarray] = {}
        self._device_values: dict[torch.device, dict[str, OrtValue]] = {}
        self._lock = threading.Lock()

    def Load(self, file_path: str | os.PathLike[str]) -> None:  # noqa: N802 - onnxruntime's name
        """Memory-map the adapter file (checked as onnxruntime checks it)."""
        _, _, _, params = _read(file_path)
        with self._lock:
            self._path, self._params, self._device_values = os.fspath(file_path), params, {}

    @property
    def loaded(self) -> bool:
        return self._path is not None

    def _values(self, device: torch.device) -> dict[str, OrtValue]:
        """The parameters as OrtValues on ``device``; uploaded on the first call for a device, then kept."""
        with self._lock:
            values = self._device_values.get(device)
            if values is None:
                values = {}
                for name, arr in self._params.items():
                    t = dtypes.from_numpy(arr)
                    values[name] = OrtValue(t.to(device) if device.type != "cpu" else t, _elem_type(arr),
                                            keepalive=arr)
                self._device_values[device] = values
            return values

    def __repr__(self) -> str:
        return f"LoraAdapter({self._path!r}, {len(self._params)} parameters)" if self._path else "LoraAdapter(not loaded)"


def active_feed(adapters: list[LoraAdapter], device: torch.device) -> dict[str, OrtValue]:
    """The parameters of a run's active adapters, the first adapter naming a parameter winning (onnxruntime's
    order)."""
    out: dict[str, OrtValue] = {}
    for adapter in adapters:
        for name, value in adapter._values(device).items():
            out.setdefault(name, value)
    return out


# -- the file format ------------------------------------------------------------------------------------
def _read(file_path: str | os.PathLike[str]) -> tuple[int, int, int, dict[str, np.ndarray]]:
    path = os.fspath(file_path)
    if not os.path.isfile(path):
        raise NoSuchFile(f"LoRA adapter file '{path}' does not exist")
    size = os.path.getsize(path)
    if size <= 8:
        raise Fail(f"'{path}' does not appear to be a valid lora parameter format (onnxruntime adapter file): "
                   f"{size} bytes")
    buf = np.memmap(path, dtype=np.uint8, mode="c")
    if bytes(buf[4:8]) != IDENTIFIER:
        raise Fail(f"'{path}' does not appear to be a valid lora parameter format: no '{IDENTIFIER.decode()}' "
                   "file identifier (write adapters with AdapterFormat.export_adapter or onnxruntime's)")
    try:
        return _parse(buf, path)
    except (IndexError, struct.error, ValueError, UnicodeDecodeError) as exc:
        raise Fail(f"'{path}' fails lora adapter format verification: {exc}") from None


def _parse(buf: np.ndarray, path: str) -> tuple[int, int, int, dict[str, np.ndarray]]:
    raw = memoryview(buf)
    size = len(buf)

    def table(pos: int) -> Table:
        if not 0 <= pos <= size - 4:
            raise ValueError(f"table offset {pos} outside the file")
        t = Table(raw, pos)
        vtable = pos - t.Get(N.SOffsetTFlags, pos)
        if not 0 <= vtable <= size - 4:
            raise ValueError(f"vtable offset {vtable} outside the file")
        return t

    def vector(t: Table, slot: int, itemsize: int) -> tuple[int, int]:
        o = t.Offset(slot)
        if not o:
            return 0, 0
        start, n = t.Vector(o), t.VectorLen(o)
        if start + n * itemsize > size:
            raise ValueError(f"a vector of {n} x {itemsize} bytes at {start} runs past the end of the file")
        return start, n

    root = table(Table(raw, 0).Get(N.UOffsetTFlags, 0))
    version = [root.GetSlot(slot, 0, N.Int32Flags) for slot in (_A_FORMAT, _A_ADAPTER, _A_MODEL)]
    if version[0] != FORMAT_VERSION:
        raise Fail(f"'{path}': unsupported lora format version {version[0]} (supported: {FORMAT_VERSION})")
    params: dict[str, np.ndarray] = {}
    start, n = vector(root, _A_PARAMS, 4)
    for i in range(n):
        entry = start + 4 * i
        p = table(root.Indirect(entry))
        o = p.Offset(_P_NAME)
        name = p.String(o + p.Pos).decode("utf-8") if o else ""
        dstart, ndims = vector(p, _P_DIMS, 8)
        dims = [int(v) for v in np.frombuffer(raw, dtype="<i8", count=ndims, offset=dstart)] if ndims else []
        elem = p.GetSlot(_P_TYPE, 0, N.Int32Flags)
        where = f"'{path}', parameter {i} ('{name}')"
        if elem in (0, onnx.TensorProto.STRING) or elem not in dtypes.ONNX_TO_TORCH:
            raise Fail(f"{where}: unsupported data type {elem}")
        if not dims or any(d < 0 for d in dims):
            raise Fail(f"{where}: dims {dims} (each parameter needs at least one dimension, none negative)")
        np_type = dtypes.np_dtype(elem)
        count = math.prod(dims)
        bstart, nbytes = vector(p, _P_DATA, 1)
        if nbytes != count * np_type.itemsize:
            raise Fail(f"{where}: {nbytes} bytes of data for shape {dims} of {dtypes.ort_type_name(elem)} "
                       f"({count * np_type.itemsize} expected)")
        if name in params:
            raise Fail(f"{where}: parameter name given twice")
        params[name] = np.frombuffer(raw, dtype=np_type, count=count, offset=bstart).reshape(dims) if count else \
            np.zeros(dims, dtype=np_type)
    return version[0], version[1], version[2], params


def _build(params: dict[str, np.ndarray], adapter_version: int, model_version: int) -> bytes:
    b = flatbuffers.Builder(1024 + sum(a.nbytes for a in params.values()))
    offsets = []
    for name, arr in params.items():
        name_off = b.CreateString(name)
        b.StartVector(8, arr.ndim, 8)
        for d in reversed(arr.shape):
            b.PrependInt64(int(d))
        dims_off = b.EndVector()
        data = np.ascontiguousarray(arr).view(np.uint8).reshape(-1).tobytes()
        b.StartVector(1, len(data), 8)  # raw_data: (force_align: 8)
        b.head = b.head - len(data)
        b.Bytes[b.head:b.head + len(data)] = data
        data_off = b.EndVector()
        b.StartObject(4)
        b.PrependUOffsetTRelativeSlot(0, name_off, 0)
        b.PrependUOffsetTRelativeSlot(1, dims_off, 0)
        b.PrependInt32Slot(2, _elem_type(arr), 0)
        b.PrependUOffsetTRelativeSlot(3, data_off, 0)
        offsets.append(b.EndObject())
    b.StartVector(4, len(offsets), 4)
    for off in reversed(offsets):
        b.PrependUOffsetTRelative(off)
    params_off = b.EndVector()
    b.StartObject(4)
    b.PrependInt32Slot(0, FORMAT_VERSION, 0)
    b.PrependInt32Slot(1, adapter_version, 0)
    b.PrependInt32Slot(2, model_version, 0)
    b.PrependUOffsetTRelativeSlot(3, params_off, 0)
    b.Finish(b.EndObject(), file_identifier=IDENTIFIER)
    return bytes(b.Output())


def _host_array(name: str, value: Any) -> np.ndarray:
    if isinstance(value, OrtValue):
        if not value.is_tensor():
            raise InvalidArgument(f"set_parameters: parameter '{name}' is a {value._kind()}, not a tensor")
        arr = dtypes.to_numpy(value._value, value._elem_type)
    elif isinstance(value, np.ndarray):
        arr = value
    else:
        raise TypeError(f"set_parameters: parameter '{name}' must be an OrtValue or a numpy array, got "
                        f"{type(value).__name__}")
    try:
        elem = _elem_type(arr)
    except (TypeError, KeyError, ValueError):
        elem = None
    if elem is None or elem == onnx.TensorProto.STRING:
        raise InvalidArgument(f"set_parameters: parameter '{name}' has type {arr.dtype}; adapters hold numeric "
                              "tensors only")
    if arr.ndim == 0:  # onnxruntime's reader refuses parameters without dims
        raise InvalidArgument(f"set_parameters: parameter '{name}' is a scalar; adapter parameters need at least one "
                              "dimension (reshape it to [1])")
    return np.ascontiguousarray(arr)


def _elem_type(arr: np.ndarray) -> int:
    return dtypes.onnx_type_of_numpy(arr.dtype)


def _int32(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not -2**31 <= int(value) < 2**31:
        raise TypeError(f"{what}: expected a 32-bit integer, got {value!r}")
    return int(value)
