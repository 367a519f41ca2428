"""Expanding a node into the function body that the ONNX schema defines for its op.

An op crossml does not implement directly, but whose ONNX schema is a function of other ops
(for example ``Celu``, ``Range`` in older opsets, ``LayerNormalization``), runs as that body,
renamed into the graph. This is how onnxruntime also runs schema-defined functions.
"""

from __future__ import annotations

import itertools

import onnx
from onnx import defs

from crossml.ops.registry import canonical_domain

_uid = itertools.count()


def expand_function_node(
    node: onnx.NodeProto, opset: int, value_types: dict[str, onnx.TypeProto]
) -> tuple[list[onnx.NodeProto], dict[str, int]] | None:
    """The nodes of ``node``'s schema function body, or None when the schema has none."""
    domain = canonical_domain(node.domain)
    try:
        schema = defs.get_schema(node.op_type, opset, domain)
    except Exception:  # noqa: BLE001 - unknown op: no schema, no body
        return None
    fn = None
    if schema.has_function:
        try:
            fn = schema.get_function_with_opset_version(opset) or schema.function_body
        except Exception:  # noqa: BLE001
            fn = schema.function_body
    if isinstance(fn, bytes):
        fn = _parse_function(fn)
    if (fn is None or not fn.node) and schema.has_context_dependent_function:
        in_types = []
        for name in node.input:
            tp = value_types.get(name) if name else None
            if name and tp is None:
                return None
            in_types.append(tp.SerializeToString() if tp is not None else onnx.TypeProto().SerializeToString())
        try:
            raw = schema.get_context_dependent_function_with_opset_version(opset, node.SerializeToString(), in_types)
        except Exception:  # noqa: BLE001
            try:
                raw = schema.get_context_dependent_function(node.SerializeToString(), in_types)
            except Exception:  # noqa: BLE001
                return None
        fn = _parse_function(raw) if isinstance(raw, bytes) else raw
    if fn is None or not fn.node:
        return None
    return _inline(node, fn, schema), {canonical_domain(o.domain): o.version for o in fn.opset_import}


def _parse_function(raw: bytes) -> onnx.FunctionProto:
    fn = onnx.FunctionProto()
    fn.ParseFromString(raw)
    return fn


def _inline(node: onnx.NodeProto, fn: onnx.FunctionProto, schema: defs.OpSchema) -> list[onnx.NodeProto]:
    prefix = f"{node.name or node.op_type}__fn{next(_uid)}/"
    rename: dict[str, str] = {}
    for formal, actual in zip(fn.input, node.input):
        rename[formal] = actual
    for formal in fn.input[len(node.input):]:
        rename[formal] = ""
    for formal, actual in zip(fn.output, node.output):
        rename[formal] = actual
    given = {a.name: a for a in node.attribute}
    defaults = {a.name: a for a in fn.attribute_proto}
    for name, attr in schema.attributes.items():  # the schema's defaults, for attributes the node omits
        dv = attr.default_value
        if name not in defaults and dv is not None and dv.type != onnx.AttributeProto.UNDEFINED:
            defaults[name] = dv
    out = []
    for i, body in enumerate(fn.node):
        n = onnx.NodeProto()
        n.CopyFrom(body)
        n.name = f"{prefix}{body.name or body.op_type}_{i}"
        n.input[:] = [_rn(x, rename, prefix) for x in body.input]
        n.output[:] = [_rn(x, rename, prefix) for x in body.output]
        attrs = []
        for a in body.attribute:
            if a.ref_attr_name:
                src = given.get(a.ref_attr_name) or defaults.get(a.ref_attr_name)
                if src is None:
                    continue
                b = onnx.AttributeProto()
                b.CopyFrom(src)
                b.name = a.name
                attrs.append(b)
            else:
                attrs.append(a)
        del n.attribute[:]
        n.attribute.extend(attrs)
        out.append(n)
    return out


def _rn(name: str, rename: dict[str, str], prefix: str) -> str:
    if not name:
        return ""
    if name in rename:
        return rename[name]
    return prefix + name
