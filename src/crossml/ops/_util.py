"""Helpers shared by the op modules: host values, axes, and dtypes torch handles partially."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from crossml.kernels import TRITON_DEVICES, load, load_compiled

#: unsigned types whose arithmetic torch only partly implements; ops compute in a wider signed type.
WIDEN = {torch.uint16: torch.int32, torch.uint32: torch.int64}


def ints(t: Any) -> list[int]:
    """A host tensor / list / scalar of integers as a Python list (host inputs: shapes, axes...)."""
    if t is None:
        return []
    if isinstance(t, torch.Tensor):
        vals = t.tolist() if t.dim() == 1 else t.reshape(-1).tolist()  # (a 1-D tensor's tolist: no reshape's ~3 us)
        return vals if not (t.is_floating_point() or t.dtype == torch.bool) else [int(v) for v in vals]
    if isinstance(t, np.ndarray):
        return [int(v) for v in t.reshape(-1).tolist()]
    if isinstance(t, (list, tuple)):
        return [int(v) for v in t]
    return [int(t)]


def scalar(t: Any) -> Any:
    """A one-element host tensor as a Python number."""
    if isinstance(t, torch.Tensor):
        return t.reshape(-1)[0].item()
    if isinstance(t, np.ndarray):
        return t.reshape(-1)[0].item()
    return t


def broadcast_shapes(*shapes: Sequence[int]) -> torch.Size:
    """``torch.broadcast_shapes`` (same result, RuntimeError on shapes that do not broadcast) in plain Python:
    torch's first call imports its symbolic-shape machinery and sympy, which took 3.5 s of a GenAI model's first
    prompt on the GPU machine."""
    ndim = max((len(s) for s in shapes), default=0)
    out = [1] * ndim
    for shape in shapes:
        for i, d in enumerate(shape, ndim - len(shape)):
            d = int(d)
            if d == 1 or d == out[i]:
                continue
            if out[i] != 1:
                raise RuntimeError(f"Shape mismatch: objects cannot be broadcast to a single shape: "
                                   f"{[tuple(s) for s in shapes]}")
            out[i] = d
    return torch.Size(out)


def norm_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"axis {axis} is out of range for a tensor of rank {rank}")
    return axis + rank if axis < 0 else axis


def norm_axes(axes: Sequence[int], rank: int) -> list[int]:
    return [norm_axis(a, rank) for a in axes]


def widened(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """Run ``fn`` on uint16/uint32 inputs as int32/int64 and cast the result back.

    uint64 arithmetic that wraps (add, sub, mul) is done in int64 bit patterns, which is exact.
    """

    def wrapper(*args: Any, **kw: Any) -> Any:
        dt = next((a.dtype for a in args if isinstance(a, torch.Tensor)), None)
        if dt in WIDEN:
            wide = WIDEN[dt]
            args = tuple(a.to(wide) if isinstance(a, torch.Tensor) and a.dtype == dt else a for a in args)
            out = fn(*args, **kw)
            return out.to(dt) if isinstance(out, torch.Tensor) and out.dtype == wide else out
        if dt == torch.uint64:
            args = tuple(a.view(torch.int64) if isinstance(a, torch.Tensor) and a.dtype == dt else a for a in args)
            out = fn(*args, **kw)
            return out.view(torch.uint64) if isinstance(out, torch.Tensor) and out.dtype == torch.int64 else out
        return fn(*args, **kw)

    wrapper.__name__ = getattr(fn, "__name__", "widened")
    wrapper.__doc__ = fn.__doc__
    return wrapper


def via_numpy(fn: Callable[..., np.ndarray], *args: torch.Tensor, device: torch.device | None = None) -> torch.Tensor:
    """Compute with numpy (for dtypes torch lacks kernels for) and return a tensor on the input's device."""
    dev = device or next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
    arrs = [a.cpu().numpy() if isinstance(a, torch.Tensor) else a for a in args]
    out = np.asarray(fn(*arrs))
    return torch.from_numpy(np.ascontiguousarray(out)).to(dev)


def is_float(t: torch.Tensor) -> bool:
    return t.dtype.is_floating_point or t.dtype.is_complex


#: CROSSML_CUDNN_SDPA=1 leaves torch free to pick its cuDNN attention backend (for A/B measurements)
_CUDNN_SDPA = os.environ.get("CROSSML_CUDNN_SDPA", "0") == "1"
#: held while torch's process-wide cuDNN attention switch is off for one call
_SDPA_SWITCH = threading.Lock()


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """``torch.nn.functional.scaled_dot_product_attention`` without torch's cuDNN backend on CUDA devices.

    torch prefers cuDNN's attention on Hopper GPUs, and cuDNN builds an execution plan for every new query / key
    length on the host before the first call of that shape runs: 45-65 ms on an H200 host, against 2-4 ms of GPU
    work for a whole 100-token continuation of the GenAI benchmark's Qwen2.5-0.5B model (its 24 SDPA calls share
    one plan). A generator's every continuation prompt and every new prompt width meet a new shape, so that plan
    was most of their time. Flash and memory-efficient attention plan nothing per shape. Switching cuDNN off is
    process-wide in torch, so the switch is taken under a lock (calls from several threads wait for each other
    only on the host) and put back after the call; where the user already switched cuDNN attention off, or
    CROSSML_CUDNN_SDPA=1, the call goes to torch as it is."""
    sdp = F.scaled_dot_product_attention
    if q.device.type != "cuda" or _CUDNN_SDPA or not torch.backends.cuda.cudnn_sdp_enabled():
        return sdp(q, k, v, **kwargs)
    with _SDPA_SWITCH:
        torch.backends.cuda.enable_cudnn_sdp(False)
        try:
            return sdp(q, k, v, **kwargs)
        finally:
            torch.backends.cuda.enable_cudnn_sdp(True)


