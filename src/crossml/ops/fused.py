"""Fused ops made by crossml's graph rewrites (domain com.crossml), e.g. Conv+Add+Relu.

Where the device layer offers a vendor-fused kernel (cuDNN / MIOpen), FusedConv is one library call (then a
clamp for Clip, ReLU6); on GPUs its pointwise form is one GEMM with bias and ReLU in the epilogue and its
depthwise form one Triton launch; elsewhere it composes the library's Conv, Add and Relu/Clip, so results
are the same on every provider.
SiluMul (two inputs g, up, or one holding both halves) runs crossml's Triton kernels on GPU tensors
(imported on first use) and composes the torch ops elsewhere; Linear runs the Triton GEMV for
decode-sized products on GPUs (as MatMul does). NormMatMulNBits (an RMSNorm, with or without skip,
feeding a 4-bit MatMulNBits) is one Triton launch at decode sizes on GPUs and the two ops elsewhere;
MatMulSkipNorm (a product feeding the residual stream's SkipSimplifiedLayerNormalization) is the GEMV and
one add-and-normalize kernel at decode sizes on GPUs, and the two ops elsewhere; MatMulSiluMul (an MLP's merged
gate/up product feeding its SiluMul) is the GEMV storing the gated activations at decode sizes on GPUs, and the two
ops elsewhere. AttentionSkipNorm (GroupQueryAttention feeding its output projection's MatMulSkipNorm) hands the
split decode step's partial results to one launch that combines them and multiplies them with the projection's rows,
then the skip-norm kernel, on GPUs, and runs the two ops elsewhere. SumCast (an integer row sum,
offset and cast: the GenAI builder's attention-mask lengths) is one Triton launch on GPUs. GatherNorm (an
embedding lookup feeding the first layer's RMSNorm) is one Triton launch on GPUs and the two ops elsewhere.
"""

from __future__ import annotations

import logging
import math

import torch

from crossml import dtypes
from crossml.device.vendor import fused_conv_add_relu, strict_fp32_bias_apart
from crossml.kernels import TRITON_DEVICES, load
from crossml.ops._util import cpu_kernels, gpu_kernels, inplace_target, sdpa
from crossml.ops.contrib.matmul_nbits import (
    KERNEL_MAX_M,
    constant_weight,
    cpu_int8_kept,
    int8_activations,
    matmul_nbits,
)
from crossml.ops.contrib.matmul_nbits import _use_kernel as _nbits_kernel
from crossml.ops.contrib.norm import (
    _kernel_vector,
    _rmsnorm_kernels,
    simplified_layer_normalization,
    skip_simplified_layer_normalization,
)
from crossml.ops.contrib.norm import _use_kernel as _norm_kernel
from crossml.ops.conv import conv, gpu_conv2d
from crossml.ops.indexing import gather as gather_op
from crossml.ops.matmul import gemv_eligible
from crossml.ops.matmul import matmul as matmul_op
from crossml.ops.registry import OpContext, op

DOMAIN = "com.crossml"
log = logging.getLogger("crossml")


@op("FusedConv", since=1, domain=DOMAIN)
def fused_conv(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, z: torch.Tensor | None = None, *,
               activation: str = "Relu", activation_params: list[float] | None = None,
               dilations: list[int] | None = None, group: int = 1, kernel_shape: list[int] | None = None,
               pads: list[int] | None = None, strides: list[int] | None = None) -> torch.Tensor:
    """act(conv(x, w, b) + z), z optional; act is Relu, or Clip with activation_params [0, max] (ReLU6)."""
    hi = _clip_max(activation, activation_params)
    strides, dilations = strides or [1, 1], dilations or [1, 1]
    if z is None and x.dim() == 4 and (pads is None or pads[:2] == pads[2:]):
        y = gpu_conv2d(x, w, b, strides, pads[:2] if pads else [0, 0], dilations, group, relu=True, clip_max=hi)
        if y is not None:
            return y
    if x.dim() == 4:
        fused = fused_conv_add_relu(x, w, b, z, strides, pads[:2] if pads else [0, 0], dilations, group)
        if fused is not None:
            return fused if hi is None else fused.clamp_max_(hi)
    y = conv(x, w, b, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads, strides=strides)
    if z is not None:
        y = y + z
    return torch.relu_(y) if hi is None else y.clamp_(0, hi)


