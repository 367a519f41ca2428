"""Execution providers: names, aliases, availability, and parsing of the ``providers`` argument."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from crossml.device.adapter import adapters, backend_vendor
from crossml.device.select import GpuConfig, parse_gpu_options
from crossml.runtime.errors import InvalidArgument

CPU_EP = "CPUExecutionProvider"
GPU_EP = "GPUExecutionProvider"
#: onnxruntime provider names that crossml's GPU provider answers to.
GPU_ALIASES = ("GPUExecutionProvider", "CUDAExecutionProvider", "ROCMExecutionProvider",
               "DmlExecutionProvider", "MIGraphXExecutionProvider", "TensorrtExecutionProvider",
               "OpenVINOExecutionProvider", "CoreMLExecutionProvider")
_VENDOR_ALIAS = {"nvidia": "CUDAExecutionProvider", "amd": "ROCMExecutionProvider"}


def get_all_providers() -> list[str]:
    """Every provider name crossml knows (onnxruntime.get_all_providers)."""
    return [GPU_EP, "CUDAExecutionProvider", "ROCMExecutionProvider", "DmlExecutionProvider", CPU_EP]


def gpu_available() -> bool:
    return bool(adapters())


def get_available_providers() -> list[str]:
    """Providers that work on this machine, in default priority order."""
    out = []
    if gpu_available():
        out.append(GPU_EP)
        alias = _VENDOR_ALIAS.get(backend_vendor() or "")
        if alias:
            out.append(alias)
        out.append("DmlExecutionProvider")
    out.append(CPU_EP)
    return out


def get_device() -> str:
    """onnxruntime.get_device(): ``GPU`` when a GPU provider works here, else ``CPU``."""
    return "GPU" if gpu_available() else "CPU"


@dataclass
class ProviderChoice:
    name: str  # as the user spelled it
    kind: str  # "cpu" or "gpu"
    options: dict[str, str] = field(default_factory=dict)
    config: GpuConfig | None = None  # validated GPU options and the chosen adapter

    def applied_options(self) -> dict[str, str]:
        return self.config.options() if self.config is not None else dict(self.options)


def default_providers() -> list[str]:
    """The providers of a session given none: the GPU provider, then the CPU's, where torch sees a GPU; else the CPU's.
    (The test suite's unmarked tests, written for the CPU, patch it to the CPU's alone on GPU machines.)"""
    return [GPU_EP, CPU_EP] if gpu_available() else [CPU_EP]


def parse_providers(providers: Sequence[Any] | None, provider_options: Sequence[dict] | None) -> list[ProviderChoice]:
    """Normalise onnxruntime's ``providers`` / ``provider_options`` arguments.

    Accepts names or ``(name, options)`` tuples. A GPU provider requested on a machine without a
    GPU is skipped with a warning (as onnxruntime does); the CPU provider is always appended last.
    """
    if providers is None:
        names: list[Any] = default_providers()
    else:
        names = list(providers)
    if provider_options is not None:
        if len(provider_options) != len(names):
            raise ValueError("'providers' and 'provider_options' should be the same length if both are given.")
        if any(isinstance(p, tuple) for p in names):
            raise ValueError("Only one of 'providers' and 'provider_options' can contain options.")
        names = list(zip(names, provider_options))
    out: list[ProviderChoice] = []
    for entry in names:
        if isinstance(entry, (tuple, list)):
            if len(entry) != 2 or not isinstance(entry[1], dict):
                raise ValueError(f"provider entry {entry!r} must be a name or a (name, options dict) tuple")
            name, opts = entry
        else:
            name, opts = entry, {}
        if not isinstance(name, str):
            raise ValueError(f"provider names are strings, got {name!r}")
        opts = {str(k): str(v) for k, v in opts.items()}
        if name == CPU_EP:
            out.append(ProviderChoice(name, "cpu", opts))
        elif name in GPU_ALIASES:
            if not gpu_available():
                warnings.warn(
                    f"Specified provider '{name}' is not in available provider names. "
                    f"Available providers: '{', '.join(get_available_providers())}'",
                    stacklevel=3,
                )
                continue
            out.append(ProviderChoice(name, "gpu", opts, parse_gpu_options(opts, name)))
        else:
            raise InvalidArgument(
                f"Unknown execution provider '{name}'. Known providers: {', '.join(get_all_providers())}"
            )
    if not any(p.kind == "cpu" for p in out):
        out.append(ProviderChoice(CPU_EP, "cpu", {}))
    return out


def resolve_device(choices: list[ProviderChoice]) -> torch.device:
    """The torch device of the highest-priority provider."""
    first = choices[0]
    return first.config.adapter.device if first.config is not None else torch.device("cpu")


__all__ = ["get_all_providers", "get_available_providers", "get_device", "parse_providers", "torch"]
