"""The plan: a graph compiled into a flat list of steps over numbered value slots.

Building a plan does all the per-node work once: op look-up by opset, attribute parsing,
constant folding, device placement (with explicit copies where a node falls back to the CPU),
and the slot each value is freed after. Running a plan is a loop over pre-resolved steps.

A plan is immutable once built, so one plan serves any number of threads: every run keeps its
values in its own list.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx
import torch

from crossml import dtypes
from crossml.graph.attributes import parse_attribute, sparse_to_dense, tensor_value
from crossml.graph.expand import expand_function_node
from crossml.graph.order import topological
from crossml.ops import OpContext, OpSpec, load_all, lookup
from crossml.ops.layout import pack_weight, weight_input, weight_layout
from crossml.ops.registry import canonical_domain, known_versions
from crossml.runtime.errors import Fail, InvalidGraph, OrtError
from crossml.runtime.errors import NotImplemented as OrtNotImplemented

log = logging.getLogger("crossml")

CPU = torch.device("cpu")
NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                    "Bernoulli", "Multinomial"}
FOLD_MAX_ELEMENTS = 1 << 24


#: (domain, op type) of the ops that launch at least one GPU kernel whenever their output holds values (the products
#: ``OpContext.settled_inputs`` relies on)
KERNEL_OPS = {("", "MatMul"), ("", "Gemm"), ("com.microsoft", "MatMulNBits"), ("com.crossml", "Linear"),
              ("com.crossml", "NormMatMulNBits"), ("com.crossml", "MatMulSkipNorm"), ("com.crossml", "MatMulSiluMul"),
              ("com.crossml", "AttentionSkipNorm"), ("com.crossml", "SiluMulMatMulNBits")}


@dataclass(slots=True)
class Step:
    """One node, ready to run: ``outputs = fn(*inputs, **attrs)``."""

    fn: Callable[..., Any]
    inputs: tuple[int, ...]  # slot per input, -1 for an omitted optional input
    outputs: tuple[int, ...]  # slot per output, -1 where not used
    attrs: dict[str, Any]
    release: tuple[int, ...]  # slots whose last use is this step
    node_name: str
    op_type: str
    device: torch.device
    subgraphs: dict[str, SubPlan] | None = None
    single: bool = True  # one output: the op returns the value itself


@dataclass(slots=True)
class SubPlan:
    """A compiled subgraph attribute (If branches, Loop/Scan bodies) and the outer values it reads."""

    plan: Plan
    outer_slots: tuple[int, ...]  # slots in the enclosing plan, in plan.outer_names order


@dataclass
class Plan:
    """A compiled graph."""

    num_slots: int
    input_slots: dict[str, int]
    output_names: list[str]
    output_slots: list[int]
    steps: list[Step]
    constants: list[tuple[int, Any]]  # (slot, value) filled before every run
    outer_names: list[str] = field(default_factory=list)  # subgraphs: names read from the outer scope
    outer_input_slots: list[int] = field(default_factory=list)
    value_types: dict[str, onnx.TypeProto] = field(default_factory=dict)
    folded: dict[str, Any] = field(default_factory=dict)  # names folded to constants at build time
    kept_nodes: list[onnx.NodeProto] = field(default_factory=list)
    fallback_nodes: list[str] = field(default_factory=list)
    #: why the plan cannot be captured into a device graph (empty: it can)
    capture_blockers: list[str] = field(default_factory=list)

    def initial_values(self) -> list[Any]:
        vals: list[Any] = [None] * self.num_slots
        for slot, v in self.constants:
            vals[slot] = v
        return vals


# --------------------------------------------------------------------------------------------
# building


@dataclass
class PlanOptions:
    device: torch.device = CPU
    fold_constants: bool = True
    #: shared between the plans of one session (per-signature plans): initializer name -> CPU value,
    #: and (name, device) -> the device copy, so weights are converted and uploaded once.
    constant_cache: dict[Any, Any] | None = None
    #: largest constant (elements) a shape computation may pull to the CPU on a GPU plan.
    small_constant: int = 4096
    #: keep 2-D convolution weights channels-last on the device (the layout tensor cores want);
    #: activations follow the weights' layout through the network.
    channels_last: bool = False
    #: session-level facts handed to every op that asks for a context (OpContext.extra), e.g.
    #: ``kv_inplace``: GroupQueryAttention may write new keys/values into the shared past buffer.
    op_extra: dict[str, Any] = field(default_factory=dict)
    #: DirectML's disable_metacommands: matrix products and convolutions run crossml's own Triton
    #: kernels (crossml.kernels) instead of the vendor libraries torch calls.
    disable_metacommands: bool = False
    #: the GPU provider's use_tf32: fp32 matrix products may use TF32 tensor cores (weights are laid out for them)
    tf32: bool = True
    #: (domain, op type) of nodes that are no step of this plan: each one's output is its first input's value. The
    #: session's row selection (com.crossml GatherRows) in plans for runs that do not select rows, so those plans'
    #: steps, and what each kernel knows of the step before it (``OpContext.settled_inputs``), are the graph's own
    pass_through: frozenset[tuple[str, str]] = frozenset()


class _Builder:
    def __init__(self, opsets: dict[str, int], options: PlanOptions, value_types: dict[str, onnx.TypeProto],
                 outer: _Builder | None = None) -> None:
        load_all()
        self.opsets = opsets
        self.opt = options
        self.value_types = value_types
        self.outer = outer
        self.slots: dict[tuple[str, str], int] = {}  # (name, device key) -> slot
        self.num_slots = 0
        self.constants: dict[str, Any] = {}  # name -> CPU value (for folding, host inputs)
        self.const_slots: list[tuple[int, Any]] = []
        self.steps: list[Step] = []
        #: the step of the last node added and its domain (``_settled``)
        self.last_node: tuple[Step, str] | None = None
        self.step_reads: list[list[int]] = []
        self.value_device: dict[str, torch.device] = {}
        self.outer_names: list[str] = []
        self.outer_input_slots: list[int] = []
        self.kept_nodes: list[onnx.NodeProto] = []
        self.folded: dict[str, Any] = {}
        self.fallback: list[str] = []
        self.graph_outputs: set[str] = set()
        self.initializer_names: set[str] = set()
        self.blockers: list[str] = []
        self.cache = options.constant_cache

    # slots -------------------------------------------------------------------------------
    def _new_slot(self) -> int:
        self.num_slots += 1
        return self.num_slots - 1

    def slot_of(self, name: str, device: torch.device, host: bool = False) -> int:
        """Slot holding ``name`` on ``device``; inserts a copy step (or constant) if needed."""
        want = CPU if host else device
        key = (name, _dev_key(want))
        if key in self.slots:
            return self.slots[key]
        if name in self.constants:
            slot = self._new_slot()
            self.const_slots.append((slot, self._device_constant(name, want)))
            self.slots[key] = slot
            return slot
        if name not in self.value_device:
            self._import_outer(name)
            if name in self.constants:  # an outer-scope constant: materialise it here
                return self.slot_of(name, device, host)
        src_dev = self.value_device[name]
        src = self.slots[(name, _dev_key(src_dev))]
        if _dev_key(src_dev) == _dev_key(want):
            return src
        slot = self._new_slot()
        self.blockers.append(f"'{name}' is copied {src_dev.type}->{want.type}")
        self.steps.append(Step(fn=_copy_to(want), inputs=(src,), outputs=(slot,), attrs={}, release=(),
                               node_name=f"copy:{name}->{want.type}", op_type="MemcpyCopy", device=want))
        self.step_reads.append([src])
        self.slots[key] = slot
        return slot

    def _device_constant(self, name: str, device: torch.device) -> Any:
        value = self.constants[name]
        if self.cache is None or name not in self.initializer_names or not isinstance(value, torch.Tensor):
            return _to(value, device)
        key = (name, _dev_key(device))
        if key not in self.cache:
            self.cache[key] = _to(value, device)
        return self.cache[key]

    def _initializer(self, t: onnx.TensorProto) -> Any:
        if self.cache is None:
            return tensor_value(t)
        if t.name not in self.cache:
            self.cache[t.name] = tensor_value(t)
        return self.cache[t.name]

    def define(self, name: str, device: torch.device) -> int:
        slot = self._new_slot()
        self.slots[(name, _dev_key(device))] = slot
        self.value_device[name] = device
        return slot

    def _import_outer(self, name: str) -> None:
        if self.outer is None or not self.outer.knows(name):
            raise InvalidGraph(f"value '{name}' is used but never produced, and is not a graph input or initializer")
        if name in self.outer.constants:
            self.constants[name] = self.outer.constants[name]
            return
        slot = self.define(name, self.outer.value_device.get(name, self.opt.device))
        self.outer_names.append(name)
        self.outer_input_slots.append(slot)

    def knows(self, name: str) -> bool:
        return name in self.constants or name in self.value_device or (
            self.outer is not None and self.outer.knows(name))

    # graph -------------------------------------------------------------------------------
    def build(self, graph: onnx.GraphProto, input_names: Sequence[str] | None = None) -> Plan:
        init_names = {t.name for t in graph.initializer} | {s.values.name for s in graph.sparse_initializer}
        overridable = {vi.name for vi in graph.input} & init_names
        dev = self.opt.device
        input_slots: dict[str, int] = {}
        names = list(input_names) if input_names is not None else [vi.name for vi in graph.input]
        for name in names:
            if name in init_names and name not in overridable:
                continue
            input_slots[name] = self.define(name, dev)
        for t in graph.initializer:
            if t.name in input_slots:
                # overridable initializer: a default value that a feed may replace
                self.const_slots.append((input_slots[t.name], _to(self._initializer(t), dev)))
            else:
                self.constants[t.name] = self._initializer(t)
                self.initializer_names.add(t.name)
        for sp in graph.sparse_initializer:
            self.constants[sp.values.name] = dtypes.from_numpy(sparse_to_dense(sp))
        self.graph_outputs = {o.name for o in graph.output}
        for node in topological(graph, set(input_slots) | init_names, self):
            self.add_node(node)
        output_names = [o.name for o in graph.output]
        output_slots = [self._output_slot(n) for n in output_names]
        return self._finish(input_slots, output_names, output_slots)

    def _output_slot(self, name: str) -> int:
        if name in self.constants:
            slot = self._new_slot()
            self.const_slots.append((slot, self._device_constant(name, self.opt.device)))
            return slot
        if name in self.value_device or self.outer is not None:
            return self.slot_of(name, self.value_device.get(name, self.opt.device))
        raise InvalidGraph(f"graph output '{name}' is not produced by any node")

    def add_node(self, node: onnx.NodeProto, opsets: dict[str, int] | None = None) -> None:
        opsets = opsets or self.opsets
        domain = canonical_domain(node.domain)
        opset = opsets.get(domain, 1)
        spec = lookup(domain, node.op_type, opset)
        label = f"{node.op_type}({opset}) node with name '{node.name}'"
        if (domain, node.op_type) in self.opt.pass_through and node.input and node.input[0]:
            src = node.input[0]
            dev = self.value_device.get(src, self.opt.device)
            self.slots[(node.output[0], _dev_key(dev))] = self.slot_of(src, dev)
            self.value_device[node.output[0]] = dev
            self.kept_nodes.append(onnx.helper.make_node("Identity", [src], [node.output[0]], name=node.name))
            return
        if spec is None:
            expanded = expand_function_node(node, opset, self.value_types)
            if expanded is not None:
                body, body_opsets = expanded
                merged = {**opsets, **body_opsets}
                for sub in body:
                    self.add_node(sub, merged)
                return
            raise _unknown_op(node, domain, opset, label)
        attrs, graphs = self._attributes(node, spec, label)
        device = self.opt.device
        if spec.cpu_only and device.type != "cpu":
            device = CPU
            self.fallback.append(node.name or node.op_type)
        elif device.type != "cpu" and self._shape_computation(node):
            device = CPU
        if self._try_fold(node, spec, attrs, graphs, opset):
            return
        if device.type != "cpu" or self.opt.device.type != "cpu":
            self._note_blockers(node, spec, device, bool(graphs))
        in_slots = []
        w_at = weight_input(node.op_type, attrs)
        for i, name in enumerate(node.input):
            if not name:
                in_slots.append(-1)
            elif spec.host_output:
                in_slots.append(self.slot_of(name, self.value_device.get(name, device)))
            elif i == w_at and (layout := self._weight_layout(node, domain, attrs, name, device)) is not None:
                in_slots.append(self._packed_slot(name, device, layout))
            else:
                in_slots.append(self.slot_of(name, device, host=i in spec.host_inputs))
        if spec.host_output:
            device = CPU
        subplans = None
        if graphs:
            subplans = {k: self._subplan(g, device) for k, g in graphs.items()}
        ctx = None
        if spec.wants_ctx:
            ctx = self._context(node, opset, device)
            self._settle(ctx, in_slots, device)
            attrs["ctx"] = ctx
        outs = tuple(self.define(o, device) if o else -1 for o in node.output)
        reads = [s for s in in_slots if s >= 0]
        if subplans:
            for sp in subplans.values():
                reads.extend(sp.outer_slots)
        fn = spec.fn
        if self.opt.disable_metacommands and device.type != "cpu" and domain == "":
            fn = _own_kernel(node.op_type) or fn
        if device.type != "cpu" and not spec.host_output and (spec.host_inputs or not node.input):
            # ops that build tensors from host values (ConstantOfShape, Range, Random*...) create
            # them on the CPU: their results move to the step's device here
            fn = _on_device(fn, device)
        self.steps.append(Step(fn=fn, inputs=tuple(in_slots), outputs=outs, attrs=attrs, release=(),
                               node_name=node.name, op_type=node.op_type, device=device,
                               subgraphs=subplans, single=len(node.output) == 1))
        self.step_reads.append(reads)
        self.kept_nodes.append(node)
        self.last_node = (self.steps[-1], domain)

    def _weight_layout(self, node: onnx.NodeProto, domain: str, attrs: dict[str, Any], name: str,
                       device: torch.device) -> str | None:
        """How a constant weight (input ``weight_input``) is pre-packed on this plan's device
        (``ops.layout.weight_layout``)."""
        return weight_layout(domain, node.op_type, self.constants.get(name), device, attrs,
                             channels_last=self.opt.channels_last, tf32=self.opt.tf32,
                             own_kernels=self.opt.disable_metacommands)

    def _packed_slot(self, name: str, device: torch.device, layout: str) -> int:
        key = (name, f"{_dev_key(device)}:{layout}")
        if key not in self.slots:
            slot = self._new_slot()
            cache = self.cache if self.cache is not None else {}
            if key not in cache:
                cache[key] = pack_weight(_to(self.constants[name], device), layout)
            self.const_slots.append((slot, cache[key]))
            self.slots[key] = slot
        return self.slots[key]

    def _shape_computation(self, node: onnx.NodeProto) -> bool:
        """True for a node of a shape computation on a GPU plan: every input is a host value (from
        Shape / Size or another such node) or a small constant. It runs on the CPU, where its
        results are read as shapes without a device sync."""
        host_value = False
        for name in node.input:
            if not name:
                continue
            if name in self.constants:
                v = self.constants[name]
                if isinstance(v, torch.Tensor) and v.numel() > self.opt.small_constant:
                    return False
            elif self.value_device.get(name, self.opt.device).type == "cpu":
                host_value = True
            else:
                return False
        return host_value

    def _note_blockers(self, node: onnx.NodeProto, spec: OpSpec, device: torch.device, has_graphs: bool) -> None:
        label = f"{node.op_type} node '{node.name}'"
        if spec.dynamic:
            self.blockers.append(f"{label} has data-dependent output shapes")
        if has_graphs:
            self.blockers.append(f"{label} runs subgraphs")
        if device.type == "cpu" and not spec.host_output:
            self.blockers.append(f"{label} runs on the CPU")

    def _attributes(self, node: onnx.NodeProto, spec: OpSpec, label: str) -> tuple[dict[str, Any], dict[str, onnx.GraphProto]]:
        attrs: dict[str, Any] = {}
        graphs: dict[str, onnx.GraphProto] = {}
        for a in node.attribute:
            if a.ref_attr_name:
                raise InvalidGraph(f"{label}: attribute '{a.name}' refers to '{a.ref_attr_name}' outside a function")
            if spec.attr_names is not None and a.name not in spec.attr_names:
                log.debug("%s: attribute '%s' is not used by crossml's implementation", label, a.name)
                continue
            v = parse_attribute(a)
            if isinstance(v, onnx.GraphProto):
                graphs[a.name] = v
            else:
                attrs[a.name] = v
        if spec.attr_names is not None:
            missing = [n for n in spec.attr_names if n not in attrs and n not in graphs and n not in spec.attr_defaults]
            if missing:
                raise InvalidGraph(f"{label}: required attribute(s) {', '.join(missing)} missing")
        return attrs, graphs

    def _context(self, node: onnx.NodeProto, opset: int, device: torch.device) -> OpContext:
        return OpContext(node_name=node.name, op_type=node.op_type, opset=opset, num_outputs=len(node.output),
                         output_types=self._elem_types(node.output),
                         outputs_wanted=tuple(bool(o) for o in node.output),
                         device=device, extra=dict(self.opt.op_extra), input_types=self._elem_types(node.input),
                         const_inputs=tuple(bool(n) and n in self.constants for n in node.input))

    def _settle(self, ctx: OpContext, in_slots: Sequence[int], device: torch.device) -> None:
        """``ctx.settled_inputs`` (``_settled``) and ``ctx.settled_by``, the previous step's op type where it settles
        any input."""
        ctx.settled_inputs = self._settled(in_slots, device)
        ctx.settled_by = self.steps[-1].op_type if ctx.settled_inputs else ""

    def _settled(self, in_slots: Sequence[int], device: torch.device) -> tuple[bool, ...]:
        """``OpContext.settled_inputs`` of a node reading ``in_slots`` on ``device``: per input, whether the plan's
        previous step separates it from the node's kernels. That step must be one of KERNEL_OPS on the same GPU and
        write one of the node's inputs (it then launches a kernel whenever the node has work, and that kernel waits
        for everything before it), and the input must not be its output; an absent input counts as settled."""
        if device.type == "cpu" or not self.steps:
            return ()
        prev = self.steps[-1]
        if self.last_node is None or self.last_node[0] is not prev:  # a copy step came after the last node
            return ()
        written = set(prev.outputs) - {-1}
        if prev.device != device or (self.last_node[1], prev.op_type) not in KERNEL_OPS \
                or not written.intersection(in_slots):
            return ()
        return tuple(s not in written for s in in_slots)

    def _elem_types(self, names: Sequence[str]) -> tuple[int | None, ...]:
        out: list[int | None] = []
        for n in names:
            tp = self.value_types.get(n) if n else None
            out.append(tp.tensor_type.elem_type if tp is not None and tp.HasField("tensor_type") else None)
        return tuple(out)

    def _subplan(self, g: onnx.GraphProto, device: torch.device) -> SubPlan:
        opt = PlanOptions(device=device, fold_constants=self.opt.fold_constants,
                          op_extra=self.opt.op_extra,
                          disable_metacommands=self.opt.disable_metacommands)
        types = dict(self.value_types)
        for vi in list(g.value_info) + list(g.input) + list(g.output):
            types[vi.name] = vi.type
        sub = _Builder(self.opsets, opt, types, outer=self)
        plan = sub.build(g)
        outer_slots = tuple(self.slot_of(n, device) for n in plan.outer_names)
        return SubPlan(plan=plan, outer_slots=outer_slots)

    def _try_fold(self, node: onnx.NodeProto, spec: OpSpec, attrs: dict[str, Any],
                  graphs: dict[str, onnx.GraphProto], opset: int) -> bool:
        if not self.opt.fold_constants or graphs or node.op_type in NONDETERMINISTIC:
            return False
        if any(o in self.graph_outputs for o in node.output) and self.outer is None:
            return False  # keep graph outputs produced by a node (profiling and output types stay honest)
        if node.op_type in ("Shape", "Size") and node.input and node.input[0] not in self.constants:
            return self._fold_shape(node, attrs)
        if not all((not n) or n in self.constants for n in node.input):
            return False
        args = [self.constants[n] if n else None for n in node.input]
        kw = dict(attrs)
        if spec.wants_ctx:
            kw["ctx"] = self._context(node, opset, CPU)
        try:
            out = spec.fn(*args, **kw)
        except Exception:  # noqa: BLE001 - leave the node to fail (with its name) at run time
            return False
        outs = out if isinstance(out, tuple) else (out,)
        if len(node.output) == 1 and isinstance(out, tuple):
            outs = out[:1]
        for v in outs:
            if isinstance(v, torch.Tensor) and v.numel() > FOLD_MAX_ELEMENTS:
                return False
        for name, v in zip(node.output, outs):
            if name:
                if isinstance(v, torch.Tensor):
                    v = v.contiguous()
                self.constants[name] = v
                self.folded[name] = v
        return True

    def _fold_shape(self, node: onnx.NodeProto, attrs: dict[str, Any]) -> bool:
        tp = self.value_types.get(node.input[0])
        if tp is None or not tp.HasField("tensor_type") or not tp.tensor_type.HasField("shape"):
            return False
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tp.tensor_type.shape.dim]
        if any(d is None for d in dims):
            return False
        if node.op_type == "Size":
            n = 1
            for d in dims:
                n *= d
            value = torch.tensor(n, dtype=torch.int64)
        else:
            r = len(dims)
            start = attrs.get("start", 0)
            end = attrs.get("end", r)
            start = min(max(start + r if start < 0 else start, 0), r)
            end = min(max(end + r if end < 0 else end, 0), r)
            value = torch.tensor(dims[start:end], dtype=torch.int64)
        self.constants[node.output[0]] = value
        self.folded[node.output[0]] = value
        return True

    def _finish(self, input_slots: dict[str, int], output_names: list[str], output_slots: list[int]) -> Plan:
        # free each intermediate after its last reader (never inputs, outputs or constants)
        keep = set(output_slots) | set(input_slots.values()) | {s for s, _ in self.const_slots}
        keep |= set(self.outer_input_slots)
        last: dict[int, int] = {}
        for i, reads in enumerate(self.step_reads):
            for s in reads:
                last[s] = i
        produced_by: dict[int, int] = {}
        for i, st in enumerate(self.steps):
            for s in st.outputs:
                if s >= 0:
                    produced_by[s] = i
        release: dict[int, list[int]] = {}
        for s, i in last.items():
            if s not in keep:
                release.setdefault(i, []).append(s)
        for s, i in produced_by.items():  # outputs nobody reads: drop right away
            if s not in keep and s not in last:
                release.setdefault(i, []).append(s)
        for i, st in enumerate(self.steps):
            st.release = tuple(release.get(i, ()))
        return Plan(num_slots=self.num_slots, input_slots=input_slots, output_names=output_names,
                    output_slots=output_slots, steps=self.steps, constants=self.const_slots,
                    outer_names=self.outer_names, outer_input_slots=self.outer_input_slots,
                    value_types=self.value_types, folded=self.folded, kept_nodes=self.kept_nodes,
                    fallback_nodes=self.fallback, capture_blockers=self.blockers)


def build_plan(model: onnx.ModelProto, options: PlanOptions,
               value_types: dict[str, onnx.TypeProto] | None = None) -> Plan:
    """Compile the main graph of ``model`` (``value_types`` overrides the model's value_info)."""
    opsets = {canonical_domain(o.domain): o.version for o in model.opset_import}
    g = model.graph
    if value_types is None:
        value_types = {}
        for vi in list(g.value_info) + list(g.input) + list(g.output):
            value_types[vi.name] = vi.type
    types = value_types
    plan = _Builder(opsets, options, types).build(g)
    if plan.fallback_nodes:
        log.warning("%d node(s) run on the CPU (no %s kernel): %s", len(plan.fallback_nodes),
                    options.device.type, ", ".join(plan.fallback_nodes[:20]))
    return plan


def _unknown_op(node: onnx.NodeProto, domain: str, opset: int, label: str) -> OrtError:
    """onnxruntime's error for a node no kernel implements: which class depends on why."""
    versions = known_versions(domain, node.op_type)
    if versions:
        return OrtNotImplemented(f"Could not find an implementation for {label}: crossml implements "
                                 f"{node.op_type} from opset {min(versions)} on")
    if domain in ("", "ai.onnx.ml", "com.microsoft", "ai.onnx.preview.training", "ai.onnx.preview"):
        if onnx.defs.has(node.op_type, domain):
            return OrtNotImplemented(f"Could not find an implementation for {label}: crossml has no kernel for "
                                     f"{domain or 'ai.onnx'}:{node.op_type} yet")
        return InvalidGraph(f"This is an invalid model. In Node, (\"{node.name}\", {node.op_type}, \"{domain}\", -1) "
                            f": Error No Op registered for {node.op_type} with domain_version of {opset}")
    return Fail(f"Fatal error: {domain}:{node.op_type}({opset}) is not a registered function/op "
                f"(node '{node.name}'); register it with crossml.ops.op(..., domain='{domain}')")


def _dev_key(d: torch.device) -> str:
    return "cpu" if d.type == "cpu" else f"{d.type}:{d.index or 0}"


def _to(v: Any, device: torch.device) -> Any:
    if isinstance(v, torch.Tensor) and v.device != device:
        return v.to(device)
    if isinstance(v, list):  # a (folded) sequence
        return [_to(x, device) for x in v]
    return v


def _own_kernel(op_type: str) -> Callable[..., Any] | None:
    """crossml's Triton implementation of ``op_type`` (used with disable_metacommands), if any."""
    from crossml.kernels import METACOMMAND_FREE

    return METACOMMAND_FREE.get(op_type)


def _on_device(fn: Callable[..., Any], device: torch.device) -> Callable[..., Any]:
    def run(*args: Any, **kw: Any) -> Any:
        out = fn(*args, **kw)
        if isinstance(out, torch.Tensor):
            return out if out.device == device else out.to(device)
        if isinstance(out, tuple):
            return tuple(o.to(device) if isinstance(o, torch.Tensor) and o.device != device else o for o in out)
        return out

    run.__name__ = getattr(fn, "__name__", "op")
    return run


def _copy_to(device: torch.device) -> Callable[[Any], Any]:
    def copy(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return x.to(device)
        if isinstance(x, list):
            return [copy(v) for v in x]
        return x

    return copy
