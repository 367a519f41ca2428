"""The GPU provider on a real GPU: device-resident I/O, DLPack, IOBinding, capture, threads, options.

Every test here is marked ``gpu`` and skips where torch sees no accelerator.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto as T
from onnx import helper as h

import crossml as ort
from tests.conftest import affine_reference, make_model, run_in_threads

pytestmark = pytest.mark.gpu
GPU = ["GPUExecutionProvider", "CPUExecutionProvider"]


def conv_model(batch: int | str = "N") -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = onnx.numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    b = onnx.numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")
    nodes = [h.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c"], ["r"]),
             h.make_node("GlobalAveragePool", ["r"], ["p"]), h.make_node("Flatten", ["p"], ["y"])]
    return make_model(nodes, [h.make_tensor_value_info("x", T.FLOAT, [batch, 3, 16, 16])],
                      [h.make_tensor_value_info("y", T.FLOAT, [batch, 8])], [w, b])


def cpu_reference(model: onnx.ModelProto, feeds: dict) -> list:
    return ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)


def test_providers_and_device(affine_model):
    assert ort.get_device() == "GPU"
    assert ort.get_available_providers()[0] == "GPUExecutionProvider"
    for name in ("GPUExecutionProvider", "CUDAExecutionProvider", "DmlExecutionProvider"):
        s = ort.InferenceSession(affine_model, providers=[name, "CPUExecutionProvider"])
        assert s.get_providers()[0] == name
        assert s.device.type == "cuda"
        x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
        # TF32 matmul is the default (as onnxruntime's CUDA provider): ~1e-3 relative
        np.testing.assert_allclose(s.run(None, {"x": x})[0], affine_reference(x)[0], rtol=2e-3, atol=2e-3)
    opts = s.get_provider_options()["DmlExecutionProvider"]
    assert opts["device_id"] == "0" and opts["enable_graph_capture"] == "true"


def test_bad_device_id(affine_model):
    with pytest.raises(ort.InvalidArgument, match="out of range; adapters: 0:"):
        ort.InferenceSession(affine_model, providers=[("GPUExecutionProvider", {"device_id": 99})])


@pytest.mark.parametrize("capture", ["true", "false"])
def test_capture_on_and_off_match_cpu(capture):
    m = conv_model()
    s = ort.InferenceSession(m, providers=[("GPUExecutionProvider", {"enable_graph_capture": capture})])
    rng = np.random.default_rng(1)
    for batch in (1, 4, 1, 2):  # repeated signatures replay their command list
        x = rng.standard_normal((batch, 3, 16, 16)).astype(np.float32)
        got = s.run(None, {"x": x})[0]
        np.testing.assert_allclose(got, cpu_reference(m, {"x": x})[0], rtol=2e-3, atol=2e-3)
    from crossml.device.recording import Recording

    kinds = {type(r) for r in s._runners.values()}
    assert (Recording in kinds) == (capture == "true")


def test_deferred_capture_records_on_the_next_run(monkeypatch):
    """Run config ``crossml.graph_capture_defer=1``: a new signature's specialised plan runs eagerly; the next run
    without it records the plan with no warm-up run (the first run warmed it), and later runs replay it."""
    from crossml.device.recording import Recording
    from crossml.runtime import session as session_module

    m = conv_model()
    s = ort.InferenceSession(m, providers=GPU)
    defer = ort.RunOptions()
    defer.add_run_config_entry("crossml.graph_capture_defer", "1")
    calls: list[bool] = []

    class Spy(Recording):
        def __init__(self, *a, warm: bool = True, **k) -> None:
            calls.append(warm)
            super().__init__(*a, warm=warm, **k)

    monkeypatch.setattr(session_module, "Recording", Spy)
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((2, 3, 16, 16)).astype(np.float32) for _ in range(4)]
    outs = [s.run(None, {"x": xs[0]}, defer)[0], s.run(None, {"x": xs[1]}, defer)[0]]
    assert not calls and [type(r).__name__ for r in s._runners.values()] == ["_Warmed"]
    outs += [s.run(None, {"x": x})[0] for x in xs[2:]]
    assert calls == [False] and [type(r) for r in s._runners.values()] == [Spy]
    for x, got in zip(xs, outs):
        np.testing.assert_allclose(got, cpu_reference(m, {"x": x})[0], rtol=2e-3, atol=2e-3)


def test_ortvalue_on_device_and_dlpack():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    v = ort.OrtValue.ortvalue_from_numpy(x, "cuda", 0)
    assert v.device_name() == "cuda" and v.data_ptr() != x.ctypes.data
    np.testing.assert_array_equal(v.numpy(), x)
    t = torch.from_dlpack(v)
    assert t.device.type == "cuda" and t.data_ptr() == v.data_ptr()  # zero-copy out
    src = torch.randn(5, 6, device="cuda")
    w = ort.OrtValue.from_dlpack(src)
    assert w.data_ptr() == src.data_ptr()  # zero-copy in
    e = ort.OrtValue.ortvalue_from_shape_and_type([2, 2], np.float16, "gpu", 0)
    assert e.device_name() == "cuda" and e.data_type() == "tensor(float16)"


def test_iobinding_on_device(affine_model):
    s = ort.InferenceSession(affine_model, providers=GPU)
    x = torch.randn(6, 4, device="cuda")
    y_ref, z_ref = affine_reference(x.cpu().numpy())
    b = s.io_binding()
    b.bind_input("x", "cuda", 0, np.float32, list(x.shape), x.data_ptr())
    b.bind_output("y", "cuda")
    z = torch.empty(6, 3, device="cuda")
    b.bind_output("z", "cuda", 0, np.float32, [6, 3], z.data_ptr())
    s.run_with_iobinding(b)
    b.synchronize_outputs()
    y = b.get_outputs()[0]
    assert y.device_name() == "cuda"
    np.testing.assert_allclose(y.numpy(), y_ref, rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(z.cpu().numpy(), z_ref, rtol=2e-3, atol=2e-3)
    b.bind_ortvalue_input("x", ort.OrtValue.from_dlpack(x))
    s.run_with_iobinding(b)
    np.testing.assert_allclose(b.copy_outputs_to_cpu()[0], y_ref, rtol=2e-3, atol=2e-3)


def test_stable_iobinding_reads_inputs_in_place():
    """An IOBinding run again with the same bindings gets a recording that reads the bound tensor in place
    (no input copy): new values written into it between runs are seen; outputs are fresh per run (or copied
    into bound buffers); rebinding new tensors every run, or host inputs, never record again."""
    from crossml.device.recording import Recording

    m = conv_model(2)
    s = ort.InferenceSession(m, providers=GPU)
    x = torch.randn(2, 3, 16, 16, device="cuda")
    b = s.io_binding()
    b.bind_ortvalue_input("x", ort.OrtValue.from_dlpack(x))
    b.bind_output("y", "cuda")
    results = []
    for step in range(4):
        x.copy_(torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(step)).cuda())
        s.run_with_iobinding(b)
        results.append((b.get_outputs()[0], x.cpu().numpy()))
    for y, xv in results:  # each run's output survives the later runs
        np.testing.assert_allclose(y.numpy(), cpu_reference(m, {"x": xv})[0], rtol=2e-3, atol=2e-3)
    in_place = [r for k, r in s._runners.items() if "in place" in k]
    assert len(in_place) == 1 and isinstance(in_place[0], Recording) and in_place[0].inputs[0].data_ptr() == x.data_ptr()
    assert len(s._runners) == 2  # the shapes' copying recording (first run) and the in-place one

    for _ in range(2):  # rebinding the same memory before each run (a common loop) keeps the bindings stable
        b.bind_input("x", "cuda", 0, np.float32, [2, 3, 16, 16], x.data_ptr())
        s.run_with_iobinding(b)
    assert len(s._runners) == 2

    out = torch.empty(2, 8, device="cuda")  # a bound output buffer is written directly
    b.bind_output("y", "cuda", 0, np.float32, [2, 8], out.data_ptr())
    s.run_with_iobinding(b)
    assert b.get_outputs()[0].data_ptr() == out.data_ptr()
    np.testing.assert_allclose(out.cpu().numpy(), cpu_reference(m, {"x": x.cpu().numpy()})[0], rtol=2e-3, atol=2e-3)

    for _ in range(3):  # new tensors every run: the copying recording serves them
        xn = torch.randn(2, 3, 16, 16, device="cuda")
        b.bind_ortvalue_input("x", ort.OrtValue.from_dlpack(xn))
        s.run_with_iobinding(b)
        np.testing.assert_allclose(out.cpu().numpy(), cpu_reference(m, {"x": xn.cpu().numpy()})[0], rtol=2e-3,
                                   atol=2e-3)
    xh = np.random.default_rng(3).standard_normal((2, 3, 16, 16)).astype(np.float32)
    b.bind_cpu_input("x", xh)
    for _ in range(3):  # host inputs are copied to the device each run: never in place
        s.run_with_iobinding(b)
    np.testing.assert_allclose(out.cpu().numpy(), cpu_reference(m, {"x": xh})[0], rtol=2e-3, atol=2e-3)
    assert len(s._runners) == 2


def test_failed_capture_leaves_torch_random_usable():
    """A function that syncs with the host cannot be recorded: the Recording raises (the session then runs
    eagerly), and CUDA random numbers still work afterwards, with the generator's seed and offset kept."""
    from crossml.device.recording import Recording

    def syncs(inputs):
        y = inputs[0] * 2
        return [y + float(y.sum().item())]

    torch.cuda.manual_seed(7)
    want = torch.randint(0, 1000, (8,), device="cuda").cpu()
    torch.cuda.manual_seed(7)
    with pytest.raises(Exception):  # noqa: B017 - whichever error torch raises for the invalidated capture
        Recording(syncs, [torch.ones(3, device="cuda")], torch.device("cuda"))
    assert torch.equal(torch.randint(0, 1000, (8,), device="cuda").cpu(), want)


