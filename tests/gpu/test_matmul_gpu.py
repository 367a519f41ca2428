"""Matrix products on a real GPU: float32 weights of MatMul, Linear (MatMul + Add) and Gemm are pre-packed
column-major (the layout cuBLAS multiplies fastest), half-precision ones stay row-major, and results match the
CPU; the device API's compiled MatMul packs its persistent weight the same way.

Every test here is marked ``gpu`` and skips where torch sees no accelerator.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

import crossml as ort
from tests.conftest import make_model

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: torch sees no accelerator")]


def products(elem: int):
    """x @ W1 + b1 (fused to Linear), then MatMul by W2, Gemm by W3 (transB=0) and by W4 (transB=1)."""
    rng = np.random.default_rng(0)
    dt = h.tensor_dtype_to_np_dtype(elem)
    inits = {n: (rng.standard_normal(s) / np.sqrt(s[0])).astype(dt)
             for n, s in (("w1", (64, 96)), ("b1", (96,)), ("w2", (96, 80)), ("w3", (80, 48)), ("w4", (32, 48)))}
    nodes = [h.make_node("MatMul", ["x", "w1"], ["m1"]), h.make_node("Add", ["m1", "b1"], ["a1"]),
             h.make_node("MatMul", ["a1", "w2"], ["m2"]), h.make_node("Gemm", ["m2", "w3"], ["g3"]),
             h.make_node("Gemm", ["g3", "w4"], ["y"], transB=1)]
    model = make_model(nodes, [h.make_tensor_value_info("x", elem, [128, 64])],
                       [h.make_tensor_value_info("y", elem, [128, 32])],
                       [numpy_helper.from_array(v, n) for n, v in inits.items()])
    return model, inits


@pytest.mark.parametrize("elem", [T.FLOAT, T.FLOAT16])
def test_fp32_weights_are_column_major_on_the_gpu(elem):
    model, inits = products(elem)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["GPUExecutionProvider"])
    consts = [t for _, t in sess._plan.constants if isinstance(t, torch.Tensor) and t.dim() == 2]
    packed = {n: [t for t in consts if tuple(t.shape) == inits[n].shape] for n in ("w1", "w2", "w3", "w4")}
    assert all(len(v) == 1 for v in packed.values()), {n: len(v) for n, v in packed.items()}
    for name in ("w1", "w2", "w3"):
        t = packed[name][0]
        assert t.is_cuda and torch.equal(t.cpu(), torch.from_numpy(inits[name]))
        want = (1, t.shape[0]) if elem == T.FLOAT else (t.shape[1], 1)
        assert t.stride() == want, (name, t.stride())
    assert packed["w4"][0].is_contiguous()  # Gemm with transB=1 already holds Wᵀ row-major

    x = np.random.default_rng(1).standard_normal((128, 64)).astype(h.tensor_dtype_to_np_dtype(elem))
    got = sess.run(None, {"x": x})[0]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    tol = 2e-2 if elem == T.FLOAT else 3e-2  # TF32 products (fp32), half rounding (fp16)
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=tol, atol=tol)


def test_strict_fp32_keeps_row_major_weights_and_adds_the_bias_apart(monkeypatch):
    import crossml.ops.fused as fused

    model, inits = products(T.FLOAT)
    try:
        sess = ort.InferenceSession(model.SerializeToString(), providers=[("GPUExecutionProvider", {"use_tf32": "0"})])
        w1 = [t for _, t in sess._plan.constants if isinstance(t, torch.Tensor) and tuple(t.shape) == (64, 96)]
        assert len(w1) == 1 and w1[0].is_contiguous()  # strict fp32: row-major is as fast or faster
        linear_calls = []
        real = torch.nn.functional.linear
        monkeypatch.setattr(fused.torch.nn.functional, "linear", lambda *a, **k: linear_calls.append(1) or real(*a, **k))
        x = np.random.default_rng(1).standard_normal((128, 64)).astype(np.float32)
        got = sess.run(None, {"x": x})[0]
        assert not linear_calls  # the Linear node ran as a product and a bias add
        cpu = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(got, cpu.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # the session default


def test_device_api_matmul_packs_its_weight_column_major(monkeypatch):
    from crossml.device import Operator, TensorDesc

    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)  # (a strict session may have cleared it)

    w = torch.randn(64, 48)
    op = Operator(torch.device("cuda"), "MatMul", [TensorDesc(torch.float32, (16, 64)),
                                                      TensorDesc(torch.float32, (64, 48))])
    compiled = op.compile(persistent=[1])
    compiled.initialize(w)
    packed = compiled._persistent_values[1]
    assert packed.stride() == (1, 64) and torch.equal(packed.cpu(), w)
