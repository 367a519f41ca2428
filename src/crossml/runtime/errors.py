"""onnxruntime's exception classes, with the same names and the same built-in bases.

onnxruntime raises these from ``onnxruntime.capi.onnxruntime_pybind11_state``; scripts catch
them by that path, so crossml re-exports them from ``crossml.capi.onnxruntime_pybind11_state``.
Messages start with onnxruntime's status prefix, e.g. ``[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : ...``.
"""

from __future__ import annotations


class OrtError(Exception):
    """Base of every crossml runtime error."""

    code = 1
    status = "FAIL"

    def __init__(self, message: str) -> None:
        super().__init__(f"[ONNXRuntimeError] : {self.code} : {self.status} : {message}")
        self.message = message


class Fail(OrtError, RuntimeError):
    code, status = 1, "FAIL"


class InvalidArgument(OrtError, ValueError):
    code, status = 2, "INVALID_ARGUMENT"


class NoSuchFile(OrtError, FileNotFoundError):
    code, status = 3, "NO_SUCHFILE"


class NoModel(OrtError, RuntimeError):
    code, status = 4, "NO_MODEL"


class EngineError(OrtError, RuntimeError):
    code, status = 5, "ENGINE_ERROR"


class RuntimeException(OrtError, RuntimeError):
    code, status = 6, "RUNTIME_EXCEPTION"


class InvalidProtobuf(OrtError, RuntimeError):
    code, status = 7, "INVALID_PROTOBUF"


class ModelLoaded(OrtError, RuntimeError):
    code, status = 8, "MODEL_LOADED"


class NotImplemented(OrtError, RuntimeError):  # noqa: A001 - onnxruntime's name
    code, status = 9, "NOT_IMPLEMENTED"


class InvalidGraph(OrtError, RuntimeError):
    code, status = 10, "INVALID_GRAPH"


class EPFail(OrtError, RuntimeError):
    code, status = 11, "EP_FAIL"


__all__ = [
    "OrtError",
    "Fail",
    "InvalidArgument",
    "NoSuchFile",
    "NoModel",
    "EngineError",
    "RuntimeException",
    "InvalidProtobuf",
    "ModelLoaded",
    "NotImplemented",
    "InvalidGraph",
    "EPFail",
]