def test_eight_threads_mixed_shapes():
    m = conv_model()
    s = ort.InferenceSession(m, providers=GPU)
    ref = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    errors: list[str] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(20):
            n = int(rng.integers(1, 5))
            x = rng.standard_normal((n, 3, 16, 16)).astype(np.float32)
            got = s.run(None, {"x": x})[0]
            want = ref.run(None, {"x": x})[0]
            if not np.allclose(got, want, rtol=2e-3, atol=2e-3):
                errors.append(f"thread {seed}: batch {n} differs by {np.abs(got - want).max()}")

    run_in_threads(work)
    assert not errors, errors[:3]


def test_strict_fp32_with_use_tf32_0():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((256, 512)).astype(np.float32)
    w = onnx.numpy_helper.from_array(rng.standard_normal((512, 256)).astype(np.float32), "w")
    m = make_model([h.make_node("MatMul", ["a", "w"], ["y"])], [h.make_tensor_value_info("a", T.FLOAT, [256, 512])],
                   [h.make_tensor_value_info("y", T.FLOAT, [256, 256])], [w])
    exact = a.astype(np.float64) @ onnx.numpy_helper.to_array(w).astype(np.float64)
    session = ort.InferenceSession(m, providers=[("GPUExecutionProvider", {"use_tf32": "0"})])
    ort.InferenceSession(m, providers=["GPUExecutionProvider"])  # a TF32 session flips torch's process-wide switch
    for run in range(2):  # the strict session still runs strict, eagerly and recorded
        strict = session.run(None, {"a": a})[0]
        rel = np.linalg.norm(strict - exact) / np.linalg.norm(exact)
        assert rel < 1e-5, (run, rel)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # the default for later tests


