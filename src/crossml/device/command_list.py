"""DirectML-style command lists: record dispatches layer by layer, close, execute many times.

Bindings are fixed when recorded (as DirectML's binding tables): each execution reads the bound
input tensors' current contents and writes the bound outputs. On a GPU, ``close`` captures the
whole list into one device graph, so an execution costs one launch and no Python per operator.
On the CPU, execution replays the recorded dispatches in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from crossml.device.operator import CompiledOperator
from crossml.device.queue import Fence, Queue
from crossml.device.recording import _capture_lock, capture_supported, capturing
from crossml.device.tensor import DeviceTensor
from crossml.runtime.errors import InvalidArgument


@dataclass
class _Dispatch:
    op: CompiledOperator
    inputs: list[DeviceTensor]
    outputs: list[DeviceTensor]


class CommandList:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._dispatches: list[_Dispatch] = []
        self._closed = False
        self._graph: torch.cuda.CUDAGraph | None = None

    @property
    def closed(self) -> bool:
        return self._closed

    def dispatch(self, op: CompiledOperator, inputs: Sequence[DeviceTensor], outputs: Sequence[DeviceTensor]) -> None:
        """Record ``op`` reading ``inputs`` and writing ``outputs`` (all bound now, by reference)."""
        if self._closed:
            raise InvalidArgument("CommandList is closed: record into a new command list")
        if outputs is None or len(outputs) != len(op.output_descs):
            raise InvalidArgument(f"{op.op.op_type}: a recorded dispatch binds all {len(op.output_descs)} output(s)")
        for j, (o, d) in enumerate(zip(outputs, op.output_descs)):
            d.check(o.torch, f"{op.op.op_type} output {j}")
        for i, (x, d) in enumerate(zip(inputs, op.input_descs)):
            d.check(x.torch, f"{op.op.op_type} input {i}")
        self._dispatches.append(_Dispatch(op, list(inputs), list(outputs)))

    def close(self, queue: Queue | None = None) -> None:
        """Finish recording; on a GPU, capture the dispatches into one device graph."""
        if self._closed:
            return
        self._closed = True
        if not capture_supported(self.device) or not self._dispatches:
            return
        q = queue or Queue(self.device)
        with _capture_lock:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            self._replay(Queue(self.device, side))  # warm-up: kernel selection, lazy inits
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with capturing(graph, self.device):
                self._replay(Queue(self.device, torch.cuda.current_stream(self.device)))
            self._graph = graph
        q.synchronize()

    def _replay(self, queue: Queue) -> None:
        for d in self._dispatches:
            d.op.dispatch(queue, d.inputs, d.outputs)

    def execute(self, queue: Queue) -> Fence:
        """Run the recorded work on ``queue``; returns a fence that completes with it."""
        if not self._closed:
            raise InvalidArgument("close() the command list before executing it")
        if self._graph is not None:
            with queue.active():
                self._graph.replay()
        else:
            self._replay(queue)
        return queue.signal()
