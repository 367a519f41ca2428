"""crossml: a cross-vendor GPU runtime for ONNX models, with onnxruntime's Python API.

    import crossml as ort
    sess = ort.InferenceSession("model.onnx", providers=["GPUExecutionProvider", "CPUExecutionProvider"])
    outputs = sess.run(None, {"input": x})
"""

from __future__ import annotations

import logging as _logging

from crossml.runtime.adapters import AdapterFormat, LoraAdapter
from crossml.runtime.errors import (
    EngineError,
    EPFail,
    Fail,
    InvalidArgument,
    InvalidGraph,
    InvalidProtobuf,
    NoModel,
    NoSuchFile,
    NotImplemented,
    OrtError,
    RuntimeException,
)
from crossml.runtime.iobinding import IOBinding
from crossml.runtime.options import (
    ExecutionMode,
    ExecutionOrder,
    GraphOptimizationLevel,
    OrtAllocatorType,
    OrtMemType,
    RunOptions,
    SessionOptions,
)
from crossml.runtime.ortvalue import OrtValue
from crossml.runtime.providers import get_all_providers, get_available_providers, get_device
from crossml.runtime.session import InferenceSession, ModelMetadata, NodeArg
from crossml.version import __version__

_SEVERITY = {0: _logging.DEBUG, 1: _logging.INFO, 2: _logging.WARNING, 3: _logging.ERROR, 4: _logging.CRITICAL}


def set_default_logger_severity(severity: int) -> None:
    """onnxruntime's logger severity: 0 verbose, 1 info, 2 warning, 3 error, 4 fatal."""
    if severity not in _SEVERITY:
        raise InvalidArgument(f"severity must be 0..4, got {severity}")
    _logging.getLogger("crossml").setLevel(_SEVERITY[severity])


def set_default_logger_verbosity(verbosity: int) -> None:
    pass


def get_version_string() -> str:
    """crossml's version (onnxruntime's returns its own)."""
    return __version__


def get_build_info() -> str:
    """What this crossml runs on: its version, torch's and the GPU backend torch was built for."""
    import torch

    backend = f"cuda {torch.version.cuda}" if torch.version.cuda else (
        f"rocm {torch.version.hip}" if getattr(torch.version, "hip", None) else "cpu")
    return f"crossml {__version__}, torch {torch.__version__} ({backend})"


def set_seed(seed: int) -> None:
    """Seed the random ops (RandomNormal, Bernoulli, ...)."""
    import torch

    torch.manual_seed(int(seed))


__all__ = [
    "EngineError", "EPFail", "Fail", "InvalidArgument", "InvalidGraph", "InvalidProtobuf", "NoModel",
    "NoSuchFile", "NotImplemented", "OrtError", "RuntimeException", "IOBinding", "ExecutionMode",
    "ExecutionOrder", "GraphOptimizationLevel", "OrtAllocatorType", "OrtMemType", "RunOptions",
    "SessionOptions", "OrtValue", "get_all_providers", "get_available_providers", "get_device",
    "InferenceSession", "ModelMetadata", "NodeArg", "__version__", "set_default_logger_severity",
    "set_default_logger_verbosity", "set_seed", "AdapterFormat", "LoraAdapter", "get_build_info",
    "get_version_string",
]
