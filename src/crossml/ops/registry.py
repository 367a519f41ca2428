"""The operator registry: every (domain, op_type, since-version) maps to one Python function.

An op is a plain function on torch tensors. Inputs arrive positionally (``None`` for an omitted
optional input); attributes arrive as typed keywords carrying the ONNX defaults. The registry
picks the implementation with the highest ``since`` that is <= the model's opset for the domain.

    @op("Gemm", since=13)
    def gemm(a, b, c=None, *, alpha: float = 1.0, beta: float = 1.0, transA: int = 0, transB: int = 0):
        ...

Options of ``op``:

* ``host_inputs``: input positions the op reads as host values (shapes, axes, pads, k...). The
  planner keeps those on the CPU so that reading them never syncs a GPU stream.
* ``ctx=True``: the op receives a keyword ``ctx`` (:class:`OpContext`): number of outputs asked
  for, declared output element types, node name, opset, and a way to run subgraphs.
* ``cpu_only=True``: the op cannot run on an accelerator (strings, maps...); a GPU session runs it
  on the CPU with explicit copies.
* ``host_output=True``: the op reads only its inputs' shapes and returns host (CPU) tensors
  (Shape, Size): its inputs are never copied between devices for it.
* ``dynamic=True``: the op's output shapes depend on tensor values (NonZero, Unique...), so it
  reads device data on the host; a plan holding one is not captured into a device graph.

An op returns a tensor, or a tuple/list of values with one entry per output (``None`` for an
output that was not requested).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: ONNX domains as onnxruntime spells them. "" and "ai.onnx" are the same domain.
DEFAULT_DOMAIN = ""
MS_DOMAIN = "com.microsoft"
ML_DOMAIN = "ai.onnx.ml"


def canonical_domain(domain: str) -> str:
    return DEFAULT_DOMAIN if domain in ("", "ai.onnx") else domain


@dataclass(frozen=True)
class OpSpec:
    """One registered implementation."""

    domain: str
    op_type: str
    since: int
    fn: Callable[..., Any]
    host_inputs: tuple[int, ...] = ()
    wants_ctx: bool = False
    cpu_only: bool = False
    host_output: bool = False
    dynamic: bool = False
    attr_names: frozenset[str] | None = None  # None: the function takes **kwargs
    attr_defaults: dict[str, Any] = field(default_factory=dict)


@dataclass
class OpContext:
    """What an op may ask about its node (only passed when registered with ``ctx=True``)."""

    node_name: str
    op_type: str
    opset: int
    num_outputs: int
    output_types: tuple[int | None, ...]  # ONNX element types, None when unknown
    outputs_wanted: tuple[bool, ...]  # False where the output name is empty / unused
    device: Any = None  # torch.device the node runs on
    input_types: tuple[int | None, ...] = ()  # ONNX element types of the inputs, None when unknown
    run_subgraph: Callable[..., Any] | None = None  # (graph_attr_name, inputs list) -> outputs list
    extra: dict[str, Any] = field(default_factory=dict)
    #: per input, True where it is a constant of the model (an initializer no feed can override, or a folded
    #: value): no kernel writes it, so a kernel may read it before the previous kernel has finished
    const_inputs: tuple[bool, ...] = ()
    #: per input, True where its value was complete before the kernels of the plan's previous step started: that
    #: step is a product on this device that wrote another input of this node (so it launches a kernel whenever
    #: this node has work), and this input is not its output. Under programmatic dependent launch a kernel waits
    #: only for the kernel before it, so it may read such inputs before that wait. Empty when the plan did not say.
    settled_inputs: tuple[bool, ...] = ()
    #: the op type of that previous step where ``settled_inputs`` says anything ("" otherwise): which kernel this
    #: node's first launch follows
    settled_by: str = ""

    def constant(self, *indices: int) -> bool:
        """Whether every one of these inputs is a model constant (False when the plan did not say)."""
        return all(i < len(self.const_inputs) and self.const_inputs[i] for i in indices)

    def settled(self, *indices: int) -> bool:
        """Whether every one of these inputs (absent optional ones included) is settled (``settled_inputs``); False
        when the plan did not say."""
        n = len(self.settled_inputs)
        return n > 0 and all(i >= n or self.settled_inputs[i] for i in indices)


_REGISTRY: dict[tuple[str, str], list[OpSpec]] = {}


def op(
    op_type: str,
    since: int = 1,
    *,
    domain: str = DEFAULT_DOMAIN,
    host_inputs: tuple[int, ...] = (),
    ctx: bool = False,
    cpu_only: bool = False,
    host_output: bool = False,
    dynamic: bool = False,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``fn`` as ``op_type`` of ``domain`` from opset ``since`` on. Decorators stack."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(fn)
        names: set[str] = set()
        defaults: dict[str, Any] = {}
        takes_any = False
        for p in sig.parameters.values():
            if p.kind is p.KEYWORD_ONLY and p.name != "ctx":
                names.add(p.name)
                if p.default is not p.empty:
                    defaults[p.name] = p.default
            elif p.kind is p.VAR_KEYWORD:
                takes_any = True
        spec = OpSpec(
            domain=canonical_domain(domain),
            op_type=op_type,
            since=since,
            fn=fn,
            host_inputs=tuple(host_inputs),
            wants_ctx=ctx,
            cpu_only=cpu_only,
            host_output=host_output,
            dynamic=dynamic,
            attr_names=None if takes_any else frozenset(names),
            attr_defaults=defaults,
        )
        versions = _REGISTRY.setdefault((spec.domain, op_type), [])
        versions[:] = [v for v in versions if v.since != since] + [spec]
        versions.sort(key=lambda s: s.since)
        return fn

    return register


def lookup(domain: str, op_type: str, opset: int) -> OpSpec | None:
    """The implementation for ``op_type`` at ``opset``: highest ``since`` <= opset, else None."""
    versions = _REGISTRY.get((canonical_domain(domain), op_type))
    if not versions:
        return None
    best = None
    for spec in versions:
        if spec.since <= opset:
            best = spec
    return best


def known_versions(domain: str, op_type: str) -> list[int]:
    return [s.since for s in _REGISTRY.get((canonical_domain(domain), op_type), [])]


def registered_ops() -> dict[tuple[str, str], list[OpSpec]]:
    """A copy of the registry (for docs and coverage reports)."""
    return {k: list(v) for k, v in _REGISTRY.items()}
