"""Running a plan: a loop over pre-resolved steps, values kept in a per-run list of slots.

Each run owns its value list, so one plan serves any number of threads. Subgraph attributes
(If branches, Loop / Scan bodies) reach their ops as ``BoundGraph`` callables bound to the outer
values of the current run.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from crossml.runtime.errors import OrtError, RuntimeException

if TYPE_CHECKING:
    from crossml.graph.plan import Plan, Step


class BoundGraph:
    """A subgraph bound to the outer values of one run; call it with the subgraph's inputs."""

    __slots__ = ("_plan", "_outer", "_profiler")

    def __init__(self, plan: Plan, outer: list[Any], profiler: Any = None) -> None:
        self._plan = plan
        self._outer = outer
        self._profiler = profiler

    @property
    def input_names(self) -> list[str]:
        return list(self._plan.input_slots)

    @property
    def output_names(self) -> list[str]:
        return self._plan.output_names

    def __call__(self, *inputs: Any) -> list[Any]:
        plan = self._plan
        vals = plan.initial_values()
        for slot, v in zip(plan.input_slots.values(), inputs):
            vals[slot] = v
        for slot, v in zip(plan.outer_input_slots, self._outer):
            vals[slot] = v
        return execute(plan, vals, self._profiler)


def execute(plan: Plan, vals: list[Any], profiler: Any = None) -> list[Any]:
    """Run ``plan`` on ``vals`` (inputs already in their slots); return the graph outputs."""
    step = None
    try:
        if profiler is None:
            for step in plan.steps:
                args = [vals[i] if i >= 0 else None for i in step.inputs]
                kw = step.attrs if step.subgraphs is None else _bind_subgraphs(step, vals, None)
                out = step.fn(*args, **kw)
                _store(step, out, vals)
        else:
            for step in plan.steps:
                args = [vals[i] if i >= 0 else None for i in step.inputs]
                kw = step.attrs if step.subgraphs is None else _bind_subgraphs(step, vals, profiler)
                t0 = time.perf_counter_ns()
                out = step.fn(*args, **kw)
                if step.device.type != "cpu":
                    torch.accelerator.synchronize()
                profiler.node(step, t0, time.perf_counter_ns(), args)
                _store(step, out, vals)
    except OrtError:
        raise
    except Exception as exc:  # noqa: BLE001 - every op failure becomes an onnxruntime status
        if step is None:
            raise
        raise RuntimeException(
            f"Non-zero status code returned while running {step.op_type} node. "
            f"Name:'{step.node_name}' Status Message: {type(exc).__name__}: {exc}"
        ) from exc
    return [vals[i] for i in plan.output_slots]


def _store(step: Step, out: Any, vals: list[Any]) -> None:
    if step.single:
        if isinstance(out, tuple):
            out = out[0]
        vals[step.outputs[0]] = out
    else:
        if not isinstance(out, tuple):
            out = (out,)
        for slot, v in zip(step.outputs, out):
            if slot >= 0:
                vals[slot] = v
    for slot in step.release:
        vals[slot] = None


def _bind_subgraphs(step: Step, vals: list[Any], profiler: Any) -> dict[str, Any]:
    kw = dict(step.attrs)
    for name, sub in step.subgraphs.items():  # type: ignore[union-attr]
        kw[name] = BoundGraph(sub.plan, [vals[i] for i in sub.outer_slots], profiler)
    return kw
