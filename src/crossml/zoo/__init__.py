"""Reference models crossml builds itself (plain torch, seeded random weights), exported to ONNX.

Used by the ``crossml demo`` command, the real-model tests and the benchmarks, so that none of
them needs a download. ``export(name)`` writes ``<cache>/<name>.onnx`` once and returns its path.
"""

from __future__ import annotations

from crossml.zoo.export import MODELS, example_inputs, export

__all__ = ["MODELS", "export", "example_inputs"]
