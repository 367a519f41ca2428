"""Device: an adapter opened for work, owning queues (DirectML's ID3D12Device + IDMLDevice)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from crossml.device.adapter import Adapter, adapters
from crossml.device.command_list import CommandList
from crossml.device.graph import DEFAULT_OPSET, GraphBuilder
from crossml.device.operator import Operator
from crossml.device.queue import Queue
from crossml.device.select import choose_adapter
from crossml.device.tensor import DeviceTensor, TensorDesc
from crossml.runtime.errors import InvalidArgument


class Device:
    """An adapter (or the CPU) ready to run operators, command lists and graphs.

    ``Device()`` takes the first GPU, or the CPU where there is none and ``device_filter="any"``
    (the default here, so code runs anywhere); ``device_filter="gpu"`` insists on a GPU.
    """

    def __init__(self, adapter: Adapter | int | None = None, performance_preference: str = "default",
                 device_filter: str = "any") -> None:
        found = adapters()
        if isinstance(adapter, Adapter):
            self.adapter: Adapter | None = adapter
        elif found:
            opts = {"performance_preference": performance_preference}
            if adapter is not None:
                opts["device_id"] = str(int(adapter))
            self.adapter = choose_adapter(found, opts, "Device")
        elif device_filter == "gpu" or adapter is not None:
            raise InvalidArgument("Device: no GPU adapter is available (use device_filter='any' for the CPU)")
        else:
            self.adapter = None
        self.torch_device = self.adapter.device if self.adapter is not None else torch.device("cpu")
        self.queue = Queue(self.torch_device)

    @property
    def is_gpu(self) -> bool:
        return self.adapter is not None

    def create_queue(self) -> Queue:
        """A new queue (stream) of this device; work on different queues may overlap."""
        if self.torch_device.type == "cuda":
            return Queue(self.torch_device, torch.cuda.Stream(self.torch_device))
        return Queue(self.torch_device)

    def tensor(self, desc: TensorDesc, fill: float | None = None) -> DeviceTensor:
        """A new device buffer described by ``desc`` (uninitialised unless ``fill`` is given)."""
        if desc.strides is not None:
            t = torch.empty_strided(desc.sizes, desc.strides, dtype=desc.dtype, device=self.torch_device)
        else:
            t = torch.empty(desc.sizes, dtype=desc.dtype, device=self.torch_device)
        if fill is not None:
            t.fill_(fill)
        return DeviceTensor(t)

    def create_operator(self, op_type: str, inputs: Sequence[TensorDesc | None], attributes: Mapping[str, Any] | None = None,
                        constants: Mapping[int, Any] | None = None, domain: str = "", opset: int | None = None,
                        num_outputs: int | None = None) -> Operator:
        return Operator(self.torch_device, op_type, inputs, attributes, constants, domain, opset, num_outputs)

    def command_list(self) -> CommandList:
        return CommandList(self.torch_device)

    def graph(self, opset: int = DEFAULT_OPSET, name: str = "crossml_graph") -> GraphBuilder:
        return GraphBuilder(self.torch_device, opset, name)

    def __repr__(self) -> str:
        return f"Device({self.adapter.name if self.adapter else 'CPU'}, {self.torch_device})"
