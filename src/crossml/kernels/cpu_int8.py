"""4-bit MatMulNBits decode products on the int8 path (accuracy level 4) with x86 integer dot products: LLVM IR
compiled at import by llvmlite (numba's LLVM), called from numba's threads.

numba cannot express ``vpmaddubsw`` (its integer arithmetic widens to 64 bits), which is how onnxruntime's MLAS
multiplies 4-bit weights by int8 activations. These kernels write that loop in LLVM IR instead, for CPUs with AVX2.
Each step reads 32 bytes of MatMulNBits' B (64 values) and splits them into their low nibbles (the even values) and
high nibbles (the odd values); ``_permute`` has put the int8 activations in that order once per call (each 64
values as their 32 even, then their 32 odd ones), so no weight byte is moved between lanes. ``pmaddubsw`` multiplies
each half with its 32 activations and adds them in pairs (unsigned weights times signed activations: at most
2 * 15 * 128 a pair, no saturation), the two halves' pairs are added (at most 7,680: int16 still) and ``pmaddwd``
adds them in fours into eight int32 lanes. With blocks of 32 values a step holds two blocks (lanes 0-3 and 4-7,
scaled by one vector of their two scale products; an odd last block takes a 16-byte step); larger blocks add their
steps in int32 lanes first. A block's lanes are exact integers (at most 256 * 15 * 128 in magnitude), converted to
float32 and added into eight float32 lanes times the block's scale product (weight scale x activation scale); the
zero points come off once per block as ``scale_w * zero_point * scale_a * sum(a)``, as onnxruntime does. The result
differs from onnxruntime's only in float32 summation order.

B, its scales and its packed zero points are read as MatMulNBits stores them, so unlike ``cpu_nbits.matmul`` there is
no laid-out copy of the weight, and the kernel keeps nothing of its own (float32 scales and uint8 zero points are
taken as they are). Per product (Qwen2.5-0.5B's shapes, one row, 2-core host, min of 5 rounds, alternated with the
kernel before the permuted activations, which interleaved each 16 bytes' nibbles into the values' order and read a
float32 copy of the scales times the zero points): gate+up (896 x 9728) 286 -> 194 us, the down projection (4864 x
896) 144 -> 95 us, qkv (896 x 1152) 45 -> 36 us; the lm_head (896 x 151936) 5.3 -> 4.3 ms, bound by the host's
memory (about 21 GB/s: B, scales and zero points are 87 MB; with the copy, 102 MB). That kernel had been 1.2-1.85x
faster than ``cpu_nbits.matmul``.

Products of two rows of A or more with 32-value blocks (prompts, batches, beams) take ``tile32``: two rows of N by
two of A a step, each 32 bytes of B unpacked once for both rows of A and each activation load serving both rows of N,
every output computed by ``pair32``'s operations in its order (a row's values are those of its product alone). A
128-token prompt's products (Qwen2.5-0.5B's shapes, 2-core host) took 32.8 -> 19.2 ms (gate+up) against one row at
a time, level with or ahead of dequantizing for torch's float32 BLAS (20.4 ms); the whole prompt 1.31 -> 1.22 s,
alternated in one process (``crossml.ops.contrib.matmul_nbits.CPU_INT8_ANY_ROWS``).

Blocks of 32, 64, 128 or 256 values (``eligible``); rows of N split over numba's threads (``cpu_nbits._parallel``).
The machine code is built once per IR, CPU and LLVM version and kept beside numba's cache (``_object_cache``; a later
process reads it in about 10 ms instead of 0.3-0.6 s of LLVM passes and code generation). ``AVAILABLE`` is False
where the CPU has no AVX2 or LLVM cannot build the kernel (llvmlite without LLVM's new pass
manager API included: logged once): the products then take ``cpu_nbits.matmul``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import tempfile

import numpy as np
import torch
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from crossml.kernels.cpu_nbits import CHUNKS_PER_THREAD, _parallel, _threads, quantize_int8
from crossml.kernels.cpu_norm import normalize as _normalize

__all__ = ["AVAILABLE", "eligible", "matmul", "norm_matmul", "scales_zero_points", "warm"]

log = logging.getLogger("crossml")

# The kernels, each (w, a, sa, asum, s, zp, out, n0, n1, nb, M, N): for n in [n0, n1), m in [0, M):
#   out[m * N + n] = sum_b s[n * nb + b] * sa[m * nb + b] * dot_b - sum_b (s[n * nb + b] * z[n, b]) * asum[m * nb + b]
#   w: uint8 [N, nb, block_size / 2], MatMulNBits' B; a: int8 [M, nb * block_size], the activations in ``_permute``'s
#   order; sa / asum: float [M, nb]; s: float [N * nb], the weight scales; zp: uint8 [N, (nb + 1) / 2], the zero
#   points z packed as MatMulNBits packs them (block b's in byte b / 2, the low nibble for even b)
# Each step reads 32 bytes of B (64 values): their low nibbles (the even values) and high nibbles (the odd values)
# multiply 32 activations each, which ``_permute`` placed in that order, so no byte of B is moved between lanes.
# ``pair32`` (blocks of 32 values) takes two blocks a step: the int32 lanes 0-3 hold the first block's sums, 4-7 the
# second's, scaled by one vector of the two blocks' scales; an odd last block takes a 16-byte step. ``wide{S}``
# (blocks of 64 * S values, S a constant so that LLVM unrolls a block's steps) adds a block's S steps in int32 lanes,
# then scales them. The zero-point sum (``zterm``, inlined) takes eight blocks a step: four bytes of zp shifted apart
# into eight int32 lanes.
_HEAD = r"""
declare <16 x i16> @llvm.x86.avx2.pmadd.ub.sw(<32 x i8>, <32 x i8>)
declare <8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16>, <16 x i16>)
declare <8 x i16> @llvm.x86.ssse3.pmadd.ub.sw.128(<16 x i8>, <16 x i8>)
declare <4 x i32> @llvm.x86.sse2.pmadd.wd(<8 x i16>, <8 x i16>)
declare float @llvm.vector.reduce.fadd.v8f32(float, <8 x float>)
declare <8 x float> @llvm.fma.v8f32(<8 x float>, <8 x float>, <8 x float>)

