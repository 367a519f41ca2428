"""4-bit MatMulNBits decode products on the int8 path (accuracy level 4) with x86 integer dot products: LLVM IR
compiled at import by llvmlite (numba's LLVM), called from numba's threads.

numba cannot express ``vpmaddubsw`` (its integer arithmetic widens to 64 bits), which is how onnxruntime's MLAS
multiplies 4-bit weights by int8 activations. This kernel writes that loop in LLVM IR instead, for CPUs with AVX2:
for each 32 values of a block, the 16 packed bytes of MatMulNBits' B are split into their low and high nibbles,
interleaved into the values' order, multiplied with the 32 int8 activations and added in pairs (``pmaddubsw``,
unsigned weights times signed activations: at most 2 * 15 * 128 a pair, no saturation), then in fours into eight
int32 lanes (``pmaddwd``). A block's lanes are exact integers (at most 256 * 15 * 128 in magnitude), converted to
float32 and added into eight float32 lanes times the block's scale product (weight scale x activation scale); the
zero points come off once per block as ``scale_w * zero_point * scale_a * sum(a)``, as onnxruntime does. The
result differs from onnxruntime's only in float32 summation order.

B is read as MatMulNBits stores it ([N, n_blocks, block_size / 2]), so unlike ``cpu_nbits.matmul`` there is no
laid-out copy of the weight. Per product (Qwen2.5-0.5B's shapes, one row, 2-core host) 1.8-2.2x faster than
``cpu_nbits.matmul``: gate+up (896 x 9728) 330 against 717 us, the lm_head (896 x 151936) 6.7 against 11.8 ms.

Blocks of 32, 64, 128 or 256 values (``eligible``); rows of N split over numba's threads (``cpu_nbits._parallel``).
``AVAILABLE`` is False where the CPU has no AVX2 or LLVM cannot build the kernel (llvmlite without LLVM's new pass
manager API included: logged once): the products then take ``cpu_nbits.matmul``.
"""

from __future__ import annotations

import ctypes
import logging
import platform

import numpy as np
import torch
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from crossml.kernels.cpu_nbits import CHUNKS_PER_THREAD, _parallel, _threads, quantize_int8
from crossml.ops.contrib.matmul_nbits import unpack_bits

__all__ = ["AVAILABLE", "eligible", "matmul", "scales_zero_points", "warm"]

log = logging.getLogger("crossml")

