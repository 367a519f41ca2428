"""Initializer data that stays in its external-data file until a value is needed.

``load_model`` checks every external-data reference of a model loaded from a path (the file lies inside
the model's folder and holds the bytes the tensor needs) and rewrites it to the file's resolved path; no
weight is read then. ``array`` reads a tensor through a copy-on-write memory map of its file (``Files``,
one per load): the bytes come from the page cache when a value is first needed, a CPU value shares them,
and a GPU value is copied from them. So the ModelProto of a 1 GB model stays a few hundred kilobytes: the
copies a session makes of it (shape inference, fusion) copy no weights, and the host holds no private copy
of them. Initializers a graph rule computes from the weights (gate and up concatenated) are held by the same
``Files`` and referred to the same way (``Files.hold``), rather than copied into the proto.

Only files that ``load_model`` checked are read: a reference it did not write is refused. As with any
memory-mapped weights (onnxruntime maps external data too), a file rewritten in place while a session uses
it changes the CPU values not yet read, and a truncated one faults on them: write a new file and rename it.
"""

from __future__ import annotations

import itertools
import math
import os
import sys
import threading
import weakref

import numpy as np
import onnx
from onnx import external_data_helper, helper, numpy_helper

from crossml.runtime.errors import Fail, InvalidGraph, NoSuchFile

#: token -> the Files of a loaded model, while its session holds them
_OPEN: weakref.WeakValueDictionary[str, Files] = weakref.WeakValueDictionary()
_TOKENS = itertools.count()
KEY = "crossml_files"  # the external_data entry naming the Files that checked a reference

#: element types whose raw bytes are a numpy array's (read straight from the map; other types, e.g. bfloat16 or
#: 4-bit, go through onnx's reader)
RAW_TYPES = {
    t: np.dtype(helper.tensor_dtype_to_np_dtype(t))
    for t in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.INT8,
              onnx.TensorProto.UINT8, onnx.TensorProto.INT16, onnx.TensorProto.UINT16, onnx.TensorProto.INT32,
              onnx.TensorProto.UINT32, onnx.TensorProto.INT64, onnx.TensorProto.UINT64, onnx.TensorProto.BOOL)
}


def is_external(t: onnx.TensorProto) -> bool:
    return external_data_helper.uses_external_data(t)


def _info(t: onnx.TensorProto) -> dict[str, str]:
    return {e.key: e.value for e in t.external_data}


