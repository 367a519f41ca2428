"""Graph rewrites. A rule is data: a pattern matcher, a check that returns the reason it refuses
(None to accept), and a rewrite that returns the replacement nodes. One rule per module.

``apply_rules(model, rules)`` walks the graph once per rule and applies every accepted match.
"""

from __future__ import annotations

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

    def only_consumer(self, name: str) -> onnx.NodeProto | None:
        users = self.consumers.get(name, [])
        return users[0] if len(users) == 1 and name not in self.outputs else None

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


@dataclass(frozen=True)
class Rule:
    name: str
    match: Callable[[GraphView, onnx.NodeProto], Match | None]
    check: Callable[[GraphView, Match], str | None]
    rewrite: Callable[[GraphView, Match], list[onnx.NodeProto]]
    domains: tuple[tuple[str, int], ...] = ()  # opset imports the rewrite needs


def apply_rules(model: onnx.ModelProto, rules: list[Rule]) -> dict[str, int]:
    """Apply ``rules`` to ``model`` in place; returns how many times each rule fired."""
    fired: dict[str, int] = {}
    for rule in rules:
        view = GraphView.of(model.graph)
        replaced: dict[int, list[onnx.NodeProto]] = {}
        dropped: set[int] = set()
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
        for domain, version in rule.domains:
            if not any(o.domain == domain for o in model.opset_import):
                model.opset_import.append(onnx.helper.make_opsetid(domain, version))
        fired[rule.name] = len(replaced)
    return fired
