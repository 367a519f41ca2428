"""Operators for fixed tensor descriptions: create, compile, initialize, dispatch (DirectML's model).

Any op of crossml's library can be made an operator: its input descriptions, attributes and
constant inputs (shapes, axes, ...) are fixed at creation; output descriptions are inferred.
``compile`` fixes which inputs are persistent; ``initialize`` uploads them (weights) once, pre-packed as
session plans pack them (``ops.layout``: channels-last convolution weights, column-major fp32 matrix
weights on a GPU); ``dispatch`` runs it on a queue for a binding of tensors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import torch
from onnx import helper

from crossml import dtypes
from crossml.device.queue import Queue
from crossml.device.tensor import DeviceTensor, TensorDesc
from crossml.ops import OpContext, load_all, lookup
from crossml.ops.layout import pack_weight, weight_layout
from crossml.ops.registry import canonical_domain
from crossml.runtime.errors import InvalidArgument
from crossml.runtime.errors import NotImplemented as OrtNotImplemented

DEFAULT_OPSET = onnx.defs.onnx_opset_version()


class Operator:
    """An op of the library bound to fixed input descriptions, attributes and constant inputs."""

    def __init__(self, device: torch.device, op_type: str, inputs: Sequence[TensorDesc | None],
                 attributes: Mapping[str, Any] | None = None, constants: Mapping[int, Any] | None = None,
                 domain: str = "", opset: int | None = None, num_outputs: int | None = None) -> None:
        load_all()
        self.device = device
        self.op_type = op_type
        self.domain = canonical_domain(domain)
        self.opset = opset or (DEFAULT_OPSET if self.domain == "" else 1)
        spec = lookup(self.domain, op_type, self.opset)
        if spec is None:
            raise OrtNotImplemented(f"no operator {self.domain or 'ai.onnx'}:{op_type} at opset {self.opset} in crossml")
        self.spec = spec
        self.attributes = dict(attributes or {})
        if spec.attr_names is not None:
            unknown = sorted(set(self.attributes) - spec.attr_names)
            if unknown:
                raise InvalidArgument(f"{op_type}: unknown attribute(s) {unknown}; accepted: {sorted(spec.attr_names)}")
        self.constants = {int(i): _host(v) for i, v in (constants or {}).items()}
        self.input_descs = list(inputs)
        for i in self.constants:
            if i >= len(self.input_descs):
                self.input_descs.extend([None] * (i + 1 - len(self.input_descs)))
        self.output_descs = self._infer_outputs(num_outputs)

    def _infer_outputs(self, num_outputs: int | None) -> list[TensorDesc]:
        """Output descriptions by running the op once on zero inputs of the described shapes."""
        args = []
        for i, d in enumerate(self.input_descs):
            if i in self.constants:
                args.append(self.constants[i])
            elif d is None:
                args.append(None)
            else:
                args.append(torch.zeros(d.sizes, dtype=d.dtype))
        kw = dict(self.attributes)
        n = num_outputs or _declared_outputs(self.op_type, self.domain, self.opset)
        if self.spec.wants_ctx:
            kw["ctx"] = OpContext(node_name=self.op_type, op_type=self.op_type, opset=self.opset, num_outputs=n,
                                  output_types=(None,) * n, outputs_wanted=(True,) * n, device=torch.device("cpu"))
        try:
            out = self.spec.fn(*args, **kw)
        except Exception as exc:  # noqa: BLE001 - report the op and the descriptions
            descs = ", ".join(str(d) for d in self.input_descs)
            raise InvalidArgument(f"{self.op_type} cannot run on inputs ({descs}) with {self.attributes}: {exc}") from None
        outs = out if isinstance(out, tuple) else (out,)
        return [TensorDesc.of(o) for o in outs[:n] if isinstance(o, torch.Tensor)]

    def compile(self, persistent: Sequence[int] = ()) -> CompiledOperator:
        """Fix the kernel and layout. ``persistent``: input positions given once by ``initialize``."""
        return CompiledOperator(self, tuple(persistent))


class CompiledOperator:
    """A compiled operator: ``initialize`` persistent inputs once, then ``dispatch`` any number of times."""

    def __init__(self, op: Operator, persistent: tuple[int, ...]) -> None:
        self.op = op
        self.persistent = persistent
        self._persistent_values: dict[int, torch.Tensor] = {}
        self.bound_inputs = [i for i, d in enumerate(op.input_descs)
                             if d is not None and i not in persistent and i not in op.constants]

    @property
    def input_descs(self) -> list[TensorDesc]:
        """Descriptions of the inputs ``dispatch`` takes, in order."""
        return [self.op.input_descs[i] for i in self.bound_inputs]

    @property
    def output_descs(self) -> list[TensorDesc]:
        return self.op.output_descs

    def initialize(self, *values: Any) -> None:
        """Upload the persistent inputs (in ``persistent`` order), pre-packed for the device."""
        if len(values) != len(self.persistent):
            raise InvalidArgument(f"{self.op.op_type}: initialize takes {len(self.persistent)} persistent "
                                  f"input(s) (positions {list(self.persistent)}), got {len(values)}")
        for i, v in zip(self.persistent, values):
            t = v.torch if isinstance(v, DeviceTensor) else _to_tensor(v)
            self.op.input_descs[i].check(t, f"{self.op.op_type} persistent input {i}")
            t = t.to(self.op.device)
            layout = None if i != 1 else weight_layout(self.op.domain, self.op.op_type, t, self.op.device,
                                                       self.op.attributes, tf32=torch.backends.cuda.matmul.allow_tf32)
            if layout is not None:
                t = pack_weight(t, layout)
            self._persistent_values[i] = t

    def dispatch(self, queue: Queue, inputs: Sequence[Any], outputs: Sequence[DeviceTensor] | None = None) -> list[DeviceTensor]:
        """Run on ``queue``. Results are written into ``outputs`` when given, else into new tensors."""
        op = self.op
        if len(self._persistent_values) != len(self.persistent):
            raise InvalidArgument(f"{op.op_type}: call initialize() with the persistent inputs before dispatch")
        if len(inputs) != len(self.bound_inputs):
            raise InvalidArgument(f"{op.op_type}: dispatch expects {len(self.bound_inputs)} input(s) "
                                  f"({', '.join(str(d) for d in self.input_descs)}), got {len(inputs)}")
        args: list[Any] = [None] * len(op.input_descs)
        for i, c in op.constants.items():
            args[i] = c
        for i, v in self._persistent_values.items():
            args[i] = v
        for i, x in zip(self.bound_inputs, inputs):
            t = x.torch if isinstance(x, DeviceTensor) else x
            op.input_descs[i].check(t, f"{op.op_type} input {i}")
            if t.device != op.device:
                raise InvalidArgument(f"{op.op_type} input {i} is on {t.device}, the operator runs on {op.device}")
            args[i] = t
        if outputs is not None:
            if len(outputs) != len(op.output_descs):
                raise InvalidArgument(f"{op.op_type}: {len(op.output_descs)} output(s) to bind, got {len(outputs)}")
            for j, (o, d) in enumerate(zip(outputs, op.output_descs)):
                d.check(o.torch, f"{op.op_type} output {j}")
        kw = dict(op.attributes)
        if op.spec.wants_ctx:
            n = len(op.output_descs)
            kw["ctx"] = OpContext(node_name=op.op_type, op_type=op.op_type, opset=op.opset, num_outputs=n,
                                  output_types=(None,) * n, outputs_wanted=(True,) * n, device=op.device)
        with queue.active():
            res = op.spec.fn(*args, **kw)
            res = res if isinstance(res, tuple) else (res,)
            if outputs is None:
                return [DeviceTensor(r) for r in res[: len(op.output_descs)]]
            for o, r in zip(outputs, res):
                o.torch.copy_(r)
        return list(outputs)


def _declared_outputs(op_type: str, domain: str, opset: int) -> int:
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except Exception:  # noqa: BLE001 - custom ops: one output unless told
        return 1
    return max(1, sum(1 for o in schema.outputs if o.option != onnx.defs.OpSchema.FormalParameterOption.Optional))


def _host(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return v.cpu()
    if isinstance(v, (list, tuple)):
        return torch.tensor(v, dtype=torch.int64)
    return dtypes.from_numpy(np.asarray(v))


def _to_tensor(v: Any) -> torch.Tensor:
    if isinstance(v, torch.Tensor):
        return v
    return dtypes.from_numpy(np.asarray(v))


__all__ = ["Operator", "CompiledOperator", "helper"]
