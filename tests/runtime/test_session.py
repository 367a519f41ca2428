"""The onnxruntime session API: metadata, run variants, OrtValue, IOBinding, options, profiling."""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest

import crossml as ort
from tests.conftest import affine_reference, run_in_threads

CPU = ["CPUExecutionProvider"]


def test_inputs_outputs_and_metadata(affine_model):
    s = ort.InferenceSession(affine_model.SerializeToString(), providers=CPU)
    (i,) = s.get_inputs()
    assert (i.name, i.type, i.shape) == ("x", "tensor(float)", ["batch", 4])
    assert [(o.name, o.shape) for o in s.get_outputs()] == [("y", ["batch", 3]), ("z", ["batch", 3])]
    assert s.get_overridable_initializers() == []
    meta = s.get_modelmeta()
    assert meta.producer_name == "crossml-tests"
    assert meta.graph_name == "g"
    assert meta.description == "affine test model"
    assert meta.version == 3
    assert meta.custom_metadata_map == {"author": "tests", "purpose": "api"}
    assert s.get_providers() == ["CPUExecutionProvider"]
    assert s.get_provider_options() == {"CPUExecutionProvider": {}}


def test_run_all_some_and_ortvalues(affine_model):
    s = ort.InferenceSession(affine_model, providers=CPU)
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    y, z = affine_reference(x)
    got = s.run(None, {"x": x})
    np.testing.assert_allclose(got[0], y, rtol=1e-6)
    np.testing.assert_allclose(got[1], z, rtol=1e-6)
    (only_z,) = s.run(["z"], {"x": x})
    np.testing.assert_allclose(only_z, z, rtol=1e-6)
    assert len(s.run([], {"x": x})) == 2
    xv = ort.OrtValue.ortvalue_from_numpy(x)
    outs = s.run_with_ort_values(["y"], {"x": xv})
    assert isinstance(outs[0], ort.OrtValue)
    np.testing.assert_allclose(outs[0].numpy(), y, rtol=1e-6)


def test_model_from_path_and_run_options(tmp_path, affine_model):
    p = tmp_path / "m.onnx"
    onnx.save(affine_model, p)
    s = ort.InferenceSession(str(p), providers=CPU)
    ro = ort.RunOptions()
    ro.run_tag = "t"
    ro.add_run_config_entry("k", "v")
    assert ro.get_run_config_entry("k") == "v"
    x = np.ones((2, 4), np.float32)
    np.testing.assert_allclose(s.run(None, {"x": x}, ro)[0], affine_reference(x)[0], rtol=1e-6)
    ro.terminate = True
    with pytest.raises(ort.Fail):
        s.run(None, {"x": x}, ro)


def test_ortvalue_api():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    v = ort.OrtValue.ortvalue_from_numpy(a)
    assert v.shape() == [2, 3]
    assert v.data_type() == "tensor(float)"
    assert v.element_type() == onnx.TensorProto.FLOAT
    assert v.device_name() == "cpu"
    assert v.is_tensor() and v.has_value() and not v.is_tensor_sequence()
    assert v.data_ptr() == a.ctypes.data  # zero-copy on the CPU
    a[0, 0] = 42
    assert v.numpy()[0, 0] == 42
    e = ort.OrtValue.ortvalue_from_shape_and_type([3, 2], np.int64)
    assert e.shape() == [3, 2] and e.data_type() == "tensor(int64)"
    import ml_dtypes

    bf = ort.OrtValue.ortvalue_from_numpy(np.array([1.5, -2], dtype=ml_dtypes.bfloat16))
    assert bf.data_type() == "tensor(bfloat16)"
    assert bf.numpy().dtype == ml_dtypes.bfloat16