define internal float @zterm(float* %s, i8* %zp, float* %asum, i64 %nbi, i64 %zbase, i64 %mbi, i64 %nb) alwaysinline {
entry:
  %ng = lshr i64 %nb, 3
  %hasg = icmp sgt i64 %ng, 0
  br i1 %hasg, label %gloop, label %gdone
gloop:
  %g = phi i64 [0, %entry], [%g.next, %gloop]
  %acc = phi <8 x float> [zeroinitializer, %entry], [%acc.next, %gloop]
  %gb = shl i64 %g, 3
  %g4 = shl i64 %g, 2
  %zo = add i64 %zbase, %g4
  %zpp = getelementptr i8, i8* %zp, i64 %zo
  %zpi = bitcast i8* %zpp to i32*
  %zw = load i32, i32* %zpi, align 1
  %zw0 = insertelement <8 x i32> undef, i32 %zw, i32 0
  %zwv = shufflevector <8 x i32> %zw0, <8 x i32> undef, <8 x i32> zeroinitializer
  %zsh = lshr <8 x i32> %zwv, <i32 0, i32 4, i32 8, i32 12, i32 16, i32 20, i32 24, i32 28>
  %zn = and <8 x i32> %zsh, <i32 15, i32 15, i32 15, i32 15, i32 15, i32 15, i32 15, i32 15>
  %zf = sitofp <8 x i32> %zn to <8 x float>
  %so = add i64 %nbi, %gb
  %sp = getelementptr float, float* %s, i64 %so
  %spv = bitcast float* %sp to <8 x float>*
  %sv = load <8 x float>, <8 x float>* %spv, align 4
  %ao = add i64 %mbi, %gb
  %ap = getelementptr float, float* %asum, i64 %ao
  %apv = bitcast float* %ap to <8 x float>*
  %av = load <8 x float>, <8 x float>* %apv, align 4
  %sz = fmul <8 x float> %sv, %zf
  %acc.next = call <8 x float> @llvm.fma.v8f32(<8 x float> %sz, <8 x float> %av, <8 x float> %acc)
  %g.next = add i64 %g, 1
  %gcond = icmp slt i64 %g.next, %ng
  br i1 %gcond, label %gloop, label %gdone
gdone:
  %accg = phi <8 x float> [zeroinitializer, %entry], [%acc.next, %gloop]
  %zg = call reassoc float @llvm.vector.reduce.fadd.v8f32(float 0.0, <8 x float> %accg)
  %b0 = shl i64 %ng, 3
  %hasr = icmp slt i64 %b0, %nb
  br i1 %hasr, label %rloop, label %exit
rloop:
  %b = phi i64 [%b0, %gdone], [%b.next, %rloop]
  %z = phi float [%zg, %gdone], [%z.next, %rloop]
  %zbi = lshr i64 %b, 1
  %rzo = add i64 %zbase, %zbi
  %rzpp = getelementptr i8, i8* %zp, i64 %rzo
  %zbyte = load i8, i8* %rzpp
  %zodd = and i64 %b, 1
  %zsh64 = shl i64 %zodd, 2
  %zsh8 = trunc i64 %zsh64 to i8
  %zs8 = lshr i8 %zbyte, %zsh8
  %zn8 = and i8 %zs8, 15
  %zf1 = uitofp i8 %zn8 to float
  %rso = add i64 %nbi, %b
  %rsp = getelementptr float, float* %s, i64 %rso
  %rsv = load float, float* %rsp
  %rao = add i64 %mbi, %b
  %rap = getelementptr float, float* %asum, i64 %rao
  %rav = load float, float* %rap
  %rsz = fmul float %rsv, %zf1
  %rzt = fmul float %rsz, %rav
  %z.next = fadd float %z, %rzt
  %b.next = add i64 %b, 1
  %rcond = icmp slt i64 %b.next, %nb
  br i1 %rcond, label %rloop, label %exit
exit:
  %zt = phi float [%zg, %gdone], [%z.next, %rloop]
  ret float %zt
}
"""
_B15 = "<" + ", ".join(["i8 15"] * 32) + ">"
_B4 = "<" + ", ".join(["i8 4"] * 32) + ">"
_B15H = "<" + ", ".join(["i8 15"] * 16) + ">"
_B4H = "<" + ", ".join(["i8 4"] * 16) + ">"
_ONES = "<" + ", ".join(["i16 1"] * 16) + ">"
_ONESH = "<" + ", ".join(["i16 1"] * 8) + ">"
# one 32-byte step: %p32 (<8 x i32>) from B at byte %wo and the activations at byte %ao
_STEP = r"""
  %wp = getelementptr i8, i8* %w, i64 %wo
  %wpv = bitcast i8* %wp to <32 x i8>*
  %wv = load <32 x i8>, <32 x i8>* %wpv, align 1
  %lo = and <32 x i8> %wv, B15
  %hi = lshr <32 x i8> %wv, B4
  %ap = getelementptr i8, i8* %a, i64 %ao
  %apv = bitcast i8* %ap to <32 x i8>*
  %alo = load <32 x i8>, <32 x i8>* %apv, align 1
  %ap2 = getelementptr i8, i8* %ap, i64 32
  %apv2 = bitcast i8* %ap2 to <32 x i8>*
  %ahi = load <32 x i8>, <32 x i8>* %apv2, align 1
  %p1 = call <16 x i16> @llvm.x86.avx2.pmadd.ub.sw(<32 x i8> %lo, <32 x i8> %alo)
  %p2 = call <16 x i16> @llvm.x86.avx2.pmadd.ub.sw(<32 x i8> %hi, <32 x i8> %ahi)
  %ps = add <16 x i16> %p1, %p2
  %p32 = call <8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16> %ps, <16 x i16> ONES)
