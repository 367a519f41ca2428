"""What the Triton kernels share: the two ways to run a kernel, the TF32 decision, dtype checks, PDL launches and
the store of a product's tile (``store_tile``).

A kernel is compiled for GPU tensors (``triton.jit``, autotuned). With ``TRITON_INTERPRET=1`` set
before triton is first imported, Triton's interpreter runs every kernel instead (numpy on the
host, CPU tensors included), so the kernels are testable on a CPU; it is slow, so interpreted
launches use one small fixed tile instead of autotuning.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import triton
import triton.language as tl

try:  # grid dependency control (NVIDIA sm90+); absent from some Triton builds
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - such builds never launch with PDL (see pdl)
    gdc_launch_dependents = gdc_wait = None

#: dtypes the kernels compute (fp32 accumulation; fp64 accumulates in fp64).
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
#: grid dimensions 1 and 2 are limited to 65535 programs on CUDA.
GRID_YZ_MAX = 65535


def _is_interpreted(fn: object) -> bool:
    return type(fn).__name__ == "InterpretedFunction"


def _probe() -> None:
    pass


#: whether Triton interprets kernels: ``triton.jit`` decides when it decorates, so both triton's own
#: library (decorated when triton was first imported) and kernels decorated now must agree
INTERPRET = _is_interpreted(tl.zeros) and _is_interpreted(triton.jit(_probe))


def _numpy24_interpreter_fix() -> None:
    """Triton 3.6's interpreter turns loop bounds into ints with ``int(array_of_shape_1)``, which
    numpy >= 2.4 refuses (triton-lang/triton#9171, fixed upstream by #9172): convert via ``.item()``."""
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "_crossml_fixed", False):
        return

    def patched(tensor: Any, scope: Any) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._crossml_fixed = True  # type: ignore[attr-defined]
    interpreter._patch_lang_tensor = patched


if INTERPRET and int(np.__version__.split(".")[0]) * 100 + int(np.__version__.split(".")[1]) >= 204:
    _numpy24_interpreter_fix()


def on_device(t: torch.Tensor, interp: bool) -> contextlib.AbstractContextManager:
    """The context a kernel launch on ``t``'s device runs in: that CUDA device compiled, nothing in Triton's
    interpreter or on other devices."""
    return torch.cuda.device(t.device) if t.device.type == "cuda" and not interp else contextlib.nullcontext()


def use_interpreter(t: torch.Tensor, what: str) -> bool:
    """True when the kernels run in Triton's interpreter; a CPU tensor needs it (else ValueError)."""
    if INTERPRET:
        return True
    if t.device.type == "cpu":
        raise ValueError(f"{what}: the Triton kernels run on GPU tensors, got a CPU tensor; use the registered "
                         "op on the CPU, or set TRITON_INTERPRET=1 before importing triton to interpret them")
    return False


@functools.cache
def _tf32_capable(device_type: str, index: int) -> bool:
    if device_type != "cuda" or not torch.cuda.is_available():
        return False
    props = torch.cuda.get_device_properties(index)
    if torch.version.hip:
        # Triton accepts input_precision="tf32" (XF32) on CDNA3 only
        return str(getattr(props, "gcnArchName", "")).startswith("gfx942")
    return props.major >= 8


def want_tf32(t: torch.Tensor, allow_tf32: bool | None, default: bool) -> bool:
    """Whether an fp32 product on ``t``'s device may use TF32 (``allow_tf32`` None: ``default``)."""
    allow = default if allow_tf32 is None else allow_tf32
    if not allow or t.dtype != torch.float32 or INTERPRET:
        return False
    return _tf32_capable(t.device.type, t.device.index if t.device.index is not None else torch.cuda.current_device())


def check_float(what: str, *ts: torch.Tensor) -> None:
    """Same floating dtype and device for every tensor, else a TypeError/ValueError saying which."""
    dtypes = {t.dtype for t in ts}
    if len(dtypes) > 1:
        raise TypeError(f"{what} inputs must share one element type, got {', '.join(str(t.dtype) for t in ts)}")
    if ts[0].dtype not in FLOAT_DTYPES:
        raise TypeError(f"{what} Triton kernel takes float16/bfloat16/float32/float64 tensors, got {ts[0].dtype}; "
                        "use the registered op for other types")
    devices = {t.device for t in ts}
    if len(devices) > 1:
        raise ValueError(f"{what} inputs are on different devices: {', '.join(str(t.device) for t in ts)}")


