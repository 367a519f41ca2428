"""MatMulNBits' 4-bit product for 2 to 64 rows of fp16 activations on NVIDIA matrix units, in Gluon.

``y[M, N] = A[M, K] @ dequantize(B)^T (+ bias)`` for M <= 64 (``crossml.kernels.matmul_nbits.mma_eligible`` routes 2
to 16 rows, and to 32 for large weights), reading MatMulNBits' own packed weight (uint8
``[N, n_blocks, block_size / 2]``, low nibble first; see ``crossml.kernels.matmul_nbits``) without a repacked copy.

Gluon (``triton.experimental.gluon``, Triton 3.6) is Triton's layout-explicit language. ``tl.dot`` in
``_matmul_nbits_dot_kernel`` keeps its dequantized weight tiles on a shared-memory round trip; here the weights are
dequantized straight into the registers the matrix units read (the ``mma_v2`` B operand,
``DotOperandLayout(1, mma, k_width=2)``), so no weight goes through shared memory:

- A lane of a quad (lane % 4 = t) owns the quantization block that starts at ``k0 + 32 t`` of each of its weight
  rows (a 128-value K step is four lanes' blocks): its four int32 words are one 128-bit load, with one scale and
  one zero point a row.
- The product's K order inside a step is permuted, alike for A and B, so that each lane's words feed its own
  operand slots: operand position ``32 w + 8 p + 2 t + e`` is K offset ``32 t + 8 w + p + 4 e`` (word w, nibble
  p + 4 e). Nibbles p and p + 4 of a word become one fp16 pair with a lop3 under the exponent of 1024, an fma
  leaves q - zero point exactly and a multiply by the scale rounds once, as ``dequantize`` does. The activations
  of a lane are eight contiguous values a word (128-bit loads), paired the same way.
- The conversions into the operand layouts are register renamings (``assert_trivial``); one ``mma_v2`` per
  16 x 8 x 16 tile, float32 accumulation. Past 16 rows, two or four 16-row tiles of A share each dequantized step
  (``M_TILES``).
- Each step's weights are requested ``DEPTH`` steps ahead (loop-carried registers); with PDL and constant weights
  the first steps' are requested before waiting for the previous kernel.
- K is split until there are about ``SPLIT_PER_SM`` programs per SM; the partial sums are added in a fixed order
  by ``crossml.kernels.gemv``'s reduction, so a captured graph's replays give the eager result bit for bit.

It covers what the GenAI builder's int4 models use: fp16 activations, block sizes 32 to 256, zero points packed or
absent, K a multiple of 128. ``supported`` says when it runs (NVIDIA compute capability 8.0 or later, not the
interpreter: Gluon kernels do not run in Triton's interpreter, so its tests run on GPUs, and on the CPU compile it
ahead of time, ``compile_for``).

On an H200 (``benchmarks/int4_mma.py``, results/int4_mma.md, in CUDA graphs) at 2 to 16 rows it took
Llama-3.2-1B's lm_head from 67.1-118.7 us (the fp16-pair GEMV at 2 rows, the tl.dot kernel from 4) to 65.8-78.6 us
and its gate+up from 15.8-19.9 to 10.8-14.9 us, and the GenAI benchmark's int4 decode at B = 2 / 4 / 8 / 16 from
2,573 / 4,639 / 8,626 / 16,174 to 3,186 / 6,210 / 11,366 / 18,327 tokens/s (Llama-3.2-1B; Qwen2.5-0.5B 3,354 /
5,689 / 10,715 / 20,377 to 3,487 / 6,853 / 12,634 / 21,924; results/genai_batch_int4_mma*.md). With one row the
fp16-pair GEMV stays faster (48.0 against 65.3 us at that lm_head): the kernel's dequantization, 3.35 SASS
instructions a weight (``int4_mma.py --compile``), not memory, bounds it there.
"""

from __future__ import annotations

import contextlib

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from crossml.kernels._gluon import gdc_launch_dependents, gdc_wait, store_rows
from crossml.kernels._launch import cdiv, nvidia_sm80, pdl

__all__ = ["MAX_M", "compile_for", "mma_product", "pick_tiles", "supported"]

