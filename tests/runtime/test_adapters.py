"""LoRA adapters: AdapterFormat files read and written as onnxruntime does, LoraAdapter, RunOptions.add_active_adapter.

onnxruntime (the test extra) is the reference for the file format (each side reads what the other wrote) and
for runs with active adapters (same outputs, same precedence)."""

from __future__ import annotations

import gc

import ml_dtypes
import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from onnx import TensorProto as T
from onnx import helper as h

import crossml as ort
from crossml.device.recording import Recording
from tests.conftest import make_model

CPU = ["CPUExecutionProvider"]
GPU = ["GPUExecutionProvider", "CPUExecutionProvider"]
RNG = np.random.default_rng(7)
W = RNG.standard_normal((6, 5)).astype(np.float32)


def lora_model() -> onnx.ModelProto:
    """y = x @ W + (x @ A) @ B, with A [6, r] and B [r, 5] overridable initializers whose default is empty (r = 0)."""
    nodes = [h.make_node("MatMul", ["x", "W"], ["xw"]), h.make_node("MatMul", ["x", "A"], ["xa"]),
             h.make_node("MatMul", ["xa", "B"], ["xab"]), h.make_node("Add", ["xw", "xab"], ["y"])]
    inputs = [h.make_tensor_value_info("x", T.FLOAT, ["n", 6]), h.make_tensor_value_info("A", T.FLOAT, [6, "r"]),
              h.make_tensor_value_info("B", T.FLOAT, ["r", 5])]
    inits = [onnx.numpy_helper.from_array(W, "W"), onnx.numpy_helper.from_array(np.zeros((6, 0), np.float32), "A"),
             onnx.numpy_helper.from_array(np.zeros((0, 5), np.float32), "B")]
    return make_model(nodes, inputs, [h.make_tensor_value_info("y", T.FLOAT, ["n", 5])], inits)


def write_onnxruntime(path, params: dict[str, np.ndarray], adapter_version: int = 1, model_version: int = 1) -> str:
    f = onnxruntime.AdapterFormat()
    f.set_adapter_version(adapter_version)
    f.set_model_version(model_version)
    f.set_parameters({k: onnxruntime.OrtValue.ortvalue_from_numpy(v) for k, v in params.items()})
    f.export_adapter(str(path))
    return str(path)


def write_crossml(path, params: dict, adapter_version: int = 1, model_version: int = 1) -> str:
    f = ort.AdapterFormat()
    f.set_adapter_version(adapter_version)
    f.set_model_version(model_version)
    f.set_parameters(params)
    f.export_adapter(str(path))
    return str(path)


