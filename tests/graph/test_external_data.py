"""Initializers in external-data files: read through a memory map when a value is needed, never copied into
the session's ModelProtos; checked against onnx's ReferenceEvaluator on the same files."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper
from onnx.external_data_helper import convert_model_to_external_data
from onnx.reference import ReferenceEvaluator

import crossml as ort
from crossml.graph import external
from crossml.runtime.errors import Fail, InvalidGraph

CPU = ["CPUExecutionProvider"]


def _model() -> onnx.ModelProto:
    """y = ((x @ W16) as float) * s + b, plus a Gather from an int64 table and a bfloat16 constant: element types
    read straight from the map (float16, float32, int64) and through onnx's reader (bfloat16)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((64, 256)).astype(np.float16), "W16")
    s = numpy_helper.from_array(rng.standard_normal(256).astype(np.float32), "s")
    b = h.make_tensor("b", T.BFLOAT16, [256], rng.standard_normal(256).astype(np.float32).tolist())
    table = numpy_helper.from_array(rng.integers(-50, 50, (100, 8)).astype(np.int64), "table")
    nodes = [
        h.make_node("MatMul", ["x", "W16"], ["xw"]),
        h.make_node("Cast", ["xw"], ["xw32"], to=T.FLOAT),
        h.make_node("Mul", ["xw32", "s"], ["xs"]),
        h.make_node("Cast", ["b"], ["b32"], to=T.FLOAT),
        h.make_node("Add", ["xs", "b32"], ["y"]),
        h.make_node("Gather", ["table", "idx"], ["rows"]),
    ]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT16, [2, 64]),
                                  h.make_tensor_value_info("idx", T.INT64, [3])],
                     [h.make_tensor_value_info("y", T.FLOAT, [2, 256]),
                      h.make_tensor_value_info("rows", T.INT64, [3, 8])], [w, s, b, table])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 19)], ir_version=9)


def _save(folder, model: onnx.ModelProto) -> str:
    folder.mkdir(exist_ok=True)
    convert_model_to_external_data(model, location="weights.bin", size_threshold=0)
    path = str(folder / "m.onnx")
    onnx.save(model, path)
    return path


def _feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {"x": rng.standard_normal((2, 64)).astype(np.float16), "idx": np.array([3, 99, 0], np.int64)}


def test_external_initializers_match_the_reference(tmp_path) -> None:
    path = _save(tmp_path / "m", _model())
    sess = ort.InferenceSession(path, providers=CPU)
    ref = ReferenceEvaluator(path)
    got, want = sess.run(None, _feeds()), ref.run(None, _feeds())
    np.testing.assert_allclose(got[0], want[0], rtol=2e-3, atol=2e-3)
    np.testing.assert_array_equal(got[1], want[1])


def test_session_models_hold_no_weight_bytes(tmp_path) -> None:
    """The session's protos keep references only, and the CPU values view the file's pages (no private copy)."""
    path = _save(tmp_path / "m", _model())
    data = os.path.getsize(tmp_path / "m" / "weights.bin")
    sess = ort.InferenceSession(path, providers=CPU)
    for proto in (sess._raw_model, sess._model, sess._skeleton):
        assert proto.ByteSize() < data // 10, proto.ByteSize()
    sess.run(None, _feeds())
    w = sess._constant_cache["W16"]
    mm = sess._files._maps[os.path.realpath(tmp_path / "m" / "weights.bin")]
    start = mm.ctypes.data
    assert start <= w.data_ptr() < start + mm.size  # a view of the map


def test_values_can_be_written_without_touching_the_file(tmp_path) -> None:
    """Maps are copy on write and one per load: a value written in place reaches neither the file nor another
    session of the same model."""
    path = _save(tmp_path / "m", _model())
    before = (tmp_path / "m" / "weights.bin").read_bytes()
    a = ort.InferenceSession(path, providers=CPU)
    b = ort.InferenceSession(path, providers=CPU)
    want = b.run(None, _feeds())
    a.run(None, _feeds())
    a._constant_cache["s"].zero_()
    assert not np.allclose(a.run(None, _feeds())[0], want[0])  # y = x W s + b: now b alone
    np.testing.assert_array_equal(b.run(None, _feeds())[0], want[0])
    assert (tmp_path / "m" / "weights.bin").read_bytes() == before


