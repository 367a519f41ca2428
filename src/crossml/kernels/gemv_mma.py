"""The GEMV's products for 2 to 16 rows of fp16 / bf16 activations on NVIDIA matrix units, in Gluon.

``y[M, N] = a[M, K] @ W[K, N] (+ bias)`` for a batched decode step's few rows, W column-major (its transpose
``[N, K]`` contiguous, as GPU plans store half-precision decode weights: ``crossml.ops.matmul.column_major_weight``).
``crossml.kernels.gemv`` routes its matrix-unit products here when ``supported`` holds; the outputs, the float32
partial sums of a split K, the fused SiLU gate and the skip-norm's workspace are the ones of its ``tl.dot`` kernel.

``tl.dot`` stages the W tiles it loads through shared memory to put them in the layout the matrix units read. Here
each lane loads its own operand registers from global memory (the layout scheme of ``crossml.kernels.nbits_mma``):

- A lane of a quad (lane % 4 = t) holds 32 contiguous K values of each of its W rows per 128-value K step: four
  128-bit loads at K offset ``32 t + 8 w`` (w = 0..3). Eight lanes' quads hold eight W rows, an ``mma`` n tile.
- The product's K order inside a step is permuted alike for a and W: operand position ``32 w + 8 p + 2 t + e`` is K
  offset ``32 t + 8 w + 2 p + e``, so each lane's loaded values are its own ``mma_v2`` operand slots (A and B,
  ``k_width=2``), each 32-bit operand register two adjacent values of a load, and the conversions into the operand
  layouts are register renamings (``assert_trivial``). No value goes through shared memory or a byte permute.
- Each step's W is requested a step ahead (loop-carried registers); with PDL and constant weights the first step's
  before waiting for the previous kernel. One ``mma_v2`` per 16 x 8 x 16 tile, float32 accumulation.
- K is split until there are about ``SPLIT_PER_SM`` programs per SM; the partial sums are added in a fixed order by
  the GEMV's reduction (or its skip-norm), so a captured graph's replays give the eager result bit for bit.

Reading a quad's four 128-bit loads as 64 contiguous bytes (``QUAD_RUNS``: lane t at K offset ``32 w + 8 t``, rather
than each lane's own 64 bytes) made every product faster (Llama-3.2-1B's lm_head at 16 rows 126.8 against 144.3 us
on an H200). The loop is 1.09 SASS instructions a weight a thread (``benchmarks/gemv_mma.py --compile``) against the
``tl.dot`` kernel's staging through shared memory; with the SiLU gate in the loads (``SILU_MUL``) each warp of each
column tile gates the same rows again (3.4 instructions a weight at 8 rows, 5.9 at 16, with the ``tl.sigmoid``
formula in PTX without its subnormal range checks), so ``crossml.kernels.gemv`` gates them in a launch of their own
first (``MMA_GATE_FIRST``). ``crossml.kernels.gemv`` routes it the products where it measured fastest (``MMA_*``
there, results/gemv_mma*.md): the large weights with N <= K of a batched decode step (Llama-3.2-1B's down
projection), which it read faster than ``_gemv_dot_kernel`` and cuBLAS. At the smaller products the ``tl.dot`` kernel
stayed ahead from 4 rows and cuBLAS at the wide ones.

It takes K a multiple of 128 and W rows at 16-byte aligned strides. ``supported`` says when it runs (NVIDIA
compute capability 8.0 or later, outside the interpreter: Gluon kernels do not run in Triton's interpreter, so its
tests run on GPUs, and on the CPU compile it ahead of time, ``compile_for``).
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from crossml.kernels._gluon import gdc_launch_dependents, gdc_wait, store_rows
from crossml.kernels._launch import cdiv, nvidia_sm80

__all__ = ["BLOCK_K", "MAX_M", "compile_for", "pick_tiles", "supported"]

#: most rows of a one program takes (one 16-row operand tile)
MAX_M = 16
#: the K step: four lanes' 32 values
BLOCK_K = 128
_BLOCK_K = gl.constexpr(BLOCK_K)
#: most K splits (the reductions load all of an output's partial sums at once)
_MAX_SPLIT = 64
#: programs per SM that K is split to reach
SPLIT_PER_SM = 4
#: kernel variants for the benchmarks: ``quad_runs`` (each quad's loads 64 contiguous bytes, else each lane's)
OPTIONS = {"quad_runs": True}


#: an int32 word as its two 16-bit values (low half first)
_UNPACK = gl.constexpr("mov.b32 {$0, $1}, $2;")


@gluon.jit
def _halves(words, BF16: gl.constexpr):
    """The two values of each int32 word of ``words`` (low, high), bfloat16 with BF16, else float16."""
    if BF16:
        lo, hi = gl.inline_asm_elementwise(_UNPACK, "=h,=h,r", [words], dtype=(gl.bfloat16, gl.bfloat16),
                                           is_pure=True, pack=1)
    else:
        lo, hi = gl.inline_asm_elementwise(_UNPACK, "=h,=h,r", [words], dtype=(gl.float16, gl.float16),
                                           is_pure=True, pack=1)
    return lo, hi


@gluon.jit
def _operand(x5, rows: gl.constexpr, lay: gl.constexpr, B: gl.constexpr):
    """A step's values ``x5`` [rows, 4 t, 4 w, 4 p, 2 e] (value e of word p of a lane's 128-bit load w) as an
    ``mma_v2`` operand in the module's K order: A [rows, 128], or with B the weights [128, rows]."""
    if B:
        x2 = gl.reshape(gl.permute(x5, (2, 3, 1, 4, 0)), (_BLOCK_K, rows))  # [w, p, t, e, n]
    else:
        x2 = gl.reshape(gl.permute(x5, (0, 2, 3, 1, 4)), (rows, _BLOCK_K))  # [m, w, p, t, e]
    return gl.convert_layout(x2, lay, assert_trivial=True)


