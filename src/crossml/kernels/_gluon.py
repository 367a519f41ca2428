"""Helpers shared by the Gluon kernels (``crossml.kernels.nbits_mma``, ``crossml.kernels.gemv_mma``): programmatic
dependent launch in Gluon, whose kernels cannot call ``_launch.pdl_wait`` (a ``triton.jit`` function). Imported only
with them (``_launch.gluon_kernels``)."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def gdc_wait():
    """Wait until the previous kernel in the stream has finished and its writes are visible (``_launch.pdl``)."""
    gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def gdc_launch_dependents():
    """Let the next kernel in the stream start launching (it waits for this one in turn)."""
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32, is_pure=False,
                              pack=1)


@gluon.jit
def store_rows(acc, bias_ptr, y_ptr, m0, M, N, n0, s_ym, s_ys, mma: gl.constexpr, BLOCK_N: gl.constexpr,
               HAS_BIAS: gl.constexpr, PARTIAL: gl.constexpr, ROUND_FIRST: gl.constexpr):
    """Rows m0 to m0 + 15 of a program's [16, BLOCK_N] accumulator ``acc`` (layout ``mma``) at columns n0 onward of y
    [M, N] (positions outside are not stored): with PARTIAL float32 partial sums of split ``program_id(1)`` (``y_ptr +
    pid1 * s_ys``), else plus the bias in y's dtype. ROUND_FIRST: the product rounded to y's dtype before the bias
    is added (as the unfused Add of the rounded product would); else the bias rounded to y's dtype added to the
    float32 sums (``_launch.store_tile``'s)."""
    mo = gl.expand_dims(m0 + gl.arange(0, 16, layout=gl.SliceLayout(1, mma)), 1)
    no = gl.expand_dims(n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma)), 0)
    ok = (mo < M) & (no < N)
    if PARTIAL:
        gl.store(y_ptr + gl.program_id(1).to(gl.int64) * s_ys + mo * s_ym + no, acc, mask=ok)
    else:
        out_ty: gl.constexpr = y_ptr.dtype.element_ty
        if HAS_BIAS:
            bias = gl.load(bias_ptr + no, mask=no < N, other=0.0)
            if ROUND_FIRST:
                acc = acc.to(out_ty).to(gl.float32) + bias.to(gl.float32)
            else:
                acc = acc + bias.to(out_ty).to(gl.float32)
        gl.store(y_ptr + mo * s_ym + no, acc.to(out_ty), mask=ok)