class Files:
    """The external-data files of one loaded model. Each is memory-mapped once, copy on write: a value written
    in place changes neither the file nor what another load of it reads. The session holds this object; the
    values keep the maps they view alive."""

    def __init__(self, root: str, where: str) -> None:
        self.root, self.where = root, where  # the model's resolved folder, and the model's name for errors
        self.token = f"{os.getpid()}-{next(_TOKENS)}"
        self._checked: set[str] = set()
        self._maps: dict[str, np.memmap] = {}
        self._held: dict[str, np.ndarray] = {}  # "memory:<i>" -> bytes a graph rule made (``hold``)
        self._lock = threading.Lock()
        _OPEN[self.token] = self

    def resolve(self, t: onnx.TensorProto, contents: np.ndarray | None = None) -> None:
        """Check ``t``'s external-data reference (inside the folder, within the file, as long as its shape
        needs) and point it at the resolved file, with an explicit offset and length. ``contents``: the file's
        bytes, given in memory (SessionOptions.add_external_initializers_from_files_in_memory)."""
        info, root, where = _info(t), self.root, self.where
        location = info.get("location", "")
        target = os.path.realpath(os.path.join(root, location))
        if contents is not None:
            target = f"memory-file:{location}"
            with self._lock:
                self._held.setdefault(target, contents)
        elif os.path.isabs(location) or os.path.commonpath([root, target]) != root:
            raise InvalidGraph(
                f"Load model from {where} failed: initializer '{t.name}' has external data location "
                f"'{location}', which lies outside the model's folder {root}; external data must be stored "
                "beside the model")
        elif not os.path.isfile(target):
            raise NoSuchFile(f"Load model from {where} failed: external data file '{location}' of initializer "
                             f"'{t.name}' does not exist in {root}")
        size = contents.size if contents is not None else os.path.getsize(target)
        offset = int(info.get("offset", 0) or 0)
        dtype = RAW_TYPES.get(t.data_type)
        if info.get("length"):
            length = int(info["length"])
        else:  # onnx reads to the end of the file; a known element type says how much the tensor takes
            length = math.prod(t.dims) * dtype.itemsize if dtype is not None else size - offset
        if offset < 0 or length < 0 or offset + length > size:
            raise Fail(f"Load model from {where} failed: external data file '{location}' ({size} bytes) is "
                       f"shorter than offset {offset} + length {length} needed by initializer '{t.name}'")
        if dtype is not None and length != math.prod(t.dims) * dtype.itemsize:
            raise Fail(f"Load model from {where} failed: initializer '{t.name}' of shape {list(t.dims)} and type "
                       f"{helper.tensor_dtype_to_string(t.data_type)} needs {math.prod(t.dims) * dtype.itemsize} "
                       f"bytes but its external data (file '{location}', offset {offset}) has length {length}")
        self._checked.add(target)
        del t.external_data[:]
        for key, value in (("location", target), ("offset", str(offset)), ("length", str(length)),
                           (KEY, self.token)):
            t.external_data.add(key=key, value=value)

    def hold(self, t: onnx.TensorProto, value: np.ndarray) -> None:
        """Make ``t`` (name, type and dims set) refer to ``value``, kept here rather than copied into the proto:
        for initializers a graph rule computes from this model's weights (e.g. gate and up concatenated)."""
        raw = np.ascontiguousarray(value).reshape(-1).view(np.uint8)
        with self._lock:
            key = f"memory:{len(self._held)}"
            self._held[key] = raw
            self._checked.add(key)
        t.ClearField("raw_data")
        t.data_location = onnx.TensorProto.EXTERNAL
        del t.external_data[:]
        for k, v in (("location", key), ("offset", "0"), ("length", str(raw.size)), (KEY, self.token)):
            t.external_data.add(key=k, value=v)

    def bytes(self, path: str, offset: int, length: int) -> np.ndarray:
        """``length`` bytes at ``offset`` of the checked file ``path`` (uint8, a view of its map), or of bytes
        held here."""
        held = self._held.get(path)
        if held is not None:
            return held[offset:offset + length]
        if not length:
            return np.empty(0, dtype=np.uint8)
        with self._lock:
            mm = self._maps.get(path)
            if mm is None:
                mm = self._maps[path] = np.memmap(path, dtype=np.uint8, mode="c")
        return mm[offset:offset + length]


def files_of(t: onnx.TensorProto) -> Files | None:
    """The Files that read ``t``'s data (None for data held in the proto)."""
    return _OPEN.get(_info(t).get(KEY, "")) if is_external(t) else None


def _bytes(t: onnx.TensorProto) -> np.ndarray:
    info = _info(t)
    files = _OPEN.get(info.get(KEY, ""))
    path = info.get("location", "")
    if files is None or path not in files._checked:
        raise InvalidGraph(f"initializer '{t.name}' refers to external data '{path}' that was not checked when "
                           "its model was loaded (or whose session is gone); load the model from its path")
    return files.bytes(path, int(info["offset"]), int(info["length"]))


def array(t: onnx.TensorProto) -> np.ndarray:
    """A TensorProto's value as a numpy array (as ``onnx.numpy_helper.to_array``); external data is read through
    a memory map, without a copy for the common element types."""
    if not is_external(t):
        return numpy_helper.to_array(t)
    raw = _bytes(t)
    dtype = RAW_TYPES.get(t.data_type)
    if dtype is not None and raw.ctypes.data % dtype.itemsize == 0 and sys.byteorder == "little":
        return np.ndarray(tuple(t.dims), dtype=dtype, buffer=raw)  # a view of the map (keeps it alive)
    return numpy_helper.to_array(materialize(t, raw))


def materialize(t: onnx.TensorProto, raw: np.ndarray | None = None) -> onnx.TensorProto:
    """A copy of ``t`` holding its data (raw_data), e.g. to save it or to hand it to onnx."""
    if not is_external(t):
        return t
    out = onnx.TensorProto()
    out.CopyFrom(t)
    del out.external_data[:]
    out.data_location = onnx.TensorProto.DEFAULT
    out.raw_data = (_bytes(t) if raw is None else raw).tobytes()
    return out