def _clip_max(activation: str, params: list[float] | None) -> float | None:
    """None for Relu; the upper bound for Clip [0, max]."""
    if activation == "Relu" and not params:
        return None
    if activation == "Clip" and params is not None and len(params) == 2 and params[0] == 0 and params[1] >= 0:
        return float(params[1])
    raise ValueError(f"FusedConv supports activation 'Relu', or 'Clip' with activation_params [0, max >= 0]; got "
                     f"'{activation}' with activation_params {params}")


@op("ScaledDotProductAttention", since=1, domain=DOMAIN)
def scaled_dot_product_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
                                 *, scale: float = 1.0, k_transposed: int = 0) -> torch.Tensor:
    """softmax(q @ kᵀ · scale + mask) @ v, k given as [.., S, D] (or [.., D, S] with k_transposed=1). float32 on
    GPUs with TF32 allowed (use_tf32, default 1) runs crossml's Triton attention, the rest torch's SDPA kernels."""
    if k_transposed:
        k = k.transpose(-1, -2)
    if q.dtype == torch.float32 and q.device.type in TRITON_DEVICES:
        # torch's fp32 attention is strict-fp32 CUTLASS; crossml's kernel runs TF32 products where allowed
        kernel = load("attention")
        if kernel is not None and kernel.tf32_products(q) and kernel.supported(q, k, v, mask):
            return kernel.attention(q, k, v, mask, scale=scale)
    if mask is not None and mask.dtype != q.dtype and mask.dtype != torch.bool:
        mask = mask.to(q.dtype)
    return sdpa(q, k, v, attn_mask=mask, scale=scale)


@op("FastGeluErf", since=1, domain=DOMAIN)
def gelu_erf(x: torch.Tensor) -> torch.Tensor:
    """x · Φ(x) with the exact (erf) form."""
    return torch.nn.functional.gelu(x)


@op("Linear", since=1, domain=DOMAIN, ctx=True)
def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, *, ctx: OpContext | None = None) -> torch.Tensor:
    """x @ w + b (w: [K, N]) as one call with the bias in the epilogue: the Triton GEMV for
    decode-sized products on GPUs (``crossml.ops.matmul.gemv_eligible``), else torch's linear; strict-fp32
    products on NVIDIA GPUs add the bias apart (``device.vendor.strict_fp32_bias_apart``)."""
    if gemv_eligible(x, w, b):
        from crossml.kernels.gemv import gemv

        return gemv(x, w, b, const_w=ctx is not None and ctx.constant(1))
    if strict_fp32_bias_apart(x, w):
        y = torch.matmul(x, w)
        return y.add_(b) if b.dim() <= 1 else y + b
    return torch.nn.functional.linear(x, w.t(), b)


@op("SumCast", since=1, domain=DOMAIN)
def sum_cast(x: torch.Tensor, *, offset: int = 0, to: int = dtypes.TP.INT64, keepdims: int = 1) -> torch.Tensor:
    """Cast(ReduceSum(x, axes=[-1], keepdims) + offset, to) of an int32 / int64 ``x``, summed in x's type as
    ReduceSum sums (graph rule MaskLengths: the GenAI builder's ``seqlens_k`` = mask lengths - 1). One Triton
    launch on GPUs (``crossml.kernels.sum_cast``), the torch ops elsewhere."""
    out_dtype = dtypes.torch_dtype(int(to))
    if x.dtype not in (torch.int32, torch.int64) or out_dtype not in (torch.int32, torch.int64) or x.dim() == 0:
        raise ValueError(f"SumCast takes an int32/int64 tensor of rank >= 1 and casts to int32/int64, got {x.dtype} "
                         f"of shape {tuple(x.shape)} and to={to}")
    if x.device.type in TRITON_DEVICES:
        kernel = load("sum_cast")
        if kernel is not None:
            return kernel.sum_cast(x, int(offset), out_dtype, bool(keepdims))
    return (x.sum(-1, keepdim=bool(keepdims), dtype=x.dtype) + int(offset)).to(out_dtype)