@functools.cache
def _processors(device_type: str, index: int) -> int:
    try:
        if device_type == "cuda":
            return int(torch.cuda.get_device_properties(index).multi_processor_count)
        if device_type == "xpu":
            props = torch.xpu.get_device_properties(index)
            return int(getattr(props, "gpu_subslice_count", 0) or 64)
    except (RuntimeError, AssertionError, AttributeError):
        pass
    return 64


def processors(t: torch.Tensor) -> int:
    """Streaming multiprocessors (CUDA/ROCm compute units, XPU subslices) of ``t``'s device, what
    grid rules aim to fill; 64 when the device does not say."""
    index = t.device.index
    if index is None:
        index = torch.cuda.current_device() if t.device.type == "cuda" else 0
    return _processors(t.device.type, index)


def rule_processors(t: torch.Tensor) -> int:
    """The SM count the tile rules take for a launch on ``t``'s device: ``processors``, or 1 in Triton's interpreter
    (which alone runs CPU tensors)."""
    return 1 if INTERPRET or t.device.type == "cpu" else processors(t)


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) of host integers. (``triton.cdiv`` and ``triton.next_power_of_2`` are constexpr functions in
    Triton 3.6, about 6 us of Python a call on the host: a dozen of them in a GEMV's tile rule cost more than
    its launch.)"""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= ``n`` for host integers (0 for n <= 0), as ``triton.next_power_of_2``."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def batch_grid(n: int) -> tuple[int, int]:
    """Grid dimensions 1 and 2 covering ``n`` batch entries (dimension 1 is at most 65535)."""
    return max(1, min(n, GRID_YZ_MAX)), max(1, cdiv(n, GRID_YZ_MAX))


def prune_tiles(m_name: str, n_name: str) -> Callable[..., list[triton.Config]]:
    """An ``early_config_prune`` dropping tiles far larger than the problem (fewer configs to time)."""

    def prune(configs: list[triton.Config], named_args: dict, **kwargs: Any) -> list[triton.Config]:
        m = max(16, next_power_of_2(int(named_args[m_name])))
        n = max(16, next_power_of_2(int(named_args[n_name])))
        kept = [c for c in configs if c.kwargs["BLOCK_M"] <= m and c.kwargs["BLOCK_N"] <= n]
        if kept:
            return kept
        smallest = min(c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] for c in configs)
        return [c for c in configs if c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] == smallest]

    return prune


@triton.jit
def grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(row tile, column tile) of program ``pid`` in grouped order: GROUP_M row tiles share each
    column tile while it is in L2."""
    num_m = (M + BLOCK_M - 1) // BLOCK_M
    num_n = (N + BLOCK_N - 1) // BLOCK_N
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % group_rows, (pid % per_group) // group_rows


