"""AttributeProto -> Python values, parsed once at plan time."""

from __future__ import annotations

from typing import Any

import onnx

from crossml import dtypes
from crossml.graph import external

A = onnx.AttributeProto


def sparse_to_dense(sp: onnx.SparseTensorProto) -> Any:
    """A SparseTensorProto as a dense numpy array."""
    import numpy as np

    values = external.array(sp.values)
    indices = external.array(sp.indices)
    shape = tuple(sp.dims)
    dense = np.zeros(shape, dtype=values.dtype)
    flat = dense.reshape(-1)
    if indices.ndim == 1:
        flat[indices] = values
    else:
        flat[np.ravel_multi_index(tuple(indices.T), shape)] = values
    return dense


def tensor_value(t: onnx.TensorProto) -> Any:
    """A TensorProto as an engine value (torch tensor, or numpy object array for strings)."""
    return dtypes.from_numpy(external.array(t))


def parse_attribute(a: onnx.AttributeProto) -> Any:
    """Graph attributes are returned as GraphProto; the planner compiles them."""
    t = a.type
    if t == A.FLOAT:
        return float(a.f)
    if t == A.INT:
        return int(a.i)
    if t == A.STRING:
        return _str(a.s)
    if t == A.TENSOR:
        return tensor_value(a.t)
    if t == A.GRAPH:
        return a.g
    if t == A.SPARSE_TENSOR:
        return dtypes.from_numpy(sparse_to_dense(a.sparse_tensor))
    if t == A.TYPE_PROTO:
        return a.tp
    if t == A.FLOATS:
        return [float(x) for x in a.floats]
    if t == A.INTS:
        return [int(x) for x in a.ints]
    if t == A.STRINGS:
        return [_str(x) for x in a.strings]
    if t == A.TENSORS:
        return [tensor_value(x) for x in a.tensors]
    if t == A.GRAPHS:
        return list(a.graphs)
    if t == A.SPARSE_TENSORS:
        return [dtypes.from_numpy(sparse_to_dense(x)) for x in a.sparse_tensors]
    if t == A.TYPE_PROTOS:
        return list(a.type_protos)
    return onnx.helper.get_attribute_value(a)


def _str(b: bytes) -> str:
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return b.decode("latin-1")