def sdpa_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: int,
               masked: bool) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """(k, v, enable_gqa) for ``sdpa`` of ``groups`` query heads per key/value head. Of torch's fused CUDA kernels
    only flash attention (fp16 / bf16, no mask) broadcasts key/value heads over their query groups; with a mask or
    in float32 ``enable_gqa`` sends the call to the math backend, which holds every score. There the heads are
    repeated for their groups instead, so the memory-efficient kernel takes the call; elsewhere SDPA's
    ``enable_gqa`` broadcasts them. On an H200 (32 query heads over 8, head size 64;
    benchmarks/attention_gqa.py): fp16 with a boolean mask, 512 tokens 294 -> 125 us, 2048 tokens 2731 -> 465 us;
    fp32 2048 tokens 2396 -> 1277 us masked, 2382 -> 703 us causal."""
    if groups == 1:
        return k, v, False
    if q.device.type == "cuda" and (masked or q.dtype not in (torch.float16, torch.bfloat16)):
        return k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1), False
    return k, v, True


def window_past(past: torch.Tensor | None, window: int, name: str, shape: str, rank: int | None = None
                ) -> torch.Tensor | None:
    """The past state a stateful op (com.microsoft CausalConvWithState, LinearAttention) reads with ``state_window``
    = W (checked within [0, 8]): slot W - 1 of the leading window axis when W > 0, else ``past`` itself. ``shape``
    names one slot's layout in errors; ``rank``, where given, is the windowed past's required rank."""
    if not 0 <= window <= 8:
        raise ValueError(f"{name}: state_window must be within [0, 8], got {window}")
    if past is None or not window:
        return past
    if past.dim() < 1 or past.shape[0] != window or (rank is not None and past.dim() != rank):
        raise ValueError(f"{name}: with state_window={window} past_state must be (W, {shape}) with W = {window}, got "
                         f"shape {tuple(past.shape)}")
    return past[window - 1]


def window_slots(window: int, length: int, after: Callable[[int], torch.Tensor], zeros: torch.Tensor
                 ) -> list[torch.Tensor]:
    """The ``state_window`` slots of a stateful op's present state after a call on ``length`` positions: slot j is
    the state after position length - W + j, ``after(n)`` the state after the call's first n positions; slots before
    the call's first position are ``zeros``."""
    return [after(length - window + j + 1) if length - window + j >= 0 else zeros for j in range(window)]


#: on a Triton device the ops that ask ``gpu_kernels`` run their Triton kernels (the Gated DeltaNet layers' ops:
#: LinearAttention, CausalConvWithState, LpNormalization, GatedRMSNorm, LinearAttentionGate, and MRotaryEmbedding);
#: False keeps their torch paths (an A/B setting for the benchmarks)
GPU_KERNELS = True
_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def inplace_target(past: torch.Tensor | None, allowed: bool, dtype: torch.dtype | None = None) -> torch.Tensor | None:
    """The past state a state op's kernel writes its present into (the GenAI static buffers: the session marks the
    op ``kv_inplace``), returned as the present: ``past`` where ``allowed``, contiguous and, with ``dtype``, of that
    dtype; else None (the kernel makes a new tensor)."""
    if not allowed or past is None or not past.is_contiguous() or (dtype is not None and past.dtype != dtype):
        return None
    return past


def gpu_kernels(name: str, *tensors: torch.Tensor | None) -> ModuleType | None:
    """``crossml.kernels.<name>`` (compiled, not interpreted) where the given tensors (None skipped; the first is the
    op's input) are float16 / bfloat16 / float32 tensors on one Triton device and GPU_KERNELS is on; else None."""
    ts = [t for t in tensors if t is not None]
    first = ts[0]
    if (not GPU_KERNELS or first.device.type not in TRITON_DEVICES
            or not all(t.device == first.device and t.dtype in _FLOATS for t in ts)):
        return None
    return load_compiled(name)


def cpu_kernels(name: str, *tensors: torch.Tensor | None) -> ModuleType | None:
    """numba's ``crossml.kernels.<name>`` where the given tensors (None skipped) are float32 CPU tensors; else None
    (also where numba is not installed)."""
    if not all(t is None or (t.device.type == "cpu" and t.dtype == torch.float32) for t in tensors):
        return None
    return load(name)
