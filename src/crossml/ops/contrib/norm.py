"""Layer normalizations of onnxruntime's contrib set (RMSNorm and the fused skip variants).

* ``SimplifiedLayerNormalization`` (RMSNorm) and ``LayerNormalization`` (opset-1 form): onnxruntime
  registers both in the ai.onnx domain, and GenAI builder models use them that way.
* ``SkipLayerNormalization`` / ``SkipSimplifiedLayerNormalization`` (com.microsoft): normalize
  ``input + skip (+ bias)`` over the last axis, optionally returning the mean, the inverse standard
  deviation and the residual sum itself.

Statistics are computed in float32 for half-precision inputs (``stash_type`` 1), as onnxruntime does.

On CUDA / XPU tensors the RMSNorm forms (last axis, fp16 / bf16 / fp32, stash_type 1) run as one
Triton kernel each (``crossml.kernels.rmsnorm``, imported on first GPU use): in a decode step the
eight or so torch kernels of the definitions below would dominate. On the CPU, SkipSimplifiedLayerNormalization of
float32 tensors runs numba's kernel (``crossml.kernels.cpu_norm``) with onnxruntime's CPU arithmetic, bit for bit,
where numba is installed and the inverse standard deviation is not asked for (``_cpu_skip``). Everything else runs
the torch code.
"""

from __future__ import annotations

import functools
import logging
from types import ModuleType

import torch

from crossml import dtypes
from crossml.kernels import TRITON_DEVICES, load, load_compiled
from crossml.ops._util import broadcast_shapes, norm_axis
from crossml.ops.registry import MS_DOMAIN, OpContext, op

_HALF = (torch.float16, torch.bfloat16)
#: storage types the Triton RMSNorm kernels take
_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

log = logging.getLogger("crossml")


@functools.cache
def _rmsnorm_kernels() -> ModuleType | None:
    """``crossml.kernels.rmsnorm``, or None where triton does not import or only interprets
    (the interpreter copies through the host, which a captured graph cannot hold)."""
    return load_compiled("rmsnorm")


def _kernel_vector(t: torch.Tensor | None, x: torch.Tensor) -> bool:
    """None, or a [..., H] tensor of x's hidden size H with no more dims than x (weights, bias)."""
    return t is None or (0 < t.dim() <= x.dim() and t.shape[-1] == x.shape[-1] and t.numel() == x.shape[-1])


def _broadcasts_to(t: torch.Tensor, x: torch.Tensor) -> bool:
    """Whether ``t`` broadcasts to x's shape without growing it (else torch's error stands)."""
    try:
        return broadcast_shapes(t.shape, x.shape) == x.shape
    except RuntimeError:
        return False


def _use_kernel(x: torch.Tensor, *ts: torch.Tensor | None) -> bool:
    """x on a Triton device, every tensor of a kernel storage type on x's device, triton importable."""
    if x.device.type not in TRITON_DEVICES or x.dim() == 0 or x.shape[-1] == 0:
        return False
    if not all(t is None or (t.dtype in _KERNEL_DTYPES and t.device == x.device) for t in (x, *ts)):
        return False
    return _rmsnorm_kernels() is not None


def _stash(x: torch.Tensor, stash_type: int) -> torch.Tensor:
    if stash_type == 11:
        return x.double()
    return x.float() if x.dtype in _HALF or stash_type == 1 and x.dtype != torch.float64 else x


def _normalize(x: torch.Tensor, axis: int, epsilon: float, simplified: bool, stash_type: int = 1):
    """(normalized x in the stash type, mean or None, inverse std) over dims axis..rank-1."""
    dims = tuple(range(norm_axis(axis, x.dim()), x.dim()))
    w = _stash(x, stash_type)
    mean = None
    if simplified:
        var = w.square().mean(dim=dims, keepdim=True)
    else:
        mean = w.mean(dim=dims, keepdim=True)
        w = w - mean
        var = w.square().mean(dim=dims, keepdim=True)
    inv = torch.rsqrt(var + epsilon)
    return w * inv, mean, inv


def _stat_type(x: torch.Tensor, stash_type: int) -> torch.dtype:
    return torch.float64 if stash_type == 11 else torch.float32