def test_iobinding_cpu(affine_model):
    s = ort.InferenceSession(affine_model, providers=CPU)
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    y, z = affine_reference(x)
    b = s.io_binding()
    b.bind_cpu_input("x", x)
    b.bind_output("y")
    out_z = np.zeros((3, 3), np.float32)
    b.bind_output("z", "cpu", 0, np.float32, [3, 3], out_z.ctypes.data)
    s.run_with_iobinding(b)
    b.synchronize_outputs()
    outs = b.get_outputs()
    np.testing.assert_allclose(outs[0].numpy(), y, rtol=1e-6)
    np.testing.assert_allclose(out_z, z, rtol=1e-6)  # written into the bound buffer
    np.testing.assert_allclose(b.copy_outputs_to_cpu()[1], z, rtol=1e-6)
    b2 = s.io_binding()
    b2.bind_input("x", "cpu", 0, np.float32, list(x.shape), x.ctypes.data)
    b2.bind_ortvalue_output("y", ort.OrtValue.ortvalue_from_shape_and_type([3, 3], np.float32))
    s.run_with_iobinding(b2)
    np.testing.assert_allclose(b2.get_outputs()[0].numpy(), y, rtol=1e-6)


def test_session_options_and_free_dimension_override(affine_model):
    so = ort.SessionOptions()
    so.add_free_dimension_override_by_name("batch", 2)
    so.add_session_config_entry("session.some_key", "1")
    assert so.get_session_config_entry("session.some_key") == "1"
    with pytest.raises(ort.InvalidArgument):
        so.get_session_config_entry("missing")
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.intra_op_num_threads = 2
    s = ort.InferenceSession(affine_model, so, providers=CPU)
    assert s.get_inputs()[0].shape == [2, 4]
    assert s.get_session_options() is so
    with pytest.raises(ort.InvalidArgument, match="index: 0 Got: 3 Expected: 2"):
        s.run(None, {"x": np.zeros((3, 4), np.float32)})


def test_override_by_denotation(affine_model):
    affine_model.graph.input[0].type.tensor_type.shape.dim[0].denotation = "DATA_BATCH"
    so = ort.SessionOptions()
    so.add_free_dimension_override_by_denotation("DATA_BATCH", 7)
    s = ort.InferenceSession(affine_model, so, providers=CPU)
    assert s.get_inputs()[0].shape == [7, 4]


def test_optimized_model_file(tmp_path, affine_model):
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    s = ort.InferenceSession(affine_model, so, providers=CPU)
    m = onnx.load(so.optimized_model_filepath)
    assert [n.op_type for n in m.graph.node] == ["Linear", "Relu", "Mul"]  # MatMul+bias fused
    basic = ort.SessionOptions()
    basic.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    basic.optimized_model_filepath = str(tmp_path / "basic.onnx")
    ort.InferenceSession(affine_model, basic, providers=CPU)
    assert [n.op_type for n in onnx.load(basic.optimized_model_filepath).graph.node] == ["MatMul", "Add", "Relu", "Mul"]
    x = np.ones((1, 4), np.float32)
    s2 = ort.InferenceSession(so.optimized_model_filepath, providers=CPU)
    np.testing.assert_allclose(s2.run(None, {"x": x})[1], s.run(None, {"x": x})[1])


def test_constant_folding_removes_constant_subgraph(tmp_path):
    from onnx import TensorProto as T
    from onnx import helper as h

    from tests.conftest import make_model

    c = onnx.numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "c")
    m = make_model([h.make_node("Mul", ["c", "c"], ["c2"]), h.make_node("Add", ["x", "c2"], ["y"])],
                   [h.make_tensor_value_info("x", T.FLOAT, [2])], [h.make_tensor_value_info("y", T.FLOAT, [2])], [c])
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    s = ort.InferenceSession(m, so, providers=CPU)
    assert [n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node] == ["Add"]
    np.testing.assert_allclose(s.run(None, {"x": np.zeros(2, np.float32)})[0], [1.0, 4.0])
    so2 = ort.SessionOptions()
    so2.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so2.optimized_model_filepath = str(tmp_path / "noopt.onnx")
    ort.InferenceSession(m, so2, providers=CPU)
    assert len(onnx.load(so2.optimized_model_filepath).graph.node) == 2


