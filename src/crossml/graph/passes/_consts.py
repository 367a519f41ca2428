"""Reading constant scalars (initializers or Constant nodes) during pattern matching."""

from __future__ import annotations

import numpy as np
import onnx

from crossml.graph import external
from crossml.graph.passes import GraphView


def constant(view: GraphView, name: str) -> onnx.TensorProto | None:
    """The tensor of ``name`` when it is an initializer or the ``value`` of a Constant node, else None."""
    t = view.initializers.get(name)
    if t is not None:
        return t
    node = view.producer.get(name)
    if node is None or node.op_type != "Constant":
        return None
    return next((a.t for a in node.attribute if a.name == "value"), None)


def scalar(view: GraphView, name: str) -> float | None:
    """The value of a one-element constant ``name``, else None."""
    t = constant(view, name)
    if t is None:
        node = view.producer.get(name)
        if node is None or node.op_type != "Constant":
            return None
        return next((float(a.f) for a in node.attribute if a.name == "value_float"), None)
    arr = external.array(t)
    return float(arr.reshape(-1)[0]) if arr.size == 1 else None


def near(value: float | None, target: float, tol: float = 1e-3) -> bool:
    return value is not None and bool(np.isclose(value, target, rtol=tol, atol=tol))


def other_input(node: onnx.NodeProto, name: str) -> str:
    return node.input[1] if node.input[0] == name else node.input[0]
