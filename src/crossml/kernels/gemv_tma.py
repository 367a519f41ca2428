"""The one-row decode GEMV with its weights streamed by the Tensor Memory Accelerator (TMA), in Gluon.

``y[1, N] = a[1, K] @ W[K, N] (+ bias)`` with W column-major (its transpose ``[N, K]`` contiguous, as GPU plans store
half-precision decode weights: ``crossml.ops.matmul.column_major_weight``), on NVIDIA GPUs of compute capability
9.0 and later. ``crossml.kernels.gemv`` routes its one-row products here where ``TMA_*`` there says so; the outputs,
the float32 partial sums of a split K, the fused SiLU gate and the skip-norm's workspace are those of its Triton
GEMV (``_gemv_kernel``).

The Triton GEMV asks for each W tile with one 16-byte load a thread and keeps two tiles in flight in registers.
Here each program owns BLOCK_N W rows (output columns) over its K range and keeps STAGES tiles of
``[BLOCK_N, BLOCK_K]`` in shared memory, each one TMA copy signalled on an mbarrier:

- every stage is requested before the program waits for the previous kernel (programmatic dependent launch; W is a
  constant of the model), so a program whose K range fits its stages has all of its weights requested while the
  kernel before it (an attention, a norm: latency-bound, the memory idle) finishes;
- one instruction asks for a whole tile, so the number of bytes in flight does not cost registers or issue slots;
- a consumed stage is asked for again, STAGES steps ahead, once every warp has read it.

The activations of each step are loaded from global memory a step ahead (they are written by the previous kernel,
so after the wait), gated with SILU_MUL as the Triton GEMV gates them; products accumulate elementwise in a
float32 tile reduced over K at the end.

It takes K * 2 bytes a multiple of 16 (TMA's row stride) and W's rows 16-byte aligned. Gluon kernels do not run in
Triton's interpreter: its tests run on GPUs, and on the CPU compile it ahead of time (``compile_for``).
"""

from __future__ import annotations

import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from crossml.kernels._gluon import gdc_launch_dependents, gdc_wait
from crossml.kernels._launch import INTERPRET, cdiv
from crossml.kernels.gemv_mma import _silu_mul

__all__ = ["compile_for", "launch", "pick_tiles", "supported"]

#: values of one thread's shared-memory read (16 bytes of fp16 / bf16)
_VEC = 8
_VEC_C = gl.constexpr(_VEC)
#: most shared memory one program's stages take
SMEM_PER_PROGRAM = 64 * 1024


@gluon.jit
def _raw(a_ptr, k, k_hi, offs_k, up_off, SILU_MUL: gl.constexpr):
    """A step's stored activations at K offset ``k`` (zeros past ``k_hi``): (x, up), up x again without SILU_MUL."""
    ok = k + offs_k < k_hi
    x = gl.load(a_ptr + k + offs_k, mask=ok, other=0.0)
    up = x
    if SILU_MUL:
        up = gl.load(a_ptr + up_off + k + offs_k, mask=ok, other=0.0)
    return x, up


