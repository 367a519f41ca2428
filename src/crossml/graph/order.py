"""Node order: a topological sort that also follows subgraphs' reads of outer-scope values."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import onnx

from crossml.runtime.errors import InvalidGraph


def topological(graph: onnx.GraphProto, available: set[str], builder: Any = None) -> Iterable[onnx.NodeProto]:
    """Nodes in an order where every input is produced first (models are usually sorted already)."""
    nodes = list(graph.node)
    produced = {o for n in nodes for o in n.output if o}
    ready = set(available)
    done = [False] * len(nodes)
    out: list[onnx.NodeProto] = []
    progress = True
    while progress and len(out) < len(nodes):
        progress = False
        for i, n in enumerate(nodes):
            if done[i]:
                continue
            deps = [x for x in n.input if x] + _implicit_inputs(n)
            if all(x in ready or x not in produced for x in deps):
                done[i] = True
                out.append(n)
                ready.update(o for o in n.output if o)
                progress = True
    if len(out) < len(nodes):
        stuck = [nodes[i].name or nodes[i].op_type for i in range(len(nodes)) if not done[i]]
        raise InvalidGraph(f"the graph has a cycle through node(s): {', '.join(stuck[:10])}")
    return out


def _implicit_inputs(node: onnx.NodeProto) -> list[str]:
    names: list[str] = []
    for a in node.attribute:
        for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
            local = {vi.name for vi in g.input} | {t.name for t in g.initializer}
            for n in g.node:
                local.update(n.output)
            for n in g.node:
                names.extend(x for x in list(n.input) + _implicit_inputs(n) if x and x not in local)
    return names
