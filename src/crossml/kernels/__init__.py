"""crossml's own Triton kernels, each beside its torch reference (``matmul.py``, ``conv.py``).

``METACOMMAND_FREE`` maps ONNX op types to drop-in replacements for the registered ops, with the
same signatures, used by the plan builder when the GPU provider option
``disable_metacommands=true`` is set: floating-point MatMul / Gemm / Conv on a GPU run the
Triton kernels, so no vendor math library (cuBLAS, cuDNN, hipBLAS, MIOpen) runs for them.
Integer tensors and CPU tensors go to the registered op. Triton is imported on first use, so
importing this package needs no triton.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from types import ModuleType
from typing import Any

import torch

__all__ = ["CPU_KERNEL_OPS", "METACOMMAND_FREE", "TRITON_DEVICES", "CompileAhead", "load", "warm_compiler", "warm_cpu"]

log = logging.getLogger("crossml")

#: device types Triton compiles for (CUDA also covers ROCm builds of torch)
TRITON_DEVICES = ("cuda", "xpu")
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_warned: set[tuple[str, str]] = set()


def load(name: str) -> ModuleType | None:
    """``crossml.kernels.<name>``, imported on the first call (which imports triton, or numba for the CPU kernels):
    what the ops' fast paths call; None, logged once, where it does not import or its kernels failed to load
    (``warm_cpu``)."""
    return None if name in _DISABLED else _import(name)


#: kernel modules whose kernels failed to load (``warm_cpu``): their ops keep their torch paths
_DISABLED: set[str] = set()


@functools.cache
def _import(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(f"crossml.kernels.{name}")
    except (ImportError, RuntimeError) as e:
        log.warning("crossml.kernels.%s does not import (%s); its ops use torch", name, e)
        return None


#: the thread ``warm_compiler`` started (None before the first call on a Triton device)
_warming: threading.Thread | None = None


def warm_compiler(device: torch.device) -> threading.Thread | None:
    """On a Triton device, start computing Triton's compiler cache key in a child process and return the thread
    that waits for it.

    The key hashes Triton's sources and its libtriton library, and the first kernel of a process waits for it,
    even when every kernel is in Triton's cache. Sessions call this before they load their model, so the hash
    overlaps with the load instead of delaying the first run.
    - A child process, not a thread of this one: a hashing thread needs the GIL between its chunks, and a model
      load keeps the GIL busy, so it starved (with the load down to 0.8 s, the Qwen2.5-0.5B int4 benchmark
      model's first prompt hashed the key itself, 0.5 s). The child imports only triton, with this process's
      ``sys.path``; its key is used only if it ran the same triton (same file and version), else Triton's own
      function computes it here.
    - Triton's ``triton_key`` is replaced by one that waits for the child's key, so no caller computes it twice.
    - The child's key is kept in Triton's cache directory with a signature of the files it hashes (their paths,
      sizes and modification times: a few milliseconds of ``stat`` calls). A later process whose files have that
      signature takes the kept key and starts no child: on an H200 host the child took longer than loading the
      GenAI benchmark's Qwen2.5-0.5B model (0.47 s), so the first prompt of every process waited 0.2 s for it.
    - No-op on other devices, under TRITON_INTERPRET=1, without triton, or once a thread has started.
    """
    global _warming
    if device.type not in TRITON_DEVICES or _warming is not None or os.environ.get("TRITON_INTERPRET") == "1":
        return None
    try:
        import triton
        from triton.runtime import autotuner, cache

        original = cache.triton_key
    except (ImportError, AttributeError, RuntimeError) as e:
        log.debug("no Triton compiler key to warm: %s", e)
        return None
    found: list[str | None] = []
    thread = threading.Thread(target=lambda: found.append(_kept_or_child_key(triton)), name="crossml-triton-key",
                              daemon=True)

    @functools.wraps(original)
    def triton_key() -> str:
        thread.join()
        return found[0] if found and found[0] else original()

    cache.triton_key = triton_key
    if getattr(autotuner, "triton_key", None) is original:
        autotuner.triton_key = triton_key
    thread.start()
    _warming = thread
    return thread


class _KeptKey:
    """Triton's compiler key as a child computed it, kept in Triton's cache directory
    (``crossml-triton-key.json``) beside a signature of the files the key hashes (Triton's ``triton_key``: its
    compiler, backends and language sources, ``runtime/cache.py`` and libtriton): each one's path, size and
    modification time. A kept key is used only where the signature is the same, so a reinstalled or edited Triton
    computes its key again."""

    NAME = "crossml-triton-key.json"

    def __init__(self, triton: ModuleType) -> None:
        self.version = str(getattr(triton, "__version__", ""))
        try:
            from triton import knobs

            cache_dir = knobs.cache.dir
        except (ImportError, AttributeError):
            cache_dir = os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache")
        self.path = os.path.join(cache_dir, self.NAME)
        self.signature = self._signature(os.path.dirname(os.path.abspath(triton.__file__)))

    @staticmethod
    def _signature(root: str) -> str | None:
        import hashlib

        entries = []
        try:
            for sub in ("compiler", "backends", "language"):
                for dirpath, dirnames, files in os.walk(os.path.join(root, sub)):
                    dirnames.sort()
                    entries += [os.path.join(dirpath, f) for f in sorted(files) if f.endswith(".py")]
            entries.append(os.path.join(root, "runtime", "cache.py"))
            lib = os.path.join(root, "_C")
            entries += [os.path.join(lib, f) for f in sorted(os.listdir(lib)) if f.startswith("libtriton")]
            text = "\n".join(f"{os.path.relpath(e, root)}:{st.st_size}:{st.st_mtime_ns}"
                             for e in entries for st in [os.stat(e)])
        except OSError:
            return None
        return hashlib.sha256(text.encode()).hexdigest()

    def read(self) -> str | None:
        """The kept key, if one was kept for files of this signature and this Triton version."""
        if self.signature is None:
            return None
        try:
            with open(self.path, encoding="utf-8") as f:
                kept = json.load(f)
        except (OSError, ValueError):
            return None
        key = kept.get("key") if isinstance(kept, dict) and kept.get("signature") == self.signature else None
        return key if isinstance(key, str) and key.startswith(self.version) else None

    def write(self, key: str | None) -> str | None:
        """Keep ``key`` (best effort: a directory that cannot be written keeps nothing); returns it."""
        if key and self.signature is not None:
            tmp = f"{self.path}.{os.getpid()}.tmp"
            try:
                os.makedirs(os.path.dirname(self.path), exist_ok=True)
                with open(tmp, "w", encoding="utf-8") as f:
                    json.dump({"signature": self.signature, "key": key}, f)
                os.replace(tmp, self.path)
            except OSError as e:
                log.debug("could not keep Triton's compiler key in %s: %s", self.path, e)
                with contextlib.suppress(OSError):
                    os.remove(tmp)
        return key


def _kept_or_child_key(triton: ModuleType) -> str | None:
    """The kept key of these Triton files, else the child's (then kept): the key thread's work, so the files'
    signature is taken off the session's start-up path too."""
    kept = _KeptKey(triton)
    return kept.read() or kept.write(_key_in_child(triton))


_KEY_SCRIPT = ("import sys, triton\nfrom triton.runtime.cache import triton_key\n"
               "sys.stdout.write(triton.__file__ + '\\n' + triton_key())\n")


def _key_in_child(triton: ModuleType) -> str | None:
    """Triton's compiler key computed by a child Python with this process's ``sys.path``; None where it could not
    run or imported another triton."""
    if not sys.executable:
        return None
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    try:
        proc = subprocess.run([sys.executable, "-c", _KEY_SCRIPT], capture_output=True, env=env, timeout=300)
    except (OSError, subprocess.SubprocessError) as e:
        log.debug("computing Triton's compiler key in a child failed: %s", e)
        return None
    path, _, key = proc.stdout.decode("utf-8", "replace").partition("\n")
    if proc.returncode or path != triton.__file__ or not key.startswith(triton.__version__):
        log.debug("Triton's compiler key from a child is not usable (exit %s, triton %s)", proc.returncode, path)
        return None
    return key


#: inside ``CompileAhead.collect``: Triton launches compile (in a thread pool) and run nothing
_COMPILE_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar("crossml_compile_only", default=False)
#: inside ``CompileAhead.collect``: the launches already handed over (``_launch_key``), so a repeat returns at once
_HANDED: contextvars.ContextVar[set | None] = contextvars.ContextVar("crossml_compile_handed", default=None)


def _arg_key(a: Any) -> Any:
    """What of a launch argument can change Triton's specialization of a kernel, or finer: a tensor's dtype,
    device and 16-byte alignment, a scalar's type and value; tuples element by element. Raises TypeError for
    what cannot be keyed."""
    if isinstance(a, torch.Tensor):
        return ("tensor", a.dtype, a.device, a.data_ptr() % 16 == 0)
    if isinstance(a, (tuple, list)):
        return (type(a).__name__, *(_arg_key(x) for x in a))
    hash(a)
    return (type(a), a)


def _launch_key(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple | None:
    """A key of a launch at least as fine as Triton's cache key of the kernel it runs (``fn`` and every argument,
    keyword arguments included, as ``_arg_key`` keys them); None where an argument cannot be keyed."""
    try:
        return (fn, tuple(_arg_key(a) for a in args), tuple(sorted((k, _arg_key(v)) for k, v in kwargs.items())))
    except TypeError:
        return None


@functools.cache
def _route_launches() -> bool:
    """Send Triton's launches through the ``CompileAhead.collect`` switch (once per process); False where this Triton
    lacks what it needs (``JITFunction.run(..., grid, warmup)``, ``Autotuner.run``, ``AsyncCompileMode``)."""
    try:
        from triton.runtime import _async_compile, autotuner, jit

        run, tuned_run = jit.JITFunction.run, autotuner.Autotuner.run
        _ = _async_compile.AsyncCompileMode
    except (ImportError, AttributeError, RuntimeError) as e:
        log.debug("CompileAhead is not available with this Triton: %s", e)
        return False

    def jit_run(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        if not warmup and _COMPILE_ONLY.get() and not _integer_only(args, kwargs):
            handed, key = _HANDED.get(), _launch_key(self, args, kwargs)
            if handed is not None and key is not None:
                if key in handed:
                    return None
                handed.add(key)
            warmup = True
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    def autotuned_run(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _COMPILE_ONLY.get():
            return None  # autotuning times launches: it runs for real, later
        return tuned_run(self, *args, **kwargs)

    jit.JITFunction.run = jit_run
    autotuner.Autotuner.run = autotuned_run
    return True


def _with_launcher(compile_fn: Callable[[], Any]) -> Any:
    """Compile, then build the kernel's host launcher: a C module Triton builds with the system compiler for each
    kernel signature, at the first launch, on the launching thread (about 0.2 s each on an H200 host; most of a
    cold first prompt). Built here, it lands in Triton's cache, where that first launch finds it."""
    kernel = compile_fn()
    try:
        from triton.runtime.driver import driver

        driver.active.launcher_cls(kernel.src, kernel.metadata)
    except Exception as e:  # noqa: BLE001 - the first launch builds it again and reports what fails
        log.debug("building a Triton launcher ahead failed: %s", e)
    return kernel


class _CompilePool(ThreadPoolExecutor):
    """Threads that compile Triton kernels and build their launchers."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        return super().submit(_with_launcher, functools.partial(fn, *args, **kwargs))


def _integer_only(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Every tensor argument is an integer (or bool) tensor: a kernel that computes integers from integers (mask
    lengths, index gathers), whose outputs later ops may index with; ``CompileAhead.collect`` runs such kernels."""
    tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    return bool(tensors) and not any(t.is_floating_point() or t.is_complex() for t in tensors)


class CompileAhead:
    """Triton kernels compiled side by side ahead of the run that needs them.

    Inside ``collect()``, every Triton kernel launched (on ``device``, from this thread) is handed to a pool of
    ``workers`` threads (default: the CPU count) to compile, with its host launcher, and is not run, except
    kernels whose tensors are all integers, which run once compiled (their outputs may be indices); autotuned
    kernels are skipped (they time real launches, later). A launch repeated with arguments of the same kind
    (``_launch_key``: a model's layers launch each kernel with the same shapes) returns at once: Triton would
    otherwise prepare and hash each one again until its compile is finalized in ``wait()``, about 640 times in the
    GenAI benchmark's Qwen2.5-0.5B dry runs, making some 14,600 objects of cyclic garbage (its argument-path
    closures). ``wait()`` waits for the compiles and puts the kernels in
    memory, so the next real run of the same code launches them at once; until then the compiles go on in the
    background. Triton's compiler releases the GIL for most of its work (two threads on two cores: 1.85x), so a
    model whose first run would compile its kernels one after the other compiles them side by side instead.

    ``active`` is False (``collect`` is a plain block, launches run) on non-Triton devices, under
    TRITON_INTERPRET=1, or without a Triton that supports it. What runs inside ``collect`` besides Triton kernels
    (torch ops) runs for real on the unwritten outputs of the skipped kernels: use it only for code that indexes
    with no such values and reads none of them on the host."""

    def __init__(self, device: torch.device, workers: int | None = None) -> None:
        self.active = (device.type in TRITON_DEVICES and os.environ.get("TRITON_INTERPRET") != "1"
                       and _route_launches())
        self._pool: _CompilePool | None = None
        self._mode: Any = None
        if self.active:
            from triton.runtime._async_compile import AsyncCompileMode

            self._pool = _CompilePool(max_workers=workers or os.cpu_count() or 1, thread_name_prefix="crossml-compile")
            # ignore_errors: a kernel that fails to compile here compiles again when it is launched, and says why
            self._mode = AsyncCompileMode(self._pool, ignore_errors=True)

    @contextlib.contextmanager
    def collect(self) -> Iterator[None]:
        if not self.active:
            yield
            return
        from triton.runtime import _async_compile

        token, mode_token = _COMPILE_ONLY.set(True), _async_compile.active_mode.set(self._mode)
        handed_token = _HANDED.set(set())
        try:
            yield
        finally:
            _HANDED.reset(handed_token)
            _async_compile.active_mode.reset(mode_token)
            _COMPILE_ONLY.reset(token)

    def wait(self) -> None:
        """Wait for the compiles and put their kernels in memory (once; later calls return at once)."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        from concurrent.futures import as_completed

        for future in as_completed(self._mode.raw_futures):
            self._mode.future_kernels[future._key].result(True)
        pool.shutdown()


#: ops whose CPU paths run numba kernels, and those kernels' modules (each with a ``warm()``)
CPU_KERNEL_OPS = {"MatMulNBits": ("cpu_nbits", "cpu_int8"), "GroupQueryAttention": ("cpu_attention",),
                  "SkipSimplifiedLayerNormalization": ("cpu_norm",), "SiluMulMatMulNBits": ("cpu_nbits", "cpu_int8"),
                  "NormMatMulNBits": ("cpu_norm", "cpu_nbits", "cpu_int8"), "CausalConvWithState": ("cpu_conv",),
                  "ShortConv": ("cpu_conv",), "GatherBlockQuantized": ("cpu_gather",),
                  "LinearAttention": ("cpu_linear_attention",), "GatedDeltaNet": ("cpu_linear_attention",),
                  "LpNormalization": ("cpu_gated_delta",),
                  "GatedRMSNorm": ("cpu_gated_delta",), "LinearAttentionGate": ("cpu_gated_delta",),
                  "MRotaryEmbedding": ("cpu_gated_delta",)}


def warm_cpu(op_types: set[str]) -> None:
    """Load the numba kernels that the CPU paths of these ops run (from numba's on-disk cache, or compiled), as a CPU
    session is created, so that its first run does not: numba's import and start take about 1.2 s of a process
    (0.4 s importing, 0.8 s starting its compiler target at the first cached kernel), each further kernel about 10
    ms. onnxruntime's CPU session does its own preparation (prepacking) at creation too. Once per module and
    process; nothing where numba is not installed. A module whose kernels fail to load is logged and disabled
    (``load`` returns None for it), so its ops keep their torch paths and the session still loads."""
    for op_type in sorted(op_types & CPU_KERNEL_OPS.keys()):
        for name in CPU_KERNEL_OPS[op_type]:
            _warm_module(name)


@functools.cache
def _warm_module(name: str) -> None:
    module = load(name)
    if module is None:
        return
    try:
        module.warm()
    except Exception as e:  # noqa: BLE001 - a kernel numba cannot build here: the ops keep torch, the session loads
        log.warning("crossml.kernels.%s: its numba kernels do not load (%s: %s); its ops use torch", name,
                    type(e).__name__, e)
        _DISABLED.add(name)


def load_compiled(name: str) -> ModuleType | None:
    """``load(name)``, or None where Triton only interprets: the interpreter copies through the host, which a
    captured graph or a run-ahead decode step cannot hold, so the callers keep their torch paths there."""
    module = load(name)
    if module is None:
        return None
    from crossml.kernels import _launch

    return None if _launch.INTERPRET else module


def _registered(op_type: str) -> Callable[..., Any]:
    """The registered implementation (highest opset) of an ai.onnx op."""
    import crossml.ops.conv  # noqa: F401 - registers Conv
    import crossml.ops.matmul  # noqa: F401 - registers MatMul, Gemm
    from crossml.ops.registry import lookup

    spec = lookup("", op_type, 99)
    if spec is None:
        raise RuntimeError(f"no registered {op_type} op to fall back to")
    return spec.fn


def _use_triton(op_type: str, *ts: torch.Tensor | None) -> bool:
    """Floating tensors of one dtype on a Triton device: the kernels take them."""
    first = ts[0]
    if not all(isinstance(t, torch.Tensor) for t in ts if t is not None) or first.device.type == "cpu":
        return False
    if first.dtype not in _FLOATS or any(t is not None and t.dtype != first.dtype for t in ts[:2]):
        return False
    if first.device.type not in TRITON_DEVICES:
        key = (op_type, first.device.type)
        if key not in _warned:
            _warned.add(key)
            log.warning("disable_metacommands: Triton does not run on %s devices; %s uses the registered op",
                        first.device.type, op_type)
        return False
    return True


def matmul(a: torch.Tensor, b: torch.Tensor, *, ctx: Any = None) -> torch.Tensor:
    if _use_triton("MatMul", a, b):
        from crossml.ops.matmul import gemv_eligible

        if gemv_eligible(a, b):  # decode-sized: the Triton GEMV (also no vendor library)
            return _registered("MatMul")(a, b, ctx=ctx)
        from crossml.kernels.matmul import matmul as triton_matmul

        return triton_matmul(a, b)
    return _registered("MatMul")(a, b, ctx=ctx)


def gemm(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None, *, alpha: float = 1.0,
         beta: float = 1.0, transA: int = 0, transB: int = 0, broadcast: int = 0) -> torch.Tensor:
    if _use_triton("Gemm", a, b) and (c is None or (isinstance(c, torch.Tensor) and c.is_floating_point())):
        from crossml.kernels.matmul import gemm as triton_gemm

        return triton_gemm(a, b, c, alpha=alpha, beta=beta, transA=transA, transB=transB)
    return _registered("Gemm")(a, b, c, alpha=alpha, beta=beta, transA=transA, transB=transB, broadcast=broadcast)


def conv(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, *, auto_pad: str = "NOTSET",
         dilations: list[int] | None = None, group: int = 1, kernel_shape: list[int] | None = None,
         pads: list[int] | None = None, strides: list[int] | None = None) -> torch.Tensor:
    if _use_triton("Conv", x, w, b) and (b is None or b.dtype == x.dtype):
        if kernel_shape and list(kernel_shape) != list(w.shape[2:]):
            raise ValueError(f"Conv kernel_shape {kernel_shape} does not match the weight shape {tuple(w.shape)}")
        from crossml.kernels.conv import conv as triton_conv

        return triton_conv(x, w, b, strides=strides, pads=pads, dilations=dilations, group=group, auto_pad=auto_pad)
    return _registered("Conv")(x, w, b, auto_pad=auto_pad, dilations=dilations, group=group,
                               kernel_shape=kernel_shape, pads=pads, strides=strides)


#: ONNX op type -> replacement with the registered op's signature (see the module docstring)
METACOMMAND_FREE: dict[str, Callable[..., Any]] = {"MatMul": matmul, "Gemm": gemm, "Conv": conv}