# rows{C}(w, a, sa, asum, s, zs, out, n0, n1, nb, M, N), one function per C = block_size / 32 (a constant, so
# LLVM unrolls a block's loop): for n in [n0, n1), m in [0, M):
#   out[m * N + n] = sum_b s[n * nb + b] * sa[m * nb + b] * dot_b - sum_b zs[n * nb + b] * asum[m * nb + b]
#   w: uint8 [N, nb, C * 16]; a: int8 [M, nb, C * 32]; sa / asum: float [M, nb]; s / zs: float [N * nb] (the weight
#   scales, and the scales times the zero points)
_HEAD = r"""
declare <16 x i16> @llvm.x86.avx2.pmadd.ub.sw(<32 x i8>, <32 x i8>)
declare <8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16>, <16 x i16>)
declare float @llvm.vector.reduce.fadd.v8f32(float, <8 x float>)
declare <8 x float> @llvm.fma.v8f32(<8 x float>, <8 x float>, <8 x float>)
"""
_ROWS = r"""
define void @rows{C}(i8* %w, i8* %a, float* %sa, float* %asum, float* %s, float* %zs, float* %out,
                     i64 %n0, i64 %n1, i64 %nb, i64 %M, i64 %N) {
entry:
  br label %nloop
nloop:
  %n = phi i64 [%n0, %entry], [%n.next, %mend]
  %ncond = icmp slt i64 %n, %n1
  br i1 %ncond, label %mloop, label %exit
mloop:
  %m = phi i64 [0, %nloop], [%m.next, %bend]
  %mcond = icmp slt i64 %m, %M
  br i1 %mcond, label %bloop, label %mend
bloop:
  %b = phi i64 [0, %mloop], [%b.next, %cend]
  %acc = phi <8 x float> [zeroinitializer, %mloop], [%acc.next, %cend]
  %z = phi float [0.0, %mloop], [%z.next, %cend]
  %nbi = mul i64 %n, %nb
  %wb = add i64 %nbi, %b
  %mbi0 = mul i64 %m, %nb
  %ab = add i64 %mbi0, %b
  %wbase = mul i64 %wb, {HB}
  %abase = mul i64 %ab, {BS}
  br label %cloop
cloop:
  %c = phi i64 [0, %bloop], [%c.next, %cloop]
  %iacc = phi <8 x i32> [zeroinitializer, %bloop], [%iacc.next, %cloop]
  %wo0 = mul i64 %c, 16
  %wo = add i64 %wbase, %wo0
  %wp = getelementptr i8, i8* %w, i64 %wo
  %wpv = bitcast i8* %wp to <16 x i8>*
  %wv = load <16 x i8>, <16 x i8>* %wpv, align 1
  %lo = and <16 x i8> %wv, <i8 15, i8 15, i8 15, i8 15, i8 15, i8 15, i8 15, i8 15, i8 15, i8 15, i8 15, i8 15, i8 15, i8 15, i8 15, i8 15>
  %hi = lshr <16 x i8> %wv, <i8 4, i8 4, i8 4, i8 4, i8 4, i8 4, i8 4, i8 4, i8 4, i8 4, i8 4, i8 4, i8 4, i8 4, i8 4, i8 4>
  %q = shufflevector <16 x i8> %lo, <16 x i8> %hi, <32 x i32> <i32 0, i32 16, i32 1, i32 17, i32 2, i32 18, i32 3, i32 19, i32 4, i32 20, i32 5, i32 21, i32 6, i32 22, i32 7, i32 23, i32 8, i32 24, i32 9, i32 25, i32 10, i32 26, i32 11, i32 27, i32 12, i32 28, i32 13, i32 29, i32 14, i32 30, i32 15, i32 31>
  %ao0 = mul i64 %c, 32
  %ao = add i64 %abase, %ao0
  %ap = getelementptr i8, i8* %a, i64 %ao
  %apv = bitcast i8* %ap to <32 x i8>*
  %av = load <32 x i8>, <32 x i8>* %apv, align 1
  %p16 = call <16 x i16> @llvm.x86.avx2.pmadd.ub.sw(<32 x i8> %q, <32 x i8> %av)
  %p32 = call <8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16> %p16, <16 x i16> <i16 1, i16 1, i16 1, i16 1, i16 1, i16 1, i16 1, i16 1, i16 1, i16 1, i16 1, i16 1, i16 1, i16 1, i16 1, i16 1>)
  %iacc.next = add <8 x i32> %iacc, %p32
  %c.next = add i64 %c, 1
  %ccond = icmp slt i64 %c.next, {C}
  br i1 %ccond, label %cloop, label %cend
cend:
  %pf = sitofp <8 x i32> %iacc.next to <8 x float>
  %swp = getelementptr float, float* %s, i64 %wb
  %swv = load float, float* %swp
  %sap = getelementptr float, float* %sa, i64 %ab
  %sav = load float, float* %sap
  %sc = fmul float %swv, %sav
  %sc0 = insertelement <8 x float> undef, float %sc, i32 0
  %scv = shufflevector <8 x float> %sc0, <8 x float> undef, <8 x i32> zeroinitializer
  %acc.next = call <8 x float> @llvm.fma.v8f32(<8 x float> %pf, <8 x float> %scv, <8 x float> %acc)
  %zsp = getelementptr float, float* %zs, i64 %wb
  %zsv = load float, float* %zsp
  %asp = getelementptr float, float* %asum, i64 %ab
  %asv = load float, float* %asp
  %zt = fmul float %zsv, %asv
  %z.next = fadd float %z, %zt
  %b.next = add i64 %b, 1
  %bcond = icmp slt i64 %b.next, %nb
  br i1 %bcond, label %bloop, label %bend
bend:
  %y0 = call reassoc float @llvm.vector.reduce.fadd.v8f32(float 0.0, <8 x float> %acc.next)
  %y = fsub float %y0, %z.next
  %oi0 = mul i64 %m, %N
  %oi = add i64 %oi0, %n
  %op = getelementptr float, float* %out, i64 %oi
  store float %y, float* %op
  %m.next = add i64 %m, 1
  br label %mloop
mend:
  %n.next = add i64 %n, 1
  br label %nloop
exit:
  ret void
}
"""
#: block sizes the kernel takes, as 32-value chunks a block
_CHUNKS = (1, 2, 4, 8)
_IR = _HEAD + "".join(_ROWS.replace("{C}", str(c)).replace("{HB}", str(16 * c)).replace("{BS}", str(32 * c))
                      for c in _CHUNKS)

_P = ctypes.c_void_p
_I = ctypes.c_int64
_SIGNATURE = ctypes.CFUNCTYPE(None, _P, _P, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I)