""".replace("B15", _B15).replace("B4", _B4).replace("ONES", _ONES)
# the end of a row: %y = the scaled sums %accf less the zero-point term, stored at out[m * N + n]
_STORE = r"""
  %zt = call float @zterm(float* %s, i8* %zp, float* %asum, i64 %nbi, i64 %zbase, i64 %mbi, i64 %nb)
  %y0 = call reassoc float @llvm.vector.reduce.fadd.v8f32(float 0.0, <8 x float> %accf)
  %y = fsub float %y0, %zt
  %oi0 = mul i64 %m, %N
  %oi = add i64 %oi0, %n
  %op = getelementptr float, float* %out, i64 %oi
  store float %y, float* %op
"""
# the loops over rows n in [n0, n1) and m in [0, M) around a kernel's body, which starts at %mstart (block indices
# %nbi, %mbi and zero-point byte %zbase of the rows) and ends at {LAST}, whose store goes back to the m loop
_OPEN = r"""  %nb1 = add i64 %nb, 1
  %zrow = lshr i64 %nb1, 1
  br label %nloop
nloop:
  %n = phi i64 [%n0, %entry], [%n.next, %mend]
  %ncond = icmp slt i64 %n, %n1
  br i1 %ncond, label %mloop, label %exit
mloop:
  %m = phi i64 [0, %nloop], [%m.next, %{LAST}]
  %mcond = icmp slt i64 %m, %M
  br i1 %mcond, label %mstart, label %mend
mstart:
  %nbi = mul i64 %n, %nb
  %mbi = mul i64 %m, %nb
  %zbase = mul i64 %n, %zrow"""
_CLOSE = r"""  %m.next = add i64 %m, 1
  br label %mloop
mend:
  %n.next = add i64 %n, 1
  br label %nloop
