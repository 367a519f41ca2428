"""Building a graph of operators in Python (DirectML's graph API / DirectMLX), compiling it, and
exporting it as an ONNX model.

    g = device.graph()
    x = g.input("x", TensorDesc("float32", [1, 3, 32, 32]))
    w = g.constant("w", weights)
    y = g.op("Relu", g.op("Conv", x, w, pads=[1, 1, 1, 1]))
    g.output(y, "y")
    compiled = g.compile()                  # crossml's planner: folding, layouts, capture
    out = compiled.execute(queue, {"x": t}) # {"y": DeviceTensor}
    model = g.to_onnx()                     # runs in InferenceSession with identical results

The compiled graph is an InferenceSession on the device underneath, so a graph and its exported
model run the very same plan.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper

from crossml import dtypes
from crossml.device.queue import Queue
from crossml.device.tensor import DeviceTensor, TensorDesc, wrap
from crossml.runtime.errors import InvalidArgument

DEFAULT_OPSET = onnx.defs.onnx_opset_version()


@dataclass(frozen=True)
class Value:
    """A symbolic value in a graph being built."""

    name: str
    graph: GraphBuilder


class GraphBuilder:
    def __init__(self, device: torch.device, opset: int = DEFAULT_OPSET, name: str = "crossml_graph") -> None:
        self.device = device
        self.opset = opset
        self.name = name
        self._inputs: list[onnx.ValueInfoProto] = []
        self._outputs: list[onnx.ValueInfoProto] = []
        self._nodes: list[onnx.NodeProto] = []
        self._inits: list[onnx.TensorProto] = []
        self._domains: dict[str, int] = {}
        self._ids = itertools.count()
        self._names: set[str] = set()

    def _fresh(self, base: str) -> str:
        name = base
        while name in self._names:
            name = f"{base}_{next(self._ids)}"
        self._names.add(name)
        return name

    def input(self, name: str, desc: TensorDesc) -> Value:
        name = self._claim(name)
        self._inputs.append(helper.make_tensor_value_info(name, desc.onnx_type, list(desc.sizes)))
        return Value(name, self)

    def constant(self, name: str, value: Any) -> Value:
        name = self._claim(name)
        arr = value.detach().cpu() if isinstance(value, torch.Tensor) else np.asarray(value)
        arr = dtypes.to_numpy(arr) if isinstance(arr, torch.Tensor) else arr
        self._inits.append(numpy_helper.from_array(arr, name))
        return Value(name, self)

    def op(self, op_type: str, *inputs: Value | None, domain: str = "", outputs: int = 1, **attributes: Any) -> Any:
        """Add a node; returns its output Value (a tuple when ``outputs`` > 1)."""
        for v in inputs:
            if v is not None and v.graph is not self:
                raise InvalidArgument(f"{op_type}: an input comes from another graph")
        outs = [self._fresh(f"{op_type.lower()}_{next(self._ids)}") for _ in range(outputs)]
        node = helper.make_node(op_type, ["" if v is None else v.name for v in inputs], outs,
                                name=self._fresh(f"{op_type}_{len(self._nodes)}"), domain=domain, **attributes)
        if domain:
            self._domains.setdefault(domain, 1)
        self._nodes.append(node)
        vals = tuple(Value(o, self) for o in outs)
        return vals[0] if outputs == 1 else vals

    def output(self, value: Value, name: str | None = None) -> None:
        if name and name != value.name:
            name = self._claim(name)
            self._nodes.append(helper.make_node("Identity", [value.name], [name]))
            value = Value(name, self)
        self._outputs.append(onnx.ValueInfoProto(name=value.name))

    def _claim(self, name: str) -> str:
        if name in self._names:
            raise InvalidArgument(f"graph value name '{name}' is already used")
        self._names.add(name)
        return name

    def to_onnx(self) -> onnx.ModelProto:
        """The graph as an ONNX model (output types inferred)."""
        if not self._outputs:
            raise InvalidArgument("the graph has no outputs: call output() first")
        g = helper.make_graph(self._nodes, self.name, self._inputs, self._outputs, self._inits)
        opsets = [helper.make_opsetid("", self.opset)] + [helper.make_opsetid(d, v) for d, v in self._domains.items()]
        m = helper.make_model(g, opset_imports=opsets, producer_name="crossml.device")
        m.ir_version = min(m.ir_version, onnx.IR_VERSION)
        inferred = onnx.shape_inference.infer_shapes(m)
        known = {vi.name: vi for vi in list(inferred.graph.value_info) + list(inferred.graph.output)}
        for out in m.graph.output:
            if out.name in known and known[out.name].type.HasField("tensor_type"):
                out.type.CopyFrom(known[out.name].type)
        return m

    def compile(self, **provider_options: str) -> CompiledGraph:
        return CompiledGraph(self.to_onnx(), self.device, provider_options)


class CompiledGraph:
    """A compiled graph on a device: ``execute(queue, inputs) -> {output name: DeviceTensor}``."""

    def __init__(self, model: onnx.ModelProto, device: torch.device, provider_options: Mapping[str, str]) -> None:
        from crossml.runtime.session import InferenceSession

        self.model = model
        if device.type == "cpu":
            providers: list[Any] = ["CPUExecutionProvider"]
        else:
            opts = {"device_id": str(device.index or 0), **provider_options}
            providers = [("GPUExecutionProvider", opts), "CPUExecutionProvider"]
        self.session = InferenceSession(model, providers=providers)
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]

    def execute(self, queue: Queue, inputs: Mapping[str, Any]) -> dict[str, DeviceTensor]:
        """Run on ``queue`` (the queue's stream is current while the graph runs: no host sync)."""
        missing = [n for n in self.input_names if n not in inputs]
        if missing:
            raise InvalidArgument(f"graph inputs {missing} are not bound")
        feeds = {k: wrap(v).torch for k, v in inputs.items()}
        with queue.active():
            outs = self.session._run(feeds, None)
        return {n: DeviceTensor(o) for n, o in zip(self.output_names, outs)}