def _build():
    """The compiled ``rows`` functions by block size and the engine that holds their code, or None without AVX2 on
    x86-64."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    if not llvm.get_host_cpu_features().get("avx2"):
        return None
    module = llvm.parse_assembly(_IR)
    module.verify()
    machine = llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3)
    passes = llvm.create_pass_builder(machine, llvm.create_pipeline_tuning_options(3))
    passes.getModulePassManager().run(module, passes)
    engine = llvm.create_mcjit_compiler(module, machine)
    engine.finalize_object()
    return {32 * c: _SIGNATURE(engine.get_function_address(f"rows{c}")) for c in _CHUNKS}, engine


try:
    _built = _build()
except Exception as e:  # noqa: BLE001 - an LLVM that cannot build the kernel here: the products take cpu_nbits
    log.warning("crossml.kernels.cpu_int8: the int8 kernel does not build (%s: %s); 4-bit products use numba's "
                "float kernel", type(e).__name__, e)
    _built = None
#: whether the kernel runs on this CPU (x86-64 with AVX2, the kernel built)
AVAILABLE = _built is not None
_rows = _built[0] if _built is not None else {}
_addresses = {bs: ctypes.cast(f, ctypes.c_void_p).value for bs, f in _rows.items()}


def eligible(block_size: int) -> bool:
    """Whether products of this block size take the kernel here: AVX2, blocks of 32 to 256 values."""
    return block_size in _rows


@intrinsic
def _call_rows(typingctx, addr, w, a, sa, asum, s, zs, out, n0, n1, nb, M, N):
    """Call the compiled ``rows`` function at address ``addr`` (an integer, so that numba's dispatch of ``_product``
    stays on its fast path: a ctypes function argument cost about 5 us a call) with the arrays' data addresses."""
    args = (addr, w, a, sa, asum, s, zs, out, n0, n1, nb, M, N)
    if not all(isinstance(t, types.Integer) for t in args):
        return None

    def codegen(context, builder, signature, llargs):
        i8p, f32p, i64 = ir.IntType(8).as_pointer(), ir.FloatType().as_pointer(), ir.IntType(64)
        pointers = (i8p, i8p, f32p, f32p, f32p, f32p, f32p)
        fn = builder.inttoptr(llargs[0], ir.FunctionType(ir.VoidType(), [*pointers, i64, i64, i64, i64, i64])
                              .as_pointer())
        call = [builder.inttoptr(v, t) for v, t in zip(llargs[1:8], pointers)]
        call += [context.cast(builder, v, t, types.int64) for v, t in zip(llargs[8:], signature.args[8:])]
        builder.call(fn, call)
        return context.get_dummy_value()

    return types.void(*args), codegen


@njit(parallel=True, cache=True, nogil=True)
def _product(addr, w, a, block_size, s, zs, N, chunks):  # pragma: no cover - compiled by numba
    """float32 ``a`` [M, K] quantized to int8 per block (``quantize_int8``), then the compiled ``rows`` function at
    ``addr`` over rows of N in ``chunks`` parts on numba's threads: float32 [M, N]. One call from Python."""
    M, K = a.shape
    nb = (K + block_size - 1) // block_size
    q = np.empty((M, nb * block_size), np.int8)
    sa = np.empty((M, nb), np.float32)
    asum = np.empty((M, nb), np.float32)
    quantize_int8(a, block_size, q, sa, asum)
    out = np.empty((M, N), np.float32)
    per = (N + chunks - 1) // chunks
    for t in prange(chunks):
        n0 = t * per
        n1 = min(N, n0 + per)
        if n0 < n1:
            _call_rows(addr, w.ctypes.data, q.ctypes.data, sa.ctypes.data, asum.ctypes.data, s.ctypes.data,
                       zs.ctypes.data, out.ctypes.data, n0, n1, nb, M, N)
    return out


def scales_zero_points(scales: torch.Tensor, zero_points: torch.Tensor | None, N: int,
                       n_blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's per-block weight scales and scales times zero points (float32 [N * n_blocks] each) from
    MatMulNBits' scales and packed uint8 zero points (or None: 8)."""
    s = scales.reshape(N, n_blocks).to(torch.float32)
    z = (torch.full((N, n_blocks), 8.0) if zero_points is None
         else unpack_bits(zero_points.reshape(N, -1), 4)[:, :n_blocks].to(torch.float32))
    return s.contiguous().reshape(-1).numpy(), (s * z).reshape(-1).numpy()


def matmul(a: torch.Tensor, B: torch.Tensor, s: np.ndarray, zs: np.ndarray, *, K: int, N: int,
           block_size: int) -> torch.Tensor:
    """``a @ dequant(B).T`` for float32 ``a`` [..., K], a quantized to int8 per block first as onnxruntime does at
    accuracy level 4; MatMulNBits' 4-bit B with ``scales_zero_points``' arrays (sizes checked by the caller;
    ``eligible(block_size)``). float32 [..., N]."""
    a = (a if a.is_contiguous() else a.contiguous()).numpy()
    B = B if B.is_contiguous() else B.contiguous()
    out = _parallel(_product, _addresses[block_size], B.numpy(), a.reshape(-1, K), block_size, s, zs, N,
                    _threads() * CHUNKS_PER_THREAD)
    return torch.from_numpy(out if a.ndim == 2 else out.reshape(a.shape[:-1] + (N,)))


def warm() -> None:
    """Compile the threads' wrapper for the argument types MatMulNBits passes (``crossml.kernels.warm_cpu``)."""
    if not AVAILABLE:
        return
    K, N = 32, 2
    s, zs = scales_zero_points(torch.ones(N), None, N, 1)
    matmul(torch.zeros(1, K), torch.zeros(N, 1, 16, dtype=torch.uint8), s, zs, K=K, N=N, block_size=32)
