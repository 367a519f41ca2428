"""The nine "light" models shipped in onnx/backend/test/data/light match their expected outputs.

Inputs are made as onnx's backend runner makes them (``arange(n) / n``, float32); expected
outputs are the ``light_<name>_output_0.pb`` files shipped beside the models (provenance: the
onnx project, produced by its ReferenceEvaluator).
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


def run_light(name: str, providers: list[str]) -> None:
    path = os.path.join(LIGHT, f"light_{name}.onnx")
    model = onnx.load(path)
    inits = {t.name for t in model.graph.initializer}
    feeds = {vi.name: dummy_input(vi) for vi in model.graph.input if vi.name not in inits}
    expected = numpy_helper.to_array(onnx.load_tensor(os.path.join(LIGHT, f"light_{name}_output_0.pb")))
    got = ort.InferenceSession(path, providers=providers).run(None, feeds)[0]
    assert got.shape == expected.shape and got.dtype == expected.dtype
    np.testing.assert_allclose(got, expected, rtol=MODELS[name], atol=1e-7)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_light_model_cpu(name: str) -> None:
    run_light(name, ["CPUExecutionProvider"])


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(MODELS))
def test_light_model_gpu(name: str) -> None:
    from crossml.runtime.providers import gpu_available

    if not gpu_available():
        pytest.skip("no GPU: torch sees no accelerator on this machine")
    run_light(name, ["GPUExecutionProvider", "CPUExecutionProvider"])
