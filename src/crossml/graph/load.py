"""Loading a model: path, bytes or ModelProto -> a checked, shape-inferred ModelProto.

* External data is read only from files inside the model's own folder; a location that escapes
  it (``..``, an absolute path, a symlink out) is refused. The data is not read here: it stays in
  its file, memory-mapped when a value is needed (``crossml.graph.external``).
* Free-dimension overrides (by dim_param name or by denotation) are applied to the graph inputs.
* Model-local functions are inlined; onnx shape inference fills value_info.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import external_data_helper, helper

from crossml.graph import external
from crossml.runtime.errors import Fail, InvalidArgument, InvalidGraph, InvalidProtobuf, NoSuchFile


def load_model(source: Any, replace: Mapping[str, np.ndarray] | None = None,
               memory_files: Mapping[str, np.ndarray] | None = None) -> tuple[onnx.ModelProto, external.Files | None]:
    """Return ``(model, files)``: ``files`` reads the model's external data (keep it while the model is used);
    None for bytes / ModelProto sources, which hold all their data.

    ``replace`` (SessionOptions.add_external_initializers): initializer name -> value given in its place (same
    type and shape; its external file need not exist). ``memory_files``
    (add_external_initializers_from_files_in_memory): external-data location -> the file's bytes."""
    if isinstance(source, onnx.ModelProto):
        model = onnx.ModelProto()
        model.CopyFrom(source)
        return _in_memory(model, "the in-memory model", replace, memory_files)
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _in_memory(_parse(bytes(source), "the model bytes"), "the model bytes", replace, memory_files)
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if not os.path.exists(path):
            raise NoSuchFile(f"Load model from {path} failed:Load model {path} failed. File doesn't exist")
        if os.path.isdir(path):
            raise InvalidArgument(f"Load model from {path} failed: {path} is a directory, not an ONNX file")
        with open(path, "rb") as f:
            data = f.read()
        model = _parse(data, path)
        # the folder of the model file itself, links resolved (as onnxruntime resolves them): a linked model's
        # external data is read beside the file the link names
        root = os.path.dirname(os.path.realpath(path))
        files = _given(model, path, root, replace, memory_files) or external.Files(root, path)
        for t in _tensors_with_external_data(model):
            if not _given_here(t):
                files.resolve(t)  # checked and pointed at its file; the bytes stay there
        return _check_model(model, path), files
    raise InvalidArgument(
        f"InferenceSession expects a path, bytes or an onnx.ModelProto, got {type(source).__name__}"
    )


def _in_memory(model: onnx.ModelProto, where: str, replace: Mapping[str, np.ndarray] | None,
               memory_files: Mapping[str, np.ndarray] | None) -> tuple[onnx.ModelProto, external.Files | None]:
    """A model given as bytes or a ModelProto: no folder, so every external tensor must be given by the caller."""
    files = _given(model, where, os.getcwd(), replace, memory_files)
    _check_no_external(model, where)
    return _check_model(model, where), files


def _given(model: onnx.ModelProto, where: str, root: str, replace: Mapping[str, np.ndarray] | None,
           memory_files: Mapping[str, np.ndarray] | None) -> external.Files | None:
    """Put the caller's initializer values and in-memory external-data files in place (see ``load_model``)."""
    if not replace and not memory_files:
        return None
    files = external.Files(root, where)
    inits = {t.name: t for t in model.graph.initializer}
    for name, value in (replace or {}).items():
        t = inits.get(name)
        if t is None:
            raise Fail(f"Load model from {where} failed: add_external_initializers: the model has no initializer "
                       f"named '{name}'")
        value = np.asarray(value)
        want = helper.tensor_dtype_to_np_dtype(t.data_type)
        if value.dtype != want:
            raise Fail(f"Load model from {where} failed: add_external_initializers: initializer '{name}' is "
                       f"{helper.tensor_dtype_to_string(t.data_type)}, the value given is {value.dtype}")
        if list(value.shape) != list(t.dims):
            raise Fail(f"Load model from {where} failed: add_external_initializers: initializer '{name}' has shape "
                       f"{list(t.dims)}, the value given {list(value.shape)}")
        del t.string_data[:], t.float_data[:], t.int32_data[:], t.int64_data[:], t.double_data[:], t.uint64_data[:]
        files.hold(t, value)
    for t in _tensors_with_external_data(model):
        location = external._info(t).get("location")
        if not _given_here(t) and location in (memory_files or {}):
            files.resolve(t, memory_files[location])
    return files