def test_short_or_mis_sized_external_data_is_refused(tmp_path) -> None:
    path = _save(tmp_path / "m", _model())
    bin_path = tmp_path / "m" / "weights.bin"
    full = bin_path.read_bytes()
    bin_path.write_bytes(full[:-100])
    with pytest.raises(Fail, match="'weights.bin' .* is shorter than offset .* needed by initializer 'table'"):
        ort.InferenceSession(path, providers=CPU)
    bin_path.write_bytes(full)
    m = onnx.load(path, load_external_data=False)
    s = next(t for t in m.graph.initializer if t.name == "s")
    for e in s.external_data:
        if e.key == "length":
            e.value = "100"
    onnx.save(m, path)
    with pytest.raises(Fail, match=r"initializer 's' of shape \[256\] and type TensorProto.FLOAT needs 1024 bytes "
                                   r"but its external data \(file 'weights.bin', offset \d+\) has length 100"):
        ort.InferenceSession(path, providers=CPU)


def test_a_reference_without_length_takes_what_its_shape_needs(tmp_path) -> None:
    """onnx reads to the end of the file where a reference has no length; with a known element type the tensor
    takes just its own bytes, so one file may hold several such tensors."""
    path = _save(tmp_path / "m", _model())
    want = ReferenceEvaluator(path).run(None, _feeds())
    m = onnx.load(path, load_external_data=False)
    for t in m.graph.initializer:
        if t.name != "b":  # bfloat16: no numpy type of its own, its reference keeps its length
            kept = [(e.key, e.value) for e in t.external_data if e.key != "length"]
            del t.external_data[:]
            for key, value in kept:
                t.external_data.add(key=key, value=value)
    onnx.save(m, path)
    got = ort.InferenceSession(path, providers=CPU).run(None, _feeds())
    np.testing.assert_allclose(got[0], want[0], rtol=2e-3, atol=2e-3)
    np.testing.assert_array_equal(got[1], want[1])


def test_only_checked_files_are_read(tmp_path) -> None:
    """A reference that load_model did not check (e.g. a hand-made absolute location) is refused."""
    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.ones(16, np.float32).tobytes())
    t = onnx.TensorProto(name="w", data_type=T.FLOAT, dims=[16], data_location=T.EXTERNAL)
    for key, value in (("location", str(secret)), ("offset", "0"), ("length", "64")):
        t.external_data.add(key=key, value=value)
    with pytest.raises(InvalidGraph, match="not checked when its model was loaded"):
        external.array(t)


def test_optimized_model_file_holds_the_data(tmp_path) -> None:
    path = _save(tmp_path / "m", _model())
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ort.InferenceSession(path, so, providers=CPU)
    saved = onnx.load(str(tmp_path / "opt.onnx"))
    assert not any(external.is_external(t) for t in saved.graph.initializer)
    got = ort.InferenceSession(str(tmp_path / "opt.onnx"), providers=CPU).run(None, _feeds())
    want = ReferenceEvaluator(path).run(None, _feeds())
    np.testing.assert_allclose(got[0], want[0], rtol=2e-3, atol=2e-3)


def test_merged_gate_up_weights_stay_out_of_the_proto(tmp_path) -> None:
    """MergeGateUp's concatenated weight (a GPU fusion) is held by the model's Files, not copied into the proto;
    its value is the concatenation of the weights in the file."""
    from crossml.graph.load import load_model, prepare
    from crossml.graph.passes import apply_rules
    from crossml.graph.passes.gate_up import GATE_UP
    from crossml.graph.passes.swiglu import SWIGLU
    from tests.graph.test_swiglu_rule import mlp

    path = _save(tmp_path / "m", mlp(dtype=T.FLOAT, layers=2))
    model, files = load_model(path)
    model = prepare(model)
    assert apply_rules(model, [SWIGLU, GATE_UP]) == {"FuseSwiGLU": 2, "MergeGateUp": 2}
    merged = {t.name: t for t in model.graph.initializer if "gate_up" in t.name}
    assert len(merged) == 2 and model.ByteSize() < 10_000
    ref = onnx.load(path)  # onnx's own reader
    weights = {t.name: numpy_helper.to_array(t) for t in ref.graph.initializer}
    for layer in (0, 1):
        t = next(t for name, t in merged.items() if name.startswith(f"l{layer}_"))
        assert external.is_external(t) and not t.raw_data and external.files_of(t) is files
        assert dict((e.key, e.value) for e in t.external_data)["location"].startswith("memory:")
        want = np.concatenate([weights[f"l{layer}_Wg"], weights[f"l{layer}_Wu"]], axis=1)
        np.testing.assert_array_equal(external.array(t), want)
        np.testing.assert_array_equal(numpy_helper.to_array(external.materialize(t)), want)


