"""Graph rewrites. A rule is data: a pattern matcher, a check that returns the reason it refuses
(None to accept), and a rewrite that returns the replacement nodes. One rule per module.

``apply_rules(model, rules)`` walks the graph once per rule and applies every accepted match. A
rewrite may add initializers (``view.graph.initializer``); initializers it left unread are dropped.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import onnx

log = logging.getLogger("crossml")


@dataclass
class Match:
    """Nodes a rule matched (in graph order) and what the matcher learnt about them."""

    nodes: list[onnx.NodeProto]
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class GraphView:
    """Read-only facts about a graph the rules need: producers, consumers, value types."""

    graph: onnx.GraphProto
    producer: dict[str, onnx.NodeProto]
    consumers: dict[str, list[onnx.NodeProto]]
    types: dict[str, onnx.TypeProto]
    outputs: set[str]
    initializers: dict[str, onnx.TensorProto]
    #: the model's ai.onnx opset (``apply_rules`` sets it; 0 where unknown)
    opset: int = 0

    @staticmethod
    def of(graph: onnx.GraphProto) -> GraphView:
        producer, consumers = {}, {}
        for n in graph.node:
            for o in n.output:
                producer[o] = n
            for i in n.input:
                consumers.setdefault(i, []).append(n)
        types = {vi.name: vi.type for vi in list(graph.value_info) + list(graph.input) + list(graph.output)}
        return GraphView(graph, producer, consumers, types, {o.name for o in graph.output},
                         {t.name: t for t in graph.initializer})

    def is_read(self, name: str) -> bool:
        """Whether ``name`` (an output slot; "" for one left out) is read by a node or is a graph output."""
        return bool(name) and (bool(self.consumers.get(name)) or name in self.outputs)

    def only_consumer(self, name: str) -> onnx.NodeProto | None:
        users = self.consumers.get(name, [])
        return users[0] if len(users) == 1 and name not in self.outputs else None

    @functools.cached_property
    def nested_reads(self) -> set[str]:
        """``subgraph_reads(graph)``, walked once per view (a view serves one rule's pass over an unchanged graph;
        walking it per query took 72 ms of a Qwen2.5-0.5B builder model's load)."""
        return subgraph_reads(self.graph)

    def read_once(self, name: str) -> bool:
        """Whether ``name`` is read by one node only: not a graph output, not read inside an If / Loop / Scan
        body (which ``consumers`` does not see); a rule may then fold it into that node."""
        return self.only_consumer(name) is not None and name not in self.nested_reads

    def shape(self, name: str) -> list[Any] | None:
        tp = self.types.get(name)
        if tp is None or not tp.HasField("tensor_type") or not tp.tensor_type.HasField("shape"):
            return None
        return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tp.tensor_type.shape.dim]

    def elem_type(self, name: str) -> int | None:
        tp = self.types.get(name)
        if tp is not None and tp.HasField("tensor_type"):
            return tp.tensor_type.elem_type
        t = self.initializers.get(name)
        return t.data_type if t is not None else None


def unique_name(view: GraphView, base: str) -> str:
    """``base``, or ``base_<i>``, not yet naming a value or initializer of the graph (for a rewrite's new names)."""
    taken = view.initializers.keys() | view.producer.keys() | view.consumers.keys()
    name, i = base, 1
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    return name


def add_initializer(view: GraphView, name: str, array: Any, like: onnx.TensorProto) -> onnx.TensorProto:
    """A new initializer ``name`` holding ``array`` in ``like``'s element type (weights a rewrite concatenated):
    kept beside ``like``'s external-data file when it has one (out of the proto), else its raw bytes; types without
    a raw layout (bfloat16, 4-bit) through onnx's writer."""
    from onnx import numpy_helper

    from crossml.graph import external

    files = external.files_of(like)
    if like.data_type in external.RAW_TYPES:
        t = view.graph.initializer.add()  # filled in place: appending a made TensorProto would copy its bytes again
        t.name, t.data_type = name, like.data_type
        t.dims.extend(array.shape)
        if files is not None:
            files.hold(t, array)
        else:
            t.raw_data = array.tobytes()
    else:
        view.graph.initializer.append(numpy_helper.from_array(array, name))
        t = view.graph.initializer[-1]
    view.initializers[name] = t
    return t


