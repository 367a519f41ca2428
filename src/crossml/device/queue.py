"""Queues (streams), fences (events), and upload / readback through pinned staging memory.

DirectML's command queue maps to a torch stream; its fence to a device event; its upload and
readback heaps to page-locked host buffers, which make host<->device copies asynchronous.
On the CPU a queue runs work at once and fences are always complete.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from crossml import dtypes
from crossml.device.tensor import DeviceTensor
from crossml.runtime.errors import InvalidArgument


class Fence:
    """Completion of the work submitted to a queue before it was signalled."""

    __slots__ = ("_event", "_keep")

    def __init__(self, event: Any = None, keep: Any = None) -> None:
        self._event = event
        self._keep = keep  # staging buffers that must outlive the copy

    @property
    def completed(self) -> bool:
        return self._event is None or self._event.query()

    def wait(self) -> None:
        """Block the host until the work is done."""
        if self._event is not None:
            self._event.synchronize()
        self._keep = None


class Queue:
    """A device queue: work submitted to it runs in order, asynchronously to the host."""

    def __init__(self, device: torch.device, stream: Any = None) -> None:
        self.device = device
        if device.type == "cuda":
            if stream is None:
                stream = torch.cuda.current_stream(device)
            elif isinstance(stream, int):
                stream = torch.cuda.ExternalStream(stream, device=device)
        self.stream = stream

    @staticmethod
    def from_stream(stream: Any, device: Any = None) -> Queue:
        """A queue over the user's own stream (a torch stream, or a raw cudaStream_t handle)."""
        if isinstance(stream, torch.cuda.Stream):
            return Queue(stream.device, stream)
        dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
        return Queue(dev, int(stream))

    @contextlib.contextmanager
    def active(self) -> Iterator[Queue]:
        """Make this queue the current stream: work crossml (and torch) launches goes onto it."""
        if self.stream is None:
            yield self
        else:
            with torch.cuda.stream(self.stream):
                yield self

    def signal(self) -> Fence:
        if self.stream is None:
            return Fence()
        ev = torch.cuda.Event()
        ev.record(self.stream)
        return Fence(ev)

    def wait(self, fence: Fence) -> None:
        """Make later work on this queue wait for ``fence`` (no host block)."""
        if self.stream is not None and fence._event is not None:
            self.stream.wait_event(fence._event)

    def synchronize(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()

    # -- upload / readback ------------------------------------------------------------
    def upload(self, dst: DeviceTensor, src: np.ndarray, blocking: bool = False) -> Fence:
        """Copy host data into ``dst`` through a pinned staging buffer; returns a fence."""
        arr = np.ascontiguousarray(src)
        host = dtypes.from_numpy(arr)
        if tuple(host.shape) != dst.desc.sizes or host.dtype != dst.desc.dtype:
            raise InvalidArgument(f"upload: source is {host.dtype}{list(host.shape)}, destination is {dst.desc}")
        if self.stream is None:
            dst.torch.copy_(host)
            return Fence()
        staging = torch.empty(host.shape, dtype=host.dtype, pin_memory=True)
        staging.copy_(host)
        with torch.cuda.stream(self.stream):
            dst.torch.copy_(staging, non_blocking=True)
        fence = self.signal()
        fence._keep = staging
        if blocking:
            fence.wait()
        return fence

    def host_visible(self, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, np.ndarray]:
        """Page-locked host memory that kernels on this queue's device may write directly (unified addressing
        maps it into the device's address space), as a tensor to hand to a kernel and a numpy view of the same
        bytes. Its contents are valid on the host once a fence signalled after the writing kernel completes; on
        the CPU it is ordinary memory."""
        buf = torch.zeros(shape, dtype=dtype, pin_memory=self.stream is not None)
        return buf, dtypes.to_numpy(buf)

    def readback(self, src: DeviceTensor, blocking: bool = True) -> Any:
        """Copy ``src`` to host memory. Blocking: returns the numpy array. Otherwise returns
        ``(fence, array)``: the array's contents are valid once the fence completes."""
        if self.stream is None:
            out = dtypes.to_numpy(src.torch.clone())
            return out if blocking else (Fence(), out)
        staging = torch.empty(src.desc.sizes, dtype=src.desc.dtype, pin_memory=True)
        with torch.cuda.stream(self.stream):
            staging.copy_(src.torch, non_blocking=True)
        fence = self.signal()
        fence._keep = staging
        arr = dtypes.to_numpy(staging)  # shares the pinned memory
        if blocking:
            fence.wait()
            return arr
        return fence, arr
