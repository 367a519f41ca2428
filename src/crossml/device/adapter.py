"""Adapters: the machine's accelerators, as torch reaches them (CUDA, ROCm, XPU, MPS).

Every vendor-specific line of crossml lives under ``crossml.device``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

VENDOR_IDS = {"nvidia": 0x10DE, "amd": 0x1002, "intel": 0x8086, "apple": 0x106B}


@dataclass(frozen=True)
class Adapter:
    index: int
    name: str
    vendor: str
    vendor_id: int
    backend: str  # torch device type: cuda, xpu, mps
    memory_bytes: int
    compute_units: int
    integrated: bool

    @property
    def device(self) -> torch.device:
        return torch.device(self.backend, self.index)


def accelerator_type() -> str | None:
    """torch's accelerator device type on this machine (``cuda`` for NVIDIA and ROCm), or None."""
    acc = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    return acc.type if acc is not None else None


def backend_vendor() -> str | None:
    t = accelerator_type()
    if t == "cuda":
        return "amd" if torch.version.hip else "nvidia"
    if t == "xpu":
        return "intel"
    if t == "mps":
        return "apple"
    return None


def adapters() -> list[Adapter]:
    """The accelerators torch can use, in device-index order."""
    t = accelerator_type()
    if t is None:
        return []
    vendor = backend_vendor() or "unknown"
    out = []
    for i in range(torch.accelerator.device_count()):
        name, mem, units, integrated = t, 0, 0, False
        if t == "cuda":
            p = torch.cuda.get_device_properties(i)
            name, mem, units, integrated = p.name, p.total_memory, p.multi_processor_count, bool(p.is_integrated)
        elif t == "xpu":
            p = torch.xpu.get_device_properties(i)
            name, mem = p.name, p.total_memory
            units = getattr(p, "gpu_eu_count", 0)
        elif t == "mps":
            name, integrated = "Apple GPU", True
        out.append(Adapter(i, name, vendor, VENDOR_IDS.get(vendor, 0), t, mem, units, integrated))
    return out


def set_current_device(index: int) -> None:
    """Make accelerator ``index`` torch's current device (no-op without an accelerator)."""
    if accelerator_type() is not None:
        torch.accelerator.set_device_index(int(index))


def current_device_index() -> int:
    """torch's current accelerator index (0 without an accelerator)."""
    return torch.accelerator.current_device_index() if accelerator_type() is not None else 0
