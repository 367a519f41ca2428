"""Mixture of experts: MoE and QMoE (com.microsoft), as the model builder emits them (gpt-oss, Qwen3.5-MoE), and
GatedAdd, which adds Qwen3.5-MoE's gated shared expert to the routed experts' sum.

Every token row picks its experts from ``router_probs`` (router logits, one row per token):
softmax over all experts in float32, the ``k`` largest (ties to the higher expert index, as
onnxruntime's sort of (probability, index) pairs gives), and with ``normalize_routing_weights``
their probabilities divided by their sum (QMoE always divides, as onnxruntime's CPU kernel does: its
weights are the softmax of the chosen logits). Each chosen expert computes
``fc2(act(fc1(x) + b1)) + b2`` and the output is the routing-weighted sum. QMoE's
``router_weights``, when given, replace the probabilities in that sum (the selection still comes
from ``router_probs``; normalized only with ``normalize_routing_weights``).

``act`` is relu, gelu (tanh form), silu, identity, swiglu:
``G = min(g, limit)``, ``L = clamp(l, -limit, limit)``, ``G * sigmoid(alpha * G) * (L + beta)``,
or geglu (Gemma 4's experts): ``gelu_tanh(g) * l``, with ``g`` and ``l`` interleaved in fc1's rows
(``swiglu_fusion=1``, the builder's layout), concatenated (2), or from fc1 and fc3 (0). onnxruntime 1.31's
kernels have no geglu (its CPU MoE refuses it); the form is that of onnxruntime's CPU QMoE proposal (pull request
32153: HF's ``gelu_pytorch_tanh`` gate, SwiGLU's layouts), which defines no alpha, beta or limit for it, so
values other than their defaults are refused. Rounding follows onnxruntime's CPU kernels: each product and each activation is
rounded to the input type, the weighted sum is accumulated in float32.

QMoE (``quant_type='int'``) stores each expert's weights as MatMulNBits does, ``[E, N, K * bits / 8]``
uint8 low bits first, with per-row scales ``[E, N]`` or, with ``block_size``, per-block scales
``[E, N, K / block_size]``; zero points are packed the same way and default to ``2^(bits-1)``.
``accuracy_level`` is accepted and changes nothing: onnxruntime 1.31's CPU kernel gives the same
result at levels 0 and 4 (checked in the tests). The float formats
(fp4, nvfp4, fp8, wfp4afp8) are refused.

How the experts run, with no device-to-host copy so that a GPU step can be captured: on the CPU
each expert takes the rows routed to it; on a device, a decode-sized call (tokens x k at most the
number of experts) runs each (token, slot) row through its chosen expert ("gather"), and a larger call
runs every expert over every row and weights the rows it was not chosen for by zero ("dense").

What a decode step reads in "gather" mode: on a Triton device the expert GEMV kernel
(``crossml.kernels.moe.expert_gemv``) computes fc1 (fc3) and fc2 for every (token, slot) row reading
that expert's weights in place, packed ones dequantized in registers, so a step reads the k chosen
experts' fc1 + fc2 weights once per token (gpt-oss-20b int4, block 32: 14.0 MB an expert with its
scales, 56 MB a layer at k=4). The torch fallback (other devices) first gathers the chosen experts'
weights into a new [tokens * k, N, K] tensor, dequantized to the compute type for QMoE, and multiplies
that: it reads the weights, writes the copy and reads it again, about three times the bytes for MoE and
far more for QMoE (an fp16 copy is four times the packed int4, and the dequantization goes through
float32 intermediates). The activation and the slot-ordered weighted sum run in torch either way.
"""

from __future__ import annotations

import math

import torch

from crossml import kernels
from crossml.ops.contrib.matmul_nbits import unpack_bits
from crossml.ops.registry import MS_DOMAIN, op

