"""crossml.genai: onnxruntime-genai's Python API on crossml.

    import crossml.genai as og

    model = og.Model("phi3-mini-int4-cpu")          # a folder made by the ONNX Runtime GenAI model builder
    tokenizer = og.Tokenizer(model)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=256)
    generator = og.Generator(model, params)
    generator.append_tokens(tokenizer.encode("Hello"))
    stream = tokenizer.create_stream()
    while not generator.is_done():
        generator.generate_next_token()
        print(stream.decode(generator.get_next_tokens()[0]), end="")
"""

from __future__ import annotations

from crossml.genai.adapters import Adapters, NamedTensors
from crossml.genai.config import Config
from crossml.genai.engine import (
    Engine,
    EngineCapabilities,
    EngineErrorCode,
    EngineEvent,
    EngineEventBuffer,
    EngineEventFlags,
    FinishReason,
    Request,
    RequestOptions,
    TurnOptions,
    TurnUsage,
)
from crossml.genai.errors import (
    ConfigError,
    GenAIError,
    GeneratorStateError,
    ModelFileNotFound,
    NameNotFoundError,
    SearchOptionError,
    UnsupportedModelError,
)
from crossml.genai.generator import Generator, GeneratorParams
from crossml.genai.logs import set_log_callback, set_log_options
from crossml.genai.model import Model
from crossml.genai.mtp import MtpGenerator
from crossml.genai.tokenizer import Tensor, Tokenizer, TokenizerStream

__version__ = "0.18.0"


def is_cuda_available() -> bool:
    """True when crossml's GPU provider has an adapter (it serves onnxruntime-genai's "cuda")."""
    from crossml.runtime.providers import gpu_available

    return gpu_available()


def is_dml_available() -> bool:
    """True when crossml's GPU provider has an adapter (it serves onnxruntime-genai's "dml")."""
    from crossml.runtime.providers import gpu_available

    return gpu_available()


def is_rocm_available() -> bool:
    from crossml.device.adapters import backend_vendor

    return is_cuda_available() and backend_vendor() == "amd"


def is_openvino_available() -> bool:
    """False: crossml runs no OpenVINO execution provider (its GPU provider serves "gpu", "cuda" and "dml")."""
    return False


def is_qnn_available() -> bool:
    """False: crossml runs no QNN execution provider."""
    return False


def is_webgpu_available() -> bool:
    """False: crossml runs no WebGPU execution provider."""
    return False


def register_execution_provider_library(registration_name: str, library_path: str) -> None:
    """onnxruntime-genai loads a native onnxruntime plug-in execution provider here; crossml cannot load those."""
    raise GenAIError(f"register_execution_provider_library('{registration_name}', '{library_path}'): onnxruntime "
                     "plug-in execution-provider libraries are native onnxruntime code that crossml cannot load; "
                     "crossml's own GPU provider serves Config.append_provider('gpu' | 'cuda' | 'dml')")


def unregister_execution_provider_library(registration_name: str) -> None:
    raise GenAIError(f"unregister_execution_provider_library('{registration_name}'): no execution-provider library "
                     "is registered (crossml cannot load onnxruntime plug-in libraries)")


def enable_telemetry_events() -> None:
    """A no-op: crossml records and sends no telemetry."""


def disable_telemetry_events() -> None:
    """A no-op: crossml records and sends no telemetry."""


def set_current_gpu_device_id(device_id: int) -> None:
    from crossml.device.adapter import set_current_device

    set_current_device(device_id)


def get_current_gpu_device_id() -> int:
    from crossml.device.adapter import current_device_index

    return current_device_index()


__all__ = [
    "Adapters", "NamedTensors", "disable_telemetry_events", "enable_telemetry_events", "is_openvino_available",
    "is_qnn_available", "is_webgpu_available", "register_execution_provider_library",
    "unregister_execution_provider_library",
    "Config", "ConfigError", "GenAIError", "Generator", "GeneratorParams", "GeneratorStateError", "Model",
    "MtpGenerator",
    "ModelFileNotFound", "NameNotFoundError", "SearchOptionError", "Tensor", "Tokenizer", "TokenizerStream",
    "UnsupportedModelError",
    "Engine", "EngineCapabilities", "EngineErrorCode", "EngineEvent", "EngineEventBuffer", "EngineEventFlags",
    "FinishReason", "Request", "RequestOptions", "TurnOptions", "TurnUsage",
    "get_current_gpu_device_id", "is_cuda_available", "is_dml_available", "is_rocm_available",
    "set_current_gpu_device_id", "set_log_callback", "set_log_options",
]
