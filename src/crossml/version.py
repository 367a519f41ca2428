"""crossml's version, and the onnxruntime API version it follows."""

__version__ = "0.1.0"
ORT_API_VERSION = "1.31.1"
