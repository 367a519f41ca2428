"""One-node ONNX models for op tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from crossml import dtypes


def one_node_model(op_type: str, inputs: dict[str, np.ndarray | None], opset: int, n_out: int = 1,
                   ir_version: int | None = None, **attrs: object) -> onnx.ModelProto:
    """A model of one ``op_type`` node; a None input is an omitted optional input (trailing ones dropped)."""
    while inputs and list(inputs.values())[-1] is None:
        inputs = dict(list(inputs.items())[:-1])
    ins = [helper.make_tensor_value_info(k, dtypes.onnx_type_of_numpy(v.dtype), v.shape)
           for k, v in inputs.items() if v is not None]
    node = helper.make_node(op_type, [k if v is not None else "" for k, v in inputs.items()],
                            [f"y{i}" for i in range(n_out)], **attrs)
    outs = [onnx.ValueInfoProto(name=f"y{i}") for i in range(n_out)]
    m = helper.make_model(helper.make_graph([node], "g", ins, outs), opset_imports=[helper.make_opsetid("", opset)])
    if ir_version is not None:
        m.ir_version = ir_version
    return m
