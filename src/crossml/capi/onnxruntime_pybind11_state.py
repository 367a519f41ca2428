"""Exception classes under onnxruntime's import path (``onnxruntime.capi.onnxruntime_pybind11_state``)."""

from crossml.runtime.errors import (  # noqa: F401
    EngineError,
    EPFail,
    Fail,
    InvalidArgument,
    InvalidGraph,
    InvalidProtobuf,
    ModelLoaded,
    NoModel,
    NoSuchFile,
    NotImplemented,
    RuntimeException,
)