exit:
  ret void
}"""
_PAIR = r"""
define void @pair32(i8* %w, i8* %a, float* %sa, float* %asum, float* %s, i8* %zp, float* %out,
                    i64 %n0, i64 %n1, i64 %nb, i64 %M, i64 %N) {
entry:
  %np = lshr i64 %nb, 1
  %odd = and i64 %nb, 1
  %hasp = icmp sgt i64 %np, 0
  %isodd = icmp ne i64 %odd, 0
OPEN
  br i1 %hasp, label %ploop, label %pdone
ploop:
  %p = phi i64 [0, %mstart], [%p.next, %ploop]
  %acc = phi <8 x float> [zeroinitializer, %mstart], [%acc.next, %ploop]
  %b = shl i64 %p, 1
  %wb = add i64 %nbi, %b
  %ab = add i64 %mbi, %b
  %wo = mul i64 %wb, 16
  %ao = mul i64 %ab, 32
STEP
  %pf = sitofp <8 x i32> %p32 to <8 x float>
  %swp = getelementptr float, float* %s, i64 %wb
  %swpv = bitcast float* %swp to <2 x float>*
  %swv = load <2 x float>, <2 x float>* %swpv, align 4
  %sap = getelementptr float, float* %sa, i64 %ab
  %sapv = bitcast float* %sap to <2 x float>*
  %sav = load <2 x float>, <2 x float>* %sapv, align 4
  %sc = fmul <2 x float> %swv, %sav
  %scv = shufflevector <2 x float> %sc, <2 x float> undef, <8 x i32> <i32 0, i32 0, i32 0, i32 0, i32 1, i32 1, i32 1, i32 1>
  %acc.next = call <8 x float> @llvm.fma.v8f32(<8 x float> %pf, <8 x float> %scv, <8 x float> %acc)
  %p.next = add i64 %p, 1
  %pcond = icmp slt i64 %p.next, %np
  br i1 %pcond, label %ploop, label %pdone
pdone:
  %accp = phi <8 x float> [zeroinitializer, %mstart], [%acc.next, %ploop]
  br i1 %isodd, label %tail, label %fin
tail:
  %tb = sub i64 %nb, 1
  %t.wb = add i64 %nbi, %tb
  %t.ab = add i64 %mbi, %tb
  %t.wo = mul i64 %t.wb, 16
  %t.wp = getelementptr i8, i8* %w, i64 %t.wo
  %t.wpv = bitcast i8* %t.wp to <16 x i8>*
  %t.wv = load <16 x i8>, <16 x i8>* %t.wpv, align 1
  %t.lo = and <16 x i8> %t.wv, B15H
  %t.hi = lshr <16 x i8> %t.wv, B4H
  %t.ao = mul i64 %t.ab, 32
  %t.ap = getelementptr i8, i8* %a, i64 %t.ao
  %t.apv = bitcast i8* %t.ap to <16 x i8>*
  %t.alo = load <16 x i8>, <16 x i8>* %t.apv, align 1
  %t.ap2 = getelementptr i8, i8* %t.ap, i64 16
  %t.apv2 = bitcast i8* %t.ap2 to <16 x i8>*
  %t.ahi = load <16 x i8>, <16 x i8>* %t.apv2, align 1
  %t.p1 = call <8 x i16> @llvm.x86.ssse3.pmadd.ub.sw.128(<16 x i8> %t.lo, <16 x i8> %t.alo)
  %t.p2 = call <8 x i16> @llvm.x86.ssse3.pmadd.ub.sw.128(<16 x i8> %t.hi, <16 x i8> %t.ahi)
  %t.ps = add <8 x i16> %t.p1, %t.p2
  %t.p32 = call <4 x i32> @llvm.x86.sse2.pmadd.wd(<8 x i16> %t.ps, <8 x i16> ONESH)
  %t.pf4 = sitofp <4 x i32> %t.p32 to <4 x float>
  %t.pf = shufflevector <4 x float> %t.pf4, <4 x float> zeroinitializer, <8 x i32> <i32 0, i32 1, i32 2, i32 3, i32 4, i32 5, i32 6, i32 7>
  %t.swp = getelementptr float, float* %s, i64 %t.wb
  %t.swv = load float, float* %t.swp
  %t.sap = getelementptr float, float* %sa, i64 %t.ab
  %t.sav = load float, float* %t.sap
  %t.sc = fmul float %t.swv, %t.sav
  %t.sc0 = insertelement <8 x float> undef, float %t.sc, i32 0
  %t.scv = shufflevector <8 x float> %t.sc0, <8 x float> undef, <8 x i32> zeroinitializer
  %acct = call <8 x float> @llvm.fma.v8f32(<8 x float> %t.pf, <8 x float> %t.scv, <8 x float> %accp)
  br label %fin
fin:
  %accf = phi <8 x float> [%accp, %pdone], [%acct, %tail]
STORE
CLOSE
""".replace("OPEN", _OPEN.replace("{LAST}", "fin")).replace("CLOSE", _CLOSE).replace("STEP", _STEP) \
    .replace("STORE", _STORE).replace("B15H", _B15H).replace("B4H", _B4H).replace("ONESH", _ONESH)
_WIDE = r"""
define void @wide{S}(i8* %w, i8* %a, float* %sa, float* %asum, float* %s, i8* %zp, float* %out,
                     i64 %n0, i64 %n1, i64 %nb, i64 %M, i64 %N) {
entry:
OPEN
  br label %bloop
bloop:
  %b = phi i64 [0, %mstart], [%b.next, %cend]
  %acc = phi <8 x float> [zeroinitializer, %mstart], [%acc.next, %cend]
  %wb = add i64 %nbi, %b
  %ab = add i64 %mbi, %b
  %wbase = mul i64 %wb, {WB}
  %abase = mul i64 %ab, {AB}
  br label %cloop
cloop:
  %c = phi i64 [0, %bloop], [%c.next, %cloop]
  %iacc = phi <8 x i32> [zeroinitializer, %bloop], [%iacc.next, %cloop]
  %wo0 = mul i64 %c, 32
  %wo = add i64 %wbase, %wo0
  %ao0 = mul i64 %c, 64
  %ao = add i64 %abase, %ao0
STEP
  %iacc.next = add <8 x i32> %iacc, %p32
  %c.next = add i64 %c, 1
  %ccond = icmp slt i64 %c.next, {S}
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
  %b.next = add i64 %b, 1
  %bcond = icmp slt i64 %b.next, %nb
  br i1 %bcond, label %bloop, label %bend
bend:
  %accf = phi <8 x float> [%acc.next, %cend]
STORE
CLOSE
""".replace("OPEN", _OPEN.replace("{LAST}", "bend")).replace("CLOSE", _CLOSE).replace("STEP", _STEP) \
    .replace("STORE", _STORE)
def _tile_ir() -> str:
    """``tile32``: ``pair32``'s arithmetic for two rows of N by two rows of M a step (N's rows [n0, n1) an even
    count, M's rows [0, M - M % 2)), each of B's 32 bytes unpacked once for two activation rows and each activation
    load serving two weight rows; every output is computed by the same operations in the same order as ``pair32``'s,
    so its values are the same bit for bit. For prompts and batches (``_product``)."""
    pairs = [(i, j) for i in (0, 1) for j in (0, 1)]
    L = []
    add = L.append
    add("define void @tile32(i8* %w, i8* %a, float* %sa, float* %asum, float* %s, i8* %zp, float* %out,")
    add("                    i64 %n0, i64 %n1, i64 %nb, i64 %M, i64 %N) {")
    add("entry:")
    add("  %np = lshr i64 %nb, 1\n  %odd = and i64 %nb, 1\n  %hasp = icmp sgt i64 %np, 0\n  %isodd = icmp ne i64 %odd, 0")
    add("  %nb1 = add i64 %nb, 1\n  %zrow = lshr i64 %nb1, 1\n  %M2 = and i64 %M, -2\n  br label %nloop")
    add("nloop:\n  %n = phi i64 [%n0, %entry], [%n.next, %mend]\n  %ncond = icmp slt i64 %n, %n1")
    add("  br i1 %ncond, label %mloop, label %exit")
    add("mloop:\n  %m = phi i64 [0, %nloop], [%m.next, %fin]\n  %mcond = icmp slt i64 %m, %M2")
    add("  br i1 %mcond, label %mstart, label %mend")
    add("mstart:\n  %nbi0 = mul i64 %n, %nb\n  %nbi1 = add i64 %nbi0, %nb\n  %mbi0 = mul i64 %m, %nb")
    add("  %mbi1 = add i64 %mbi0, %nb\n  %zb0 = mul i64 %n, %zrow\n  %zb1 = add i64 %zb0, %zrow")
    add("  br i1 %hasp, label %ploop, label %pdone")
    add("ploop:\n  %p = phi i64 [0, %mstart], [%p.next, %ploop]")
    for i, j in pairs:
        add(f"  %acc{i}{j} = phi <8 x float> [zeroinitializer, %mstart], [%acc{i}{j}.next, %ploop]")
    add("  %b = shl i64 %p, 1")
    for i in (0, 1):
        add(f"""  %wb{i} = add i64 %nbi{i}, %b
  %wo{i} = mul i64 %wb{i}, 16
  %wp{i} = getelementptr i8, i8* %w, i64 %wo{i}
  %wpv{i} = bitcast i8* %wp{i} to <32 x i8>*
  %wv{i} = load <32 x i8>, <32 x i8>* %wpv{i}, align 1
  %lo{i} = and <32 x i8> %wv{i}, {_B15}
  %hi{i} = lshr <32 x i8> %wv{i}, {_B4}
  %swp{i} = getelementptr float, float* %s, i64 %wb{i}
  %swpv{i} = bitcast float* %swp{i} to <2 x float>*
  %sw{i} = load <2 x float>, <2 x float>* %swpv{i}, align 4""")
    for j in (0, 1):
        add(f"""  %ab{j} = add i64 %mbi{j}, %b
  %ao{j} = mul i64 %ab{j}, 32
  %ap{j} = getelementptr i8, i8* %a, i64 %ao{j}
  %apv{j} = bitcast i8* %ap{j} to <32 x i8>*
  %alo{j} = load <32 x i8>, <32 x i8>* %apv{j}, align 1
  %aph{j} = getelementptr i8, i8* %ap{j}, i64 32
  %aphv{j} = bitcast i8* %aph{j} to <32 x i8>*
  %ahi{j} = load <32 x i8>, <32 x i8>* %aphv{j}, align 1
  %sap{j} = getelementptr float, float* %sa, i64 %ab{j}
  %sapv{j} = bitcast float* %sap{j} to <2 x float>*
  %sa{j} = load <2 x float>, <2 x float>* %sapv{j}, align 4""")
    for i, j in pairs:
        c = f"{i}{j}"
        add(f"""  %p1.{c} = call <16 x i16> @llvm.x86.avx2.pmadd.ub.sw(<32 x i8> %lo{i}, <32 x i8> %alo{j})
  %p2.{c} = call <16 x i16> @llvm.x86.avx2.pmadd.ub.sw(<32 x i8> %hi{i}, <32 x i8> %ahi{j})
  %ps.{c} = add <16 x i16> %p1.{c}, %p2.{c}
  %p32.{c} = call <8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16> %ps.{c}, <16 x i16> {_ONES})
  %pf.{c} = sitofp <8 x i32> %p32.{c} to <8 x float>
  %sc.{c} = fmul <2 x float> %sw{i}, %sa{j}
  %scv.{c} = shufflevector <2 x float> %sc.{c}, <2 x float> undef, <8 x i32> <i32 0, i32 0, i32 0, i32 0, i32 1, i32 1, i32 1, i32 1>
  %acc{c}.next = call <8 x float> @llvm.fma.v8f32(<8 x float> %pf.{c}, <8 x float> %scv.{c}, <8 x float> %acc{c})""")
    add("  %p.next = add i64 %p, 1\n  %pcond = icmp slt i64 %p.next, %np\n  br i1 %pcond, label %ploop, label %pdone")
    add("pdone:")
    for i, j in pairs:
        add(f"  %accp{i}{j} = phi <8 x float> [zeroinitializer, %mstart], [%acc{i}{j}.next, %ploop]")
    add("  br i1 %isodd, label %tail, label %fin")
    add("tail:\n  %tb = sub i64 %nb, 1")
    for i in (0, 1):
        add(f"""  %t.wb{i} = add i64 %nbi{i}, %tb
  %t.wo{i} = mul i64 %t.wb{i}, 16
  %t.wp{i} = getelementptr i8, i8* %w, i64 %t.wo{i}
  %t.wpv{i} = bitcast i8* %t.wp{i} to <16 x i8>*
  %t.wv{i} = load <16 x i8>, <16 x i8>* %t.wpv{i}, align 1
  %t.lo{i} = and <16 x i8> %t.wv{i}, {_B15H}
  %t.hi{i} = lshr <16 x i8> %t.wv{i}, {_B4H}
  %t.swp{i} = getelementptr float, float* %s, i64 %t.wb{i}
  %t.sw{i} = load float, float* %t.swp{i}""")
    for j in (0, 1):
        add(f"""  %t.ab{j} = add i64 %mbi{j}, %tb
  %t.ao{j} = mul i64 %t.ab{j}, 32
  %t.ap{j} = getelementptr i8, i8* %a, i64 %t.ao{j}
  %t.apv{j} = bitcast i8* %t.ap{j} to <16 x i8>*
  %t.alo{j} = load <16 x i8>, <16 x i8>* %t.apv{j}, align 1
  %t.aph{j} = getelementptr i8, i8* %t.ap{j}, i64 16
  %t.aphv{j} = bitcast i8* %t.aph{j} to <16 x i8>*
  %t.ahi{j} = load <16 x i8>, <16 x i8>* %t.aphv{j}, align 1
  %t.sap{j} = getelementptr float, float* %sa, i64 %t.ab{j}
  %t.sa{j} = load float, float* %t.sap{j}""")
    for i, j in pairs:
        c = f"{i}{j}"
        add(f"""  %t.p1.{c} = call <8 x i16> @llvm.x86.ssse3.pmadd.ub.sw.128(<16 x i8> %t.lo{i}, <16 x i8> %t.alo{j})
  %t.p2.{c} = call <8 x i16> @llvm.x86.ssse3.pmadd.ub.sw.128(<16 x i8> %t.hi{i}, <16 x i8> %t.ahi{j})
  %t.ps.{c} = add <8 x i16> %t.p1.{c}, %t.p2.{c}
  %t.p32.{c} = call <4 x i32> @llvm.x86.sse2.pmadd.wd(<8 x i16> %t.ps.{c}, <8 x i16> {_ONESH})
  %t.pf4.{c} = sitofp <4 x i32> %t.p32.{c} to <4 x float>
  %t.pf.{c} = shufflevector <4 x float> %t.pf4.{c}, <4 x float> zeroinitializer, <8 x i32> <i32 0, i32 1, i32 2, i32 3, i32 4, i32 5, i32 6, i32 7>
  %t.sc.{c} = fmul float %t.sw{i}, %t.sa{j}
  %t.sc0.{c} = insertelement <8 x float> undef, float %t.sc.{c}, i32 0
  %t.scv.{c} = shufflevector <8 x float> %t.sc0.{c}, <8 x float> undef, <8 x i32> zeroinitializer
  %acct{c} = call <8 x float> @llvm.fma.v8f32(<8 x float> %t.pf.{c}, <8 x float> %t.scv.{c}, <8 x float> %accp{c})""")
    add("  br label %fin\nfin:")
    for i, j in pairs:
        add(f"  %accf{i}{j} = phi <8 x float> [%accp{i}{j}, %pdone], [%acct{i}{j}, %tail]")
    for i, j in pairs:
        c = f"{i}{j}"
        add(f"""  %zt{c} = call float @zterm(float* %s, i8* %zp, float* %asum, i64 %nbi{i}, i64 %zb{i}, i64 %mbi{j}, i64 %nb)
  %y0.{c} = call reassoc float @llvm.vector.reduce.fadd.v8f32(float 0.0, <8 x float> %accf{c})
  %y.{c} = fsub float %y0.{c}, %zt{c}
  %om.{c} = add i64 %m, {j}
  %on.{c} = add i64 %n, {i}
  %oi0.{c} = mul i64 %om.{c}, %N
  %oi.{c} = add i64 %oi0.{c}, %on.{c}
  %op.{c} = getelementptr float, float* %out, i64 %oi.{c}
  store float %y.{c}, float* %op.{c}""")
    add("  %m.next = add i64 %m, 2\n  br label %mloop\nmend:\n  %n.next = add i64 %n, 2\n  br label %nloop")
    add("exit:\n  ret void\n}\n")
    return "\n".join(L)


#: block size -> the kernel's name (``wide{S}``: S = block_size / 64 steps a block)
_KERNELS = {32: "pair32", 64: "wide1", 128: "wide2", 256: "wide4"}
_IR = _HEAD + _PAIR + _tile_ir() + "".join(_WIDE.replace("{S}", str(bs // 64)).replace("{WB}", str(bs // 2)).replace(
    "{AB}", str(bs)) for bs in (64, 128, 256))

def _build(cache_dir: str | None = None):
    """The compiled ``rows`` functions' addresses by block size, ``tile32``'s, and the engine that holds their code,
    or None without AVX2 on x86-64. The machine code is kept in ``_object_cache(cache_dir)`` and read from there by later processes:
    LLVM's optimization and code generation took 0.3-0.45 s of a process's first CPU session."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    if not llvm.get_host_cpu_features().get("avx2"):
        return None
    cpu, features = llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()
    module = llvm.parse_assembly(_IR)
    module.verify()
    machine = llvm.Target.from_default_triple().create_target_machine(cpu=cpu, features=features, opt=3)
    path = _object_cache(cache_dir, cpu, features, llvm)
    cached = _read_object(path)
    if cached is None:
        passes = llvm.create_pass_builder(machine, llvm.create_pipeline_tuning_options(3))
        passes.getModulePassManager().run(module, passes)
    engine = llvm.create_mcjit_compiler(module, machine)
    engine.set_object_cache(notify_func=lambda _module, obj: cached is None and _write_object(path, obj),
                            getbuffer_func=lambda _module: cached)
    engine.finalize_object()
    return ({bs: engine.get_function_address(name) for bs, name in _KERNELS.items()},
            engine.get_function_address("tile32"), engine)


def _object_cache(cache_dir: str | None, cpu: str, features: str, llvm) -> str | None:
    """Where the kernels' machine code for this IR, CPU and LLVM is kept: ``cache_dir``, else numba's cache directory
    (NUMBA_CACHE_DIR) where set, else this package's ``__pycache__`` (where numba keeps its own) where writable, else
    ``~/.cache/crossml``; None where none is writable."""
    import llvmlite

    key = hashlib.sha256("\n".join([_IR, cpu, features, llvmlite.__version__, str(llvm.llvm_version_info)])
                         .encode()).hexdigest()[:32]
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "__pycache__")
    for d in ([cache_dir] if cache_dir else [os.environ.get("NUMBA_CACHE_DIR"), here,
                                              os.path.join(os.path.expanduser("~"), ".cache", "crossml")]):
        if not d:
            continue
        try:
            os.makedirs(d, exist_ok=True)
        except OSError:
            continue
        if os.access(d, os.W_OK):
            return os.path.join(d, f"cpu_int8.{key}.o")
    return None