def test_fp16_model_runs_in_fp16():
    rng = np.random.default_rng(3)
    w = onnx.numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float16), "w")
    m = make_model([h.make_node("MatMul", ["a", "w"], ["y"])], [h.make_tensor_value_info("a", T.FLOAT16, [8, 64])],
                   [h.make_tensor_value_info("y", T.FLOAT16, [8, 64])], [w])
    a = rng.standard_normal((8, 64)).astype(np.float16)
    got = ort.InferenceSession(m, providers=GPU).run(None, {"a": a})[0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), a.astype(np.float32) @ onnx.numpy_helper.to_array(w).astype(np.float32),
                               rtol=2e-2, atol=5e-2)


def test_disable_metacommands_runs_no_vendor_library():
    """With disable_metacommands, no cuBLAS / cuDNN kernel runs, and results match within tolerance."""
    rng = np.random.default_rng(4)
    w = onnx.numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    fc = onnx.numpy_helper.from_array(rng.standard_normal((8 * 16 * 16, 10)).astype(np.float32), "fc")
    nodes = [h.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c"], ["r"]),
             h.make_node("Flatten", ["r"], ["f"]), h.make_node("MatMul", ["f", "fc"], ["y"])]
    m = make_model(nodes, [h.make_tensor_value_info("x", T.FLOAT, [2, 3, 16, 16])],
                   [h.make_tensor_value_info("y", T.FLOAT, [2, 10])], [w, fc])
    x = rng.standard_normal((2, 3, 16, 16)).astype(np.float32)
    opts = {"disable_metacommands": "true", "enable_graph_capture": "false", "use_tf32": "0"}
    s = ort.InferenceSession(m, providers=[("GPUExecutionProvider", opts)])
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        got = s.run(None, {"x": x})[0]
        torch.cuda.synchronize()
    names = [e.name.lower() for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    libs = ("cublas", "cudnn", "xmma", "cutlass", "gemv", "nvjet", "sm90_", "sm80_")
    vendor = [n for n in names if any(k in n for k in libs)]
    assert not vendor, vendor[:5]
    want = cpu_reference(m, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)


def test_add_initializer_reaches_captured_plans(affine_model):
    """add_initializer values hold in the per-signature (captured) plans too, not only the generic one."""
    affine_model.graph.input.append(onnx.helper.make_tensor_value_info("two", onnx.TensorProto.FLOAT, []))
    so = ort.SessionOptions()
    so.add_initializer("two", np.array(5.0, np.float32))
    s = ort.InferenceSession(affine_model, so, providers=GPU)
    x = torch.ones(3, 4, device="cuda")
    for _ in range(2):  # first run records the command list, the second replays it
        y, z = s._run({"x": x}, None)
        torch.testing.assert_close(z, y * 5)


def _constant_node_model() -> onnx.ModelProto:
    """y = (x - c) * 2 with c a Constant node (not an initializer): its device copy lives only in the plans."""
    c = onnx.numpy_helper.from_array(np.arange(1, 5, dtype=np.float32), "cv")
    nodes = [h.make_node("Constant", [], ["c"], value=c), h.make_node("Sub", ["x", "c"], ["d"]),
             h.make_node("Add", ["d", "d"], ["y"])]
    return make_model(nodes, [h.make_tensor_value_info("x", T.FLOAT, ["N", 4])],
                      [h.make_tensor_value_info("y", T.FLOAT, ["N", 4])])


@pytest.mark.parametrize("bind", ["0", "1"])
def test_replays_keep_plan_memory_alive(bind):
    """A recorded graph reads its specialised plan's constants at their capture-time addresses: the recording
    keeps the plan alive, so allocations between replays never take (and overwrite) those bytes."""
    so = ort.SessionOptions()
    so.add_session_config_entry("crossml.graph_capture_bind_io", bind)
    s = ort.InferenceSession(_constant_node_model(), so, providers=GPU)
    x = torch.arange(8, dtype=torch.float32, device="cuda").reshape(2, 4)
    want = (x - torch.arange(1, 5, dtype=torch.float32, device="cuda")) * 2
    for step in range(4):
        y = s.run_with_ort_values(["y"], {"x": ort.OrtValue.ortvalue_from_torch(x)})[0].as_torch()
        torch.testing.assert_close(y, want, msg=f"replay {step}")
        junk = [torch.full((256,), 1e6, device="cuda") for _ in range(64)]  # reuse freed blocks, if any
        del junk
    assert len(s._runners) == 1