def lora_pair(rank: int, scale: float = 1.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(rank)
    return {"A": (rng.standard_normal((6, rank)) * scale).astype(np.float32),
            "B": rng.standard_normal((rank, 5)).astype(np.float32)}


def test_files_written_by_onnxruntime_read_by_crossml(tmp_path):
    params = {"f32": RNG.standard_normal((3, 4)).astype(np.float32), "f16": RNG.random(5).astype(np.float16),
              "i64": np.arange(-3, 4, dtype=np.int64), "f64": np.array([2.5], np.float64),
              "empty": np.zeros((4, 0), np.float32), "u8": np.arange(9, dtype=np.uint8).reshape(3, 3)}
    path = write_onnxruntime(tmp_path / "a.onnx_adapter", params, adapter_version=3, model_version=5)
    got = ort.AdapterFormat.read_adapter(path)
    assert (got.get_format_version(), got.get_adapter_version(), got.get_model_version()) == (1, 3, 5)
    values = got.get_parameters()
    assert sorted(values) == sorted(params)
    for name, want in params.items():
        v = values[name]
        assert v.shape() == list(want.shape)
        assert v.data_type() == ort.OrtValue.ortvalue_from_numpy(want).data_type()
        np.testing.assert_array_equal(v.numpy(), want)


def test_files_written_by_crossml_read_by_onnxruntime(tmp_path):
    params = {"f32": RNG.standard_normal((2, 3, 4)).astype(np.float32), "f16": RNG.random(7).astype(np.float16),
              "bf16": RNG.random((4, 3)).astype(ml_dtypes.bfloat16), "i32": np.arange(5, dtype=np.int32),
              "f64": np.array([-1.25], np.float64), "empty": np.zeros((0, 5), np.float32)}
    path = write_crossml(tmp_path / "x.onnx_adapter", {k: ort.OrtValue.ortvalue_from_numpy(v) for k, v in params.items()},
                         adapter_version=7, model_version=9)
    ref = onnxruntime.AdapterFormat.read_adapter(path)
    assert (ref.get_adapter_version(), ref.get_model_version()) == (7, 9)
    values = ref.get_parameters()
    assert sorted(values) == sorted(params)
    for name, want in params.items():
        assert values[name].shape() == list(want.shape)
        if want.dtype == ml_dtypes.bfloat16:  # onnxruntime's numpy() has no bfloat16: compare through crossml
            assert values[name].data_type() == "tensor(bfloat16)"
            continue
        np.testing.assert_array_equal(values[name].numpy(), want)
    onnxruntime.LoraAdapter().Load(path)  # onnxruntime's loader verifies the flatbuffer
    back = ort.AdapterFormat.read_adapter(path).get_parameters()
    for name, want in params.items():
        assert back[name].numpy().tobytes() == want.tobytes()


def test_runs_with_active_adapters_match_onnxruntime(tmp_path):
    model = lora_model()
    x = RNG.standard_normal((3, 6)).astype(np.float32)
    one = write_onnxruntime(tmp_path / "one.onnx_adapter", lora_pair(2))
    two = write_crossml(tmp_path / "two.onnx_adapter", lora_pair(3, scale=2.0))
    a_only = write_onnxruntime(tmp_path / "a.onnx_adapter", {"A": lora_pair(2)["A"] * 3})
    ours = ort.InferenceSession(model, providers=CPU)
    ref = onnxruntime.InferenceSession(model.SerializeToString(), providers=CPU)

    loaded = {}  # onnxruntime's RunOptions does not keep its adapters alive: the test does

    def options(module, *paths):
        ro = module.RunOptions()
        for p in paths:
            a = loaded.setdefault((module.__name__, p), module.LoraAdapter())
            a.Load(p)
            ro.add_active_adapter(a)
        return ro

    cases = [
        ((), {"x": x}),
        ((one,), {"x": x}),
        ((two,), {"x": x}),
        ((one, two), {"x": x}),  # both name A and B: the first adapter wins
        ((two, one), {"x": x}),
        ((one,), {"x": x, "A": np.zeros((6, 2), np.float32)}),  # the adapter wins over the feed
        ((a_only,), {"x": x, "B": lora_pair(2)["B"]}),  # the adapter's A with the feed's B
    ]
    for paths, feed in cases:
        want = ref.run(None, feed, options(onnxruntime, *paths))[0]
        got = ours.run(None, feed, options(ort, *paths))[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=str(paths))
    pair = lora_pair(2)
    ro = ort.RunOptions()
    adapter = ort.LoraAdapter()
    adapter.Load(one)
    ro.add_active_adapter(adapter)
    del adapter  # crossml's RunOptions keeps its adapters alive
    gc.collect()
    np.testing.assert_allclose(ours.run(None, {"x": x}, ro)[0], x @ W + x @ pair["A"] @ pair["B"], rtol=1e-5, atol=1e-5)


def test_loaded_parameters_are_private_to_the_process(tmp_path):
    params = lora_pair(2)
    path = write_crossml(tmp_path / "p.onnx_adapter", params)
    before = open(path, "rb").read()
    f = ort.AdapterFormat.read_adapter(path)
    v = f.get_parameters()["A"].numpy()
    v[...] = 0  # a copy-on-write map: the file keeps its bytes
    assert open(path, "rb").read() == before
    np.testing.assert_array_equal(ort.AdapterFormat.read_adapter(path).get_parameters()["A"].numpy(), params["A"])


def test_adapter_errors(tmp_path):
    model = lora_model()
    s = ort.InferenceSession(model, providers=CPU)
    x = np.ones((1, 6), np.float32)
    with pytest.raises(ort.NoSuchFile, match="does not exist"):
        ort.LoraAdapter().Load(str(tmp_path / "missing.onnx_adapter"))
    junk = tmp_path / "junk.onnx_adapter"
    junk.write_bytes(b"0123456789abcdef")
    with pytest.raises(ort.Fail, match="valid lora parameter format"):
        ort.LoraAdapter().Load(str(junk))
    good = open(write_crossml(tmp_path / "g.onnx_adapter", lora_pair(2)), "rb").read()
    cut = tmp_path / "cut.onnx_adapter"
    cut.write_bytes(good[: len(good) // 2])
    with pytest.raises(ort.Fail, match="verification|bytes of data"):
        ort.LoraAdapter().Load(str(cut))
    with pytest.raises(TypeError, match="LoraAdapter"):
        ort.RunOptions().add_active_adapter("adapter.onnx_adapter")
    with pytest.raises(ort.InvalidArgument, match="Load"):
        ort.RunOptions().add_active_adapter(ort.LoraAdapter())
    stranger = ort.LoraAdapter()
    stranger.Load(write_crossml(tmp_path / "z.onnx_adapter", {"Z": np.ones(3, np.float32)}))
    ro = ort.RunOptions()
    ro.add_active_adapter(stranger)
    with pytest.raises(ort.InvalidArgument, match="Invalid input name: Z.*z.onnx_adapter"):
        s.run(None, {"x": x}, ro)
    half = ort.LoraAdapter()
    half.Load(write_crossml(tmp_path / "h.onnx_adapter", {k: v.astype(np.float16) for k, v in lora_pair(2).items()}))
    ro = ort.RunOptions()
    ro.add_active_adapter(half)
    with pytest.raises(ort.InvalidArgument, match="float16"):
        s.run(None, {"x": x}, ro)
    with pytest.raises(ort.InvalidArgument, match="numeric"):
        ort.AdapterFormat().set_parameters({"s": np.array(["text"])})
    with pytest.raises(ort.InvalidArgument, match="scalar"):
        ort.AdapterFormat().set_parameters({"s": np.array(1.0, np.float32)})
    with pytest.raises(TypeError, match="32-bit"):
        ort.AdapterFormat().set_adapter_version(2**40)


@pytest.mark.gpu
def test_adapters_on_the_gpu_recorded_runs(tmp_path):
    """On the GPU provider with graph capture: adapter parameters are uploaded once and the run with them is
    recorded (an overridable initializer fed is an input of the recording); switching adapters changes the
    result."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA/ROCm device")
    model = lora_model()
    so = ort.SessionOptions()
    so.add_session_config_entry("ep.dml.enable_graph_capture", "1")
    s = ort.InferenceSession(model, so, providers=GPU)
    cpu = ort.InferenceSession(model, providers=CPU)
    x = RNG.standard_normal((4, 6)).astype(np.float32)
    adapters = []
    for rank in (2, 3):
        a = ort.LoraAdapter()
        a.Load(write_crossml(tmp_path / f"r{rank}.onnx_adapter", lora_pair(rank)))
        ro = ort.RunOptions()
        ro.add_active_adapter(a)
        adapters.append((a, ro))
    for _ in range(3):  # the first run of a signature records it, the next ones replay
        for _, ro in adapters:
            # float32 products on the GPU use TF32 (onnxruntime's CUDA default): ~1e-3 relative
            np.testing.assert_allclose(s.run(None, {"x": x}, ro)[0], cpu.run(None, {"x": x}, ro)[0],
                                       rtol=1e-2, atol=1e-2)
        np.testing.assert_allclose(s.run(None, {"x": x})[0], x @ W, rtol=1e-2, atol=1e-2)
    a, _ = adapters[0]
    device_values = a._values(s._device)
    assert all(v.as_torch().device == s._device for v in device_values.values())
    assert a._values(s._device) is device_values  # uploaded once
    recorded = [k[0] for k, r in s._runners.items() if isinstance(r, Recording)]
    assert ("x", "A", "B") in recorded and ("x",) in recorded