def _read_object(path: str | None) -> bytes | None:
    """The machine code kept at ``path`` (after its SHA-256), or None where there is none or it does not check out (a
    torn write: the kernels are built again)."""
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    digest, obj = data[:32], data[32:]
    return obj if obj and hashlib.sha256(obj).digest() == digest else None


def _write_object(path: str | None, obj: bytes) -> None:
    """Keep the machine code at ``path``, written whole to a temporary file first, then renamed."""
    if path is None:
        return
    try:
        with tempfile.NamedTemporaryFile(dir=os.path.dirname(path), delete=False) as f:
            f.write(hashlib.sha256(obj).digest() + obj)
        os.chmod(f.name, 0o644)
        os.replace(f.name, path)
    except OSError as e:  # a read-only or full disk: the next process builds the kernels again
        log.debug("crossml.kernels.cpu_int8: machine code not kept at %s (%s)", path, e)


try:
    _built = _build()
except Exception as e:  # noqa: BLE001 - an LLVM that cannot build the kernel here: the products take cpu_nbits
    log.warning("crossml.kernels.cpu_int8: the int8 kernel does not build (%s: %s); 4-bit products use numba's "
                "float kernel", type(e).__name__, e)
    _built = None
#: whether the kernel runs on this CPU (x86-64 with AVX2, the kernel built)
AVAILABLE = _built is not None
#: block size -> its ``rows`` function's address; blocks of 32 values -> ``tile32``'s, for two rows or more
_addresses = _built[0] if _built is not None else {}
_TILE = {32: _built[1]} if _built is not None else {}