@op("SimplifiedLayerNormalization", since=1)
def simplified_layer_normalization(
    X: torch.Tensor, scale: torch.Tensor, *, axis: int = -1, epsilon: float = 1e-5, stash_type: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    if (stash_type == 1 and _use_kernel(X, scale) and norm_axis(axis, X.dim()) == X.dim() - 1
            and _kernel_vector(scale, X)):
        return _rmsnorm_kernels().rms_norm(X, scale, epsilon)
    y, _, inv = _normalize(X, axis, epsilon, True, stash_type)
    out = (y * _stash(scale, stash_type)).to(scale.dtype)
    return out, inv.to(_stat_type(X, stash_type))


@op("SimplifiedLayerNormalization", since=1, domain="com.crossml")
def simplified_layer_normalization_cast(X: torch.Tensor, scale: torch.Tensor, *, axis: int = -1, epsilon: float = 1e-5,
                                        stash_type: int = 1, to: int = 0) -> torch.Tensor:
    """com.crossml SimplifiedLayerNormalization (graph rule FoldNormCasts, ``crossml.graph.passes.norm_casts``): the
    ai.onnx op on X widened to float32 first, its result of ``to`` (an ONNX element type; 0: scale's type), Y alone.
    It stands for Cast(X -> float32), SimplifiedLayerNormalization, Cast(-> to): the same values bit for bit (the
    widening is exact; the one rounding is the second Cast's), in one launch on a GPU."""
    out = dtypes.torch_dtype(to) if to else scale.dtype
    if (stash_type == 1 and _use_kernel(X, scale) and norm_axis(axis, X.dim()) == X.dim() - 1
            and _kernel_vector(scale, X)):
        return _rmsnorm_kernels().rms_norm(X, scale, epsilon, out_dtype=out)[0]
    x = X.float() if X.dtype in _HALF else X
    return simplified_layer_normalization(x, scale, axis=axis, epsilon=epsilon, stash_type=stash_type)[0].to(out)


@op("LayerNormalization", since=1)
def layer_normalization(
    X: torch.Tensor,
    Scale: torch.Tensor,
    B: torch.Tensor | None = None,
    *,
    axis: int = -1,
    epsilon: float = 1e-5,
    stash_type: int = 1,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y, mean, inv = _normalize(X, axis, epsilon, False, stash_type)
    y = y * _stash(Scale, stash_type)
    if B is not None:
        y = y + _stash(B, stash_type)
    st = _stat_type(X, stash_type)
    return y.to(X.dtype), mean.to(st), inv.to(st)


def _cpu_skip(x: torch.Tensor, skip: torch.Tensor, gamma: torch.Tensor, bias: torch.Tensor | None,
              want: tuple[bool, ...]) -> bool:
    """Whether a SkipSimplifiedLayerNormalization runs numba's CPU kernel (``crossml.kernels.cpu_norm``): float32
    tensors on the CPU, gamma and bias of H values, the skip x's shape or its trailing dims (leading ones dropped),
    neither the mean nor the inverse standard deviation wanted (onnxruntime's CPU kernel gives neither), numba
    installed."""
    f32 = torch.float32
    if x.device.type != "cpu" or want[1] or want[2] or x.numel() == 0 or x.dtype != f32 or skip.dtype != f32:
        return False
    if skip.device.type != "cpu" or gamma.dtype != f32 or gamma.device.type != "cpu" or (
            bias is not None and (bias.dtype != f32 or bias.device.type != "cpu")):
        return False
    if not (_kernel_vector(gamma, x) and _kernel_vector(bias, x)):
        return False
    trail = tuple(skip.shape)
    while len(trail) > 1 and trail[0] == 1:
        trail = trail[1:]
    if tuple(x.shape[x.dim() - len(trail):]) != trail:
        return False
    return load("cpu_norm") is not None


def _check_skip(x: torch.Tensor, skip: torch.Tensor) -> None:
    if x.dim() not in (2, 3):
        raise ValueError(f"input is expected to have rank 2 or 3, got shape {tuple(x.shape)}")
    if skip.shape[-1] != x.shape[-1] or skip.dim() > x.dim():
        raise ValueError(f"skip of shape {tuple(skip.shape)} does not broadcast to input {tuple(x.shape)}")


def _skip_sum(x: torch.Tensor, skip: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    _check_skip(x, skip)
    s = _stash(x, 1) + _stash(skip, 1)
    return s if bias is None else s + _stash(bias, 1)


def _wanted(ctx: OpContext) -> tuple[bool, ...]:
    """Which of the skip norms' four outputs (output, mean, inv_std, sum) the node uses."""
    return ctx.outputs_wanted + (False,) * (4 - len(ctx.outputs_wanted))


def _skip_outputs(ctx: OpContext, x: torch.Tensor, y: torch.Tensor, mean, inv, s: torch.Tensor) -> tuple:
    want = _wanted(ctx)
    return (
        y.to(x.dtype),
        mean if want[1] and mean is not None else None,
        inv if want[2] else None,
        s.to(x.dtype) if want[3] else None,
    )


@op("SkipLayerNormalization", domain=MS_DOMAIN, ctx=True)
def skip_layer_normalization(
    x: torch.Tensor,
    skip: torch.Tensor,
    gamma: torch.Tensor,
    beta: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    *,
    epsilon: float = 1e-12,
    ctx: OpContext,
) -> tuple:
    _check_skip(x, skip)
    want = _wanted(ctx)
    if (not want[1] and _use_kernel(x, skip, gamma, beta, bias) and _kernel_vector(gamma, x)
            and _kernel_vector(beta, x) and _kernel_vector(bias, x) and _broadcasts_to(skip, x)
            and x.shape[-1] <= _rmsnorm_kernels().LAYER_NORM_MAX):
        y, inv, s = _rmsnorm_kernels().skip_layer_norm(x, skip, gamma, beta, bias, epsilon, store_inv=want[2],
                                                       store_sum=want[3])
        return y, None, inv, s
    s = _skip_sum(x, skip, bias)
    y, mean, inv = _normalize(s, -1, epsilon, False)
    y = y * _stash(gamma, 1)
    if beta is not None:
        y = y + _stash(beta, 1)
    return _skip_outputs(ctx, x, y, mean, inv, s)


@op("SkipSimplifiedLayerNormalization", domain=MS_DOMAIN, ctx=True)
def skip_simplified_layer_normalization(
    x: torch.Tensor,
    skip: torch.Tensor,
    gamma: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    epsilon: float = 1e-12,
    ctx: OpContext,
) -> tuple:
    _check_skip(x, skip)
    want = _wanted(ctx)
    if (_use_kernel(x, skip, gamma, bias) and _kernel_vector(gamma, x) and _kernel_vector(bias, x)
            and _broadcasts_to(skip, x)):
        y, inv, s = _rmsnorm_kernels().skip_rms_norm(x, skip, gamma, bias, epsilon, store_inv=want[2],
                                                     store_sum=want[3])
        return y, None, inv, s
    if _cpu_skip(x, skip, gamma, bias, want):
        y, s = load("cpu_norm").skip_rms_norm(x, skip, gamma, bias, epsilon)
        return y, None, None, s if want[3] else None
    s = _skip_sum(x, skip, bias)
    y, _, inv = _normalize(s, -1, epsilon, True)
    return _skip_outputs(ctx, x, y * _stash(gamma, 1), None, inv, s)


@op("SkipSimplifiedLayerNormalization", since=1, domain="com.crossml", ctx=True)
def folded_skip_simplified_layer_normalization(
    x: torch.Tensor,
    skip: torch.Tensor,
    gamma: torch.Tensor,
    bias: torch.Tensor | None = None,
    skip_gamma: torch.Tensor | None = None,
    *,
    epsilon: float = 1e-12,
    to: int = 0,
    input_scale: float | None = None,
    skip_scale: float | None = None,
    skip_epsilon: float = 1e-6,
    ctx: OpContext,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """com.crossml SkipSimplifiedLayerNormalization (graph rule FoldSkipNorm, ``crossml.graph.passes.norm_casts``):
    com.microsoft's op with the nodes around it that the builder's Gemma exports write, → (Y, sum):
    ``skip_gamma``: the skip is SimplifiedLayerNormalization(skip, skip_gamma, epsilon=skip_epsilon) first (Gemma's
    post-attention / post-feed-forward norm), its result of x's type; ``input_scale`` / ``skip_scale``: x / the skip
    times that constant first (Mul nodes of x's type: Gemma 4's layer scalars); ``to``: Y's ONNX element type (0: x's;
    a Cast of the result). On a GPU one launch (``crossml.kernels.rmsnorm.folded_skip_rms_norm``: the nodes' steps,
    within an ulp or two of their kernels) where the skip has x's shape, else the ops one by one (their values)."""
    out = dtypes.torch_dtype(to) if to else x.dtype
    want_sum = len(ctx.outputs_wanted) > 1 and ctx.outputs_wanted[1]
    kernels = _rmsnorm_kernels() if _use_kernel(x, skip, gamma, bias, skip_gamma) else None
    if (kernels is not None and skip.shape == x.shape and x.dim() > 0 and 0 < x.shape[-1] <= kernels.FOLDED_MAX
            and all(_kernel_vector(t, x) for t in (gamma, bias, skip_gamma))):
        return kernels.folded_skip_rms_norm(x, skip, gamma, bias, epsilon, out_dtype=out, x_scale=input_scale,
                                            skip_scale=skip_scale, skip_weight=skip_gamma, skip_eps=skip_epsilon,
                                            store_sum=want_sum)
    if skip_gamma is not None:
        skip = simplified_layer_normalization_cast(skip, skip_gamma, epsilon=skip_epsilon,
                                                   to=dtypes.onnx_type_of(x))
    if input_scale is not None:
        x = torch.mul(x, torch.tensor(input_scale, dtype=x.dtype, device=x.device))
    if skip_scale is not None:
        skip = torch.mul(skip, torch.tensor(skip_scale, dtype=skip.dtype, device=skip.device))
    sub = OpContext(ctx.node_name, "SkipSimplifiedLayerNormalization", 1, 4, (None,) * 4,
                    (True, False, False, want_sum), ctx.device)
    y, _, _, s = skip_simplified_layer_normalization(x, skip, gamma, bias, epsilon=epsilon, ctx=sub)
    return y.to(out), s