@op("GatherNorm", since=1, domain=DOMAIN)
def gather_norm(data: torch.Tensor, indices: torch.Tensor, scale: torch.Tensor, *,
                epsilon: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor]:
    """SimplifiedLayerNormalization(Gather(data, indices), scale) (Gather on axis 0, the norm over the last axis,
    stash_type 1; graph rule GatherNorm: an LLM's embedding lookup and its first layer's RMSNorm), returning the
    normalized rows and the gathered rows. One Triton launch on GPUs (``crossml.kernels.rmsnorm.gather_rms_norm``,
    any strides: a tied model's table is a transposed view of its output projection); the two ops elsewhere, where
    an index outside the table raises as Gather does (the kernel writes zeros there, as the Gather kernel does)."""
    if data.dim() != 2:
        raise ValueError(f"GatherNorm takes a 2-D table, got shape {tuple(data.shape)}")
    if (indices.dtype in (torch.int32, torch.int64) and indices.device == data.device
            and _norm_kernel(data, scale) and _kernel_vector(scale, data)):
        y, _, rows = _rmsnorm_kernels().gather_rms_norm(data, indices, scale, epsilon)
        return y, rows
    rows = gather_op(data, indices, axis=0)
    return simplified_layer_normalization(rows, scale, epsilon=epsilon)[0], rows


#: dtypes the Triton SiluMul kernel takes
_SILU_MUL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: SiluMul's gates (``activation``; ``crossml.kernels.swiglu.ACTIVATIONS``)
ACTIVATIONS = ("silu", "gelu_tanh")


@op("SiluMul", since=1, domain=DOMAIN)
def silu_mul_op(g: torch.Tensor, up: torch.Tensor | None = None, *, activation: str = "silu") -> torch.Tensor:
    """(g · σ(g)) · up: the SiLU-gated product of LLM MLPs (Sigmoid, Mul, Mul) as one kernel on a GPU.
    ``activation="gelu_tanh"``: gelu_tanh(g) · up, the GELU-gated product of Gemma's MLPs (Gelu(approximate="tanh"),
    Mul; graph rule FuseGeGLU).

    With one input ``gu``, g and up are its two halves along the last axis (``g = gu[..., :N]``,
    ``up = gu[..., N:]``, ``N = gu.shape[-1] // 2``): what the merged gate/up product of
    graph/passes/gate_up.py writes. Elsewhere (CPU tensors, other dtypes, shapes that broadcast)
    the same torch ops the unfused nodes run, in their order. The kernel computes in fp32
    and rounds once, so fp16 / bf16 results differ from the node-by-node rounding in the last bit
    or so.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"SiluMul activation '{activation}' is not one of {', '.join(ACTIVATIONS)}")
    if up is None:
        if g.dim() == 0 or g.shape[-1] % 2:
            raise ValueError(f"SiluMul with one input takes [g | up] concatenated along the last axis, which "
                             f"must be even; got shape {tuple(g.shape)}")
        if g.device.type in TRITON_DEVICES and g.dtype in _SILU_MUL_DTYPES:
            swiglu = load("swiglu")
            if swiglu is not None:
                return swiglu.silu_mul_packed(g, activation=activation)
        # contiguous halves: torch's CPU loops vectorize by memory layout, so this rounds exactly as
        # the two-input op on the separate products does (views of the halves can differ in the last bit)
        g, up = (h.contiguous() for h in g.chunk(2, dim=-1))
    elif (g.device.type in TRITON_DEVICES and g.dtype in _SILU_MUL_DTYPES and up.dtype == g.dtype
            and up.device == g.device and g.shape == up.shape):
        swiglu = load("swiglu")
        if swiglu is not None:
            return swiglu.silu_mul(g, up, activation=activation)
    if activation == "gelu_tanh":
        return torch.mul(torch.nn.functional.gelu(g, approximate="tanh"), up)
    return torch.mul(torch.mul(g, torch.sigmoid(g)), up)


#: widest K the one-launch NormMatMulNBits takes on every kernel; wider products fuse only where the fp16-pair
#: kernel takes all of K in one step (``norm_fuses``), else they run the RMSNorm kernel, then the GEMV. Each
#: program of the fused GEMV re-reads the activations, skip and gamma (3 x K values) beside its 8 weight rows: on an
#: H200 a Qwen2.5-0.5B int4 decode step (K=896) took 0.766 ms fused against 0.813 ms unfused, a Llama-3.2-1B one
#: (K=2048) 0.848 against 0.842 (back-to-back replays; 16- and 32-column tiles were slower still; both before
#: the fp16-pair kernel)
NORM_FUSE_MAX_K = 1024


def norm_fuses(K: int, pair_tiles: tuple[int, int, int, int] | None) -> bool:
    """Whether a NormMatMulNBits of width K runs as one launch: K <= NORM_FUSE_MAX_K, or the fp16-pair kernel's
    tiles (``pick_pair_tiles``; None where that kernel does not run) hold all of K in one step, so the row's
    statistics come from the step's own tile. With the fp16-pair kernel, fusing Llama-3.2-1B's input norm into
    its qkv product (K=2048, one step) took the int4 decode step from 0.515-0.516 to 0.508 ms on an H200; fusing
    the post-attention norm too (the gate+up product walks K in 4 steps, after a statistics pass) made it 0.548.
    """
    return K <= NORM_FUSE_MAX_K or (pair_tiles is not None and pair_tiles[2] >= K)


def _pair_tiles(x: torch.Tensor, rows: int, N: int, K: int, block_size: int) -> tuple[int, int, int, int] | None:
    """The fp16-pair kernel's tiles for ``x`` where it runs (``crossml.kernels.matmul_nbits.fp16_pairs``), else
    None."""
    kernels = load("matmul_nbits")
    if kernels is None or not kernels.fp16_pairs(x):
        return None
    return kernels.pick_pair_tiles(rows, N, K, block_size, kernels.rule_processors(x))


def _dot_rows(x: torch.Tensor, rows: int, N: int, K: int, block_size: int, zero_points: torch.Tensor | None) -> bool:
    """Whether a 4-bit product of ``rows`` rows of ``x`` takes a matrix-unit kernel
    (``crossml.kernels.matmul_nbits.dot_eligible`` or ``mma_eligible``), which normalize nothing: the norm then runs
    on its own kernel first, as its arithmetic per row would otherwise be the fused GEMV's again."""
    kernels = load("matmul_nbits")
    return kernels is not None and (kernels.dot_eligible(x, rows, N)
                                    or kernels.mma_eligible(x, rows, K, N, block_size, zero_points))


