"""Bad input raises the onnxruntime exception class onnxruntime raises, naming what is wrong."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import crossml as ort
from crossml.capi.onnxruntime_pybind11_state import (
    Fail,
    InvalidArgument,
    InvalidGraph,
    InvalidProtobuf,
    NoSuchFile,
    RuntimeException,
)
from crossml.capi.onnxruntime_pybind11_state import (
    NotImplemented as OrtNotImplemented,
)

CPU = ["CPUExecutionProvider"]


def relu_model(op="Relu", domain="", opset=17, shape=(1, 3)) -> onnx.ModelProto:
    n = h.make_node(op, ["x"], ["y"], domain=domain, name="n0")
    g = h.make_graph([n], "g", [h.make_tensor_value_info("x", T.FLOAT, list(shape))],
                     [h.make_tensor_value_info("y", T.FLOAT, None)])
    ops = [h.make_opsetid("", opset)] + ([h.make_opsetid(domain, 1)] if domain else [])
    return h.make_model(g, opset_imports=ops, ir_version=8)


def test_missing_file(tmp_path):
    with pytest.raises(NoSuchFile, match="File doesn't exist"):
        ort.InferenceSession(str(tmp_path / "nope.onnx"), providers=CPU)


def test_truncated_and_foreign_files(tmp_path):
    data = relu_model().SerializeToString()
    (tmp_path / "t.onnx").write_bytes(data[: len(data) // 2])
    (tmp_path / "f.onnx").write_bytes(b"GIF89a not a model at all")
    for name in ("t.onnx", "f.onnx"):
        with pytest.raises(InvalidProtobuf, match="Protobuf parsing failed"):
            ort.InferenceSession(str(tmp_path / name), providers=CPU)
    with pytest.raises(InvalidArgument, match="No graph was found"):
        ort.InferenceSession(b"", providers=CPU)


def test_bad_feeds():
    s = ort.InferenceSession(relu_model(), providers=CPU)
    with pytest.raises(ValueError, match=r"Required inputs \(\['x'\]\) are missing"):
        s.run(None, {})
    with pytest.raises(InvalidArgument, match="Invalid input name: z"):
        s.run(None, {"x": np.zeros((1, 3), np.float32), "z": np.zeros(1)})
    with pytest.raises(InvalidArgument, match=r"Actual: \(tensor\(double\)\) , expected: \(tensor\(float\)\)"):
        s.run(None, {"x": np.zeros((1, 3), np.float64)})
    with pytest.raises(InvalidArgument, match="Invalid rank for input: x Got: 1 Expected: 2"):
        s.run(None, {"x": np.zeros(3, np.float32)})
    with pytest.raises(InvalidArgument, match="index: 1 Got: 4 Expected: 3"):
        s.run(None, {"x": np.zeros((1, 4), np.float32)})
    with pytest.raises(InvalidArgument, match="Invalid output name: q"):
        s.run(["q"], {"x": np.zeros((1, 3), np.float32)})


def test_unknown_ops_and_domains():
    with pytest.raises(InvalidGraph, match="No Op registered for FooBar with domain_version of 17"):
        ort.InferenceSession(relu_model("FooBar"), providers=CPU)
    with pytest.raises(Fail, match="my.domain:FooBar"):
        ort.InferenceSession(relu_model("FooBar", domain="my.domain"), providers=CPU)


def test_opset_too_new():
    with pytest.raises(Fail, match="opset 40 .* newer than the newest"):
        ort.InferenceSession(relu_model(opset=40), providers=CPU)


def test_op_not_in_its_opset_is_not_implemented():
    # Gelu entered ai.onnx at opset 20: a model stamped opset 17 cannot use it
    with pytest.raises((OrtNotImplemented, InvalidGraph), match="Gelu"):
        ort.InferenceSession(relu_model("Gelu", opset=17), providers=CPU)


def test_runtime_failure_names_the_node():
    n = h.make_node("Reshape", ["x", "s"], ["y"], name="bad_reshape")
    g = h.make_graph([n], "g", [h.make_tensor_value_info("x", T.FLOAT, [2, 3]),
                                h.make_tensor_value_info("s", T.INT64, [2])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)])
    s = ort.InferenceSession(h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8), providers=CPU)
    with pytest.raises(RuntimeException, match="Reshape node. Name:'bad_reshape'"):
        s.run(None, {"x": np.zeros((2, 3), np.float32), "s": np.array([4, 4], np.int64)})


def test_external_data_must_stay_in_model_folder(tmp_path):
    from onnx.external_data_helper import convert_model_to_external_data

    w = onnx.numpy_helper.from_array(np.ones((64, 64), np.float32), "W")
    n = h.make_node("MatMul", ["x", "W"], ["y"])
    g = h.make_graph([n], "g", [h.make_tensor_value_info("x", T.FLOAT, [1, 64])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 64])], [w])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    good = tmp_path / "good"
    good.mkdir()
    convert_model_to_external_data(m, location="w.bin", size_threshold=0)
    onnx.save(m, good / "m.onnx")
    s = ort.InferenceSession(str(good / "m.onnx"), providers=CPU)
    np.testing.assert_allclose(s.run(None, {"x": np.ones((1, 64), np.float32)})[0], np.full((1, 64), 64.0))
    # point the tensor at a file outside the folder
    evil = onnx.load(good / "m.onnx", load_external_data=False)
    for e in evil.graph.initializer[0].external_data:
        if e.key == "location":
            e.value = "../secret.bin"
    (tmp_path / "secret.bin").write_bytes(np.ones((64, 64), np.float32).tobytes())
    onnx.save(evil, good / "evil.onnx")
    with pytest.raises(InvalidGraph, match="outside the model's folder"):
        ort.InferenceSession(str(good / "evil.onnx"), providers=CPU)
    with pytest.raises(InvalidGraph, match="load the model from its path"):
        ort.InferenceSession(onnx.load(good / "m.onnx", load_external_data=False), providers=CPU)
    # links are resolved as onnxruntime resolves them: a linked model reads the data beside the file it names
    # (a model folder linking another's files, a Hugging Face cache snapshot), a data link out of the folder is refused
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "m.onnx").symlink_to(good / "m.onnx")
    s = ort.InferenceSession(str(linked / "m.onnx"), providers=CPU)
    np.testing.assert_allclose(s.run(None, {"x": np.ones((1, 64), np.float32)})[0], np.full((1, 64), 64.0))
    escape = tmp_path / "escape"
    escape.mkdir()
    (escape / "m.onnx").write_bytes((good / "m.onnx").read_bytes())
    (escape / "w.bin").symlink_to(good / "w.bin")
    with pytest.raises(InvalidGraph, match="outside the model's folder"):
        ort.InferenceSession(str(escape / "m.onnx"), providers=CPU)


def test_bad_providers():
    with pytest.raises(InvalidArgument, match="Unknown execution provider 'FooExecutionProvider'"):
        ort.InferenceSession(relu_model(), providers=["FooExecutionProvider"])
    with pytest.raises(ValueError, match="same length"):
        ort.InferenceSession(relu_model(), providers=["CPUExecutionProvider"], provider_options=[{}, {}])


def test_not_a_model_object():
    with pytest.raises(InvalidArgument, match="expects a path, bytes or an onnx.ModelProto"):
        ort.InferenceSession(12345, providers=CPU)
