"""Recordings: a function captured once into a device graph (CUDA / HIP graph) and replayed.

This is DirectML's "compiled graph recorded into a command list" model: the first run of an
input signature records every kernel launch; later runs copy the inputs into the recorded
buffers and replay the whole model as one launch.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

_capture_lock = threading.Lock()  # one capture at a time


def capture_supported(device: torch.device) -> bool:
    return device.type == "cuda" and hasattr(torch.cuda, "CUDAGraph")


@contextlib.contextmanager
def capturing(graph: torch.cuda.CUDAGraph, device: torch.device) -> Iterator[None]:
    """Record the block's launches into ``graph`` on a side stream (thread-local capture mode: other threads keep
    launching and syncing meanwhile), ordered after the work queued before it and before the work queued after.

    ``torch.cuda.graph`` does the same after a device synchronize and ``torch.cuda.empty_cache()``, which hands
    every cached block back to the driver, so the runs after it allocate from the driver again. On an H200
    (GenAI benchmark's Qwen2.5-0.5B fp16 model, one process alternating the two): a prompt bucket's recording
    115-118 -> 102-109 ms, the decode step after it 2.6 -> 1.2 ms; a decode step's recording stayed 95-100 ms."""
    stream = torch.cuda.Stream(device)
    current = torch.cuda.current_stream(device)
    stream.wait_stream(current)
    with torch.cuda.stream(stream):
        graph.capture_begin(capture_error_mode="thread_local")
        try:
            yield
        except BaseException:
            with contextlib.suppress(Exception):  # the capture is invalid; the block's error is the one to see
                graph.capture_end()
            raise
        graph.capture_end()
    current.wait_stream(stream)


class Recording:
    """``run(inputs) -> outputs`` recorded into a device graph (what command lists and the
    session's per-signature plans replay).

    ``fn(inputs)`` must take device tensors and return a list of values; it is run once eagerly
    and then recorded (a function that reads device data on the host cannot be recorded: the
    capture raises, and the caller falls back to running it eagerly). Replays are serialised per
    command list.

    The recording keeps ``fn`` alive: the graph reads device memory that ``fn`` owns (a plan's
    constants and weights) at the addresses it had during capture, and freeing it would let the
    allocator hand those bytes to other tensors while replays still read them.

    ``bind_inputs=False`` (default): the recording owns copies of the inputs; each run copies the
    caller's tensors in and copies the outputs out, so a later replay never overwrites what a caller
    holds. ``bind_inputs=True``: the graph reads the example tensors where they are (no input copies;
    a run given other tensors copies them into those addresses) and ``run`` returns the recorded
    output buffers themselves, valid until the next replay — onnxruntime's CUDA-graph contract of
    inputs and outputs bound at fixed addresses. ``bind_outputs`` (default: as ``bind_inputs``) can
    keep the output copies of a recording that reads its inputs in place (IOBinding's stable bindings).
    ``warm=False``: ``fn`` already ran eagerly on inputs of these shapes (kernels compiled and chosen, lazy caches
    filled), so it is captured without running it first.
    """

    def __init__(self, fn: Callable[[list[Any]], list[Any]], example: Sequence[torch.Tensor],
                 device: torch.device, *, bind_inputs: bool = False, bind_outputs: bool | None = None,
                 warm: bool = True) -> None:
        self.device = device
        self.fn = fn  # what the graph reads (plan constants, weights) must outlive every replay
        self.bound = bind_inputs if bind_outputs is None else bind_outputs
        self.inputs = list(example) if bind_inputs else [torch.empty_like(x, device=device).copy_(x) for x in example]
        self.lock = threading.Lock()
        self.done: torch.cuda.Event | None = None
        with _capture_lock:
            if warm:
                side = torch.cuda.Stream(device)
                side.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(side):
                    fn(list(self.inputs))  # warm-up: allocator, kernel selection, lazy inits
                torch.cuda.current_stream(device).wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            # thread-local: other threads keep launching (and syncing) while this one records;
            # a host sync inside fn makes the capture fail here, and the caller runs eagerly
            try:
                with capturing(self.graph, device):
                    self.outputs = fn(list(self.inputs))
            except BaseException:
                _reset_random_state(device)
                raise

    def replay(self) -> list[Any]:
        """Replay a ``bind_inputs`` recording on the tensors it was recorded with (the caller has written the
        new values into them); returns the recorded output buffers."""
        return self._replay(None)

    def run(self, inputs: Sequence[torch.Tensor], into: Sequence[torch.Tensor | None] | None = None) -> list[Any]:
        """One replay on ``inputs``; ``into`` (optional, per output): buffers the outputs are copied into (each
        returned in its output's place) instead of fresh copies, where the shapes agree."""
        return self._replay(inputs, into)

    def _replay(self, inputs: Sequence[torch.Tensor] | None,
                into: Sequence[torch.Tensor | None] | None = None) -> list[Any]:
        """One replay, serialised with the previous one of this recording on the current stream: copies
        ``inputs`` (if given) into the recorded buffers first; returns the outputs (copies unless bound)."""
        stream = torch.cuda.current_stream(self.device)
        with self.lock:
            if self.done is not None:
                stream.wait_event(self.done)
            for buf, x in zip(self.inputs, inputs or ()):
                if x is not buf and not same_view(x, buf):
                    buf.copy_(x, non_blocking=True)
            self.graph.replay()
            if self.bound and not into:
                outs = list(self.outputs)
            else:
                outs = [_output(o, t, self.bound) for o, t in zip(self.outputs, into or [None] * len(self.outputs))]
            self.done = torch.cuda.Event()
            self.done.record(stream)
        return outs


def _output(recorded: Any, target: torch.Tensor | None, bound: bool) -> Any:
    """A replay's output: copied into ``target`` when given with the same shape (before the next replay can
    overwrite it), else the recorded buffer itself (``bound``) or a copy."""
    if not isinstance(recorded, torch.Tensor):
        return recorded
    if target is not None and target.shape == recorded.shape:
        return target.copy_(recorded)
    return recorded if bound else recorded.clone()


def same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when ``a`` and ``b`` are the same elements of the same memory (copying would be a no-op)."""
    return (a.data_ptr() == b.data_ptr() and a.dtype == b.dtype and a.shape == b.shape
            and a.stride() == b.stride())


def _reset_random_state(device: torch.device) -> None:
    """After a failed capture: torch's CUDA graph raises out of ``capture_end`` before it takes the default
    random generator out of capture mode, and every later random op on the device (``torch.randn`` in the
    user's own code included) would then fail with "Offset increment outside graph capture encountered
    unexpectedly". A clone of the generator's state (same seed and offset) is not in capture mode."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    gen = torch.cuda.default_generators[index]
    gen.graphsafe_set_state(gen.clone_state())