@op("NormMatMulNBits", since=1, domain=DOMAIN, ctx=True)
def norm_matmul_nbits(x: torch.Tensor, skip: torch.Tensor | None, gamma: torch.Tensor, B: torch.Tensor,
                      scales: torch.Tensor, zero_points: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                      *, epsilon: float = 1e-5, K: int, N: int, block_size: int, bits: int = 4,
                      accuracy_level: int = 0, ctx: OpContext) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(MatMulNBits(RMSNorm(x (+ skip)) * gamma), x + skip): SimplifiedLayerNormalization (no skip) or
    SkipSimplifiedLayerNormalization feeding a 4-bit MatMulNBits (graph rule NormMatMulNBits). At decode sizes
    on a GPU where ``norm_fuses`` one Triton launch, which normalizes as it multiplies
    (``crossml.kernels.matmul_nbits``); elsewhere, and for rows the matrix-unit kernel takes (``_dot_rows``), the two
    ops (each on its own kernel on a GPU). ``accuracy_level``: the product's (the CPU's rule, NORM_MATMUL_CPU, fuses
    level-4 products too): at level 4 the product quantizes the normalized rows to int8 first, which the GPU's fused
    launch does not do, so there the two ops run. On the CPU, with a skip, once the weight has taken the int8 kernel
    (``crossml.ops.contrib.matmul_nbits.cpu_int8_kept``), the skip norm's kernel and the product straight from here
    (``crossml.kernels.cpu_int8.norm_matmul``: the two ops' values)."""
    want_sum = skip is not None and len(ctx.outputs_wanted) > 1 and ctx.outputs_wanted[1]
    if (skip is not None and skip.shape == x.shape and skip.dtype == torch.float32 and skip.device.type == "cpu"
            and gamma.dtype == torch.float32 and gamma.device.type == "cpu" and gamma.numel() == K
            and (kept := cpu_int8_kept(x, K, B, scales, zero_points, None, bias, K, N, block_size, bits,
                                       accuracy_level)) is not None):
        y, s = kept[0].norm_matmul(x, skip, gamma, epsilon, B, kept[1], kept[2], K=K, N=N, block_size=block_size)
        return y, s if want_sum else None
    rows = math.prod(x.shape[:-1]) if x.dim() else 0
    if not int8_activations(accuracy_level, None, zero_points) \
            and (skip is None or skip.shape == x.shape) and gamma.numel() == K and 0 < K == x.shape[-1] \
            and rows <= KERNEL_MAX_M and _nbits_kernel(x, B, scales, zero_points, None, bias, bits) \
            and all(t.device == x.device and t.is_floating_point() for t in (skip, gamma) if t is not None) \
            and not _dot_rows(x, rows, N, K, block_size, zero_points) \
            and (K <= NORM_FUSE_MAX_K or norm_fuses(K, _pair_tiles(x, rows, N, K, block_size))):
        s = torch.empty(x.shape, dtype=x.dtype, device=x.device) if want_sum else None
        y = load("matmul_nbits").matmul_nbits(x, B, scales, zero_points, bias, K=K, N=N, block_size=block_size,
                                              norm=(skip, gamma, epsilon), sum_out=s,
                                              const_w=constant_weight(ctx, 3, zero_points))
        return y, s
    if skip is None:
        normed, _ = simplified_layer_normalization(x, gamma, epsilon=epsilon)
        s = None
    else:
        sub = OpContext(ctx.node_name, "SkipSimplifiedLayerNormalization", 1, 4, (None,) * 4,
                        (True, False, False, want_sum), ctx.device)
        normed, _, _, s = skip_simplified_layer_normalization(x, skip, gamma, epsilon=epsilon, ctx=sub)
    # on the CPU the product's weight is flagged constant (so torch's packed int4 kernel may take it, as it takes the
    # unfused op's); GPU launches keep the plain launch measured in the decode steps. The norm kernel launching early
    # (``crossml.kernels._launch.pdl``) with the product reading its first K step before its wait made Llama-3.2-1B's
    # int4 decode step slower on an H200, 0.466-0.469 -> 0.484-0.486 ms (results/norm_early.md run 4, commit 192bcfd)
    product = OpContext(ctx.node_name, "MatMulNBits", 1, 1, (None,), (True,), ctx.device,
                        const_inputs=(False, *(ctx.constant(i) for i in (3, 4, 5)), False, ctx.constant(6))) \
        if x.device.type == "cpu" else None
    y = matmul_nbits(normed, B, scales, zero_points, None, bias, K=K, N=N, block_size=block_size, bits=bits,
                     accuracy_level=accuracy_level, ctx=product)
    return y, s


@op("SiluMulMatMulNBits", since=1, domain=DOMAIN, ctx=True)
def silu_mul_matmul_nbits(gu: torch.Tensor, B: torch.Tensor, scales: torch.Tensor,
                          zero_points: torch.Tensor | None = None, g_idx: torch.Tensor | None = None,
                          bias: torch.Tensor | None = None, *, K: int, N: int, block_size: int, bits: int = 4,
                          accuracy_level: int = 0, activation: str = "silu", ctx: OpContext) -> torch.Tensor:
    """MatMulNBits(SiluMul(gu), B, scales, ...) for ``gu = [g | up]`` (the merged gate/up product) of an LLM MLP: its
    4-bit down projection (graph rule SiluMulMatMulNBits; MatMulNBits' inputs and attributes, gu in A's place, and
    SiluMul's ``activation``).

    For one row on a GPU (a decode step at batch 1) it is the SiluMul kernel, then the product's GEMV, as the two ops
    launch them, but the SiluMul kernel lets the product launch before its own PDL wait (``crossml.kernels._launch.
    pdl``'s ``early``: the product reads nothing but its constant weight before its wait), so the product's programs
    request their first K step while the gate/up product still runs, and a long K takes longer steps
    (``crossml.kernels.matmul_nbits.pick_pair_tiles``' ``early_input``). On the CPU, once the weight has taken the
    int8 kernel (accuracy level 4: ``crossml.ops.contrib.matmul_nbits.cpu_int8_kept``), the SiluMul op's torch calls
    and the int8 kernel straight from here (the two ops' values, one node).
    Elsewhere the SiluMul and MatMulNBits ops."""
    if (kept := cpu_int8_kept(gu, 2 * K, B, scales, zero_points, g_idx, bias, K, N, block_size, bits,
                              accuracy_level)) is not None:
        return kept[0].matmul(silu_mul_op(gu, activation=activation), B, kept[1], kept[2], K=K, N=N,
                              block_size=block_size)
    rows = math.prod(gu.shape[:-1]) if gu.dim() else 0
    if rows == 1 and gu.shape[-1] == 2 * K and g_idx is None \
            and not int8_activations(accuracy_level, g_idx, zero_points) and gu.dtype in _SILU_MUL_DTYPES \
            and _nbits_kernel(gu, B, scales, zero_points, None, bias, bits) \
            and not _dot_rows(gu, rows, N, K, block_size, zero_points):
        swiglu, kernels = load("swiglu"), load("matmul_nbits")
        if swiglu is not None and kernels is not None:
            h = swiglu.silu_mul_packed(gu, early=True, activation=activation)
            return kernels.matmul_nbits(h, B, scales, zero_points, bias, K=K, N=N, block_size=block_size,
                                        const_w=constant_weight(ctx, 1, zero_points), early_input=True)
    return matmul_nbits(silu_mul_op(gu, activation=activation), B, scales, zero_points, g_idx, bias, K=K, N=N,
                        block_size=block_size, bits=bits, accuracy_level=accuracy_level, ctx=ctx)


@op("MatMulSiluMul", since=1, domain=DOMAIN, ctx=True)
def matmul_silu_mul(a: torch.Tensor, w: torch.Tensor, *, ctx: OpContext) -> torch.Tensor:
    """SiluMul(a @ w) for ``w`` [K, 2I], the merged gate/up weight [Wg | Wu] of an LLM MLP (graph rule MatMulSiluMul):
    the [..., I] gated activations. At decode sizes on a GPU (``crossml.ops.matmul.gemv_eligible`` of the merged
    product) the Triton GEMV computes the g and up products of each output column in one program and stores their
    SiluMul (``crossml.kernels.gemv.gemv(silu_out=True)``; its split-K reduction gates where K is split), the
    products rounded to a's dtype first as the MatMul's output is; elsewhere the MatMul and SiluMul ops."""
    if w.dim() == 2 and w.shape[-1] % 2 == 0 and gemv_eligible(a, w):
        return load("gemv").gemv(a, w, const_w=ctx.constant(1), silu_out=True)
    return silu_mul_op(matmul_op(a, w, ctx=ctx))


@op("MatMulSkipNorm", since=1, domain=DOMAIN, ctx=True)
def matmul_skip_norm(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor,
                     gamma: torch.Tensor, *, epsilon: float = 1e-12, silu_mul: int = 0,
                     ctx: OpContext) -> tuple[torch.Tensor, torch.Tensor | None]:
    """SkipSimplifiedLayerNormalization(residual, a @ w (+ bias), gamma) → (normed, sum): a product feeding the
    residual stream's RMSNorm (graph rule MatMulSkipNorm); with ``silu_mul=1`` the product's input is
    SiluMul(a), a holding [g | up] (graph rule SiluMulSkipNorm: an MLP's down projection). At decode sizes on a GPU
    (``crossml.ops.matmul.gemv_eligible``, the residual of the product's shape and dtype) the Triton GEMV, which
    gates the activations as it loads them, and one kernel that adds the residual and normalizes
    (``crossml.kernels.gemv.gemv_skip_norm``), with the results of the separate ops; elsewhere the SiluMul,
    MatMul (or Linear) and SkipSimplifiedLayerNormalization ops."""
    want_sum = len(ctx.outputs_wanted) > 1 and ctx.outputs_wanted[1]
    K, N = (w.shape[0], w.shape[-1]) if w.dim() == 2 else (None, None)
    gated_ok = not silu_mul or (a.dim() > 0 and a.shape[-1] == 2 * K)
    if gated_ok and gemv_eligible(a[..., :K] if silu_mul else a, w, bias) and residual.device == a.device \
            and residual.shape == (*a.shape[:-1], N) and residual.dtype == a.dtype and gamma.numel() == N \
            and gamma.device == a.device and gamma.is_floating_point():
        return load("gemv").gemv_skip_norm(a, w, bias, residual, gamma, epsilon, want_sum=want_sum,
                                           const_w=ctx.constant(1), silu_mul=bool(silu_mul))
    if silu_mul:
        a = silu_mul_op(a)
    y = matmul_op(a, w, ctx=ctx) if bias is None else linear(a, w, bias, ctx=ctx)
    sub = OpContext(ctx.node_name, "SkipSimplifiedLayerNormalization", 1, 4, (None,) * 4,
                    (True, False, False, want_sum), ctx.device)
    normed, _, _, s = skip_simplified_layer_normalization(residual, y, gamma, epsilon=epsilon, ctx=sub)
    return normed, s


#: most query heads whose rows of the output projection one program of ``combine_product`` multiplies
_MAX_HEADS_PER_PROGRAM = 8
#: output columns of one ``combine_product`` program (the fastest in benchmarks/results/attention_product.md)
_PRODUCT_COLUMNS = 128
#: most weight values one ``combine_product`` program holds (its [heads x head tile, columns] tile, loaded before the
#: PDL wait): Llama-3.2-1B's 4 heads x 64 x 128 columns, the largest measured
_PRODUCT_TILE = 32768
#: fewest output columns of one program (a tile past _PRODUCT_TILE with fewer: the two ops instead)
_MIN_PRODUCT_COLUMNS = 16
#: most partial results one program combines (splits, padded to a power of two, x its heads' channels): Llama-3.2-1B's
#: 16 x 4 x 64, the largest measured; past it the two ops
_PARTIALS_TILE = 4096
#: most batch rows AttentionSkipNorm takes to ``combine_product``, whose programs load their weight tile for each row:
#: from 4 rows the batched decode steps were slower than the combine kernel and the GEMV (H100, Llama-3.2-1B fp16
#: 3,515-3,529 -> 3,389-3,390 tokens/s at 4 rows, 11,583-12,089 -> 9,919-10,231 at 16), at 2 level
ATTENTION_PRODUCT_ROWS = 1


def _product_tiles(num_heads: int, head_size: int, n_out: int, splits: int) -> tuple[int, int] | None:
    """(heads, columns) of a ``combine_product`` program, or None (the two ops instead). Heads: the fewest (a power of
    two, at most _MAX_HEADS_PER_PROGRAM) whose partial sums, one row per group of heads, the skip-norm kernel adds in
    one tile (``crossml.kernels.gemv.norm_tile_fits``), if their ``splits`` partial results stay within
    _PARTIALS_TILE. Columns: _PRODUCT_COLUMNS, fewer where the weight tile would pass _PRODUCT_TILE values (head
    sizes past 64), at least _MIN_PRODUCT_COLUMNS."""
    fits = load("gemv").norm_tile_fits
    hp = 1
    while hp <= _MAX_HEADS_PER_PROGRAM and not fits(-(-num_heads // hp), n_out):
        hp *= 2
    rows = hp * max(16, 1 << (head_size - 1).bit_length())
    if hp > _MAX_HEADS_PER_PROGRAM or rows * (1 << (max(splits, 1) - 1).bit_length()) > _PARTIALS_TILE:
        return None
    columns = min(_PRODUCT_COLUMNS, _PRODUCT_TILE // rows)
    return (hp, columns) if columns >= _MIN_PRODUCT_COLUMNS else None


@op("AttentionSkipNorm", since=1, domain=DOMAIN, host_inputs=(6,), ctx=True)
def attention_skip_norm(*inputs: torch.Tensor | None, gqa_inputs: int, epsilon: float = 1e-12, ctx: OpContext,
                        **attrs: object) -> tuple:
    """GroupQueryAttention (its inputs first, ``gqa_inputs`` of them, and its attributes) whose output feeds the
    output projection's MatMulSkipNorm (the next four inputs: w, bias, residual, gamma; ``epsilon``) → (normed,
    sum, present_key, present_value) (graph rule AttentionSkipNorm). Where the decode step runs on the Triton
    kernels with its key range split, the splits' partial results go to ``combine_product``, which combines them
    and multiplies them with w in one launch, and the skip-norm kernel adds its partial sums (one launch fewer than
    the combine kernel and the projection's GEMV); elsewhere the GroupQueryAttention and MatMulSkipNorm ops, with
    their results."""
    from crossml.ops.contrib.attention import PARTIALS, group_query_attention

    gqa = inputs[:gqa_inputs]
    w, bias, residual, gamma = (list(inputs[gqa_inputs:]) + [None] * 4)[:4]
    wanted = tuple(ctx.outputs_wanted) + (False,) * 4
    rows = gqa[0].shape[0] if gqa[0] is not None and gqa[0].dim() == 3 else 0
    sub = OpContext(ctx.node_name, "GroupQueryAttention", ctx.opset, 3, (None,) * 3, (True, wanted[2], wanted[3]),
                    ctx.device, extra={**ctx.extra, PARTIALS: 0 < rows <= ATTENTION_PRODUCT_ROWS},
                    settled_inputs=ctx.settled_inputs,
                    settled_by=ctx.settled_by, const_inputs=ctx.const_inputs[:gqa_inputs],
                    input_types=ctx.input_types[:gqa_inputs])
    out, present_key, present_value, *_ = group_query_attention(*gqa, **attrs, ctx=sub)
    if isinstance(out, tuple):  # the decode step's partial results [B, N, S, H], [B, N, S]
        B, N, S, H = out[0].shape
        n_out = w.shape[-1] if w.dim() == 2 else -1
        tiles = _product_tiles(N, H, n_out, S) if w.dim() == 2 and w.shape[0] == N * H else None
        if tiles is not None and w.dtype == residual.dtype and residual.shape == (B, 1, n_out) \
                and gamma.numel() == n_out and (bias is None or bias.shape == (n_out,)) and w.device == residual.device:
            kernels = load("decode_attention")
            ws = kernels.combine_product(out, w, heads_per_program=tiles[0], block_n=tiles[1])
            bias1 = bias.to(residual.dtype) if bias is not None else None
            normed, s = load("gemv").partials_skip_norm(ws, bias1, residual.reshape(B, n_out), gamma, epsilon,
                                                        want_sum=wanted[1])
            return normed.reshape(residual.shape), (s.reshape(residual.shape) if s is not None else None), \
                present_key, present_value
        out = load("decode_attention").combine_partials(out, gqa[0].dtype).reshape(B, 1, N * H)
    msn = OpContext(ctx.node_name, "MatMulSkipNorm", 1, 2, (None,) * 2, (True, wanted[1]), ctx.device,
                    const_inputs=(False, *ctx.const_inputs[gqa_inputs:]))
    normed, s = matmul_skip_norm(out, w, bias, residual, gamma, epsilon=epsilon, ctx=msn)
    return normed, s, present_key, present_value


@op("ShortConv", since=1, domain=DOMAIN, ctx=True)
def short_conv(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
               past_state: torch.Tensor | None = None, *, activation: str = "none",
               dilation: int = 1, ctx: OpContext | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """LFM2's short-convolution block (graph rule SHORT_CONV, ``crossml.graph.passes.short_conv``): h [B, L, 3C] is
    split along its channels into b, c and x; the causal depthwise convolution of b * x after ``past_state``
    (com.microsoft CausalConvWithState with ``activation`` and ``dilation``), times c, is the output [B, L, C], and
    the convolution's present state the second output. On the CPU, float32 and no activation: numba's kernel
    (``crossml.kernels.cpu_conv.short_conv``), the same products and sums as the six nodes; on a Triton device one
    launch (``crossml.kernels.short_conv``, within a rounding of the six nodes); elsewhere their ops. With the GenAI
    static buffers (``kv_inplace``) the Triton kernel writes the present state into ``past_state`` and returns it, as
    CausalConvWithState does."""
    from crossml.ops.attention import causal_conv

    if h.dim() != 3 or h.shape[2] % 3:
        raise ValueError(f"ShortConv: h must be [batch, length, 3 * channels], got {tuple(h.shape)}")
    B, L, C3 = h.shape
    C = C3 // 3
    span = (weight.shape[-1] - 1) * dilation if weight.dim() == 3 else 0
    past = past_state if past_state is not None else torch.zeros((B, C, span), dtype=h.dtype, device=h.device)
    # the shapes both kernels take (elsewhere the ops' own checks name what is wrong)
    shaped = (weight.shape == (C, 1, weight.shape[-1]) and tuple(past.shape) == (B, C, span)
              and (bias is None or tuple(bias.shape) == (C,)))
    if (shaped and activation == "none"
            and (kernels := cpu_kernels("cpu_conv", h, weight, past, bias)) is not None):
        return kernels.short_conv(h, weight, bias, past, dilation)
    if (shaped and activation in ("none", "silu", "swish")
            and (triton_kernels := gpu_kernels("short_conv", h, weight, past, bias)) is not None):
        into = inplace_target(past_state, ctx is not None and bool(ctx.extra.get("kv_inplace")), h.dtype)
        return triton_kernels.short_conv(h, weight, bias, past.to(h.dtype), dilation, activation != "none", into)
    b, c, x = h.transpose(1, 2).split(C, dim=1)
    out, present, _ = causal_conv(b * x, weight, bias, past, activation, dilation, "ShortConv")
    return (c * out).transpose(1, 2), present
