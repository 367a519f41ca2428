"""Convolutions on a real GPU: channels-last end to end, fused ReLU / ReLU6 blocks,
pointwise convolutions as one GEMM, depthwise ones as one Triton launch, and half-precision
LayerNormalization without casts.

Every test here is marked ``gpu`` and skips where torch sees no accelerator.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto as T
from onnx import helper as h

import crossml as ort
import crossml.ops.fused as fused_ops
from crossml.ops.conv import pointwise_gemm
from tests.conftest import make_model

pytestmark = pytest.mark.gpu


def cuda_kernels(fn) -> tuple[object, list[str]]:
    """``fn()``'s result and the names of the CUDA kernels it ran (lower case)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        out = fn()
        torch.cuda.synchronize()
    return out, [e.name.lower() for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def mobile_block(elem: int) -> onnx.ModelProto:
    """ResNet- and MobileNet-style blocks: 3x3 conv + Relu, pointwise conv + ReLU6, depthwise conv + ReLU6,
    pointwise projection + residual Add, a 3x3 conv + Add + Relu tail, then a global pool."""
    rng = np.random.default_rng(0)
    dt = onnx.helper.tensor_dtype_to_np_dtype(elem)

    def init(name, *shape):
        return onnx.numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(dt), name)

    inits = [init("w1", 16, 3, 3, 3), init("b1", 16), init("w2", 32, 16, 1, 1), init("b2", 32),
             init("w3", 32, 1, 3, 3), init("b3", 32), init("w4", 16, 32, 1, 1), init("b4", 16),
             init("w5", 16, 16, 3, 3), init("b5", 16),
             onnx.numpy_helper.from_array(np.array(0, dt), "lo"), onnx.numpy_helper.from_array(np.array(6, dt), "hi")]
    nodes = [h.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c1"], ["r1"]),
             h.make_node("Conv", ["r1", "w2", "b2"], ["c2"]), h.make_node("Clip", ["c2", "lo", "hi"], ["r2"]),
             h.make_node("Conv", ["r2", "w3", "b3"], ["c3"], pads=[1, 1, 1, 1], group=32),
             h.make_node("Clip", ["c3", "lo", "hi"], ["r3"]),
             h.make_node("Conv", ["r3", "w4", "b4"], ["c4"]), h.make_node("Add", ["c4", "r1"], ["s4"]),
             h.make_node("Conv", ["s4", "w5", "b5"], ["c5"], pads=[1, 1, 1, 1]),
             h.make_node("Add", ["c5", "s4"], ["s5"]),
             h.make_node("Relu", ["s5"], ["r5"]), h.make_node("GlobalAveragePool", ["r5"], ["y"])]
    return make_model(nodes, [h.make_tensor_value_info("x", elem, [2, 3, 20, 20])],
                      [h.make_tensor_value_info("y", elem, [2, 16, 1, 1])], inits)


@pytest.mark.parametrize("elem", [T.FLOAT, T.FLOAT16])
def test_conv_blocks_fuse_and_run_channels_last(elem, monkeypatch):
    m = mobile_block(elem)
    x = 3 * np.random.default_rng(1).standard_normal((2, 3, 20, 20))
    x = x.astype(onnx.helper.tensor_dtype_to_np_dtype(elem))
    want = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    opts = {"use_tf32": "0", "enable_graph_capture": "false"}
    s = ort.InferenceSession(m, providers=[("GPUExecutionProvider", opts)])
    ops = [st.op_type for st in s._plan.steps]
    assert ops.count("FusedConv") == 4 and ops.count("Conv") == 1, ops
    layouts = []
    real = fused_ops.fused_conv_add_relu

    def spy(x, w, *args):
        layouts.append(tuple(t.is_contiguous(memory_format=torch.channels_last) for t in (x, w)))
        return real(x, w, *args)

    monkeypatch.setattr(fused_ops, "fused_conv_add_relu", spy)
    got, names = cuda_kernels(lambda: s.run(None, {"x": x})[0])
    # cuDNN gets the 3x3 convolutions: channels-last weights, and channels-last activations after the first
    # (the model's NCHW input), so nothing is transposed between layers
    assert layouts == [(False, True), (True, True)], layouts
    assert any("_depthwise_kernel" in n for n in names), names  # depthwise + bias + ReLU6: one Triton launch
    tol = 2e-2 if elem == T.FLOAT16 else 1e-4
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("bias,relu", [(True, False), (True, True), (False, False), (False, True)])
def test_pointwise_gemm_matches_conv2d(dtype, bias, relu):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 24, 7, 9, generator=g).to("cuda", dtype).contiguous(memory_format=torch.channels_last)
    w = (torch.randn(40, 24, 1, 1, generator=g) / 5).to("cuda", dtype).contiguous(memory_format=torch.channels_last)
    b = torch.randn(40, generator=g).to("cuda", dtype) if bias else None
    prev = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        got = pointwise_gemm(x, w, b, relu=relu)
        want = F.conv2d(x.float(), w.float(), None if b is None else b.float())
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = prev
    want = torch.relu(want) if relu else want
    assert got.shape == want.shape and got.dtype == dtype
    assert got.is_contiguous(memory_format=torch.channels_last)
    tol = 1e-2 if dtype == torch.float16 else 1e-5
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)
    assert pointwise_gemm(x.contiguous(), w, b) is None  # NCHW activations keep cuDNN


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_layer_norm_runs_without_casts(dtype):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 16, 768)).astype(np.float32)
    scale = onnx.numpy_helper.from_array(rng.standard_normal(768).astype(np.float32), "s")
    bias = onnx.numpy_helper.from_array(rng.standard_normal(768).astype(np.float32), "b")
    elem = T.FLOAT16 if dtype == torch.float16 else T.BFLOAT16
    nodes = [h.make_node("Cast", ["x"], ["xh"], to=elem), h.make_node("Cast", ["s"], ["sh"], to=elem),
             h.make_node("Cast", ["b"], ["bh"], to=elem),
             h.make_node("LayerNormalization", ["xh", "sh", "bh"], ["yh"], epsilon=1e-5),
             h.make_node("Cast", ["yh"], ["y"], to=T.FLOAT)]
    m = make_model(nodes, [h.make_tensor_value_info("x", T.FLOAT, [4, 16, 768])],
                   [h.make_tensor_value_info("y", T.FLOAT, [4, 16, 768])], [scale, bias])
    s = ort.InferenceSession(m, providers=[("GPUExecutionProvider", {"enable_graph_capture": "false"})])
    got, names = cuda_kernels(lambda: s.run(None, {"x": x})[0])
    norms = [n for n in names if "layer_norm" in n]
    assert len(norms) == 1 and "float, float" not in norms[0], norms  # the half kernel, not the float one
    ref = F.layer_norm(torch.from_numpy(x).to(dtype).float(), (768,),
                       torch.from_numpy(onnx.numpy_helper.to_array(scale)).to(dtype).float(),
                       torch.from_numpy(onnx.numpy_helper.to_array(bias)).to(dtype).float(), 1e-5).to(dtype).float()
    ulp = 8e-3 if dtype == torch.float16 else 6e-2
    np.testing.assert_allclose(got, ref.numpy(), rtol=ulp, atol=ulp)