@gluon.jit
def _gemv_tma_kernel(a_ptr, w_desc, bias_ptr, y_ptr, N, K, K_PER_SPLIT, s_ys, up_off,
                     HAS_BIAS: gl.constexpr, PARTIAL: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                     STAGES: gl.constexpr, WARPS: gl.constexpr, SILU_MUL: gl.constexpr = False,
                     PDL: gl.constexpr = False):
    """Columns [pid0 * BLOCK_N, +BLOCK_N) of y [1, N] over K range pid1 (K_PER_SPLIT values, a multiple of BLOCK_K),
    W's transpose read through ``w_desc`` ([N, K] in [BLOCK_N, BLOCK_K] boxes; rows past N and values past K come as
    zeros). PARTIAL: float32 sums to workspace slice pid1 (``y_ptr + pid1 * s_ys``), no bias; else plus the bias
    (rounded to y's dtype) in y's dtype."""
    TK: gl.constexpr = BLOCK_K // _VEC_C
    blk: gl.constexpr = gl.BlockedLayout([1, _VEC_C], [32 // TK, TK], [WARPS, 1], [1, 0])
    pid_n = gl.program_id(0)
    pid_k = gl.program_id(1)
    n0 = pid_n * BLOCK_N
    k_lo = pid_k * K_PER_SPLIT
    k_hi = gl.minimum(K, k_lo + K_PER_SPLIT)
    steps = gl.cdiv(k_hi - k_lo, BLOCK_K)
    nbytes: gl.constexpr = w_desc.block_type.nbytes

    w_smem = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], w_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(STAGES):
        mbarrier.init(bars.index(j), count=1)
    fence_async_shared()
    for j in gl.static_range(STAGES):  # W is a constant: every stage asked for before the wait
        ok = j < steps
        mbarrier.expect(bars.index(j), nbytes, pred=ok)
        tma.async_copy_global_to_shared(w_desc, [n0, k_lo + j * BLOCK_K], bars.index(j), w_smem.index(j), pred=ok)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()

    offs_k = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, blk))
    x, up = _raw(a_ptr, k_lo, k_hi, offs_k, up_off, SILU_MUL)
    acc = gl.zeros([BLOCK_N, BLOCK_K], gl.float32, blk)
    for i in range(steps):
        s = i % STAGES
        if SILU_MUL:
            a = _silu_mul(x, up).to(gl.float32)
        else:
            a = x.to(gl.float32)
        x, up = _raw(a_ptr, k_lo + (i + 1) * BLOCK_K, k_hi, offs_k, up_off, SILU_MUL)
        mbarrier.wait(bars.index(s), (i // STAGES) & 1)
        w = w_smem.index(s).load(blk)
        acc += w.to(gl.float32) * gl.expand_dims(a, 0)
        gl.thread_barrier()  # every warp has read stage s before it is written again
        fence_async_shared()
        nxt = i + STAGES
        ok = nxt < steps
        mbarrier.expect(bars.index(s), nbytes, pred=ok)
        tma.async_copy_global_to_shared(w_desc, [n0, k_lo + nxt * BLOCK_K], bars.index(s), w_smem.index(s), pred=ok)
    for j in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(j))

    y = gl.sum(acc, axis=1)
    offs_n = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, blk))
    n_ok = offs_n < N
    if PARTIAL:
        gl.store(y_ptr + pid_k.to(gl.int64) * s_ys + offs_n, y, mask=n_ok)
    else:
        out_ty: gl.constexpr = y_ptr.dtype.element_ty
        if HAS_BIAS:
            y = y + gl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(out_ty).to(gl.float32)
        gl.store(y_ptr + offs_n, y.to(out_ty), mask=n_ok)


@functools.cache
def _tma_capable(index: int) -> bool:
    return not torch.version.hip and torch.cuda.get_device_capability(index) >= (9, 0)


def supported(a: torch.Tensor, w: torch.Tensor, M: int) -> bool:
    """Whether the kernel takes ``a [M, K] @ w``: one row of fp16 or bf16 on an NVIDIA GPU of compute capability 9.0
    or later (outside the interpreter), ``w`` [K, N] of a's dtype stored column-major, K at least 8, W's base and row
    stride 16-byte aligned (TMA's), a's row 16-byte aligned."""
    if M != 1 or a.dtype not in (torch.float16, torch.bfloat16) or w.dtype != a.dtype or w.dim() != 2:
        return False
    if INTERPRET or a.device.type != "cuda" or w.stride(0) != 1:
        return False
    K, N = w.shape
    if K < _VEC or w.stride(1) % 8 or w.data_ptr() % 16 or a.data_ptr() % 16:
        return False
    return _tma_capable(a.device.index if a.device.index is not None else torch.cuda.current_device())


