"""Run one com.microsoft node through onnxruntime (CPU, the oracle) and through crossml."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper as h
from onnx import numpy_helper

import crossml
from crossml.dtypes import onnx_type_of_numpy

MS = "com.microsoft"


def single_node_model(
    op_type: str,
    inputs: dict[str, np.ndarray | None],
    outputs: Sequence[tuple[str, int]],
    inits: dict[str, np.ndarray] | None = None,
    domain: str = MS,
    opset: int = 21,
    **attrs,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A model of one node. ``inputs`` in node order (None: omitted), ``inits`` become initializers."""
    inits = inits or {}
    names = []
    graph_inputs = []
    feeds = {}
    for name, arr in list(inputs.items()):
        if arr is None and name not in inits:
            names.append("")
            continue
        names.append(name)
        if name in inits:
            continue
        graph_inputs.append(h.make_tensor_value_info(name, onnx_type_of_numpy(arr.dtype), list(arr.shape)))
        feeds[name] = arr
    out_names = [n for n, _ in outputs]
    node = h.make_node(op_type, names, out_names, domain=domain, **attrs)
    graph_outputs = [h.make_tensor_value_info(n, t, None) for n, t in outputs if n]
    initializers = [numpy_helper.from_array(v, k) for k, v in inits.items()]
    g = h.make_graph([node], "g", graph_inputs, graph_outputs, initializer=initializers)
    opsets = [h.make_opsetid("", opset), h.make_opsetid(MS, 1)]
    return h.make_model(g, opset_imports=opsets, ir_version=10), feeds


def run_both(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    data = model.SerializeToString()
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = crossml.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    return ref, got


def check(op_type: str, inputs, outputs, inits=None, atol=1e-5, rtol=1e-5, domain=MS, **attrs) -> float:
    """Compare every output of the node; returns the largest absolute difference."""
    model, feeds = single_node_model(op_type, inputs, outputs, inits, domain=domain, **attrs)
    ref, got = run_both(model, feeds)
    worst = 0.0
    for name, r, g in zip([n for n, _ in outputs if n], ref, got):
        g = np.asarray(g)
        assert g.dtype == r.dtype, f"{name}: dtype {g.dtype} != {r.dtype}"
        assert g.shape == r.shape, f"{name}: shape {g.shape} != {r.shape}"
        np.testing.assert_allclose(g.astype(np.float64), r.astype(np.float64), atol=atol, rtol=rtol, err_msg=name)
        if r.size:
            worst = max(worst, float(np.max(np.abs(g.astype(np.float64) - r.astype(np.float64)))))
    return worst