def eligible(block_size: int) -> bool:
    """Whether products of this block size take the kernel here: AVX2, blocks of 32 to 256 values."""
    return block_size in _addresses


@intrinsic
def _call_rows(typingctx, addr, w, a, sa, asum, s, zp, out, n0, n1, nb, M, N):
    """Call the compiled ``rows`` function at address ``addr`` (an integer, so that numba's dispatch of ``_product``
    stays on its fast path: a ctypes function argument cost about 5 us a call) with the arrays' data addresses."""
    args = (addr, w, a, sa, asum, s, zp, out, n0, n1, nb, M, N)
    if not all(isinstance(t, types.Integer) for t in args):
        return None

    def codegen(context, builder, signature, llargs):
        i8p, f32p, i64 = ir.IntType(8).as_pointer(), ir.FloatType().as_pointer(), ir.IntType(64)
        pointers = (i8p, i8p, f32p, f32p, f32p, i8p, f32p)
        fn = builder.inttoptr(llargs[0], ir.FunctionType(ir.VoidType(), [*pointers, i64, i64, i64, i64, i64])
                              .as_pointer())
        call = [builder.inttoptr(v, t) for v, t in zip(llargs[1:8], pointers)]
        call += [context.cast(builder, v, t, types.int64) for v, t in zip(llargs[8:], signature.args[8:])]
        builder.call(fn, call)
        return context.get_dummy_value()

    return types.void(*args), codegen