#: x * sigmoid(x) in float32 as ``tl.sigmoid``'s formula computes it (``1 / (1 + exp(-x))`` with the approximate
#: exp2 and reciprocal it lowers to), flushing subnormals (the range checks those lowerings add for them cost
#: more than the rest)
_SILU_PTX = gl.constexpr("""
{
.reg .f32 e;
mul.ftz.f32 e, $1, 0fBFB8AA3B;
ex2.approx.ftz.f32 e, e;
add.ftz.f32 e, e, 0f3F800000;
rcp.approx.ftz.f32 e, e;
mul.ftz.f32 $0, $1, e;
}
""")


@gluon.jit
def _silu_mul(g, up):
    """SiluMul of values g and up, rounded to their type as the SiluMul kernel stores it."""
    s = gl.inline_asm_elementwise(_SILU_PTX, "=f,f", [g.to(gl.float32)], dtype=gl.float32, is_pure=True, pack=1)
    return (s * up.to(gl.float32)).to(up.dtype)


@gluon.jit
def _rows8(a, up, BF16: gl.constexpr, SILU_MUL: gl.constexpr):
    """Eight rows' activations [8, t, w, p, e] from their words ``a`` (with SILU_MUL the g words, ``up`` the up
    words) [8, t, w, p]."""
    lo, hi = _halves(a, BF16)
    if SILU_MUL:
        up_lo, up_hi = _halves(up, BF16)
        lo = _silu_mul(lo, up_lo)
        hi = _silu_mul(hi, up_hi)
    return gl.join(lo, hi)


@gluon.jit
def _activations(a, up, a8, up8, a_l: gl.constexpr, BF16: gl.constexpr, SILU_MUL: gl.constexpr,
                 HALF_M: gl.constexpr):
    """A step's activations as the mma A operand: rows 0-7 from words ``a`` / ``up``, rows 8-15 from ``a8`` /
    ``up8``, or zeros with HALF_M (no gate computed for them)."""
    top = _rows8(a, up, BF16, SILU_MUL)
    if HALF_M:
        bottom = gl.zeros_like(top)
    else:
        bottom = _rows8(a8, up8, BF16, SILU_MUL)
    x = gl.reshape(gl.permute(gl.join(top, bottom), (5, 0, 1, 2, 3, 4)), (16, 4, 4, 4, 2))  # row 8 r + g
    return _operand(x, 16, a_l, False)