@triton.jit
def conv_tap(tap, KH, KW, d0, h0, w0, dd, dh, dw, D, H, W):
    """Kernel tap ``tap`` -> (kd, kh, kw, input d, h, w, inside-the-image mask)."""
    kw = tap % KW
    kh = (tap // KW) % KH
    kd = tap // (KW * KH)
    di = d0 + kd * dd
    hi = h0 + kh * dh
    wi = w0 + kw * dw
    inside = (di >= 0) & (di < D) & (hi >= 0) & (hi < H) & (wi >= 0) & (wi < W)
    return kd, kh, kw, di, hi, wi, inside


def product_output(a: torch.Tensor, N: int, K: int, bias: torch.Tensor | None) -> tuple[torch.Tensor, bool]:
    """The ``[..., N]`` output of a product of ``a [..., K]`` (in a's dtype, from ``torch.empty``, so the call
    stays capturable) and whether it is already final: no elements, or K == 0 (the empty sum: zeros + bias)."""
    y = torch.empty((*a.shape[:-1], N), dtype=a.dtype, device=a.device)
    if y.numel() == 0:
        return y, True
    if K == 0:
        y.zero_()
        if bias is not None:
            y.add_(bias.reshape(N).to(a.dtype))
        return y, True
    return y, False



@functools.cache
def gluon_kernels(name: str) -> Any:
    """The Gluon kernel module ``crossml.kernels.<name>``, or None where this Triton has no Gluon as of Triton 3.6
    (an experimental language whose API moves between releases; the kernels are written and tested against 3.6)."""
    if tuple(int(x) for x in re.findall(r"\d+", triton.__version__)[:2]) < (3, 6):
        return None
    try:
        return importlib.import_module(f"crossml.kernels.{name}")
    except (ImportError, AttributeError, TypeError):  # pragma: no cover - builds without Gluon, or another API
        return None


@functools.cache
def _sm80_capable(index: int) -> bool:
    return not torch.version.hip and torch.cuda.get_device_capability(index) >= (8, 0)


def nvidia_sm80(t: torch.Tensor) -> bool:
    """Whether ``t`` is on an NVIDIA GPU of compute capability 8.0 or later (fp16 pairs in PTX, ``mma_v2``), outside
    the interpreter."""
    if INTERPRET or t.device.type != "cuda":
        return False
    return _sm80_capable(t.device.index if t.device.index is not None else torch.cuda.current_device())


#: CROSSML_PDL=0 launches every kernel without programmatic dependent launch (for A/B measurements)
_PDL_ENABLED = os.environ.get("CROSSML_PDL", "1") != "0"


@functools.cache
def _pdl_capable(index: int) -> bool:
    if not _PDL_ENABLED or gdc_wait is None or torch.version.hip or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(index)[0] >= 9


def pdl(t: torch.Tensor, early: bool = False) -> dict[str, Any]:
    """Launch options of a kernel that starts with ``pdl_wait(PDL)``, for a launch on ``t``'s device:
    ``{"PDL": True, "launch_pdl": True}`` on NVIDIA GPUs of compute capability 9.0 and later (programmatic
    dependent launch: the launch overlaps the previous kernel's tail, in streams and in CUDA graphs alike),
    else ``{}`` (the interpreter, other devices).

    Such a kernel lets the next one start launching once its programs have passed their wait, so when a kernel
    starts, every kernel two or more before it has finished: the kernels that read more than constants before their
    wait (the skip-norm kernel's residual, the decode attention's lengths and cache rows) rely on that. With
    ``early`` (PDL 2) the kernel lets the next one launch before its own wait instead: the next kernel's programs
    become resident, and request what they read before their wait (their weights), while the kernel before this one
    still runs. That is safe where either
    - the kernel before this one is this kernel's own product, launched just before it by the same call, whose output
      (partial sums) only this kernel reads, after its wait: a kernel that starts while that product still runs finds
      every kernel before the product finished, as it would without ``early`` (``crossml.kernels.gemv``'s skip-norm
      kernel, ``NORM_EARLY``); or
    - the kernel after this one is launched just after it by the same call and reads nothing but constants before
      its wait (the SiluMul kernel before its 4-bit down projection, ``crossml.ops.fused``'s SiluMulMatMulNBits).
    Either way no two early kernels of one call follow each other, and a kernel that reads more than constants before
    its wait still finds the kernels it relies on finished: between them lies a kernel that waited in the usual order
    (launches of other threads on the same stream only add kernels between)."""
    if INTERPRET or t.device.type != "cuda":
        return {}
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    if not _pdl_capable(index):
        return {}
    return {"PDL": 2 if early else True, "launch_pdl": True}


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """The first statement of a kernel launched with ``pdl``: wait until the previous kernel in the stream has
    finished and its writes are visible (what a kernel reads before this: ``pdl``), then let the next
    kernel start launching (it waits for this one in turn); with PDL 2 (``pdl``'s ``early``) let it start launching
    first, then wait."""
    if PDL:
        if PDL == 2:
            gdc_launch_dependents()
            gdc_wait()
        else:
            gdc_wait()
            gdc_launch_dependents()


@functools.cache
def _cluster_capable(index: int) -> bool:
    if torch.version.hip or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(index)[0] in (9, 10)


def cluster_capable(t: torch.Tensor, size: int) -> bool:
    """Whether ``launch_clustered`` runs clusters of ``size`` (<= 16) programs on ``t``'s device: NVIDIA GPUs of
    compute capability 9.x (Hopper) and 10.x (datacenter Blackwell), which take the non-portable 16 as well as the
    portable 8, outside the interpreter."""
    if INTERPRET or t.device.type != "cuda" or not 1 <= size <= 16:
        return False
    return _cluster_capable(t.device.index if t.device.index is not None else torch.cuda.current_device())


def launch_clustered(fn: Any, grid: tuple[int, ...], size: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Launch ``fn[grid](*args, **kwargs)`` with each ``size`` consecutive programs along grid dimension 0 (a
    multiple of ``size``) one thread-block cluster, for kernels that meet at ``cluster_barrier``
    (``cluster_capable`` devices only).

    The kernel is compiled as usual, one CTA a program, so ``tl.program_id`` counts CTAs; Triton's NVIDIA launcher
    launches ``grid[0] / size * num_ctas`` CTAs in clusters of ``num_ctas`` (its metadata), which is set to ``size``
    on the compiled kernel before its first launch. (Compiling with ``num_ctas`` instead would spread each
    program's tensors over the cluster.) The kernel's constexprs must tell the cluster size apart, as they key the
    compiled kernel. Under CUDA graph capture the launch is captured as any other; inside
    ``CompileAhead.collect`` the kernel is handed over to compile and nothing runs, as for other launches."""
    if grid[0] % size:
        raise ValueError(f"launch_clustered: grid {grid} is not a whole number of clusters of {size}")
    kernel = fn.warmup(*args, grid=grid, **kwargs)
    if kernel is None or hasattr(kernel, "result"):
        return  # compiling in the background (crossml.kernels.CompileAhead), where launches run nothing
    meta = kernel.packed_metadata
    if meta[1] != size:
        kernel.packed_metadata = (meta[0], size, *meta[2:])
    fn[(grid[0] // size, *grid[1:])](*args, **kwargs)


@triton.jit
def cluster_barrier():
    """Every program of the thread-block cluster arrives here before any goes on; the writes of each before its
    arrival are visible to all after (release / acquire at cluster scope). Programs of a ``launch_clustered``
    kernel only (outside a cluster launch it is a barrier of the one CTA)."""
    tl.inline_asm_elementwise("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;"
                              "\n\tmov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def dot_acc(a, b, acc, F32_DOT: tl.constexpr):
    """acc + a @ b on the matrix units in b's dtype; F32_DOT: the same products (exact in float32) in IEEE float32,
    for Triton's interpreter, whose bf16 dot is wrong (and for float32 operands, which ``tl.dot`` would round to
    tf32)."""
    if F32_DOT:
        acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        acc = tl.dot(a.to(b.dtype), b, acc)
    return acc


@triton.jit
def store_tile(acc, bias_ptr, y_ptr, offs_n, rows, M, N, s_ym, HAS_BIAS: tl.constexpr, PARTIAL: tl.constexpr = False,
               pid_k=0, s_ys=0):
    """A product's float32 tile ``acc`` [rows, offs_n] into y [M, N] (row stride ``s_ym``; positions outside are not
    stored): with PARTIAL as float32 partial sums to workspace slice ``pid_k`` (``y_ptr + pid_k * s_ys``), without
    the bias; else plus the bias, rounded to y's dtype first (as the unfused Add of the rounded product would), in
    y's dtype."""
    mask = (rows[:, None] < M) & (offs_n[None, :] < N)
    if PARTIAL:
        tl.store(y_ptr + pid_k.to(tl.int64) * s_ys + rows[:, None] * s_ym + offs_n[None, :], acc, mask=mask)
    else:
        out_ty = y_ptr.dtype.element_ty
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(out_ty).to(tl.float32)[None, :]
        tl.store(y_ptr + rows[:, None] * s_ym + offs_n[None, :], acc.to(out_ty), mask=mask)
