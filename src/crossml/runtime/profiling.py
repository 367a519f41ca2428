"""Chrome-trace profiling (onnxruntime's ``enable_profiling`` / ``end_profiling``)."""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import datetime
from typing import Any

import torch


class Profiler:
    """Collects session and node events; ``end`` writes them as a Chrome trace JSON list."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix or "onnxruntime_profile_"
        self.t0 = time.perf_counter_ns()
        self.events: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.pid = os.getpid()

    def _us(self, ns: int) -> int:
        return (ns - self.t0) // 1000

    def event(self, cat: str, name: str, start_ns: int, end_ns: int, args: dict[str, Any] | None = None) -> None:
        ev = {"cat": cat, "pid": self.pid, "tid": threading.get_ident() % 100000, "dur": max(0, (end_ns - start_ns) // 1000),
              "ts": self._us(start_ns), "ph": "X", "name": name, "args": args or {}}
        with self.lock:
            self.events.append(ev)

    def node(self, step: Any, start_ns: int, end_ns: int, args: list[Any]) -> None:
        shapes = [list(a.shape) if isinstance(a, torch.Tensor) else None for a in args]
        self.event("Node", f"{step.node_name or step.op_type}_kernel_time", start_ns, end_ns,
                   {"op_name": step.op_type, "provider": "CPUExecutionProvider" if step.device.type == "cpu"
                    else "GPUExecutionProvider", "input_type_shape": shapes})

    def end(self) -> str:
        stamp = datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
        path = f"{self.prefix}{stamp}.json"
        n = 1
        while os.path.exists(path):
            path = f"{self.prefix}{stamp}_{n}.json"
            n += 1
        with self.lock:
            events = list(self.events)
            self.events.clear()
        with open(path, "w") as f:
            json.dump(events, f)
        return path