def test_profiling(tmp_path, affine_model):
    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "prof_")
    s = ort.InferenceSession(affine_model, so, providers=CPU)
    s.run(None, {"x": np.ones((2, 4), np.float32)})
    path = s.end_profiling()
    assert os.path.basename(path).startswith("prof_") and path.endswith(".json")
    events = json.load(open(path))
    names = {e["name"] for e in events}
    assert "model_run" in names and "model_loading_and_session_initialization" in names
    node_ops = {e["args"].get("op_name") for e in events if e["cat"] == "Node"}
    assert {"Linear", "Relu", "Mul"} <= node_ops
    assert all(e["ph"] == "X" and e["dur"] >= 0 for e in events)


def test_overridable_initializer(affine_model):
    affine_model.graph.input.append(onnx.helper.make_tensor_value_info("two", onnx.TensorProto.FLOAT, []))
    s = ort.InferenceSession(affine_model, providers=CPU)
    assert [a.name for a in s.get_overridable_initializers()] == ["two"]
    x = np.ones((1, 4), np.float32)
    y, z = s.run(None, {"x": x})
    np.testing.assert_allclose(z, y * 2)
    y3, z3 = s.run(None, {"x": x, "two": np.array(3.0, np.float32)})
    np.testing.assert_allclose(z3, y3 * 3)


def test_threads_share_one_session(affine_model):
    s = ort.InferenceSession(affine_model, providers=CPU)
    errors: list[str] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(30):
            n = int(rng.integers(1, 9))
            x = rng.standard_normal((n, 4)).astype(np.float32)
            y, z = s.run(None, {"x": x})
            ry, rz = affine_reference(x)
            # atol: a 4-term float32 dot product that cancels to ~1e-4 differs by an ulp of its terms between
            # summation orders (torch against numpy)
            if not (np.allclose(y, ry, rtol=1e-5, atol=1e-6) and np.allclose(z, rz, rtol=1e-5, atol=2e-6)):
                errors.append(f"thread {seed} wrong result for batch {n}")

    run_in_threads(work)
    assert not errors


def test_module_level_api():
    assert "CPUExecutionProvider" in ort.get_available_providers()
    assert "CUDAExecutionProvider" in ort.get_all_providers()
    assert ort.get_device() in ("CPU", "GPU")
    ort.set_default_logger_severity(3)
    ort.set_default_logger_severity(2)
    assert isinstance(ort.__version__, str)
    from crossml.capi.onnxruntime_pybind11_state import Fail, InvalidArgument, NoSuchFile  # noqa: F401


def test_add_initializer_replaces_the_default(affine_model):
    affine_model.graph.input.append(onnx.helper.make_tensor_value_info("two", onnx.TensorProto.FLOAT, []))
    so = ort.SessionOptions()
    so.add_initializer("two", ort.OrtValue.ortvalue_from_numpy(np.array(5.0, np.float32)))
    s = ort.InferenceSession(affine_model, so, providers=CPU)
    y, z = s.run(None, {"x": np.ones((2, 4), np.float32)})
    np.testing.assert_allclose(z, y * 5)
    bad = ort.SessionOptions()
    bad.add_initializer("W_missing", np.zeros(1, np.float32))
    with pytest.raises(ort.InvalidArgument, match="'W_missing' is not an overridable initializer"):
        ort.InferenceSession(affine_model, bad, providers=CPU)


