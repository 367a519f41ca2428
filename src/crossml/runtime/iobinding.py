"""IOBinding: bind inputs and outputs (host or device memory) to a session before running it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from crossml import dtypes
from crossml.device.interop import tensor_from_pointer
from crossml.device.recording import same_view
from crossml.runtime.errors import InvalidArgument
from crossml.runtime.ortvalue import OrtValue, _elem_type, torch_device


class IOBinding:
    """onnxruntime.IOBinding. Outputs bound to a device stay there; outputs bound to a buffer are
    written into that buffer.

    On a GPU session with graph capture, the first run of a set of input bindings replays the shapes'
    recording (which copies the inputs in); from the second run on with the same bindings, a recording of
    its own reads the bound device tensors in place. Binding other memory to an input starts over, so bindings
    that change every run never record again (rebinding the same pointer does not count). Outputs bound to buffers are copied straight into them."""

    def __init__(self, session: Any) -> None:
        self._session = session
        self._runs_since_bind = 0  # runs since an input binding last changed
        self._inputs: dict[str, Any] = {}
        self._outputs: dict[str, tuple[torch.device | None, OrtValue | None]] = {}
        self._results: list[OrtValue] = []

    # -- inputs -------------------------------------------------------------------------
    def bind_cpu_input(self, name: str, arr_on_cpu: np.ndarray) -> None:
        self._check_input(name)
        self._set_input(name, OrtValue.ortvalue_from_numpy(np.asarray(arr_on_cpu)))

    def bind_input(self, name: str, device_type: str, device_id: int, element_type: Any,
                   shape: Sequence[int], buffer_ptr: int) -> None:
        self._check_input(name)
        et = _elem_type(element_type)
        dev = torch_device(device_type, device_id)
        t = tensor_from_pointer(buffer_ptr, shape, dtypes.torch_dtype(et), dev)
        self._set_input(name, OrtValue(t, et))

    def bind_ortvalue_input(self, name: str, ortvalue: OrtValue) -> None:
        self._check_input(name)
        self._set_input(name, ortvalue)

    def _set_input(self, name: str, value: OrtValue) -> None:
        """Bind ``value``; binding the same device memory again (the same pointer, shape and strides, as
        loops that rebind before every run do) keeps the bindings stable."""
        old = self._inputs.get(name)
        self._inputs[name] = value
        if old is None or not _same_memory(old._value, value._value):
            self._runs_since_bind = 0

    def clear_binding_inputs(self) -> None:
        self._inputs.clear()
        self._runs_since_bind = 0

    def synchronize_inputs(self) -> None:
        _sync_all(v._value for v in self._inputs.values())

    # -- outputs ------------------------------------------------------------------------
    def bind_output(self, name: str, device_type: str = "cpu", device_id: int = 0, element_type: Any = None,
                    shape: Sequence[int] | None = None, buffer_ptr: int | None = None) -> None:
        self._check_output(name)
        dev = torch_device(device_type, device_id)
        if buffer_ptr is not None:
            if element_type is None or shape is None:
                raise InvalidArgument(f"bind_output('{name}') with buffer_ptr needs element_type and shape")
            et = _elem_type(element_type)
            t = tensor_from_pointer(buffer_ptr, shape, dtypes.torch_dtype(et), dev)
            self._outputs[name] = (dev, OrtValue(t, et))
        else:
            self._outputs[name] = (dev, None)

    def bind_ortvalue_output(self, name: str, ortvalue: OrtValue) -> None:
        self._check_output(name)
        self._outputs[name] = (None, ortvalue)

    def clear_binding_outputs(self) -> None:
        self._outputs.clear()

    def synchronize_outputs(self) -> None:
        _sync_all(v._value for v in self._results)

    def get_outputs(self) -> list[OrtValue]:
        return list(self._results)

    def copy_outputs_to_cpu(self) -> list[Any]:
        return [v.numpy() if v.is_tensor() else v._value for v in self._results]

    def get_outputs_names(self) -> list[str]:
        return list(self._outputs)

    # -- running ------------------------------------------------------------------------
    def _run(self, session: Any, run_options: Any) -> None:
        if not self._outputs:
            raise InvalidArgument("IOBinding has no outputs bound; call bind_output for each output to fetch")
        names = list(self._outputs)
        idx = session._output_indices(names)
        into: list[torch.Tensor | None] = [None] * len(session._outputs)
        for name, i in zip(names, idx):
            bound = self._outputs[name][1]
            if bound is not None and isinstance(bound._value, torch.Tensor):
                into[i] = bound._value
        outs = session._run(self._inputs, run_options, stable=self._runs_since_bind > 0, into=into)
        self._runs_since_bind += 1
        results = []
        for name, i in zip(names, idx):
            value = outs[i]
            dev, bound = self._outputs[name]
            et = bound.element_type() if bound is not None else _elem_from(session, i)
            if bound is not None:
                target = bound._value
                if not isinstance(value, torch.Tensor) or tuple(target.shape) != tuple(value.shape):
                    raise InvalidArgument(
                        f"output '{name}' has shape {tuple(getattr(value, 'shape', ()))} but the bound buffer "
                        f"has shape {tuple(target.shape)}"
                    )
                if value is not target:  # (a recording copies into the bound buffer itself)
                    target.copy_(value)
                results.append(bound)
            else:
                if isinstance(value, torch.Tensor) and dev is not None and value.device != dev:
                    value = value.to(dev)
                results.append(OrtValue(value, et))
        self._results = results

    def _check_input(self, name: str) -> None:
        if name not in self._session._input_by_name:
            raise InvalidArgument(f"Invalid input name: {name}")

    def _check_output(self, name: str) -> None:
        if name not in self._session._output_index:
            raise InvalidArgument(f"Invalid output name: {name}")


def _elem_from(session: Any, i: int) -> int | None:
    tp = session._outputs[i]._tp
    return tp.tensor_type.elem_type if tp is not None and tp.HasField("tensor_type") else None


def _same_memory(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are the same elements of the same device memory (``recording.same_view``)."""
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.device == b.device
            and a.device.type != "cpu" and same_view(a, b))


def _sync_all(values: Any) -> None:
    if any(isinstance(v, torch.Tensor) and v.device.type != "cpu" for v in values):
        torch.accelerator.synchronize()