@gluon.jit
def _words_of_rows(a_ptr, a_off, kw, ok, ok8, off8, up_off, SILU_MUL: gl.constexpr, HALF_M: gl.constexpr):
    """The words of a step at word ``kw`` of a's rows 0-7 and 8-15 (not loaded with HALF_M), and with SILU_MUL
    their up words: (a, up, a8, up8), unloaded ones the rows 0-7 words again."""
    a = gl.load(a_ptr + a_off + kw, mask=ok, other=0)
    up = a
    a8 = a
    up8 = a
    if SILU_MUL:
        up = gl.load(a_ptr + a_off + kw + up_off, mask=ok, other=0)
    if not HALF_M:
        a8 = gl.load(a_ptr + a_off + kw + off8, mask=ok8, other=0)
        if SILU_MUL:
            up8 = gl.load(a_ptr + a_off + kw + off8 + up_off, mask=ok8, other=0)
    return a, up, a8, up8


@gluon.jit
def _gemv_mma_kernel(a_ptr, w_ptr, bias_ptr, y_ptr, M, N, K, K_PER_SPLIT, s_am, s_wn, s_ym, s_ys, up_off,
                     HAS_BIAS: gl.constexpr, PARTIAL: gl.constexpr, BLOCK_N: gl.constexpr, WARPS: gl.constexpr,
                     CONST_W: gl.constexpr, SILU_MUL: gl.constexpr = False, HALF_M: gl.constexpr = False,
                     QUAD_RUNS: gl.constexpr = True, PDL: gl.constexpr = False):
    """Columns [pid0 * BLOCK_N, +BLOCK_N) of y [M <= 16, N] over K range pid1 (K_PER_SPLIT values, a multiple of
    128): PARTIAL stores the float32 sums to workspace slice pid1 (``y_ptr + pid1 * s_ys``), else adds the bias and
    stores in y's dtype. a and W are read as int32 words (two values each; ``s_am``, ``s_wn`` and ``up_off`` in
    words): W column-major, values k and k + 1 of column n in word ``n * s_wn + k / 2``. SILU_MUL: each row of a
    holds [g | up] (up ``up_off`` words on), the activations are ``SiluMul`` of them. ``bias_ptr`` has a's dtype
    (W when there is no bias)."""
    BF16: gl.constexpr = bias_ptr.dtype.element_ty == gl.bfloat16
    # QUAD_RUNS: a quad's w-th loads are 64 contiguous bytes (lane t at K offset 32 w + 8 t); else lane t's four
    # loads are (at 32 t + 8 w)
    T_WORDS: gl.constexpr = 4 if QUAD_RUNS else 16
    W_WORDS: gl.constexpr = 16 if QUAD_RUNS else 4
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, WARPS], instr_shape=[16, 8])
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    pb: gl.constexpr = gl.BlockedLayout([1, 1, 4, 4], [8, 4, 1, 1], [WARPS, 1, 1, 1], [3, 2, 1, 0])  # n, t, w, p
    pa: gl.constexpr = gl.BlockedLayout([1, 1, 4, 4], [8, 4, 1, 1], [1, 1, 1, WARPS], [3, 2, 1, 0])  # 8 m, t, w, p
    n0 = gl.program_id(0) * BLOCK_N
    n_b = gl.minimum(n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, pb)))),
                     N - 1)
    t_b = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, pb))))
    w_b = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, pb))))
    p_b = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, pb))))
    w_off = (gl.expand_dims(gl.expand_dims(gl.expand_dims(n_b, 1), 2), 3) * s_wn
             + gl.expand_dims(gl.expand_dims(gl.expand_dims(t_b, 0), 2), 3) * T_WORDS
             + gl.expand_dims(gl.expand_dims(gl.expand_dims(w_b, 0), 1), 3) * W_WORDS
             + gl.expand_dims(gl.expand_dims(gl.expand_dims(p_b, 0), 1), 2))
    m_a = gl.arange(0, 8, layout=gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, pa))))
    t_a = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, pa))))
    w_a = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, pa))))
    p_a = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, pa))))
    m4 = gl.expand_dims(gl.expand_dims(gl.expand_dims(m_a, 1), 2), 3)
    a_off = (m4 * s_am + gl.expand_dims(gl.expand_dims(gl.expand_dims(t_a, 0), 2), 3) * T_WORDS
             + gl.expand_dims(gl.expand_dims(gl.expand_dims(w_a, 0), 1), 3) * W_WORDS
             + gl.expand_dims(gl.expand_dims(gl.expand_dims(p_a, 0), 1), 2))
    a_ok = m4 < M
    a_ok8 = m4 + 8 < M
    off8 = 8 * s_am

    kw_lo = gl.program_id(1) * (K_PER_SPLIT // 2)  # in words
    last = (gl.minimum(K, 2 * kw_lo + K_PER_SPLIT) - 2 * kw_lo) // _BLOCK_K - 1  # index of the last step
    if PDL and not CONST_W:
        gdc_wait()
    w = gl.load(w_ptr + w_off + kw_lo)
    if PDL:
        if CONST_W:
            gdc_wait()
        gdc_launch_dependents()
    a, up, a8, up8 = _words_of_rows(a_ptr, a_off, kw_lo, a_ok, a_ok8, off8, up_off, SILU_MUL, HALF_M)
    acc = gl.zeros([16, BLOCK_N], gl.float32, mma)
    for i in range(0, last + 1):
        ahead = kw_lo + gl.minimum(i + 1, last) * (_BLOCK_K // 2)  # the last step again at the end
        w_n = gl.load(w_ptr + w_off + ahead)
        a_n, up_n, a8_n, up8_n = _words_of_rows(a_ptr, a_off, ahead, a_ok, a_ok8, off8, up_off, SILU_MUL, HALF_M)
        w_lo, w_hi = _halves(w, BF16)
        acc = mma_v2(_activations(a, up, a8, up8, a_l, BF16, SILU_MUL, HALF_M),
                     _operand(gl.join(w_lo, w_hi), BLOCK_N, b_l, True), acc)
        a, up, a8, up8 = a_n, up_n, a8_n, up8_n
        w = w_n
    store_rows(acc, bias_ptr, y_ptr, 0, M, N, n0, s_ym, s_ys, mma, BLOCK_N, HAS_BIAS, PARTIAL, False)


def supported(a: torch.Tensor, w: torch.Tensor, M: int) -> bool:
    """Whether the kernel takes ``a [M, K] @ w``: 1 to MAX_M rows of fp16 or bf16 on an NVIDIA GPU of compute
    capability 8.0 or later (outside the interpreter), ``w`` [K, N] of a's dtype stored column-major with K a
    multiple of 128, its rows 16-byte aligned and addressable with 32-bit offsets, and a's rows 16-byte aligned."""
    if a.dtype not in (torch.float16, torch.bfloat16) or w.dtype != a.dtype or not 1 <= M <= MAX_M:
        return False
    if w.dim() != 2 or w.stride(0) != 1 or not nvidia_sm80(a):
        return False
    K, N = w.shape
    s_wn = w.stride(1)
    return (K % BLOCK_K == 0 and s_wn % 8 == 0 and N * s_wn < 2**31 and w.data_ptr() % 16 == 0
            and a.data_ptr() % 16 == 0 and (M == 1 or a.stride(0) % 8 == 0))


def pick_tiles(M: int, K: int, N: int, processors: int) -> tuple[int, int, int]:
    """(BLOCK_N, WARPS, SPLIT_K): 64 W rows at two warps, K split (whole steps, at most 64 ranges) until there are
    about SPLIT_PER_SM programs per SM."""
    n_prog = cdiv(N, 64)
    split = max(1, min(cdiv(SPLIT_PER_SM * processors, n_prog), K // BLOCK_K, _MAX_SPLIT))
    return 64, 2, split


def _words(x: torch.Tensor) -> torch.Tensor:
    """2-D ``x`` (rows contiguous, an even row stride) as int32 words over the same memory."""
    return torch.as_strided(x, (x.shape[0], x.shape[1]), (x.stride(0), 1)).view(torch.int32)


def launch(a2: torch.Tensor, w: torch.Tensor, bias1: torch.Tensor, out: torch.Tensor, *, k_per_split: int,
           split: int, block_n: int, warps: int, has_bias: bool, partial: bool, const_w: bool, silu_mul: bool,
           pdl: dict[str, bool]) -> None:
    """One launch over the grid (N / block_n, split) of ``a2 [M, K] @ w`` (``a2 [M, 2K]``, [g | up], with
    ``silu_mul``): ``out`` [M, N] (``partial`` False: bias added, a's dtype) or the float32 ``[split, M, N]``
    workspace of partial sums (``supported`` holds; ``k_per_split`` a multiple of BLOCK_K). ``bias1``: the bias,
    or any tensor of a's dtype without one."""
    M = a2.shape[0]
    K, N = w.shape
    if block_n not in (32, 64, 128, 256) or block_n % (8 * warps) or k_per_split % BLOCK_K:
        raise ValueError(f"GEMV mma kernel: BLOCK_N {block_n} at {warps} warps (32-256 in whole 8-row tiles a warp) "
                         f"with {k_per_split} values of K a split (a multiple of {BLOCK_K})")
    _gemv_mma_kernel[(cdiv(N, block_n), split)](
        _words(a2), _words(w.t()), bias1, out, M, N, K, k_per_split, a2.stride(0) // 2, w.stride(1) // 2,
        N if partial else out.stride(0), M * N, K // 2, HAS_BIAS=has_bias and not partial, PARTIAL=partial,
        BLOCK_N=block_n, WARPS=warps, CONST_W=const_w, SILU_MUL=silu_mul, HALF_M=M <= 8,
        QUAD_RUNS=OPTIONS["quad_runs"], num_warps=warps, **pdl)


def compile_for(arch: int = 90, dtype: str = "fp16", **constexprs: object) -> object:
    """The kernel compiled ahead of time for NVIDIA compute capability ``arch`` (no GPU needed): ``dtype`` ("fp16"
    or "bf16") a and W, float32 partial sums, PDL from sm_90 (as ``_launch.pdl`` launches it), the defaults below
    overridden by ``constexprs``. For the tests (Gluon kernels do not run in Triton's interpreter) and the
    benchmarks."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    kernel = _gemv_mma_kernel
    sig = {"a_ptr": "*i32", "w_ptr": "*i32", "bias_ptr": f"*{dtype}", "y_ptr": "*fp32", "M": "i32",
           "N": "i32", "K": "i32", "K_PER_SPLIT": "i32", "s_am": "i32", "s_wn": "i32", "s_ym": "i32", "s_ys": "i32",
           "up_off": "i32"}
    consts = {"HAS_BIAS": False, "PARTIAL": True, "BLOCK_N": 64, "WARPS": 2, "CONST_W": True, "SILU_MUL": False,
              "PDL": arch >= 90, **constexprs}
    if not consts["PARTIAL"]:
        sig["y_ptr"] = f"*{dtype}"
    sig.update(dict.fromkeys(consts, "constexpr"))
    div16 = ["a_ptr", "w_ptr", "bias_ptr", "y_ptr", "N", "K", "K_PER_SPLIT", "s_am", "s_wn", "s_ym", "s_ys", "up_off"]
    src = GluonASTSource(fn=kernel, signature=sig, constexprs=consts,
                         attrs={(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in div16})
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": consts["WARPS"]})