def _given_here(t: onnx.TensorProto) -> bool:
    """``t``'s external data is already in place (given by the caller, see ``_given``)."""
    return any(e.key == external.KEY for e in t.external_data)


def _parse(data: bytes, where: str) -> onnx.ModelProto:
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise InvalidProtobuf(f"Load model from {where} failed:Protobuf parsing failed. ({exc})") from None
    return model


def _check_model(model: onnx.ModelProto, where: str) -> onnx.ModelProto:
    if not model.HasField("graph") or (not model.graph.node and not model.graph.output):
        raise InvalidArgument(f"No graph was found in the protobuf ({where}); is it an ONNX model?")
    if not model.opset_import:
        raise InvalidGraph(f"Load model from {where} failed: the model declares no opset_import")
    if model.ir_version <= 0:
        raise InvalidGraph(f"Load model from {where} failed: the model has no ir_version (not an ONNX model?)")
    return model


def _tensors_with_external_data(model: onnx.ModelProto):
    return [t for t in external_data_helper._get_all_tensors(model) if external_data_helper.uses_external_data(t)]


def _check_no_external(model: onnx.ModelProto, where: str) -> None:
    for t in _tensors_with_external_data(model):
        info = {e.key: e.value for e in t.external_data}
        if not t.raw_data and not _given_here(t):
            raise InvalidGraph(
                f"Load model from {where} failed: initializer '{t.name}' refers to external data file "
                f"'{info.get('location')}', which needs the model's folder; load the model from its path"
            )


def apply_free_dimension_overrides(
    model: onnx.ModelProto, by_name: Mapping[str, int], by_denotation: Mapping[str, int]
) -> None:
    """Fix symbolic input dimensions (onnxruntime's add_free_dimension_override_by_*)."""
    if not by_name and not by_denotation:
        return
    init_names = {i.name for i in model.graph.initializer}
    for vi in model.graph.input:
        if vi.name in init_names or not vi.type.HasField("tensor_type"):
            continue
        for dim in vi.type.tensor_type.shape.dim:
            value = None
            if dim.HasField("dim_param") and dim.dim_param in by_name:
                value = by_name[dim.dim_param]
            elif dim.denotation and dim.denotation in by_denotation:
                value = by_denotation[dim.denotation]
            if value is None:
                continue
            if dim.HasField("dim_value") and dim.dim_value != value:
                raise InvalidArgument(
                    f"free dimension override {value} for input '{vi.name}' contradicts its fixed size {dim.dim_value}"
                )
            dim.dim_value = int(value)


#: initializers of at most this many elements stay in a skeleton (shape inference may read their values)
SKELETON_MAX_ELEMENTS = 64


def skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` without the data of its large initializers, which become typed graph inputs: all that
    shape inference reads, cheap to copy and to serialise (an LLM's weights are never copied)."""
    g = model.graph
    m = onnx.ModelProto(ir_version=model.ir_version)
    m.opset_import.extend(model.opset_import)
    m.functions.extend(model.functions)
    sg = m.graph
    sg.name = g.name
    sg.node.extend(g.node)
    sg.input.extend(g.input)
    sg.output.extend(g.output)
    sg.value_info.extend(g.value_info)
    sg.sparse_initializer.extend(g.sparse_initializer)
    inputs = {vi.name for vi in g.input}
    for t in g.initializer:
        if math.prod(t.dims) <= SKELETON_MAX_ELEMENTS:
            sg.initializer.append(external.materialize(t))
        elif t.name not in inputs:
            sg.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return m


def prepare(model: onnx.ModelProto) -> onnx.ModelProto:
    """Inline model-local functions and run onnx shape inference (best effort); returns a new model (the
    argument is left as it was).

    Inference runs on the ``skeleton`` (the weights would otherwise be serialised and parsed again: 8 s of a
    1 GB model's load); the value types it finds, the nodes (with their subgraphs' value types) and the output
    types go into a copy of the model."""
    if model.functions:
        try:
            model = onnx.inliner.inline_local_functions(model)
        except Exception as exc:  # noqa: BLE001 - the inliner refuses malformed functions
            raise InvalidGraph(f"could not inline the model's local functions: {exc}") from None
    try:
        inferred = onnx.shape_inference.infer_shapes(skeleton(model), check_type=False, strict_mode=False,
                                                     data_prop=True)
    except Exception:  # noqa: BLE001 - shape inference is an optimisation input, not a gate
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g, ig = out.graph, inferred.graph
    del g.value_info[:]
    g.value_info.extend(ig.value_info)
    del g.node[:]
    g.node.extend(ig.node)
    del g.output[:]
    g.output.extend(ig.output)
    return out
