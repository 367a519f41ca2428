"""crossml.device: tensors, upload/readback, operators, command lists, graphs, interop.

Runs on the GPU when there is one (device tests below marked ``gpu`` insist on it), else on the CPU.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

import crossml
import crossml.device as xd
from crossml.runtime.errors import InvalidArgument

RNG = np.random.default_rng(0)


def conv_ref(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=1).numpy()


@pytest.fixture
def dev() -> xd.Device:
    return xd.Device()


def test_tensor_desc():
    d = xd.TensorDesc("float32", [2, 3])
    assert d.numel == 6 and d.nbytes == 24 and d.dtype == torch.float32 and str(d) == "float32[2, 3]"
    s = xd.TensorDesc(np.float16, [2, 3], strides=[1, 2])
    assert s.nbytes == 12
    with pytest.raises(InvalidArgument, match="2 strides for 3 sizes"):
        xd.TensorDesc("float32", [1, 2, 3], strides=[1, 2])
    with pytest.raises(InvalidArgument, match="unknown element type"):
        xd.TensorDesc("float33", [1])


def test_upload_readback_sync_and_async(dev):
    x = RNG.standard_normal((4, 5)).astype(np.float32)
    t = dev.tensor(xd.TensorDesc("float32", [4, 5]))
    fence = dev.queue.upload(t, x)
    fence.wait()
    assert fence.completed
    np.testing.assert_array_equal(dev.queue.readback(t), x)
    f2, host = dev.queue.readback(t, blocking=False)
    f2.wait()
    np.testing.assert_array_equal(host, x)
    with pytest.raises(InvalidArgument, match="destination is float32"):
        dev.queue.upload(t, x.astype(np.float64))


def test_host_visible_buffer_is_written_by_device_work(dev):
    """host_visible: the tensor kernels write (page-locked on a GPU) and a numpy view of the same bytes, valid on
    the host once a fence after the writing work completes."""
    buf, view = dev.queue.host_visible((3,), torch.int64)
    assert buf.device.type == "cpu" and buf.is_pinned() == (dev.queue.stream is not None)
    assert view.tolist() == [0, 0, 0]
    src = torch.tensor([4, 5, 6], device=dev.torch_device)
    with dev.queue.active():
        buf.copy_(src, non_blocking=True)
    dev.queue.signal().wait()
    assert view.tolist() == [4, 5, 6]  # the view shares the tensor's memory


def test_operator_compile_initialize_dispatch(dev):
    x = RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)
    w = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    op = dev.create_operator("Conv", [xd.TensorDesc("float32", x.shape), xd.TensorDesc("float32", w.shape)],
                             {"pads": [1, 1, 1, 1]})
    assert [str(d) for d in op.output_descs] == ["float32[1, 4, 8, 8]"]
    conv = op.compile(persistent=[1])
    with pytest.raises(InvalidArgument, match="initialize"):
        conv.dispatch(dev.queue, [dev.tensor(xd.TensorDesc("float32", x.shape))])
    conv.initialize(w)
    xt = dev.tensor(xd.TensorDesc("float32", x.shape))
    dev.queue.upload(xt, x)
    (y,) = conv.dispatch(dev.queue, [xt])
    np.testing.assert_allclose(dev.queue.readback(y), conv_ref(x, w), rtol=1e-3, atol=1e-3)
    out = dev.tensor(conv.output_descs[0])
    conv.dispatch(dev.queue, [xt], [out])
    np.testing.assert_allclose(dev.queue.readback(out), conv_ref(x, w), rtol=1e-3, atol=1e-3)


def test_binding_mismatch_is_a_clear_error(dev):
    relu = dev.create_operator("Relu", [xd.TensorDesc("float32", [2, 2])]).compile()
    with pytest.raises(InvalidArgument, match=r"bound tensor is float32\[3, 2\], the description says float32\[2, 2\]"):
        relu.dispatch(dev.queue, [dev.tensor(xd.TensorDesc("float32", [3, 2]))])
    with pytest.raises(InvalidArgument, match="expects 1 input"):
        relu.dispatch(dev.queue, [])
    with pytest.raises(InvalidArgument, match="unknown attribute"):
        dev.create_operator("Relu", [xd.TensorDesc("float32", [2])], {"alpha": 1.0})


def test_constant_inputs_fix_shapes(dev):
    op = dev.create_operator("Reshape", [xd.TensorDesc("float32", [2, 6])], constants={1: [3, 4]}).compile()
    assert [str(d) for d in op.output_descs] == ["float32[3, 4]"]
    x = dev.tensor(xd.TensorDesc("float32", [2, 6]), fill=1.5)
    (y,) = op.dispatch(dev.queue, [x])
    assert dev.queue.readback(y).shape == (3, 4)


def test_command_list_records_and_replays(dev):
    d = xd.TensorDesc("float32", [16])
    a, b, s, r = (dev.tensor(d) for _ in range(4))
    add = dev.create_operator("Add", [d, d]).compile()
    relu = dev.create_operator("Relu", [d]).compile()
    cl = dev.command_list()
    cl.dispatch(add, [a, b], [s])
    cl.dispatch(relu, [s], [r])
    with pytest.raises(InvalidArgument, match="close"):
        cl.execute(dev.queue)
    cl.close()
    for _ in range(3):  # new data in the bound inputs each time: the replay reads it
        x, y = RNG.standard_normal(16).astype(np.float32), RNG.standard_normal(16).astype(np.float32)
        dev.queue.upload(a, x)
        dev.queue.upload(b, y)
        cl.execute(dev.queue).wait()
        np.testing.assert_allclose(dev.queue.readback(r), np.maximum(x + y, 0), rtol=1e-6)
    with pytest.raises(InvalidArgument, match="closed"):
        cl.dispatch(relu, [s], [r])


def test_graph_build_compile_export(dev):
    w = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    g = dev.graph()
    x = g.input("x", xd.TensorDesc("float32", [2, 3, 8, 8]))
    y = g.op("Relu", g.op("Conv", x, g.constant("w", w), pads=[1, 1, 1, 1]))
    g.output(g.op("ReduceMean", y, g.constant("axes", np.array([2, 3], np.int64)), keepdims=0), "pooled")
    compiled = g.compile()
    xs = RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)
    xt = dev.tensor(xd.TensorDesc("float32", xs.shape))
    dev.queue.upload(xt, xs)
    out = compiled.execute(dev.queue, {"x": xt})["pooled"]
    want = np.maximum(conv_ref(xs, w), 0).mean(axis=(2, 3))
    got = dev.queue.readback(out)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
    model = g.to_onnx()
    onnx.checker.check_model(model)
    via_session = crossml.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": xs})[0]
    np.testing.assert_allclose(via_session, got, rtol=1e-3, atol=1e-4)


def test_wrap_user_memory_without_copy(dev):
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    w = xd.wrap(t)
    assert w.data_ptr() == t.data_ptr()
    a = np.arange(6, dtype=np.float32)
    wn = xd.wrap(a)  # numpy arrays have __dlpack__
    assert wn.data_ptr() == a.ctypes.data
    p = xd.wrap_pointer(a.ctypes.data, xd.TensorDesc("float32", [2, 3]), "cpu", owner=a)
    a[0] = 7
    assert p.torch[0, 0].item() == 7
    ov = w.to_ortvalue()
    assert ov.data_ptr() == t.data_ptr()
    with pytest.raises(InvalidArgument, match="cannot wrap a str"):
        xd.wrap("nope")


@pytest.mark.gpu
def test_gpu_command_list_is_one_graph_launch():
    dev = xd.Device(device_filter="gpu")
    d = xd.TensorDesc("float16", [1024])
    a, r = dev.tensor(d, fill=-1.0), dev.tensor(d)
    relu = dev.create_operator("Relu", [d]).compile()
    cl = dev.command_list()
    for _ in range(4):
        cl.dispatch(relu, [a], [r])
    cl.close()
    assert cl._graph is not None
    dev.queue.upload(a, np.linspace(-1, 1, 1024).astype(np.float16))
    cl.execute(dev.queue).wait()
    np.testing.assert_array_equal(dev.queue.readback(r), np.maximum(np.linspace(-1, 1, 1024).astype(np.float16), 0))


@pytest.mark.gpu
def test_wrap_cuda_array_interface_and_user_stream():
    dev = xd.Device(device_filter="gpu")
    src = torch.randn(8, device="cuda")

    class CAI:
        __cuda_array_interface__ = src.__cuda_array_interface__

    w = xd.wrap(CAI())
    assert w.data_ptr() == src.data_ptr()
    user = torch.cuda.Stream()
    user.wait_stream(torch.cuda.current_stream())  # src is written on the default stream: order it, as a user must
    q = xd.Queue.from_stream(user)
    relu = dev.create_operator("Relu", [w.desc]).compile()
    (y,) = relu.dispatch(q, [w])
    q.synchronize()
    torch.testing.assert_close(y.torch, src.relu())
    raw = xd.Queue.from_stream(user.cuda_stream)
    assert raw.stream.cuda_stream == user.cuda_stream