_ACTIVATIONS = ("relu", "gelu", "silu", "identity", "swiglu", "geglu")
#: activations of a gate half and a linear half (fc1's rows doubled, or fc3)
_GATED = ("swiglu", "geglu")
_QUANT_TYPES = ("int", "fp4", "nvfp4", "fp8", "wfp4afp8")
#: added to QMoE's weight-shape errors: the builder's CUDA exports prepack the experts unless told not to
_PREPACKED_HINT = (". An int4/int8 export of the model builder for CUDA writes onnxruntime CUDA's CUTLASS-prepacked "
                   "layout unless built with --extra_options qmoe_weights_prepacked=0 (the raw layout read here); "
                   "re-export with it, or for -e cpu")


def _attr_str(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def route(router_probs: torch.Tensor, k: int, normalize: bool, router_weights: torch.Tensor | None = None
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``k`` experts per row of ``router_probs [T, E]`` and their weights: ``(experts [T, k] int64, weights
    [T, k] float32)``. Ties go to the higher expert index (a stable descending sort of the reversed row)."""
    E = router_probs.shape[-1]
    probs = torch.softmax(router_probs.float(), dim=-1)
    order = torch.sort(probs.flip(-1), dim=-1, descending=True, stable=True).indices[:, :k]
    experts = (E - 1) - order
    top = probs.gather(1, experts) if router_weights is None else router_weights.float().gather(1, experts)
    if normalize:
        top = top / top.sum(-1, keepdim=True)
    return experts, top


class _Experts:
    """One projection (fc1, fc2 or fc3) of every expert: dense ``[E, N, K]`` weights, or QMoE's packed ones
    dequantized on use; ``rows(idx)`` gives the dense weights of experts ``idx`` (any shape of indices)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, N: int, K: int, dtype: torch.dtype,
                 *, scales: torch.Tensor | None = None, zero_points: torch.Tensor | None = None, bits: int = 0,
                 block_size: int = 0) -> None:
        self.weight, self.bias, self.N, self.K = weight, bias, N, K
        self.dtype, self.scales, self.zero_points, self.bits, self.block_size = dtype, scales, zero_points, bits, block_size

    def rows(self, idx: torch.Tensor | int) -> torch.Tensor:
        w = self.weight[idx]  # [..., N, K] or packed [..., N, K * bits / 8]
        if not self.bits:
            return w.to(self.dtype)
        q = unpack_bits(w, self.bits).float()
        s = self.scales[idx].float()
        if not self.block_size:
            s = s.unsqueeze(-1)  # per-row scales: one block of K
        blocks = s.shape[-1]
        if self.zero_points is None:
            zp = torch.full_like(s, float(1 << (self.bits - 1)))
        else:
            z = unpack_bits(self.zero_points[idx], self.bits).float()
            zp = z[..., :blocks] if self.block_size else z[..., :self.N].unsqueeze(-1)
        q = q.reshape(*q.shape[:-1], blocks, self.K // blocks)
        return ((q - zp.unsqueeze(-1)) * s.unsqueeze(-1)).reshape(*q.shape[:-2], self.K).to(self.dtype)

    def bias_rows(self, idx: torch.Tensor | int) -> torch.Tensor | None:
        return None if self.bias is None else self.bias[idx].float()

    def gemv(self, x: torch.Tensor, idx: torch.Tensor, rows_per_token: int) -> torch.Tensor:
        """``apply`` of experts ``idx [R]`` to rows ``x[r // rows_per_token]`` through the expert GEMV kernel, which
        reads the weights in place: ``[R, N]`` in x's dtype (bias added before the one rounding)."""
        return kernels.load("moe").expert_gemv(
            x, idx, self.weight, self.bias, scales=self.scales, zero_points=self.zero_points, bits=self.bits,
            block_size=self.block_size, N=self.N, K=self.K, rows_per_token=rows_per_token)

    def apply(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        """``x [..., K] @ w[..., N, K]^T (+ b)`` rounded to the compute type (x broadcast over w's experts)."""
        y = torch.matmul(x.unsqueeze(-2), w.transpose(-1, -2)).squeeze(-2) if w.dim() > 2 else x @ w.T
        if b is not None:
            y = (y.float() + b).to(y.dtype)
        return y


def _activate(h: torch.Tensor, h3: torch.Tensor | None, kind: str, alpha: float, beta: float, limit: float,
              fusion: int) -> torch.Tensor:
    """The expert activation of fc1's output ``h`` (and fc3's ``h3`` for an unfused gated one), rounded to h's
    type."""
    f = h.float()
    if kind == "relu":
        y = torch.relu(f)
    elif kind == "gelu":
        y = _gelu_tanh(f)
    elif kind == "silu":
        y = f * torch.sigmoid(f)
    elif kind == "identity":
        y = f
    else:
        inter = f.shape[-1] // 2
        if fusion == 1:
            g, lin = f[..., 0::2], f[..., 1::2]
        elif fusion == 2:
            g, lin = f[..., :inter], f[..., inter:]
        else:
            g, lin = f, h3.float()
        if kind == "geglu":
            y = _gelu_tanh(g) * lin
        else:
            g = g.clamp(max=limit)
            lin = lin.clamp(-limit, limit)
            y = g * torch.sigmoid(alpha * g) * (lin + beta)
    return y.to(h.dtype)


def _gelu_tanh(f: torch.Tensor) -> torch.Tensor:
    """GELU's tanh form in float32 (onnxruntime's MoE gelu; transformers' gelu_pytorch_tanh)."""
    return 0.5 * f * (1.0 + torch.tanh(0.7978845608 * (f + 0.044715 * f * f * f)))


def expert_mode(device: torch.device, tokens: int, k: int, num_experts: int) -> str:
    """How ``_run_experts`` runs: "grouped" on the CPU (each expert over its rows; reads which rows on the host),
    "gather" for decode sizes on a device, "dense" for larger device calls (nothing read on the host)."""
    if device.type == "cpu":
        return "grouped"
    return "gather" if tokens * k <= num_experts else "dense"


def use_expert_kernel(device: torch.device) -> bool:
    """Whether "gather" mode runs the Triton expert GEMV: on Triton devices where its module compiles (not where
    Triton only interprets, which copies through the host). Tests patch it to run the kernel on CPU tensors in
    the interpreter."""
    return device.type in kernels.TRITON_DEVICES and kernels.load_compiled("moe") is not None


def _ffn(x: torch.Tensor, idx: torch.Tensor | int, fc1: _Experts, fc2: _Experts, fc3: _Experts | None,
         act) -> torch.Tensor:
    """``fc2(act(fc1(x), fc3(x)))`` of experts ``idx`` (one expert, or one per row of x) in the compute type."""
    h = fc1.apply(x, fc1.rows(idx), fc1.bias_rows(idx))
    h3 = fc3.apply(x, fc3.rows(idx), fc3.bias_rows(idx)) if fc3 is not None else None
    return fc2.apply(act(h, h3), fc2.rows(idx), fc2.bias_rows(idx))


def _run_experts(x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor, fc1: _Experts, fc2: _Experts,
                 fc3: _Experts | None, act, mode: str | None = None) -> torch.Tensor:
    """sum over the k slots of weight * fc2(act(fc1(x))) for x [T, H]; float32 [T, H]. ``mode``: see
    ``expert_mode`` (None: its choice)."""
    T, k = experts.shape
    E = fc1.weight.shape[0]
    out = torch.zeros(T, fc2.N, dtype=torch.float32, device=x.device)
    mode = mode or expert_mode(x.device, T, k, E)
    if mode == "grouped":
        for e in range(E):
            hit = (experts == e).nonzero()
            if hit.numel() == 0:
                continue
            rows, slots = hit[:, 0], hit[:, 1]
            y = _ffn(x[rows], e, fc1, fc2, fc3, act)
            out.index_add_(0, rows, y.float() * weights[rows, slots].unsqueeze(1))
        return out
    if mode == "gather":  # decode sizes: each (token, slot) row through its chosen expert
        flat = experts.reshape(-1)
        if use_expert_kernel(x.device):  # the weights read in place
            h = fc1.gemv(x, flat, k)
            h3 = fc3.gemv(x, flat, k) if fc3 is not None else None
            y = fc2.gemv(act(h, h3), flat, 1)
        else:  # the chosen experts' weights gathered, one batched product per projection
            y = _ffn(x.repeat_interleave(k, dim=0), flat, fc1, fc2, fc3, act)
        y = y.float().reshape(T, k, -1)
        for s in range(k):  # slot order, as a per-row loop over the chosen experts adds them
            out += y[:, s] * weights[:, s:s + 1]
        return out
    dense = torch.zeros(T, E, dtype=torch.float32, device=x.device).scatter_(1, experts, weights)
    chosen = torch.zeros(T, E, dtype=torch.bool, device=x.device).scatter_(1, experts, True)
    for e in range(E):
        y = _ffn(x, e, fc1, fc2, fc3, act).float()
        out += torch.where(chosen[:, e:e + 1], y * dense[:, e:e + 1], 0.0)
    return out


def _moe(what: str, x_in: torch.Tensor, router_probs: torch.Tensor, fc1: _Experts, fc2: _Experts,
         fc3: _Experts | None, *, k: int, activation_type, activation_alpha: float, activation_beta: float,
         normalize_routing_weights: int, swiglu_fusion: int, swiglu_limit: float | None, use_sparse_mixer: int,
         router_weights: torch.Tensor | None = None) -> torch.Tensor:
    kind = _attr_str(activation_type)
    H = x_in.shape[-1]
    T = x_in.numel() // H if H else 0
    E = fc1.weight.shape[0]
    if use_sparse_mixer:
        raise ValueError(f"{what}: use_sparse_mixer=1 (Phi-3.5-MoE's routing) is not supported; only top-k routing "
                         "(use_sparse_mixer=0) is")
    if router_probs.dim() != 2 or router_probs.shape[0] != T:
        raise ValueError(f"{what}: router_probs {tuple(router_probs.shape)} must be [tokens, num_experts] with "
                         f"tokens = {T}, the rows of input {tuple(x_in.shape)}")
    if router_probs.shape[1] != E:
        raise ValueError(f"{what}: router_probs has {router_probs.shape[1]} experts but fc1_experts_weights has {E}")
    if not 1 <= k <= E:
        raise ValueError(f"{what}: k={k} must be in 1 .. num_experts ({E})")
    if router_weights is not None and tuple(router_weights.shape) != tuple(router_probs.shape):
        raise ValueError(f"{what}: router_weights {tuple(router_weights.shape)} must have router_probs' shape "
                         f"{tuple(router_probs.shape)}")
    if kind == "geglu":
        given = [f"{name}={float(value):.6g}" for name, value, default in
                 (("activation_alpha", activation_alpha, 1.0), ("activation_beta", activation_beta, 0.0),
                  ("swiglu_limit", swiglu_limit, None)) if value != default]
        if given:
            raise ValueError(f"{what}: {', '.join(given)} is not defined for activation_type 'geglu' "
                             "(gelu_tanh(gate) * linear); leave it at its default")
    limit = math.inf if swiglu_limit is None else float(swiglu_limit)

    def act(h, h3):
        return _activate(h, h3, kind, float(activation_alpha), float(activation_beta), limit, swiglu_fusion)

    x = x_in.reshape(T, H).to(fc1.dtype)
    if T == 0:
        return torch.zeros_like(x_in)
    experts, weights = route(router_probs.reshape(T, E), k, bool(normalize_routing_weights), router_weights)
    out = _run_experts(x, experts, weights, fc1, fc2, fc3, act)
    return out.to(x_in.dtype).reshape(x_in.shape)


def _shapes(what: str, kind: str, fusion: int, fc1_rows: int, fc2_shape: tuple, H: int, has_fc3: bool
            ) -> tuple[int, int]:
    """(inter_size, fc1 rows) of an MoE node after checking the activation and fusion against the weights."""
    if kind not in _ACTIVATIONS:
        raise ValueError(f"{what}: activation_type '{kind}' is not one of {', '.join(_ACTIVATIONS)}")
    if fusion not in (0, 1, 2):
        raise ValueError(f"{what}: swiglu_fusion {fusion} must be 0 (fc1 and fc3), 1 (interleaved) or 2 (concatenated)")
    if len(fc2_shape) != 3 or fc2_shape[1] != H:
        raise ValueError(f"{what}: fc2_experts_weights {fc2_shape} must be [num_experts, hidden_size={H}, inter_size]")
    fused = kind in _GATED and fusion in (1, 2)
    if kind in _GATED and not fused and not has_fc3:
        raise ValueError(f"{what}: {kind} with swiglu_fusion=0 needs fc3_experts_weights (the linear half)")
    return (fc1_rows // 2 if fused else fc1_rows), fc1_rows


@op("MoE", domain=MS_DOMAIN)
def moe(
    x_in: torch.Tensor,
    router_probs: torch.Tensor,
    fc1_experts_weights: torch.Tensor,
    fc1_experts_bias: torch.Tensor | None = None,
    fc2_experts_weights: torch.Tensor | None = None,
    fc2_experts_bias: torch.Tensor | None = None,
    fc3_experts_weights: torch.Tensor | None = None,
    fc3_experts_bias: torch.Tensor | None = None,
    *,
    k: int = 1,
    activation_type: str = "relu",
    activation_alpha: float = 1.0,
    activation_beta: float = 0.0,
    normalize_routing_weights: int = 0,
    swiglu_fusion: int = 0,
    swiglu_limit: float | None = None,
    use_sparse_mixer: int = 0,
) -> torch.Tensor:
    if fc2_experts_weights is None:
        raise ValueError("MoE: fc2_experts_weights (input 4) is required")
    H = x_in.shape[-1]
    kind = _attr_str(activation_type)
    if fc1_experts_weights.dim() != 3 or fc1_experts_weights.shape[2] != H:
        raise ValueError(f"MoE: fc1_experts_weights {tuple(fc1_experts_weights.shape)} must be [num_experts, "
                         f"fusion_size * inter_size, hidden_size={H}]")
    inter, n1 = _shapes("MoE", kind, swiglu_fusion, fc1_experts_weights.shape[1], tuple(fc2_experts_weights.shape), H,
                        fc3_experts_weights is not None)
    dt = x_in.dtype
    fc1 = _Experts(fc1_experts_weights, fc1_experts_bias, n1, H, dt)
    fc2 = _Experts(fc2_experts_weights, fc2_experts_bias, H, inter, dt)
    fc3 = None if fc3_experts_weights is None else _Experts(fc3_experts_weights, fc3_experts_bias, inter, H, dt)
    return _moe("MoE", x_in, router_probs, fc1, fc2, fc3, k=k, activation_type=kind,
                activation_alpha=activation_alpha, activation_beta=activation_beta,
                normalize_routing_weights=normalize_routing_weights, swiglu_fusion=swiglu_fusion,
                swiglu_limit=swiglu_limit, use_sparse_mixer=use_sparse_mixer)


def _quantized(what: str, name: str, weight: torch.Tensor, scales: torch.Tensor | None, zero_points: torch.Tensor | None,
               bias: torch.Tensor | None, E: int, N: int, K: int, bits: int, block_size: int, dtype: torch.dtype
               ) -> _Experts:
    """Check one QMoE projection's packed weight, scales and zero points; the projection."""
    row_bytes = K * bits // 8
    if weight.dtype != torch.uint8 or tuple(weight.shape) != (E, N, row_bytes):
        raise ValueError(f"{what}: {name}_experts_weights {weight.dtype} {tuple(weight.shape)} must be uint8 "
                         f"[{E}, {N}, {row_bytes}] ({K} values of {bits} bits per row)" + _PREPACKED_HINT)
    if scales is None:
        raise ValueError(f"{what}: {name}_scales is required with quant_type 'int'")
    blocks = K // block_size if block_size else 1
    want = (E, N, blocks) if block_size else (E, N)
    if tuple(scales.shape) != want:
        raise ValueError(f"{what}: {name}_scales {tuple(scales.shape)} must be {list(want)}"
                         + (f" (K={K} / block_size {block_size})" if block_size else " (one scale per row)"))
    if zero_points is not None:
        zwant = (E, N, (blocks * bits + 7) // 8) if block_size else (E, (N * bits + 7) // 8)
        if zero_points.dtype != torch.uint8 or tuple(zero_points.shape) != zwant:
            raise ValueError(f"{what}: {name}_zero_points {zero_points.dtype} {tuple(zero_points.shape)} must be uint8 "
                             f"{list(zwant)}")
    return _Experts(weight, bias, N, K, dtype, scales=scales, zero_points=zero_points, bits=bits,
                    block_size=block_size)


@op("QMoE", domain=MS_DOMAIN)
def qmoe(
    x_in: torch.Tensor,
    router_probs: torch.Tensor,
    fc1_experts_weights: torch.Tensor,
    fc1_scales: torch.Tensor | None = None,
    fc1_experts_bias: torch.Tensor | None = None,
    fc2_experts_weights: torch.Tensor | None = None,
    fc2_scales: torch.Tensor | None = None,
    fc2_experts_bias: torch.Tensor | None = None,
    fc3_experts_weights: torch.Tensor | None = None,
    fc3_scales: torch.Tensor | None = None,
    fc3_experts_bias: torch.Tensor | None = None,
    fc1_zero_points: torch.Tensor | None = None,
    fc2_zero_points: torch.Tensor | None = None,
    fc3_zero_points: torch.Tensor | None = None,
    router_weights: torch.Tensor | None = None,
    fc1_global_scale: torch.Tensor | None = None,
    fc2_global_scale: torch.Tensor | None = None,
    fc1_act_scale: torch.Tensor | None = None,
    fc2_act_scale: torch.Tensor | None = None,
    fc1_act_block_scale: torch.Tensor | None = None,
    fc2_act_block_scale: torch.Tensor | None = None,
    *,
    k: int = 1,
    activation_type: str = "relu",
    activation_alpha: float = 1.0,
    activation_beta: float = 0.0,
    normalize_routing_weights: int = 0,
    swiglu_fusion: int = 0,
    swiglu_limit: float | None = None,
    use_sparse_mixer: int = 0,
    expert_weight_bits: int = 4,
    fc1_expert_weight_bits: int | None = None,
    fc2_expert_weight_bits: int | None = None,
    fc3_expert_weight_bits: int | None = None,
    block_size: int | None = None,
    accuracy_level: int = 0,
    quant_type: str = "int",
    weights_prepacked: int = -1,
) -> torch.Tensor:
    qt = _attr_str(quant_type)
    if qt not in _QUANT_TYPES:
        raise ValueError(f"QMoE: quant_type '{qt}' is not one of {', '.join(_QUANT_TYPES)}")
    if qt != "int":
        raise ValueError(f"QMoE: quant_type '{qt}' is not supported by crossml; supported: 'int' (integer weights with "
                         "scales). Export the experts as int4/int8 (the builder's default QMoE) instead")
    if weights_prepacked == 1:
        raise ValueError("QMoE: weights_prepacked=1 (an execution provider's CUTLASS layout) is not supported; export "
                         "the raw [E, N, K * bits / 8] layout (weights_prepacked 0 or -1)")
    if fc2_experts_weights is None:
        raise ValueError("QMoE: fc2_experts_weights (input 5) is required")
    bits = {name: (v if v is not None else expert_weight_bits) for name, v in
            (("fc1", fc1_expert_weight_bits), ("fc2", fc2_expert_weight_bits), ("fc3", fc3_expert_weight_bits))}
    for name, b in bits.items():
        if b not in (4, 8):
            raise ValueError(f"QMoE: {name} weight bits {b} are not supported; 4 and 8 are")
    bs = int(block_size or 0)
    if bs and (bs < 16 or bs & (bs - 1)):
        raise ValueError(f"QMoE: block_size {bs} must be a power of two >= 16")
    H = x_in.shape[-1]
    if bs and H % bs:
        raise ValueError(f"QMoE: hidden_size {H} is not a multiple of block_size {bs}")
    kind = _attr_str(activation_type)
    E = fc1_experts_weights.shape[0]
    if fc1_experts_weights.dim() != 3 or fc2_experts_weights.dim() != 3:
        raise ValueError(f"QMoE: fc1/fc2_experts_weights {tuple(fc1_experts_weights.shape)} / "
                         f"{tuple(fc2_experts_weights.shape)} must be 3-D [num_experts, N, K * bits / 8]")
    if fc2_experts_weights.shape[1] != H:
        raise ValueError(f"QMoE: fc2_experts_weights {tuple(fc2_experts_weights.shape)} must be [num_experts, "
                         f"hidden_size={H}, inter_size * bits / 8]" + _PREPACKED_HINT)
    inter = fc2_experts_weights.shape[2] * 8 // bits["fc2"]
    if bs and inter % bs:
        raise ValueError(f"QMoE: inter_size {inter} is not a multiple of block_size {bs}")
    _, n1 = _shapes("QMoE", kind, swiglu_fusion, fc1_experts_weights.shape[1],
                    (E, fc2_experts_weights.shape[1], inter), H, fc3_experts_weights is not None)
    dt = x_in.dtype
    common = dict(E=E, block_size=bs, dtype=dt)
    fc1 = _quantized("QMoE", "fc1", fc1_experts_weights, fc1_scales, fc1_zero_points, fc1_experts_bias, N=n1, K=H,
                     bits=bits["fc1"], **common)
    fc2 = _quantized("QMoE", "fc2", fc2_experts_weights, fc2_scales, fc2_zero_points, fc2_experts_bias, N=H, K=inter,
                     bits=bits["fc2"], **common)
    fc3 = None
    if fc3_experts_weights is not None:
        fc3 = _quantized("QMoE", "fc3", fc3_experts_weights, fc3_scales, fc3_zero_points, fc3_experts_bias, N=inter,
                         K=H, bits=bits["fc3"], **common)
    return _moe("QMoE", x_in, router_probs, fc1, fc2, fc3, k=k, activation_type=kind,
                activation_alpha=activation_alpha, activation_beta=activation_beta,
                normalize_routing_weights=1 if router_weights is None else normalize_routing_weights,
                swiglu_fusion=swiglu_fusion,
                swiglu_limit=swiglu_limit, use_sparse_mixer=use_sparse_mixer, router_weights=router_weights)


@op("GatedAdd", domain=MS_DOMAIN)
def gated_add(X: torch.Tensor, Y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """``X + Y * gate``, the product rounded to the tensor type before the sum (a Mul then an Add), ``gate`` one value
    per row: X's shape with a last dimension of 1."""
    if X.dim() == 0 or Y.shape != X.shape or gate.shape != (*X.shape[:-1], 1):
        raise ValueError(f"GatedAdd: X {tuple(X.shape)} and Y {tuple(Y.shape)} must have one shape (..., C), and gate "
                         f"{tuple(gate.shape)} that shape with a last dimension of 1, {(*X.shape[:-1], 1)}")
    if Y.dtype != X.dtype or gate.dtype != X.dtype:
        raise TypeError(f"GatedAdd: X, Y and gate must have one type, got {X.dtype}, {Y.dtype}, {gate.dtype}")
    return X + Y * gate
