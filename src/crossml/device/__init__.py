"""crossml.device: DirectML's device API in Pythonic form, on crossml's operator library.

    import crossml.device as xd
    dev = xd.Device()                                   # first GPU (or the CPU)
    x = dev.tensor(xd.TensorDesc("float32", [1, 3, 32, 32]))
    dev.queue.upload(x, frames).wait()                  # through pinned staging memory
    conv = dev.create_operator("Conv", [x.desc, xd.TensorDesc("float32", [8, 3, 3, 3])],
                               {"pads": [1, 1, 1, 1]}).compile(persistent=[1])
    conv.initialize(weights)
    (y,) = conv.dispatch(dev.queue, [x])
    print(dev.queue.readback(y))

Also: command lists (record, close, execute: one device-graph launch), graphs (build, compile,
export to ONNX), queues and fences, and wrapping memory the user owns without a copy.
"""

from __future__ import annotations

from crossml.device.adapter import Adapter
from crossml.device.adapter import adapters as _adapters
from crossml.device.command_list import CommandList
from crossml.device.core import Device
from crossml.device.graph import CompiledGraph, GraphBuilder, Value
from crossml.device.operator import CompiledOperator, Operator
from crossml.device.queue import Fence, Queue
from crossml.device.tensor import DeviceTensor, TensorDesc, wrap, wrap_pointer


def adapters() -> list[Adapter]:
    """The machine's GPUs: name, vendor id, memory, compute units, integrated or not."""
    return _adapters()


__all__ = ["Adapter", "CommandList", "CompiledGraph", "CompiledOperator", "Device", "DeviceTensor", "Fence",
           "GraphBuilder", "Operator", "Queue", "TensorDesc", "Value", "adapters", "wrap", "wrap_pointer"]