def _affine_external(folder) -> tuple[str, np.ndarray, np.ndarray]:
    """y = x @ W + b with W and b in the external file w.bin; returns the model path and W, b."""
    w = np.arange(12, dtype=np.float32).reshape(4, 3) / 7
    b = np.linspace(-1, 1, 3).astype(np.float32)
    g = h.make_graph([h.make_node("MatMul", ["x", "W"], ["xw"]), h.make_node("Add", ["xw", "b"], ["y"])], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, ["n", 4])], [h.make_tensor_value_info("y", T.FLOAT, None)],
                     [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    path = os.path.join(folder, "m.onnx")
    onnx.save(m, path, save_as_external_data=True, location="w.bin", size_threshold=0)
    return path, w, b


def test_external_initializers_given_by_the_caller_match_onnxruntime(tmp_path):
    """SessionOptions.add_external_initializers / add_external_initializers_from_files_in_memory, as onnxruntime:
    given values replace the initializers (their file need not exist); file bytes given in memory are read in
    place of the file."""
    import onnxruntime

    path, w, b = _affine_external(str(tmp_path))
    data = open(os.path.join(tmp_path, "w.bin"), "rb").read()
    x = np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)

    def both(setup, source=path):
        outs = []
        for mod in (ort, onnxruntime):
            so = mod.SessionOptions()
            setup(mod, so)
            src = source if mod is ort or not isinstance(source, onnx.ModelProto) else source.SerializeToString()
            outs.append(mod.InferenceSession(src, so, providers=CPU).run(None, {"x": x})[0])
        np.testing.assert_allclose(outs[0], outs[1], rtol=1e-6)
        return outs[0]

    def values(*arrays):
        return lambda mod, so: so.add_external_initializers(
            ["W", "b"][: len(arrays)], [mod.OrtValue.ortvalue_from_numpy(a) for a in arrays])

    np.testing.assert_allclose(both(values(w * 0)), x @ (w * 0) + b, rtol=1e-6)  # the file still gives b
    os.rename(tmp_path / "w.bin", tmp_path / "w.bin.gone")
    np.testing.assert_allclose(both(values(w * 2, b * 3)), x @ (w * 2) + b * 3, rtol=1e-6)
    with open(path, "rb") as f:  # the model's bytes: every external tensor given
        np.testing.assert_allclose(both(values(w, b), f.read()), x @ w + b, rtol=1e-6)
    np.testing.assert_allclose(both(lambda mod, so: so.add_external_initializers_from_files_in_memory(
        ["w.bin"], [data], [len(data)])), x @ w + b, rtol=1e-6)

    def fails(setup, match, error=Fail):
        so = ort.SessionOptions()
        setup(ort, so)
        with pytest.raises(error, match=match):
            ort.InferenceSession(path, so, providers=CPU)

    fails(values(w), "'w.bin' of initializer 'b' does not exist", ort.NoSuchFile)
    fails(lambda mod, so: so.add_external_initializers(["W", "b", "zz"], [w, b, b]), "no initializer named 'zz'")
    fails(values(w.T.copy(), b), r"'W' has shape \[4, 3\], the value given \[3, 4\]")
    fails(values(w.astype(np.float64), b), "'W' is .*FLOAT, the value given is float64")
    fails(lambda mod, so: so.add_external_initializers_from_files_in_memory(["w.bin"], [data[:20]], [20]),
          r"\(20 bytes\) is shorter")
    with pytest.raises(ort.InvalidArgument, match="length 99"):
        ort.SessionOptions().add_external_initializers_from_files_in_memory(["w.bin"], [data[:20]], [99])
    with pytest.raises(ort.InvalidArgument, match="2 names but 1 values"):
        ort.SessionOptions().add_external_initializers(["W", "b"], [w])
