"""og.Adapters and og.NamedTensors, as in onnxruntime-genai 0.18.

``Adapters(model)`` holds LoRA adapter files (onnxruntime's ``.onnx_adapter`` format, see
``crossml.runtime.adapters``) loaded for one model, by name; ``Generator.set_active_adapter(adapters,
name)`` feeds an adapter's parameters to every later run of that generator, as the decoder inputs
of the same names (usually overridable initializers: LoRA A/B matrices whose default is empty or zero).
A loaded adapter is uploaded to the model's device once and shared by the generators using it; it
cannot be unloaded while one of them lives.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np

from crossml.genai.errors import GenAIError, NameNotFoundError
from crossml.genai.tokenizer import Tensor
from crossml.runtime.adapters import LoraAdapter


class Adapters:
    """og.Adapters(model): LoRA adapters loaded for ``model``, by name."""

    def __init__(self, model: Any) -> None:
        from crossml.genai.model import Model

        if not isinstance(model, Model):
            raise TypeError(f"Adapters(model): expected an og.Model, got {type(model).__name__}")
        self._model = model
        self._loaded: dict[str, LoraAdapter] = {}
        self._users: dict[str, int] = {}
        self._lock = threading.Lock()

    def load(self, adapter_file_path: str | os.PathLike[str], adapter_name: str) -> None:
        """Load (memory-map) an adapter file under ``adapter_name``."""
        with self._lock:
            if adapter_name in self._loaded:
                raise GenAIError(f"Adapter already loaded: {adapter_name} (unload it first, or pick another name)")
        adapter = LoraAdapter()
        adapter.Load(adapter_file_path)
        with self._lock:
            if adapter_name in self._loaded:
                raise GenAIError(f"Adapter already loaded: {adapter_name} (unload it first, or pick another name)")
            self._loaded[adapter_name] = adapter
            self._users[adapter_name] = 0

    def unload(self, adapter_name: str) -> None:
        """Forget an adapter; refused while a generator that activated it lives."""
        with self._lock:
            self._find(adapter_name)
            if self._users[adapter_name]:
                raise GenAIError(f"Adapter still in use: {adapter_name} (active in {self._users[adapter_name]} "
                                 "generator(s); delete them first)")
            del self._loaded[adapter_name], self._users[adapter_name]

    def _find(self, name: str) -> LoraAdapter:
        adapter = self._loaded.get(name)
        if adapter is None:
            loaded = ", ".join(self._loaded) or "none"
            raise GenAIError(f"Adapter not found: {name} (loaded: {loaded}; Adapters.load(path, name) first)")
        return adapter

    def _acquire(self, name: str) -> LoraAdapter:
        with self._lock:
            adapter = self._find(name)
            self._users[name] += 1
            return adapter

    def _release(self, name: str) -> None:
        with self._lock:
            if name in self._users:
                self._users[name] -= 1


class NamedTensors:
    """og.NamedTensors: name -> og.Tensor, for ``Generator.set_inputs``."""

    def __init__(self) -> None:
        self._items: dict[str, Tensor] = {}

    def __setitem__(self, name: str, value: Any) -> None:
        self._items[str(name)] = value if isinstance(value, Tensor) else Tensor(np.asarray(value))

    def __getitem__(self, name: str) -> Tensor:
        if name not in self._items:
            raise NameNotFoundError(f"NamedTensors: no tensor named '{name}'; names: {', '.join(self._items) or 'none'}")
        return self._items[name]

    def __delitem__(self, name: str) -> None:
        self[name]  # noqa: B018 - the clear error for an unknown name
        del self._items[name]

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __len__(self) -> int:
        return len(self._items)

    def keys(self) -> list[str]:
        return list(self._items)