#: most rows of A one product takes (four 16-row operand tiles)
MAX_M = 64
#: the K step: four lanes' 32-value blocks
BLOCK_K = 128
_BLOCK_K = gl.constexpr(BLOCK_K)
_STEP_W = gl.constexpr(BLOCK_K // 8)  # the step in int32 words
#: most K splits (the reduction loads all of an output's partial sums at once)
_MAX_SPLIT = 64

#: nibbles ``$2 & $3`` under the exponent of 1024 as an fp16 pair, times $4 (1, or 1/16 for the upper nibbles,
#: which land as 16 q) plus $5 (-(1024 + zero point), or -(64 + zero point)): q - zero point exactly
_PAIR_PTX = gl.constexpr("""
{
.reg .b32 x, c2;
lop3.b32 x, $2, $3, 0x64006400, 0xEA;
mov.b32 c2, {$5, $5};
fma.rn.f16x2 x, x, $4, c2;
mov.b32 {$0, $1}, x;
}
""")


@gluon.jit
def _weight_loads(w_ptr, s_ptr, z_ptr, w_off, s_row, z_row, t32, kw, BS: gl.constexpr, ZP: gl.constexpr):
    """The words [BN, 4 t, 4 w], scales [BN, 4 t] and zero-point nibbles [BN, 4 t] (int32; 8 without zero points) of
    the K step at word ``kw`` (K offset 8 kw)."""
    word = gl.load(w_ptr + w_off + kw)
    blk = (kw * 8 + t32) // BS
    sc = gl.load(s_ptr + s_row + blk)
    if ZP:
        zp = (gl.load(z_ptr + z_row + blk // 2).to(gl.int32) >> ((blk % 2) * 4)) & 0xF
    else:
        zp = gl.full(sc.shape, 8, gl.int32, sc.type.layout)
    return word, sc, zp


@gluon.jit
def _weights(word, sc, zp, shift, mask, mul, odd, b_l: gl.constexpr):
    """The step's weights [BLOCK_K, BN] dequantized into the mma B operand (see the module)."""
    c_even = gl.expand_dims(gl.expand_dims((0xE400 | zp).to(gl.int16), 2), 3)  # fp16 bits of -(1024 + zp)
    c_odd = gl.expand_dims(gl.expand_dims((0xD400 | (zp << 4)).to(gl.int16), 2), 3)  # of -(64 + zp)
    lo, hi = gl.inline_asm_elementwise(_PAIR_PTX, "=h,=h,r,r,r,h",
                                       [gl.expand_dims(word, 3) >> shift, mask, mul, gl.where(odd, c_odd, c_even)],
                                       dtype=(gl.float16, gl.float16), is_pure=True, pack=1)
    s4 = gl.expand_dims(gl.expand_dims(sc, 2), 3)
    # [n, t, w, p, e] -> operand position 32 w + 8 p + 2 t + e
    b = gl.reshape(gl.permute(gl.join(lo * s4, hi * s4), (2, 3, 1, 4, 0)), (_BLOCK_K, lo.shape[0]))
    return gl.convert_layout(b, b_l, assert_trivial=True)


@gluon.jit
def _activations(a, a_l: gl.constexpr):
    """The step's activations ``a`` [16, 4 t, 4 w, 8 h = p + 4 e] as the mma A operand, in the weights' K order."""
    a2 = gl.reshape(gl.permute(gl.reshape(a, (16, 4, 4, 2, 4)), (0, 2, 4, 1, 3)), (16, _BLOCK_K))
    return gl.convert_layout(a2, a_l, assert_trivial=True)


@gluon.jit
def _nbits_mma_kernel(a_ptr, w_ptr, s_ptr, z_ptr, bias_ptr, y_ptr, M, N, K, KW_PER_SPLIT, ROW_W, S_ROW, Z_ROW,
                      s_am, s_ym, s_ys, BS: gl.constexpr, ZP: gl.constexpr, HAS_BIAS: gl.constexpr,
                      PARTIAL: gl.constexpr, BLOCK_N: gl.constexpr, WARPS: gl.constexpr, DEPTH: gl.constexpr,
                      HALF_M: gl.constexpr, CONST_W: gl.constexpr, M_TILES: gl.constexpr = 1,
                      PDL: gl.constexpr = False):
    """y [M, N] (or with PARTIAL float32 partial sums [split, M, N]) of the K range of program (n tile, split);
    words ``w_ptr`` int32 [N, ROW_W], scales [N, S_ROW], packed zero points [N, Z_ROW] (ZP). HALF_M: M <= 8, the
    activation rows 8-15 are not loaded. M_TILES (1, 2 or 4) 16-row tiles of A share each step's dequantized
    weights; the first tile's activations are requested a step ahead, the others' at the step."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, WARPS], instr_shape=[16, 8])
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    p4: gl.constexpr = gl.BlockedLayout([1, 1, 4, 4], [8, 4, 1, 1], [WARPS, 1, 1, 1], [3, 2, 1, 0])  # n, t, w, p
    lw: gl.constexpr = gl.SliceLayout(3, p4)  # n, t, w
    ls: gl.constexpr = gl.SliceLayout(2, lw)  # n, t
    pa: gl.constexpr = gl.BlockedLayout([1, 1, 4, 8], [8, 4, 1, 1], [1, 1, 1, WARPS], [3, 2, 1, 0])  # m, t, w, h
    n0 = gl.program_id(0) * BLOCK_N
    rows = gl.expand_dims(gl.minimum(n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ls)), N - 1), 1)
    t = gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(0, ls)), 0)
    w = gl.expand_dims(gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, lw))), 0), 1)
    w_off = gl.expand_dims(rows * ROW_W + t * 4, 2) + w
    s_row = rows * S_ROW
    z_row = rows * Z_ROW
    t32 = t * 32
    p = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, p4))))
    p = gl.expand_dims(gl.expand_dims(gl.expand_dims(p, 0), 1), 2)  # [1, 1, 1, 4]: pair p of a word
    shift = (p // 2) * 8
    mask = gl.where(p % 2 == 1, 0x00F000F0, 0x000F000F)
    mul = gl.where(p % 2 == 1, 0x2C002C00, 0x3C003C00)  # 1/16 or 1 in both halves
    odd = p % 2 == 1
    # activations [16 m, 4 t, 4 w, 8 h] at K offset 32 t + 8 w + h of the step
    m_a = gl.arange(0, 16, layout=gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, pa))))
    t_a = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, pa))))
    w_a = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, pa))))
    h_a = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, pa))))
    m4 = gl.expand_dims(gl.expand_dims(gl.expand_dims(m_a, 1), 2), 3)
    a_off = (m4 * s_am + gl.expand_dims(gl.expand_dims(gl.expand_dims(t_a, 0), 2), 3) * 32
             + gl.expand_dims(gl.expand_dims(gl.expand_dims(w_a, 0), 1), 3) * 8
             + gl.expand_dims(gl.expand_dims(gl.expand_dims(h_a, 0), 1), 2))
    a_ok = m4 < (gl.minimum(M, 8) if HALF_M else M)

    kw_lo = gl.program_id(1) * KW_PER_SPLIT
    last = (gl.minimum(K // 8, kw_lo + KW_PER_SPLIT) - kw_lo) // _STEP_W - 1  # index of the last step
    if PDL and not CONST_W:
        gdc_wait()
    word, sc, zp = _weight_loads(w_ptr, s_ptr, z_ptr, w_off, s_row, z_row, t32, kw_lo, BS, ZP)
    if DEPTH == 2:
        word1, sc1, zp1 = _weight_loads(w_ptr, s_ptr, z_ptr, w_off, s_row, z_row, t32,
                                        kw_lo + gl.minimum(1, last) * _STEP_W, BS, ZP)
    if PDL:
        if CONST_W:
            gdc_wait()
        gdc_launch_dependents()
    a = gl.load(a_ptr + a_off + kw_lo * 8, mask=a_ok, other=0.0)
    acc = gl.zeros([16, BLOCK_N], gl.float32, mma)
    if M_TILES >= 2:
        acc1 = gl.zeros([16, BLOCK_N], gl.float32, mma)
    if M_TILES == 4:
        acc2 = gl.zeros([16, BLOCK_N], gl.float32, mma)
        acc3 = gl.zeros([16, BLOCK_N], gl.float32, mma)
    for i in range(0, last + 1):
        ahead = kw_lo + gl.minimum(i + DEPTH, last) * _STEP_W  # the last step again at the end
        word_n, sc_n, zp_n = _weight_loads(w_ptr, s_ptr, z_ptr, w_off, s_row, z_row, t32, ahead, BS, ZP)
        a_n = gl.load(a_ptr + a_off + (kw_lo + gl.minimum(i + 1, last) * _STEP_W) * 8, mask=a_ok, other=0.0)
        here = a_off + (kw_lo + i * _STEP_W) * 8
        if M_TILES >= 2:
            a1 = gl.load(a_ptr + here + 16 * s_am, mask=m4 + 16 < M, other=0.0)
        if M_TILES == 4:
            a2 = gl.load(a_ptr + here + 32 * s_am, mask=m4 + 32 < M, other=0.0)
            a3 = gl.load(a_ptr + here + 48 * s_am, mask=m4 + 48 < M, other=0.0)
        b = _weights(word, sc, zp, shift, mask, mul, odd, b_l)
        acc = mma_v2(_activations(a, a_l), b, acc)
        if M_TILES >= 2:
            acc1 = mma_v2(_activations(a1, a_l), b, acc1)
        if M_TILES == 4:
            acc2 = mma_v2(_activations(a2, a_l), b, acc2)
            acc3 = mma_v2(_activations(a3, a_l), b, acc3)
        a = a_n
        if DEPTH == 2:
            word, sc, zp = word1, sc1, zp1
            word1, sc1, zp1 = word_n, sc_n, zp_n
        else:
            word, sc, zp = word_n, sc_n, zp_n
    store_rows(acc, bias_ptr, y_ptr, 0, M, N, n0, s_ym, s_ys, mma, BLOCK_N, HAS_BIAS, PARTIAL, True)
    if M_TILES >= 2:
        store_rows(acc1, bias_ptr, y_ptr, 16, M, N, n0, s_ym, s_ys, mma, BLOCK_N, HAS_BIAS, PARTIAL, True)
    if M_TILES == 4:
        store_rows(acc2, bias_ptr, y_ptr, 32, M, N, n0, s_ym, s_ys, mma, BLOCK_N, HAS_BIAS, PARTIAL, True)
        store_rows(acc3, bias_ptr, y_ptr, 48, M, N, n0, s_ym, s_ys, mma, BLOCK_N, HAS_BIAS, PARTIAL, True)


def supported(a: torch.Tensor, K: int, N: int, block_size: int, zero_points: torch.Tensor | None) -> bool:
    """Whether ``mma_product`` takes this product: fp16 activations on an NVIDIA GPU of compute capability 8.0 or
    later (outside the interpreter), K a multiple of 128, block size 32 to 256, zero points packed (uint8) or
    absent, and the weight's words addressable with 32-bit offsets."""
    if a.dtype != torch.float16 or not nvidia_sm80(a):
        return False
    if K % BLOCK_K or not 32 <= block_size <= 256 or N * (K // 8) >= 2**31:
        return False
    return zero_points is None or zero_points.dtype == torch.uint8


#: programs per SM that K is split to reach
SPLIT_PER_SM = 4


def pick_tiles(M: int, N: int, K: int, processors: int) -> tuple[int, int, int, int]:
    """(BLOCK_N, WARPS, DEPTH, SPLIT_K): 64 weight rows at two warps, each step's weights requested one step ahead,
    K split (in whole steps, at most _MAX_SPLIT ranges) until there are about SPLIT_PER_SM programs per SM.

    From the in-graph sweep at Qwen2.5-0.5B's and Llama-3.2-1B's decode shapes, 1 to 16 rows, on an H200
    (``benchmarks/int4_mma.py --run --sweep``, results/int4_mma_sweep.json):

    - 32 weight rows a warp (64 x 2 warps) was the fastest or within 0.3 us of it at the narrow products; at
      Qwen2.5-0.5B's lm_head (K = 896) 64 rows a warp (128 x 2) cost 38-43 us against 31-39;
    - at 16 rows one warp of 64 rows led at Llama-3.2-1B's lm_head and gate+up in the sweep (66.9 against 77.7 us,
      13.9 against 15.0), but taking it for more than 8 rows at K >= 2048 made that lm_head no faster (68.2 us) and
      its qkv, o, gate+up and down products slower (6.7 / 5.6 / 15.9 / 11.0 against 6.0 / 5.3 / 14.9 / 10.3 us) in
      the next run, so it is not taken;
    - two steps ahead, or K split to 2 or 8 programs per SM, won by at most 1 us (Llama-3.2-1B's o projection at
      16 rows, 4.5 against 5.3 us) and lost elsewhere."""
    n_prog = cdiv(N, 64)
    split = max(1, min(cdiv(SPLIT_PER_SM * processors, n_prog), K // BLOCK_K, _MAX_SPLIT))
    return 64, 2, 1, split


def mma_product(a2: torch.Tensor, b2: torch.Tensor, s2: torch.Tensor, z2: torch.Tensor | None,
                bias1: torch.Tensor | None, y2: torch.Tensor, *, K: int, N: int, block_size: int,
                tiles: tuple[int, int, int, int], const_w: bool) -> None:
    """``y2 [M, N] = a2 [M <= MAX_M, K] @ dequantize(b2)^T (+ bias1)`` (``supported`` holds): b2 uint8
    [N, n_blocks * block_size / 2] contiguous, s2 [N, n_blocks], z2 uint8 [N, bytes] or None; ``tiles`` (BLOCK_N, WARPS, DEPTH, SPLIT_K) as
    ``pick_tiles``. One launch, or with K split the float32 partial sums and ``crossml.kernels.gemv``'s
    fixed-order reduction (bias and cast)."""
    from crossml.kernels.gemv import _k_per_split, _reduce_tiles, _split_k_reduce_kernel

    block_n, warps, depth, split = tiles
    M = a2.shape[0]
    if M > MAX_M or block_n not in (32, 64, 128, 256) or block_n % (8 * warps) or depth not in (1, 2) \
            or not 1 <= split <= _MAX_SPLIT:
        raise ValueError(f"MatMulNBits mma kernel: tiles {tiles} (BLOCK_N 32-256 in whole 8-row tiles a warp, "
                         f"DEPTH 1 or 2, SPLIT_K in [1, {_MAX_SPLIT}]) for M={M} <= {MAX_M} rows")
    k_per_split = _k_per_split(K, split, BLOCK_K)
    split = cdiv(K, k_per_split)  # no empty splits
    out = y2 if split == 1 else torch.empty((split, M, N), dtype=torch.float32, device=a2.device)
    has_bias = bias1 is not None
    with torch.cuda.device(a2.device) if a2.device.type == "cuda" else contextlib.nullcontext():
        _nbits_mma_kernel[(cdiv(N, block_n), split)](
            a2, b2.view(torch.int32), s2, z2 if z2 is not None else s2, bias1 if has_bias else s2, out, M, N, K,
            k_per_split // 8, b2.shape[1] // 4, s2.stride(0), z2.stride(0) if z2 is not None else 0, a2.stride(0),
            out.stride(-2), M * N, BS=block_size, ZP=z2 is not None, HAS_BIAS=has_bias, PARTIAL=split > 1,
            BLOCK_N=block_n, WARPS=warps, DEPTH=depth, HALF_M=M <= 8, CONST_W=const_w,
            M_TILES=1 if M <= 16 else 2 if M <= 32 else 4, num_warps=warps, **pdl(a2))
        if split > 1:
            block_s, block, reduce_warps = _reduce_tiles(split)
            _split_k_reduce_kernel[(cdiv(M * N, block),)](out, bias1 if has_bias else out, y2, M * N, N, split,
                                                           HAS_BIAS=has_bias, BLOCK_S=block_s, BLOCK=block,
                                                           num_warps=reduce_warps, **pdl(a2))


def compile_for(arch: int = 90, **constexprs: object) -> object:
    """The kernel compiled ahead of time for NVIDIA compute capability ``arch`` (no GPU needed): fp16 A, packed zero
    points, float32 partial sums, PDL from sm_90 (as ``pdl`` launches it), the defaults below overridden by
    ``constexprs``. For the tests (Gluon kernels do not run in Triton's interpreter) and ``benchmarks/int4_mma.py
    --compile``."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    kernel = _nbits_mma_kernel
    sig = {"a_ptr": "*fp16", "w_ptr": "*i32", "s_ptr": "*fp16", "z_ptr": "*u8", "bias_ptr": "*fp16",
           "y_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32", "KW_PER_SPLIT": "i32", "ROW_W": "i32",
           "S_ROW": "i32", "Z_ROW": "i32", "s_am": "i32", "s_ym": "i32", "s_ys": "i32"}
    consts = {"BS": 32, "ZP": True, "HAS_BIAS": False, "PARTIAL": True, "BLOCK_N": 64, "WARPS": 2, "DEPTH": 1,
              "HALF_M": False, "CONST_W": True, "M_TILES": 1, "PDL": arch >= 90, **constexprs}
    if not consts["PARTIAL"]:
        sig["y_ptr"] = "*fp16"
    sig.update(dict.fromkeys(consts, "constexpr"))
    div16 = ["a_ptr", "w_ptr", "s_ptr", "z_ptr", "bias_ptr", "y_ptr", "N", "K", "KW_PER_SPLIT", "ROW_W", "s_am",
             "s_ym", "s_ys"]
    src = GluonASTSource(fn=kernel, signature=sig, constexprs=consts,
                         attrs={(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in div16})
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": consts["WARPS"]})