def test_iobinding_tells_the_session_when_its_input_bindings_are_stable(affine_model, monkeypatch):
    """The second and later runs of unchanged device bindings are "stable" (a GPU session then reads them in
    place); binding other memory starts over, rebinding the same memory does not; host inputs never count
    (the session copies them), which the session checks itself."""
    sess = ort.InferenceSession(affine_model, providers=["CPUExecutionProvider"])
    seen = []
    real = sess._run

    def spy(feed, run_options, *, stable=False, into=None):
        seen.append(stable)
        return real(feed, run_options, stable=stable, into=into)

    monkeypatch.setattr(sess, "_run", spy)
    b = sess.io_binding()
    x = np.ones((2, 4), np.float32)
    b.bind_cpu_input("x", x)
    b.bind_output("y")
    sess.run_with_iobinding(b)
    sess.run_with_iobinding(b)
    b.bind_cpu_input("x", x)  # a new host copy: starts over
    sess.run_with_iobinding(b)
    assert seen == [False, True, False]
    np.testing.assert_allclose(b.copy_outputs_to_cpu()[0], affine_reference(x)[0], rtol=1e-6)


def test_run_async_calls_back_from_another_thread(affine_model):
    import threading

    s = ort.InferenceSession(affine_model, providers=CPU)
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    done = threading.Event()
    calls = []

    def callback(results, user_data, err):
        calls.append((results, user_data, err, threading.current_thread() is threading.main_thread()))
        done.set()

    s.run_async(None, {"x": x}, callback, {"tag": 1})
    assert done.wait(30)
    (results, user_data, err, on_main), = calls
    assert err == "" and user_data == {"tag": 1} and not on_main
    for got, want in zip(results, s.run(None, {"x": x})):
        np.testing.assert_array_equal(got, want)
    done.clear()
    s.run_async(["z"], {"x": np.ones((2, 5), np.float32)}, callback, None)  # a run error goes to the callback
    assert done.wait(30)
    results, _, err, _ = calls[-1]
    assert results == [] and "x" in err and "5" in err
    with pytest.raises(ort.InvalidArgument, match="missing from input feed"):
        s.run_async(None, {"q": x}, callback, None)
    with pytest.raises(ort.InvalidArgument, match="Invalid output name"):
        s.run_async(["nope"], {"x": x}, callback, None)


def test_ortvalue_update_inplace_and_size():
    import onnxruntime

    arr = np.zeros((2, 3), np.float32)
    v = ort.OrtValue.ortvalue_from_numpy(arr)
    ptr = v.data_ptr()
    v.update_inplace(np.arange(6, dtype=np.float32))
    np.testing.assert_array_equal(v.numpy(), np.arange(6, dtype=np.float32).reshape(2, 3))
    v.update_inplace(ort.OrtValue.ortvalue_from_numpy(np.full((3, 2), 7, np.float32)))
    assert v.data_ptr() == ptr and (v.numpy() == 7).all()
    with pytest.raises(ort.InvalidArgument, match="does not match"):
        v.update_inplace(np.zeros(4, np.float32))
    with pytest.raises(ort.InvalidArgument, match=r"tensor\(double\).*tensor\(float\)"):
        v.update_inplace(np.zeros(6, np.float64))
    for a in (np.zeros((2, 3), np.float32), np.zeros(5, np.int64), np.zeros((4, 4), np.float16), np.zeros(0, np.int8)):
        want = onnxruntime.OrtValue.ortvalue_from_numpy(a).tensor_size_in_bytes()
        assert ort.OrtValue.ortvalue_from_numpy(a).tensor_size_in_bytes() == want


def test_version_and_build_info():
    assert ort.get_version_string() == ort.__version__
    assert ort.__version__ in ort.get_build_info() and "torch" in ort.get_build_info()


def test_unmarked_tests_take_the_cpu_provider_by_default(affine_model, monkeypatch) -> None:
    """The suite's conftest keeps sessions of unmarked (CPU) tests on the CPU provider on GPU machines too: with a GPU
    seen, a session given no providers still runs on the CPU here (outside the tests it takes the GPU provider)."""
    import crossml.runtime.providers as providers

    monkeypatch.setattr(providers, "gpu_available", lambda: True)
    s = ort.InferenceSession(affine_model)
    assert s.get_providers() == ["CPUExecutionProvider"]
    assert providers.default_providers() == ["CPUExecutionProvider"]
