"""Attention-family ops against onnx.reference.ReferenceEvaluator (and onnxruntime) on the cases the
ONNX node tests miss: GQA/MQA ratios with every mask kind and rank, cache offsets, nonpad lengths and
windows combined, fully-masked rows, float16/bfloat16, softmax_precision, which Attention cases run
on scaled_dot_product_attention, and RotaryEmbedding / LinearAttention / CausalConvWithState /
SwiGLU in half precision."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx.reference import ReferenceEvaluator

import crossml
import crossml.ops.attention as attn_mod
from tests.ops._models import one_node_model

RNG = np.random.default_rng(23)
BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.float32


def rand(*shape: int, dtype=F32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32).astype(dtype)


def model(op_type: str, inputs: dict[str, np.ndarray | None], opset: int, n_out: int = 1,
          **attrs: object) -> onnx.ModelProto:
    return one_node_model(op_type, inputs, opset, n_out, **attrs)


def feeds(inputs: dict[str, np.ndarray | None]) -> dict[str, np.ndarray]:
    return {k: v for k, v in inputs.items() if v is not None}


def run(m: onnx.ModelProto, inputs: dict[str, np.ndarray | None]) -> list[np.ndarray]:
    return crossml.InferenceSession(m.SerializeToString()).run(None, feeds(inputs))


def reference(m: onnx.ModelProto, inputs: dict[str, np.ndarray | None]) -> list[np.ndarray]:
    return ReferenceEvaluator(m).run(None, feeds(inputs))


def upcast(inputs: dict[str, np.ndarray | None]) -> dict[str, np.ndarray | None]:
    """Half-precision float inputs as float32 (to compute a reference in full precision)."""
    return {k: (v.astype(F32) if v is not None and v.dtype in (np.float16, BF16) else v) for k, v in inputs.items()}


def check(op_type: str, inputs: dict[str, np.ndarray | None], opset: int, n_out: int = 1,
          rtol: float = 1e-5, atol: float = 1e-5, **attrs: object) -> list[np.ndarray]:
    """crossml against the reference; half-precision inputs are checked against a float32 reference."""
    got = run(model(op_type, inputs, opset, n_out, **attrs), inputs)
    want = reference(model(op_type, upcast(inputs), opset, n_out, **attrs), upcast(inputs))
    first = next(v for v in inputs.values() if v is not None)
    for i, (g, w) in enumerate(zip(got, want)):
        if first.dtype in (np.float16, BF16):
            assert g.dtype == first.dtype or w.dtype != F32, f"output {i}: dtype {g.dtype}"
        else:
            assert g.dtype == w.dtype, f"output {i}: dtype {g.dtype} != {w.dtype}"
        assert g.shape == w.shape, f"output {i}: shape {g.shape} != {w.shape}"
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol,
                                   err_msg=f"output {i}")
    return got


def qkv(b: int, hq: int, hkv: int, lq: int, lkv: int, d: int = 8, dv: int = 8, three_d: bool = False,
        dtype=F32) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if three_d:
        return rand(b, lq, hq * d, dtype=dtype), rand(b, lkv, hkv * d, dtype=dtype), rand(b, lkv, hkv * dv, dtype=dtype)
    return rand(b, hq, lq, d, dtype=dtype), rand(b, hkv, lkv, d, dtype=dtype), rand(b, hkv, lkv, dv, dtype=dtype)


def mask(kind: str, b: int, h: int, lq: int, total: int, dtype=F32) -> np.ndarray | None:
    if kind == "none":
        return None
    shape = {"2d": (lq, total), "3d": (h, lq, total), "4d": (b, 1, lq, total), "1d": (total,)}[kind[:2]]
    if kind.endswith("bool"):
        m = RNG.random(shape) > 0.3
        m[..., 0] = True  # keep one key per row
        return m
    return rand(*shape, dtype=dtype)


# --------------------------------------------------------------------------------------------
# Attention against the reference

HEADS = [(4, 4), (4, 2), (8, 2), (4, 1)]
MASKS = ["none", "2d_bool", "2d_float", "3d_float", "4d_bool", "1d_bool"]


@pytest.mark.parametrize(("heads", "mask_kind", "causal", "past"),
                         [(h, m, c, p) for h, m, c, p in itertools.product(HEADS, MASKS, (0, 1), (0, 3))
                          if (h, m) != ((4, 1), "3d_float")
                          and not (m.startswith("1d") and c)])  # the reference cannot do rank-1 + causal
def test_attention_grid(heads, mask_kind, causal, past):
    hq, hkv = heads
    b, lq, lkv = 2, 3, 3 if past else 5
    q, k, v = qkv(b, hq, hkv, lq, lkv, dv=6)
    pk = rand(b, hkv, past, 8) if past else None
    pv = rand(b, hkv, past, 6) if past else None
    inputs = {"Q": q, "K": k, "V": v, "attn_mask": mask(mask_kind, b, hq, lq, lkv + past),
              "past_key": pk, "past_value": pv}
    check("Attention", inputs, 23, n_out=3 if past else 1, is_causal=causal)


@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("causal", [0, 1])
def test_attention_3d_inputs(heads, causal):
    hq, hkv = heads
    q, k, v = qkv(2, hq, hkv, 4, 6, dv=4, three_d=True)
    check("Attention", {"Q": q, "K": k, "V": v}, 23, is_causal=causal, q_num_heads=hq, kv_num_heads=hkv,
          scale=0.3)


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
@pytest.mark.parametrize("softcap", [0.0, 1.5])
def test_attention_qk_output_modes(mode, softcap):
    q, k, v = qkv(2, 4, 2, 3, 5)
    inputs = {"Q": q, "K": k, "V": v, "attn_mask": mask("2d_float", 2, 4, 3, 5)}
    check("Attention", inputs, 23, n_out=4, qk_matmul_output_mode=mode, softcap=softcap, is_causal=1)


@pytest.mark.parametrize("nonpad", [[5, 3], [0, 7], [2, 1]])
@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("mask_kind", ["none", "2d_bool", "2d_float"])
def test_attention_nonpad(nonpad, causal, mask_kind):
    q, k, v = qkv(2, 4, 2, 3, 7)
    inputs = {"Q": q, "K": k, "V": v, "attn_mask": mask(mask_kind, 2, 4, 3, 7), "past_key": None,
              "past_value": None, "nonpad_kv_seqlen": np.array(nonpad, dtype=np.int64)}
    got = check("Attention", inputs, 24, is_causal=causal)
    assert not np.isnan(got[0]).any()


@pytest.mark.parametrize(("left", "right"), [(2, 0), (1, 1), (-1, 1), (0, -1), (3, 2)])
@pytest.mark.parametrize("cache", ["none", "past", "nonpad"])
@pytest.mark.parametrize("causal", [0, 1])
def test_attention_windows(left, right, cache, causal):
    b, hq, hkv, lq = 2, 4, 2, 3
    lkv = 3 if cache == "past" else 6
    q, k, v = qkv(b, hq, hkv, lq, lkv)
    inputs: dict[str, np.ndarray | None] = {"Q": q, "K": k, "V": v, "attn_mask": None}
    if cache == "past":
        inputs.update(past_key=rand(b, hkv, 4, 8), past_value=rand(b, hkv, 4, 8))
    elif cache == "nonpad":
        inputs.update(past_key=None, past_value=None, nonpad_kv_seqlen=np.array([6, 4], dtype=np.int64))
    check("Attention", inputs, 25, n_out=3 if cache == "past" else 1, is_causal=causal,
          left_window_size=left, right_window_size=right)


def test_attention_short_mask_is_padded():
    q, k, v = qkv(1, 2, 2, 3, 6)
    check("Attention", {"Q": q, "K": k, "V": v, "attn_mask": mask("2d_bool", 1, 2, 3, 4)}, 25)
    check("Attention", {"Q": q, "K": k, "V": v, "attn_mask": mask("2d_float", 1, 2, 3, 4)}, 25)


def test_attention_fully_masked_rows_are_zero():
    q, k, v = qkv(1, 2, 2, 3, 4)
    m = np.ones((3, 4), dtype=bool)
    m[1] = False
    for attrs in ({}, {"softcap": 2.0}):  # SDPA path and explicit path
        y = check("Attention", {"Q": q, "K": k, "V": v, "attn_mask": m}, 23, **attrs)[0]
        assert (y[:, :, 1] == 0).all()
    fm = np.where(m, 0, -np.inf).astype(F32)
    y = check("Attention", {"Q": q, "K": k, "V": v, "attn_mask": fm}, 23)[0]
    assert (y[:, :, 1] == 0).all()


def test_attention_softmax_precision_double():
    q, k, v = qkv(2, 4, 2, 3, 5)
    check("Attention", {"Q": q, "K": k, "V": v, "attn_mask": mask("2d_float", 2, 4, 3, 5)}, 23,
          n_out=4, softmax_precision=11, qk_matmul_output_mode=3)


def test_attention_float64():
    q, k, v = qkv(2, 4, 2, 3, 5, dtype=np.float64)
    check("Attention", {"Q": q, "K": k, "V": v}, 23, is_causal=1, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2), (4, 1)])
@pytest.mark.parametrize("mask_kind", ["none", "2d_bool", "4d_float", "causal", "past"])
def test_attention_half(dtype, heads, mask_kind):
    hq, hkv = heads
    tol = 4e-3 if dtype == np.float16 else 3e-2
    past = mask_kind == "past"
    q, k, v = qkv(2, hq, hkv, 3, 2 if past else 5, dtype=dtype)
    inputs = {"Q": q, "K": k, "V": v,
              "attn_mask": None if mask_kind in ("none", "causal", "past") else mask(mask_kind, 2, hq, 3, 5, dtype),
              "past_key": rand(2, hkv, 4, 8, dtype=dtype) if past else None,
              "past_value": rand(2, hkv, 4, 8, dtype=dtype) if past else None}
    got = check("Attention", inputs, 23, n_out=3 if past else 1, rtol=tol, atol=tol,
                is_causal=int(mask_kind in ("causal", "past")))
    assert got[0].dtype == dtype


@pytest.mark.parametrize("heads", [(4, 4), (8, 2)])
def test_attention_fp16_matches_onnxruntime(heads):
    hq, hkv = heads
    q, k, v = qkv(2, hq, hkv, 4, 4, dtype=np.float16)
    inputs = {"Q": q, "K": k, "V": v, "attn_mask": mask("2d_float", 2, hq, 4, 4, np.float16),
              "past_key": rand(2, hkv, 3, 8, dtype=np.float16), "past_value": rand(2, hkv, 3, 8, dtype=np.float16)}
    inputs["attn_mask"] = mask("2d_float", 2, hq, 4, 7, np.float16)
    m = model("Attention", inputs, 23, n_out=3, is_causal=1)
    m.ir_version = 10  # the newest onnxruntime reads
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds(inputs))
    got = run(m, inputs)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g.astype(F32), w.astype(F32), rtol=4e-3, atol=4e-3)


def test_attention_errors():
    q, k, v = qkv(1, 2, 2, 3, 3)
    m = model("Attention", {"Q": q, "K": k, "V": v, "attn_mask": None, "past_key": rand(1, 2, 2, 8)}, 23)
    with pytest.raises(Exception, match="past_key and past_value"):
        run(m, {"Q": q, "K": k, "V": v, "past_key": rand(1, 2, 2, 8)})
    q3, k3, v3 = qkv(1, 2, 2, 3, 3, three_d=True)
    with pytest.raises(Exception, match="q_num_heads"):
        run(model("Attention", {"Q": q3, "K": k3, "V": v3}, 23), {"Q": q3, "K": k3, "V": v3})
    q, k, v = qkv(1, 3, 2, 3, 3)
    with pytest.raises(Exception, match="not a multiple"):
        run(model("Attention", {"Q": q, "K": k, "V": v}, 23), {"Q": q, "K": k, "V": v})


# --------------------------------------------------------------------------------------------
# which cases run on scaled_dot_product_attention


@pytest.fixture
def sdpa_calls(monkeypatch):
    calls: list[dict] = []
    real = attn_mod.F.scaled_dot_product_attention

    def spy(*args, **kw):
        calls.append(kw)
        return real(*args, **kw)

    monkeypatch.setattr(attn_mod.F, "scaled_dot_product_attention", spy)
    return calls


@pytest.mark.parametrize(("case", "fused"), [
    ("plain", True), ("causal", True), ("decode", True), ("bool_mask", True), ("float_mask", True),
    ("nonpad", True), ("softmax_fp32", True), ("softcap", False), ("qk_output", False), ("softmax_fp64", False),
])
def test_attention_uses_sdpa(sdpa_calls, case, fused):
    dt = np.float16 if case.startswith("softmax") else F32
    length = 1 if case == "decode" else 3
    q, k, v = qkv(1, 4, 2, length, length, dtype=dt)
    inputs: dict[str, np.ndarray | None] = {"Q": q, "K": k, "V": v, "attn_mask": None}
    attrs: dict[str, object] = {}
    n_out, opset = 1, 23
    if case in ("causal", "decode"):
        attrs["is_causal"] = 1
    if case == "decode":
        inputs.update(past_key=rand(1, 2, 5, 8), past_value=rand(1, 2, 5, 8))
        n_out = 3
    if case == "bool_mask":
        inputs["attn_mask"] = mask("2d_bool", 1, 4, 3, 3)
    if case == "float_mask":
        inputs["attn_mask"] = mask("4d_float", 1, 4, 3, 3)
    if case == "nonpad":
        inputs.update(past_key=None, past_value=None, nonpad_kv_seqlen=np.array([2], dtype=np.int64))
        opset, attrs["is_causal"] = 24, 1
    if case == "softcap":
        attrs["softcap"] = 3.0
    if case == "qk_output":
        n_out = 4
    if case == "softmax_fp32":
        attrs["softmax_precision"] = 1
    if case == "softmax_fp64":
        attrs["softmax_precision"] = 11
    run(model("Attention", inputs, opset, n_out, **attrs), inputs)
    assert bool(sdpa_calls) == fused
    if case in ("causal",):
        assert sdpa_calls[0].get("is_causal") and sdpa_calls[0].get("attn_mask") is None
    if case == "decode":  # the causal frontier shows every cached key: no mask at all
        assert not sdpa_calls[0].get("is_causal") and sdpa_calls[0].get("attn_mask") is None


def test_attention_torch_direct_keeps_device_and_dtype():
    """The op on torch tensors: outputs stay on the input's device and dtype (bf16 included)."""
    from crossml.ops.registry import OpContext

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    q = torch.randn(2, 8, 3, 16, dtype=torch.bfloat16, device=dev)
    k = torch.randn(2, 2, 3, 16, dtype=torch.bfloat16, device=dev)
    ctx = OpContext(node_name="n", op_type="Attention", opset=24, num_outputs=3, output_types=(None,) * 3,
                    outputs_wanted=(True, True, True))
    nonpad = torch.tensor([5, 4], device=dev)
    pk = torch.randn(2, 2, 2, 16, dtype=torch.bfloat16, device=dev)
    y, pk2, pv2, qk = attn_mod.attention(q, k, k, None, pk, pk, None, is_causal=1, ctx=ctx)
    assert y.dtype == torch.bfloat16 and y.device == q.device and qk is None
    assert pk2.shape == (2, 2, 5, 16)
    y2 = attn_mod.attention(q, k, k, None, None, None, nonpad, is_causal=1, ctx=ctx)[0]
    assert y2.shape == (2, 8, 3, 16) and not torch.isnan(y2).any()


