"""The nine "light" models shipped in onnx/backend/test/data/light match their expected outputs.

Inputs are made as onnx's backend runner makes them (``arange(n) / n``, float32); expected
outputs are the ``light_<name>_output_0.pb`` files shipped beside the models (provenance: the
onnx project, produced by its ReferenceEvaluator).

On the GPU, squeezenet is checked before its final Softmax: its weights are constants, so its
1000 logits are all equal and about 9.5e9, and the expected output (every class 0.001) holds
only if all 1000 are bit-identical. One rounding step's difference between channels (any
convolution algorithm may give one; cuDNN picks its algorithm by timing, so under load the
choice changes) is ~1e3 after the scaling and makes the softmax one-hot. The logits themselves
are compared with onnxruntime's on the CPU instead, at the model's tolerance, in strict fp32
(``use_tf32=0``): with TF32 products the 26 convolutions of positive constant weights drift by
1.6e-3 relative (measured on an H200; every input is rounded the same way), past that tolerance.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import crossml as ort

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
MODELS = {  # name -> rtol, as onnx's own model test list gives them (atol 1e-7)
    "bvlc_alexnet": 1e-3, "densenet121": 2e-3, "inception_v1": 1e-3, "inception_v2": 1e-3,
    "resnet50": 1e-3, "shufflenet": 1e-3, "squeezenet": 1e-3, "vgg19": 1e-3, "zfnet512": 1e-3,
}


def dummy_input(vi: onnx.ValueInfoProto) -> np.ndarray:
    shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in vi.type.tensor_type.shape.dim)
    n = int(np.prod(shape))
    return (np.arange(n).reshape(shape) / n).astype(np.float32)


#: GPU runs of these models are compared at this tensor (see the module docstring)
GPU_COMPARE_AT = {"squeezenet": "r65"}


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    inits = {t.name for t in model.graph.initializer}
    return {vi.name: dummy_input(vi) for vi in model.graph.input if vi.name not in inits}


def run_light(name: str, providers: list[str]) -> None:
    path = os.path.join(LIGHT, f"light_{name}.onnx")
    model = onnx.load(path)
    feeds = _feeds(model)
    expected = numpy_helper.to_array(onnx.load_tensor(os.path.join(LIGHT, f"light_{name}_output_0.pb")))
    got = ort.InferenceSession(path, providers=providers).run(None, feeds)[0]
    assert got.shape == expected.shape and got.dtype == expected.dtype
    np.testing.assert_allclose(got, expected, rtol=MODELS[name], atol=1e-7)


def run_light_at(name: str, tensor: str, providers: list) -> tuple[np.ndarray, np.ndarray]:
    """Compare the model's intermediate ``tensor`` with onnxruntime's on the CPU, and check the final output is
    still a distribution of the expected shape; returns (that tensor, the final output)."""
    ref_ort = pytest.importorskip("onnxruntime", reason="onnxruntime (test extra) is the reference here")
    model = onnx.load(os.path.join(LIGHT, f"light_{name}.onnx"))
    model.graph.output.append(onnx.helper.make_tensor_value_info(tensor, onnx.TensorProto.FLOAT, None))
    blob = model.SerializeToString()
    feeds = _feeds(model)
    expected = ref_ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run([tensor], feeds)[0]
    final, got = ort.InferenceSession(blob, providers=providers).run(None, feeds)
    np.testing.assert_allclose(got, expected, rtol=MODELS[name], atol=1e-7)
    shipped = numpy_helper.to_array(onnx.load_tensor(os.path.join(LIGHT, f"light_{name}_output_0.pb")))
    assert final.shape == shipped.shape and final.dtype == shipped.dtype
    np.testing.assert_allclose(final.sum(axis=1), 1.0, rtol=1e-5)
    return got, final


@pytest.mark.parametrize("name", sorted(GPU_COMPARE_AT))
def test_light_model_at_cpu(name: str) -> None:
    """The intermediate comparison the GPU test uses, on the CPU provider (so CI runs it too)."""
    run_light_at(name, GPU_COMPARE_AT[name], ["CPUExecutionProvider"])


def _softmax_input(name: str) -> str | None:
    """The input of the model's last Softmax (its logits), None without one."""
    model = onnx.load(os.path.join(LIGHT, f"light_{name}.onnx"))
    return next((n.input[0] for n in reversed(model.graph.node) if n.op_type == "Softmax"), None)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_light_model_cpu(name: str) -> None:
    """The shipped outputs (every class 0.001) hold only where a model's 1000 logits, equal in exact arithmetic
    (constant weights), come out bit-identical. torch's CPU products on a wide host (16 threads on an H200 machine)
    sum the final product's column blocks in different orders, one rounding apart at logits of 1e12-1e31, and the
    softmax is then 1/24 on 24 classes: so the logits are compared with onnxruntime's at the model's tolerance, and the
    output with the shipped one where the logits of each row are all equal (as on a 2-core host), else checked as a
    distribution."""
    tensor = _softmax_input(name)
    if tensor is None:
        run_light(name, ["CPUExecutionProvider"])
        return
    logits, final = run_light_at(name, tensor, ["CPUExecutionProvider"])
    flat = logits.reshape(logits.shape[0], -1)
    if (flat == flat[:, :1]).all():
        shipped = numpy_helper.to_array(onnx.load_tensor(os.path.join(LIGHT, f"light_{name}_output_0.pb")))
        np.testing.assert_allclose(final, shipped, rtol=MODELS[name], atol=1e-7)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(MODELS))
def test_light_model_gpu(name: str) -> None:
    from crossml.runtime.providers import gpu_available

    if not gpu_available():
        pytest.skip("no GPU: torch sees no accelerator on this machine")
    providers = ["GPUExecutionProvider", "CPUExecutionProvider"]
    if name in GPU_COMPARE_AT:
        run_light_at(name, GPU_COMPARE_AT[name], [("GPUExecutionProvider", {"use_tf32": "0"}), "CPUExecutionProvider"])
    else:
        run_light(name, providers)
