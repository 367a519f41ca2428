"""Shared fixtures: small models built with onnx.helper."""

from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h


def make_model(nodes, inputs, outputs, initializers=(), opset=17, **kw) -> onnx.ModelProto:
    g = h.make_graph(nodes, kw.pop("graph_name", "g"), inputs, outputs, initializer=list(initializers))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=8, **kw)
    return m


@pytest.fixture
def affine_model() -> onnx.ModelProto:
    """y = relu(x @ W + b); z = y * 2. x: float[batch, 4]."""
    w = np.arange(12, dtype=np.float32).reshape(4, 3) / 10 - 0.5
    b = np.array([0.1, -0.2, 0.3], dtype=np.float32)
    two = np.array(2.0, dtype=np.float32)
    nodes = [
        h.make_node("MatMul", ["x", "W"], ["xw"], name="matmul"),
        h.make_node("Add", ["xw", "b"], ["pre"], name="add"),
        h.make_node("Relu", ["pre"], ["y"], name="relu"),
        h.make_node("Mul", ["y", "two"], ["z"], name="mul"),
    ]
    m = make_model(
        nodes,
        [h.make_tensor_value_info("x", T.FLOAT, ["batch", 4])],
        [h.make_tensor_value_info("y", T.FLOAT, ["batch", 3]), h.make_tensor_value_info("z", T.FLOAT, ["batch", 3])],
        [onnx.numpy_helper.from_array(w, "W"), onnx.numpy_helper.from_array(b, "b"),
         onnx.numpy_helper.from_array(two, "two")],
        producer_name="crossml-tests", doc_string="affine test model", model_version=3,
    )
    h.set_model_props(m, {"author": "tests", "purpose": "api"})
    return m


def affine_reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    w = np.arange(12, dtype=np.float32).reshape(4, 3) / 10 - 0.5
    b = np.array([0.1, -0.2, 0.3], dtype=np.float32)
    y = np.maximum(x @ w + b, 0)
    return y, y * 2


def run_in_threads(work, count: int = 8) -> None:
    """``work(i)`` for i in 0..count-1, each on its own thread, all started before any is joined."""
    threads = [threading.Thread(target=work, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def pytest_collection_modifyitems(config, items):
    """Skip tests marked ``gpu`` where torch sees no accelerator, saying so."""
    from crossml.runtime.providers import gpu_available

    if gpu_available():
        return
    skip = pytest.mark.skip(reason="no GPU: torch sees no accelerator on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _unmarked_tests_default_to_the_cpu(request, monkeypatch):
    """Tests not marked ``gpu`` are the CPU suite (CI runs them on a CPU host): on a GPU machine, a session they make
    without providers still takes the CPU provider, so their tolerances (written for float32 CPU arithmetic, not the
    GPU provider's TF32 products) and their references hold there too."""
    if request.node.get_closest_marker("gpu") is None:
        import crossml.runtime.providers as providers

        monkeypatch.setattr(providers, "default_providers", lambda: [providers.CPU_EP])


@pytest.fixture(autouse=True)
def _restore_torch_math_flags():
    """GPU sessions set process-wide torch math flags (TF32 per use_tf32, cuDNN benchmark) as
    onnxruntime's CUDA provider options say; restore them after each test so kernel tests that
    compare against torch references see torch's defaults whatever ran before."""
    import torch

    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = saved