# --------------------------------------------------------------------------------------------
# RotaryEmbedding, LinearAttention, CausalConvWithState, SwiGLU


@pytest.mark.parametrize("dtype", [F32, np.float16, BF16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rot_dim", [0, 4])
@pytest.mark.parametrize("rank", [3, 4])
def test_rotary_embedding(dtype, interleaved, rot_dim, rank):
    tol = {F32: 1e-6, np.float16: 2e-3}.get(dtype, 2e-2)
    b, s, h, d = 2, 5, 3, 8
    x = rand(b, s, h * d, dtype=dtype) if rank == 3 else rand(b, h, s, d, dtype=dtype)
    half = (rot_dim or d) // 2
    cos, sin = rand(12, half, dtype=dtype), rand(12, half, dtype=dtype)
    pos = RNG.integers(0, 12, size=(b, s)).astype(np.int64)
    attrs = {"interleaved": interleaved, "rotary_embedding_dim": rot_dim}
    if rank == 3:
        attrs["num_heads"] = h
    check("RotaryEmbedding", {"X": x, "cos_cache": cos, "sin_cache": sin, "position_ids": pos}, 23,
          rtol=tol, atol=tol, **attrs)
    cos3, sin3 = rand(b, s, half, dtype=dtype), rand(b, s, half, dtype=dtype)
    check("RotaryEmbedding", {"X": x, "cos_cache": cos3, "sin_cache": sin3}, 23, rtol=tol, atol=tol, **attrs)


@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
@pytest.mark.parametrize("heads", [(2, 2), (4, 2), (4, 1)])
@pytest.mark.parametrize("per_dim_decay", [False, True])
def test_linear_attention(rule, heads, per_dim_decay):
    hq, hkv = heads
    b, t, dk, dv = 2, 5, 4, 3
    inputs = {"query": rand(b, t, hq * dk), "key": rand(b, t, hkv * dk) * 0.5, "value": rand(b, t, hkv * dv),
              "past_state": rand(b, hkv, dk, dv),
              "decay": (-np.abs(rand(b, t, hkv * (dk if per_dim_decay else 1)))) if "gated" in rule else None,
              "beta": np.abs(rand(b, t, hkv)) * 0.5 if "delta" in rule else None}
    check("LinearAttention", inputs, 27, n_out=2, rtol=1e-4, atol=1e-4, q_num_heads=hq, kv_num_heads=hkv,
          update_rule=rule)


def test_linear_attention_half_state_types():
    b, t, h, dk, dv = 1, 4, 2, 4, 4
    inputs = {"query": rand(b, t, h * dk, dtype=np.float16), "key": rand(b, t, h * dk, dtype=np.float16),
              "value": rand(b, t, h * dv, dtype=np.float16), "past_state": rand(b, h, dk, dv)}
    m = model("LinearAttention", inputs, 27, 2, q_num_heads=h, kv_num_heads=h, update_rule="linear", scale=0.5)
    got, want = run(m, inputs), reference(m, inputs)
    assert got[0].dtype == np.float16 and got[1].dtype == F32
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.astype(F32), w.astype(F32), rtol=3e-3, atol=3e-3)


@pytest.mark.parametrize("dtype", [F32, np.float16, BF16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("activation", ["none", "silu"])
def test_causal_conv_with_state(dtype, k, activation):
    tol = {F32: 1e-5, np.float16: 3e-3}.get(dtype, 3e-2)
    b, c, length = 2, 3, 2
    inputs = {"input": rand(b, c, length, dtype=dtype), "weight": rand(c, 1, k, dtype=dtype),
              "bias": rand(c, dtype=dtype), "past_state": rand(b, c, k - 1, dtype=dtype)}
    got = check("CausalConvWithState", inputs, 27, n_out=2, rtol=tol, atol=tol, activation=activation)
    assert got[1].shape == (b, c, k - 1)


@pytest.mark.parametrize("dtype", [F32, np.float64, np.float16, BF16], ids=["fp32", "fp64", "fp16", "bf16"])
def test_swiglu(dtype):
    tol = {np.float16: 2e-3, BF16: 2e-2}.get(dtype, 1e-6)
    a, b = rand(3, 7, dtype=dtype), rand(3, 7, dtype=dtype)
    check("SwiGLU", {"A": a, "B": b}, 28, rtol=tol, atol=tol, alpha=1.7)
