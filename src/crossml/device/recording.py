"""Recordings: a function captured once into a device graph (CUDA / HIP graph) and replayed.

This is DirectML's "compiled graph recorded into a command list" model: the first run of an
input signature records every kernel launch; later runs copy the inputs into the recorded
buffers and replay the whole model as one launch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

_capture_lock = threading.Lock()  # sync-debug mode is process-wide: one capture at a time


def capture_supported(device: torch.device) -> bool:
    return device.type == "cuda" and hasattr(torch.cuda, "CUDAGraph")


class Recording:
    """``run(inputs) -> outputs`` recorded into a device graph (what command lists and the
    session's per-signature plans replay).

    ``fn(inputs)`` must take device tensors and return a list of values; it is run once eagerly
    (with host syncs turned into errors, so a function that reads device data on the host is
    refused) and then recorded. Replays are serialised per command list; outputs are copied out
    of the recorded buffers so a later replay never overwrites what a caller holds.
    """

    def __init__(self, fn: Callable[[list[Any]], list[Any]], example: Sequence[torch.Tensor],
                 device: torch.device) -> None:
        self.device = device
        self.inputs = [torch.empty_like(x, device=device).copy_(x) for x in example]
        self.lock = threading.Lock()
        self.done: torch.cuda.Event | None = None
        with _capture_lock:
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            prev = torch.cuda.get_sync_debug_mode()
            with torch.cuda.stream(side):
                torch.cuda.set_sync_debug_mode("error")
                try:
                    fn(list(self.inputs))  # warm-up: allocator, kernel selection, lazy inits
                finally:
                    torch.cuda.set_sync_debug_mode(prev)
            torch.cuda.current_stream(device).wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.outputs = fn(list(self.inputs))

    def run(self, inputs: Sequence[torch.Tensor]) -> list[Any]:
        stream = torch.cuda.current_stream(self.device)
        with self.lock:
            if self.done is not None:
                stream.wait_event(self.done)
            for buf, x in zip(self.inputs, inputs):
                buf.copy_(x, non_blocking=True)
            self.graph.replay()
            outs = [o.clone() if isinstance(o, torch.Tensor) else o for o in self.outputs]
            self.done = torch.cuda.Event()
            self.done.record(stream)
        return outs
