"""Row selection in front of an output's last product: an LLM prompt's logits at the positions a generator reads.

A decoder's logits come from the lm_head product of every position's hidden state, then row-wise nodes (a Cast,
Gemma's softcap: Div, Tanh, Mul by constants). A generator reads one position per row of a prompt (its last real
token), so the product over every other position is spare work: for a 0.5B-1B model with a 128k-262k vocabulary,
the lm_head is a fifth to a quarter of a prompt's arithmetic.

``select_rows(model, output, rows)`` finds that tail (walking up from ``output`` through row-wise nodes to the
first product with constant weights) and puts a com.crossml GatherRows node on each per-position input of the
product, fed by a new overridable initializer ``rows`` (int64, default empty). A run that does not feed ``rows``
takes the default, with which GatherRows hands its input on as it is (no kernel): the output is what it was. A run
that feeds ``rows`` ([batch] int64: one position per row) gets ``output`` for those positions only, [batch, 1, ...].
The product's per-position inputs become graph outputs too, so a caller can run the tail on every position later
(``Tail``), as when a user asks for a prompt's full logits.

It runs after the fusion rules, on their graph, so decode steps (which never feed ``rows``) keep every fusion.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx
from onnx import TensorProto, helper

from crossml.graph.passes import GraphView
from crossml.graph.passes._consts import constant

#: products whose per-position inputs are their non-constant ones (every other input a constant of the model):
#: (domain, op type)
PRODUCTS = {("", "MatMul"), ("com.microsoft", "MatMulNBits"), ("com.crossml", "NormMatMulNBits"),
            ("com.crossml", "Linear")}
#: nodes applied position by position with constant other operands (walked through from the output)
ROW_WISE = {"Cast", "Tanh", "Sigmoid", "Relu", "Identity", "Mul", "Div", "Add", "Sub"}
GATHER_ROWS = "GatherRows"
DOMAIN = "com.crossml"


@dataclass
class Tail:
    """What ``select_rows`` found and inserted: the tail's nodes (product first, as the fusion rules left them),
    the product's per-position inputs (now graph outputs too) and the output."""

    nodes: list[onnx.NodeProto]
    inputs: list[str]
    output: str
    rows: str

    def model(self, source: onnx.ModelProto) -> onnx.ModelProto:
        """The tail alone as a model of ``source``'s opsets: inputs ``inputs`` (element types and ranks as in
        ``source``), output ``output``, with the initializers and Constant nodes it reads (so a plan built with the
        source session's constant cache shares its device weights)."""
        g = source.graph
        view = GraphView.of(g)
        names = {i for n in self.nodes for i in n.input if i}
        consts = [view.producer[i] for i in names
                  if i in view.producer and view.producer[i].op_type == "Constant"]
        inits = [t for t in g.initializer if t.name in names]
        inputs = [onnx.ValueInfoProto(name=i, type=view.types[i]) if i in view.types
                  else helper.make_tensor_value_info(i, TensorProto.UNDEFINED, None) for i in self.inputs]
        out = view.types.get(self.output)
        outputs = [onnx.ValueInfoProto(name=self.output, type=out) if out is not None
                   else helper.make_tensor_value_info(self.output, TensorProto.UNDEFINED, None)]
        graph = helper.make_graph([*consts, *self.nodes], "tail", inputs, outputs, inits)
        return helper.make_model(graph, opset_imports=list(source.opset_import), ir_version=source.ir_version)


def _const(view: GraphView, name: str) -> bool:
    return bool(name) and name not in view.outputs and constant(view, name) is not None and (
        name not in {vi.name for vi in view.graph.input})


def _row_wise(view: GraphView, node: onnx.NodeProto) -> str | None:
    """The one per-position input of a row-wise node (its other inputs constants of at most one axis), else None."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in ROW_WISE or len(node.output) != 1:
        return None
    moving = [i for i in node.input if i and not _const(view, i)]
    if len(moving) != 1:
        return None
    for i in node.input:
        if i and i != moving[0] and len(constant(view, i).dims) > 1:
            return None
    return moving[0]


def find_tail(view: GraphView, output: str) -> tuple[list[onnx.NodeProto], list[str]] | None:
    """(tail nodes, product first; the product's per-position inputs) of ``output``, or None where the output is not
    a product of constant weights followed by row-wise nodes, each read by the next alone."""
    tail: list[onnx.NodeProto] = []
    name = output
    while True:
        node = view.producer.get(name)
        if node is None:
            return None
        if tail and not (view.read_once(name) and view.only_consumer(name) is tail[-1]):
            return None  # an intermediate value of the tail read elsewhere would change shape
        if (node.domain or "", node.op_type) in PRODUCTS:
            moving = [i for i in node.input if i and not _const(view, i)]
            used = [o for o in node.output if view.is_read(o)]
            if not moving or used != [name] or not all(i in view.producer for i in moving):
                return None
            if node.op_type == "MatMul" and len(constant(view, node.input[1]).dims) != 2:
                return None
            tail.append(node)
            return tail[::-1], list(dict.fromkeys(moving))
        moving_one = _row_wise(view, node)
        if moving_one is None:
            return None
        tail.append(node)
        name = moving_one


def select_rows(model: onnx.ModelProto, output: str, rows: str) -> Tail | None:
    """Insert the row selection in front of ``output``'s product (see the module docstring); None (graph unchanged)
    where ``output`` is not a rank-3 output made that way."""
    g = model.graph
    view = GraphView.of(g)
    shape = view.shape(output)
    if output not in view.outputs or shape is None or len(shape) != 3:
        return None
    found = find_tail(view, output)
    if found is None:
        return None
    nodes, inputs = found
    product = nodes[0]
    kept = [onnx.NodeProto() for _ in nodes]
    for k, n in zip(kept, nodes):
        k.CopyFrom(n)
    selected = {}
    for i, name in enumerate(inputs):
        selected[name] = f"{name}/{GATHER_ROWS}"
        g.node.append(helper.make_node(GATHER_ROWS, [name, rows], [selected[name]], name=f"{output}/{GATHER_ROWS}_{i}",
                                       domain=DOMAIN))
    for j, name in enumerate(product.input):
        if name in selected:
            product.input[j] = selected[name]
    g.initializer.append(helper.make_tensor(rows, TensorProto.INT64, [0], []))
    g.input.append(helper.make_tensor_value_info(rows, TensorProto.INT64, ["rows"]))
    g.output.extend(onnx.ValueInfoProto(name=i, type=view.types[i]) if i in view.types
                    else helper.make_tensor_value_info(i, TensorProto.UNDEFINED, None) for i in inputs)
    if not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    _sort(g)
    return Tail(kept, inputs, output, rows)


def _sort(g: onnx.GraphProto) -> None:
    """Put the appended GatherRows nodes before the product that reads them (graph order is topological)."""
    gathers = [n for n in g.node if n.op_type == GATHER_ROWS and n.domain == DOMAIN]
    by_out = {n.output[0]: n for n in gathers}
    rest = [n for n in g.node if not (n.op_type == GATHER_ROWS and n.domain == DOMAIN)]
    ordered: list[onnx.NodeProto] = []
    for n in rest:
        ordered.extend(by_out.pop(i) for i in n.input if i in by_out)
        ordered.append(n)
    new = [onnx.NodeProto() for _ in ordered]
    for a, b in zip(new, ordered):
        a.CopyFrom(b)
    del g.node[:]
    g.node.extend(new)