def node_attrs(node: onnx.NodeProto) -> dict[str, Any]:
    """A node's attributes as Python values, by name."""
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def subgraph_reads(graph: onnx.GraphProto) -> set[str]:
    """Names read inside If / Loop / Scan bodies at any depth (outer-scope values are not in
    ``GraphView.consumers``)."""
    names: set[str] = set()
    for n in graph.node:
        for a in n.attribute:
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                names.update(i for m in sub.node for i in m.input)
                names |= subgraph_reads(sub)
    return names


def _drop_unread_initializers(graph: onnx.GraphProto, candidates: set[str]) -> None:
    """Remove the initializers among ``candidates`` that no node reads any more (subgraphs included)
    and that are not graph inputs or outputs, so replaced weights do not stay resident."""
    kept = {i for n in graph.node for i in n.input} | subgraph_reads(graph)
    kept |= {vi.name for vi in graph.input} | {vi.name for vi in graph.output}
    for i in reversed(range(len(graph.initializer))):
        name = graph.initializer[i].name
        if name in candidates and name not in kept:
            del graph.initializer[i]


@dataclass(frozen=True)
class Rule:
    name: str
    match: Callable[[GraphView, onnx.NodeProto], Match | None]
    check: Callable[[GraphView, Match], str | None]
    rewrite: Callable[[GraphView, Match], list[onnx.NodeProto]]
    domains: tuple[tuple[str, int], ...] = ()  # opset imports the rewrite needs


def model_opset(model: onnx.ModelProto) -> int:
    """The model's ai.onnx opset (0 where it imports none)."""
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def apply_rules(model: onnx.ModelProto, rules: list[Rule]) -> dict[str, int]:
    """Apply ``rules`` to ``model`` in place; returns how many times each rule fired.

    After a rule fired, the initializers the replaced nodes read that no node reads any more (nodes
    of subgraphs included) and that are not graph inputs or outputs are removed from the model:
    e.g. the gate and up weights once GATE_UP has concatenated them into one new initializer."""
    fired: dict[str, int] = {}
    opset = model_opset(model)
    for rule in rules:
        view = GraphView.of(model.graph)
        view.opset = opset
        replaced: dict[int, list[onnx.NodeProto]] = {}
        dropped: set[int] = set()
        read_before: set[str] = set()  # what the replaced nodes read
        for node in model.graph.node:
            if id(node) in dropped:
                continue
            m = rule.match(view, node)
            if m is None or any(id(n) in dropped for n in m.nodes):
                continue
            reason = rule.check(view, m)
            if reason is not None:
                log.debug("%s refused at node '%s': %s", rule.name, node.name, reason)
                continue
            new = rule.rewrite(view, m)
            replaced[id(m.nodes[-1])] = new
            dropped.update(id(n) for n in m.nodes)
            read_before.update(i for n in m.nodes for i in n.input)
        if not replaced:
            continue
        kept: list[onnx.NodeProto] = []
        for node in model.graph.node:
            if id(node) in replaced:
                kept.extend(replaced[id(node)])
            elif id(node) not in dropped:
                kept.append(node)
        del model.graph.node[:]
        model.graph.node.extend(kept)
        _drop_unread_initializers(model.graph, read_before & view.initializers.keys())
        for domain, version in rule.domains:
            if not any(o.domain == domain for o in model.opset_import):
                model.opset_import.append(onnx.helper.make_opsetid(domain, version))
        fired[rule.name] = len(replaced)
    return fired