@njit(cache=True, nogil=True, boundscheck=False)
def _permute(q, qp):  # pragma: no cover - compiled by numba
    """The int8 activations q [M, nb * block_size] in the kernels' order: each 64 values as their 32 even ones, then
    their 32 odd ones (the low and the high nibbles of 32 bytes of B); a last 32 values (an odd number of 32-value
    blocks) as 16 and 16."""
    M, K = q.shape
    for m in range(M):
        c = 0
        while c < K:
            h = 32 if c + 64 <= K else 16
            for j in range(h):
                qp[m, c + j] = q[m, c + 2 * j]
                qp[m, c + h + j] = q[m, c + 2 * j + 1]
            c += 2 * h


@njit(parallel=True, cache=True, nogil=True)
def _product(addr, tile, w, a, block_size, s, zp, N, chunks):  # pragma: no cover - compiled by numba
    """float32 ``a`` [M, K] quantized to int8 per block (``quantize_int8``), then the compiled ``rows`` function at
    ``addr`` over rows of N in ``chunks`` parts on numba's threads: float32 [M, N]. One call from Python. ``tile``:
    where nonzero (blocks of 32 values) and M >= 2, ``tile32`` takes pairs of N's rows by pairs of M's, ``addr``
    (``pair32``, the same values) an odd last row of M (at offset pointers) and of N."""
    M, K = a.shape
    nb = (K + block_size - 1) // block_size
    q = np.empty((M, nb * block_size), np.int8)
    sa = np.empty((M, nb), np.float32)
    asum = np.empty((M, nb), np.float32)
    quantize_int8(a, block_size, q, sa, asum)
    qp = np.empty_like(q)
    _permute(q, qp)
    out = np.empty((M, N), np.float32)
    if tile == 0 or M < 2:
        per = (N + chunks - 1) // chunks
        for t in prange(chunks):
            n0 = t * per
            n1 = min(N, n0 + per)
            if n0 < n1:
                _call_rows(addr, w.ctypes.data, qp.ctypes.data, sa.ctypes.data, asum.ctypes.data, s.ctypes.data,
                           zp.ctypes.data, out.ctypes.data, n0, n1, nb, M, N)
        return out
    last = M - 1  # the odd last row of M: its activations, scales and outputs start here
    a1, s1, o1 = qp.ctypes.data + last * nb * block_size, last * nb * 4, last * N * 4
    pairs = N // 2
    per = (pairs + chunks - 1) // chunks
    for t in prange(chunks):
        n0 = 2 * t * per
        n1 = min(2 * pairs, n0 + 2 * per)
        if n0 < n1:
            _call_rows(tile, w.ctypes.data, qp.ctypes.data, sa.ctypes.data, asum.ctypes.data, s.ctypes.data,
                       zp.ctypes.data, out.ctypes.data, n0, n1, nb, M, N)
            if M % 2:
                _call_rows(addr, w.ctypes.data, a1, sa.ctypes.data + s1, asum.ctypes.data + s1, s.ctypes.data,
                           zp.ctypes.data, out.ctypes.data + o1, n0, n1, nb, 1, N)
    if N % 2:
        _call_rows(addr, w.ctypes.data, qp.ctypes.data, sa.ctypes.data, asum.ctypes.data, s.ctypes.data,
                   zp.ctypes.data, out.ctypes.data, N - 1, N, nb, M, N)
    return out