def pick_tiles(K: int, N: int, processors: int) -> tuple[int, int, int, int, int]:
    """(BLOCK_N, BLOCK_K, STAGES, SPLIT_K, warps): 16 W rows (8 where 16-row slices are fewer than 2 per SM) of
    512-byte runs (256 values; K itself when shorter), K whole, as many stages as the program's K range has steps up
    to SMEM_PER_PROGRAM bytes, 4 warps."""
    block_n = 16 if cdiv(N, 16) >= 2 * processors else 8
    block_k = min(256, max(_VEC, 1 << (max(K, 1) - 1).bit_length()))
    stages = max(1, min(cdiv(K, block_k), SMEM_PER_PROGRAM // (block_n * block_k * 2)))
    return block_n, block_k, stages, 1, 4


def _layout() -> gl.NVMMASharedLayout:
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)


def launch(a2: torch.Tensor, w: torch.Tensor, bias1: torch.Tensor, out: torch.Tensor, *, k_per_split: int,
           split: int, block_n: int, block_k: int, stages: int, warps: int, has_bias: bool, partial: bool,
           silu_mul: bool, pdl: dict[str, bool]) -> None:
    """One launch over the grid (N / block_n, split) of ``a2 [1, K] @ w`` (``a2 [1, 2K]``, [g | up], with
    ``silu_mul``): ``out`` [1, N] (``partial`` False: bias added, a's dtype) or the float32 ``[split, 1, N]``
    workspace of partial sums (``supported`` holds; ``k_per_split`` a multiple of block_k). ``bias1``: the bias, or
    any tensor of a's dtype without one."""
    K, N = w.shape
    tk = block_k // _VEC
    if (block_k & (block_k - 1) or not _VEC <= block_k <= 256 or block_n & (block_n - 1)
            or block_n < (32 // tk) * warps or k_per_split % block_k or not 1 <= stages <= 16):
        raise ValueError(f"GEMV TMA kernel: BLOCK_K {block_k} must be a power of two in [8, 256], BLOCK_N {block_n} a "
                         f"power of two covering {warps} warps of {32 // max(tk, 1)} rows, K per split {k_per_split} "
                         f"a multiple of BLOCK_K, STAGES {stages} in [1, 16]")
    desc = TensorDescriptor(w.t(), [N, K], [w.stride(1), 1], [block_n, block_k], _layout())
    _gemv_tma_kernel[(cdiv(N, block_n), split)](
        a2, desc, bias1, out, N, K, k_per_split, N if partial else 0, K,
        HAS_BIAS=has_bias and not partial, PARTIAL=partial, BLOCK_N=block_n, BLOCK_K=block_k, STAGES=stages,
        WARPS=warps, SILU_MUL=silu_mul, num_warps=warps, **pdl)


def compile_for(arch: int = 90, dtype: str = "fp16", **constexprs: object) -> object:
    """The kernel compiled ahead of time for NVIDIA compute capability ``arch`` (9.0 or later; no GPU needed):
    ``dtype`` ("fp16" or "bf16") a and W, float32 partial sums, PDL, the defaults below overridden by
    ``constexprs``. For the tests (Gluon kernels do not run in Triton's interpreter) and the benchmarks."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    kernel = _gemv_tma_kernel
    consts = {"HAS_BIAS": False, "PARTIAL": True, "BLOCK_N": 16, "BLOCK_K": 256, "STAGES": 4, "WARPS": 4,
              "SILU_MUL": False, "PDL": True, **constexprs}
    desc_ty = f"tensordesc<{dtype}[{consts['BLOCK_N']}, {consts['BLOCK_K']}],{_layout()!r}>"
    sig = {"a_ptr": f"*{dtype}", "w_desc": desc_ty, "bias_ptr": f"*{dtype}",
           "y_ptr": "*fp32" if consts["PARTIAL"] else f"*{dtype}", "N": "i32", "K": "i32", "K_PER_SPLIT": "i32",
           "s_ys": "i32", "up_off": "i32"}
    sig.update(dict.fromkeys(consts, "constexpr"))
    div16 = ["a_ptr", "bias_ptr", "y_ptr", "N", "K", "K_PER_SPLIT", "s_ys", "up_off"]
    src = GluonASTSource(fn=kernel, signature=sig, constexprs=consts,
                         attrs={(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in div16})
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": consts["WARPS"]})