def scales_zero_points(scales: torch.Tensor, zero_points: torch.Tensor | None, N: int,
                       n_blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's per-block weight scales (float32 [N * n_blocks]) and packed zero points (uint8 [N * ((n_blocks +
    1) // 2)]) from MatMulNBits' scales and packed uint8 zero points (or None: 8 in every nibble): views of them where
    they are float32 and uint8 already, so the kernel reads what onnxruntime reads (a copy of the scales times the
    zero points in float32 had added half of B's bytes again at 32-value blocks)."""
    s = scales.reshape(-1).to(torch.float32).contiguous()
    rows = (n_blocks + 1) // 2
    z = torch.full((N * rows,), 0x88, dtype=torch.uint8) if zero_points is None else zero_points.reshape(-1)
    return s.numpy(), z.contiguous().numpy()


def matmul(a: torch.Tensor, B: torch.Tensor, s: np.ndarray, zp: np.ndarray, *, K: int, N: int,
           block_size: int) -> torch.Tensor:
    """``a @ dequant(B).T`` for float32 ``a`` [..., K], a quantized to int8 per block first as onnxruntime does at
    accuracy level 4; MatMulNBits' 4-bit B with ``scales_zero_points``' arrays (sizes checked by the caller;
    ``eligible(block_size)``). float32 [..., N]."""
    a = (a if a.is_contiguous() else a.contiguous()).numpy()
    return torch.from_numpy(_matmul(a, B, s, zp, K, N, block_size))


def norm_matmul(x: torch.Tensor, skip: torch.Tensor, gamma: torch.Tensor, epsilon: float, B: torch.Tensor,
                s: np.ndarray, zp: np.ndarray, *, K: int, N: int, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``matmul`` of SkipSimplifiedLayerNormalization(x, skip, gamma) (``crossml.kernels.cpu_norm.normalize``, the
    op's values), and the sum x + skip: the fused NormMatMulNBits node's outputs."""
    normed, total = _normalize(x, skip, gamma, None, epsilon)
    return torch.from_numpy(_matmul(normed, B, s, zp, K, N, block_size)), torch.from_numpy(total)


def _matmul(a: np.ndarray, B: torch.Tensor, s: np.ndarray, zp: np.ndarray, K: int, N: int,
            block_size: int) -> np.ndarray:
    B = B if B.is_contiguous() else B.contiguous()
    out = _parallel(_product, _addresses[block_size], _TILE.get(block_size, 0), B.numpy(), a.reshape(-1, K),
                    block_size, s, zp, N, _threads() * CHUNKS_PER_THREAD)
    return out if a.ndim == 2 else out.reshape(a.shape[:-1] + (N,))


def warm() -> None:
    """Compile the threads' wrapper for the argument types MatMulNBits passes (``crossml.kernels.warm_cpu``)."""
    if not AVAILABLE:
        return
    K, N = 32, 2
    s, zp = scales_zero_points(torch.ones(N), None, N, 1)
    matmul(torch.zeros(1, K), torch.zeros(N, 1, 16, dtype=torch.uint8), s, zp, K=K, N=N, block_size=32)
