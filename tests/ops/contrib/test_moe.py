"""MoE and QMoE (com.microsoft) against onnxruntime CPU.

onnxruntime's float16 CPU MoE is a usable reference only with normalize_routing_weights=1: without it, on the
same data it disagrees with its own float32 kernel by about the output's size (checked in ``test_moe_fp16``),
so float16 is checked against onnxruntime's float32 result on the float16-rounded inputs.
"""

from __future__ import annotations

import os

import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto as TP

if not torch.cuda.is_available():  # before triton's first import: the expert-kernel tests interpret the kernel
    os.environ.setdefault("TRITON_INTERPRET", "1")

import crossml  # noqa: E402
from crossml.ops.contrib.moe import route  # noqa: E402
from tests.ops.contrib._ort import check, run_both, single_node_model  # noqa: E402
from tests.ops.contrib.test_matmul_nbits import pack  # noqa: E402

RNG = np.random.default_rng(5)
MOE_ORDER = ("input", "router_probs", "fc1", "b1", "fc2", "b2", "fc3", "b3")


def _trim(ins: dict) -> dict:
    while list(ins) and ins[list(ins)[-1]] is None:
        ins.pop(list(ins)[-1])
    return ins


def moe_inputs(T=6, H=32, inter=16, E=4, act="swiglu", fusion=1, bias=True, dtype=np.float32, shape3d=False):
    n1 = 2 * inter if act in ("swiglu", "geglu") and fusion else inter
    x = RNG.standard_normal((2, T // 2, H) if shape3d else (T, H)).astype(dtype)
    ins = dict(input=x, router_probs=RNG.standard_normal((T, E)).astype(dtype),
               fc1=(RNG.standard_normal((E, n1, H)) * 0.3).astype(dtype),
               b1=(RNG.standard_normal((E, n1)) * 0.1).astype(dtype) if bias else None,
               fc2=(RNG.standard_normal((E, H, inter)) * 0.3).astype(dtype),
               b2=(RNG.standard_normal((E, H)) * 0.1).astype(dtype) if bias else None)
    return _trim(ins)


@pytest.mark.parametrize("act,attrs", [
    ("swiglu", {}),
    ("swiglu", dict(normalize_routing_weights=1)),
    ("swiglu", dict(activation_alpha=1.702, activation_beta=1.0, swiglu_limit=0.5, normalize_routing_weights=1)),
    ("relu", {}),
    ("gelu", {}),
    ("silu", dict(normalize_routing_weights=1)),
    ("identity", {}),
])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_moe_matches_onnxruntime(act, attrs, k):
    check("MoE", moe_inputs(act=act), [("out", TP.FLOAT)], atol=2e-5, rtol=1e-5, k=k, activation_type=act,
          swiglu_fusion=1, **attrs)


@pytest.mark.parametrize("case", ["no_bias", "3d", "one_token", "many_tokens"])
def test_moe_shapes(case):
    ins = {"no_bias": lambda: moe_inputs(bias=False), "3d": lambda: moe_inputs(shape3d=True),
           "one_token": lambda: moe_inputs(T=1, E=8), "many_tokens": lambda: moe_inputs(T=40, E=8)}[case]()
    check("MoE", ins, [("out", TP.FLOAT)], atol=2e-5, rtol=1e-5, k=2, activation_type="swiglu", swiglu_fusion=1,
          normalize_routing_weights=1)


def _moe_reference(ins: dict, k: int, normalize: bool, fusion: int, alpha=1.0, beta=0.0, limit=np.inf,
                   act="swiglu") -> np.ndarray:
    """float64 numpy MoE with swiglu or geglu (transformers' gelu_pytorch_tanh(gate) * up); fc3 for fusion 0."""
    x = ins["input"].astype(np.float64).reshape(-1, ins["input"].shape[-1])
    r = ins["router_probs"].astype(np.float64)
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        p = np.exp(r[t] - r[t].max())
        p /= p.sum()
        idx = np.argsort(-p, kind="stable")[:k]
        w = p[idx] / (p[idx].sum() if normalize else 1.0)
        for e, we in zip(idx, w):
            h = ins["fc1"][e].astype(np.float64) @ x[t] + ins["b1"][e]
            if fusion == 1:
                g, lin = h[0::2], h[1::2]
            elif fusion == 2:
                g, lin = np.split(h, 2)
            else:
                g, lin = h, ins["fc3"][e].astype(np.float64) @ x[t] + ins["b3"][e]
            if act == "geglu":
                a = 0.5 * g * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (g + 0.044715 * g ** 3))) * lin
            else:
                g = np.minimum(g, limit)
                lin = np.clip(lin, -limit, limit)
                a = g / (1.0 + np.exp(-alpha * g)) * (lin + beta)
            out[t] += we * (ins["fc2"][e].astype(np.float64) @ a + ins["b2"][e])
    return out.reshape(ins["input"].shape)


@pytest.mark.parametrize("fusion", [0, 2])
def test_moe_swiglu_layouts_onnxruntime_cpu_refuses(fusion):
    """onnxruntime's CPU MoE takes only interleaved swiglu; the concatenated (2) and fc3 (0) layouts are checked
    against a float64 reference, and against the interleaved layout of the same weights."""
    import crossml

    ins = moe_inputs(fusion=fusion)
    inter = ins["fc2"].shape[2]
    if fusion == 0:
        ins.update(fc3=(RNG.standard_normal((4, inter, 32)) * 0.3).astype(np.float32),
                   b3=(RNG.standard_normal((4, inter)) * 0.1).astype(np.float32))
    attrs = dict(k=2, activation_type="swiglu", swiglu_fusion=fusion, normalize_routing_weights=1,
                 activation_alpha=1.702, activation_beta=1.0, swiglu_limit=1.5)
    model, feeds = single_node_model("MoE", ins, [("out", TP.FLOAT)], **attrs)
    got = crossml.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    want = _moe_reference(ins, 2, True, fusion, alpha=1.702, beta=1.0, limit=1.5)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
    # the same experts with g and l interleaved into fc1 go through onnxruntime
    if fusion == 2:
        g, lin = np.split(ins["fc1"], 2, axis=1)
        bg, bl = np.split(ins["b1"], 2, axis=1)
    else:
        g, lin, bg, bl = ins["fc1"], ins["fc3"], ins["b1"], ins["b3"]
    inter_ins = dict(ins, fc1=np.stack([g, lin], axis=2).reshape(4, 2 * inter, 32),
                     b1=np.stack([bg, bl], axis=2).reshape(4, 2 * inter), fc3=None, b3=None)
    check("MoE", _trim(inter_ins), [("out", TP.FLOAT)], atol=2e-5, rtol=1e-5, **dict(attrs, swiglu_fusion=1))
    np.testing.assert_allclose(got, _moe_reference(_trim(inter_ins), 2, True, 1, 1.702, 1.0, 1.5), atol=1e-5)


@pytest.mark.parametrize("fusion", [0, 1, 2])
@pytest.mark.parametrize("k", [1, 2])
def test_moe_geglu_matches_the_reference(fusion, k):
    """geglu (Gemma 4's experts: gelu_tanh(gate) * up, gate and up interleaved in fc1 as the builder writes them, or
    concatenated, or fc3), which onnxruntime 1.31's MoE refuses, against the float64 reference."""
    import crossml

    ins = moe_inputs(act="geglu", fusion=fusion)
    inter = ins["fc2"].shape[2]
    if fusion == 0:
        ins.update(fc3=(RNG.standard_normal((4, inter, 32)) * 0.3).astype(np.float32),
                   b3=(RNG.standard_normal((4, inter)) * 0.1).astype(np.float32))
    model, feeds = single_node_model("MoE", ins, [("out", TP.FLOAT)], k=k, activation_type="geglu",
                                     swiglu_fusion=fusion, normalize_routing_weights=1)
    with pytest.raises(Exception, match="geglu"):  # the reference: onnxruntime refuses the activation
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = crossml.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    want = _moe_reference(ins, k, True, fusion, act="geglu")
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
    swiglu = crossml.InferenceSession(single_node_model("MoE", ins, [("out", TP.FLOAT)], k=k, activation_type="swiglu",
                                                        swiglu_fusion=fusion, normalize_routing_weights=1)[0]
                                      .SerializeToString()).run(None, feeds)[0]
    assert np.abs(swiglu - got).max() > 1e-2  # the gate's activation matters on these inputs


def test_qmoe_geglu_equals_moe_on_the_dequantized_weights():
    """QMoE with geglu (the builder's int4 Gemma 4 experts) gives MoE's geglu result on the weights its 4-bit blocks
    stand for (q - 8) * scale (dequantized here, in numpy)."""
    import crossml

    E, H, inter, bs, T = 4, 64, 32, 32, 5

    def weights(N, K):
        q = RNG.integers(0, 16, size=(E, N, K))
        scales = (RNG.random((E, N, K // bs)) * 0.05 + 0.01).astype(np.float32)
        return pack(q, 4), scales, ((q - 8) * np.repeat(scales, bs, axis=2)).astype(np.float32)

    w1, s1, f1 = weights(2 * inter, H)
    w2, s2, f2 = weights(H, inter)
    x = RNG.standard_normal((T, H)).astype(np.float32)
    r = RNG.standard_normal((T, E)).astype(np.float32)
    b1 = (RNG.standard_normal((E, 2 * inter)) * 0.1).astype(np.float32)
    b2 = (RNG.standard_normal((E, H)) * 0.1).astype(np.float32)
    attrs = dict(k=2, activation_type="geglu", swiglu_fusion=1)
    q_model, q_feeds = single_node_model("QMoE", dict(input=x, router_probs=r, fc1=w1, s1=s1, b1=b1, fc2=w2, s2=s2,
                                                      b2=b2), [("out", TP.FLOAT)], expert_weight_bits=4,
                                         block_size=bs, **attrs)
    got = crossml.InferenceSession(q_model.SerializeToString()).run(None, q_feeds)[0]
    f_ins = dict(input=x, router_probs=r, fc1=f1, b1=b1, fc2=f2, b2=b2)
    f_model, f_feeds = single_node_model("MoE", f_ins, [("out", TP.FLOAT)], normalize_routing_weights=1, **attrs)
    want = crossml.InferenceSession(f_model.SerializeToString()).run(None, f_feeds)[0]
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(got, _moe_reference(f_ins, 2, True, 1, act="geglu"), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("normalize", [0, 1])
def test_moe_fp16(normalize):
    """float16 against onnxruntime's float32 kernel on the same (float16) values, and against its float16 kernel
    where that agrees with its float32 one: with normalized routing weights, and without them since onnxruntime
    1.32 (before, that kernel was off by about the output's own size)."""
    import crossml

    ins = moe_inputs(dtype=np.float16)
    attrs = dict(k=2, activation_type="swiglu", swiglu_fusion=1, normalize_routing_weights=normalize)
    model16, feeds16 = single_node_model("MoE", ins, [("out", TP.FLOAT16)], **attrs)
    got = crossml.InferenceSession(model16.SerializeToString()).run(None, feeds16)[0]
    assert got.dtype == np.float16
    ins32 = {n: v.astype(np.float32) for n, v in ins.items()}
    model32, feeds32 = single_node_model("MoE", ins32, [("out", TP.FLOAT)], **attrs)
    ref32 = ort.InferenceSession(model32.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds32)[0]
    np.testing.assert_allclose(got.astype(np.float32), ref32, atol=2e-2, rtol=1e-2)
    ref16 = ort.InferenceSession(model16.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds16)[0]
    off = np.abs(ref16.astype(np.float32) - ref32).max()
    if off <= 2e-2 + 1e-2 * np.abs(ref32).max():
        np.testing.assert_allclose(got.astype(np.float32), ref16.astype(np.float32), atol=2e-2, rtol=1e-2)
    else:  # why onnxruntime's float16 kernel is not the reference here (onnxruntime before 1.32)
        assert not normalize and off > np.abs(ref32).max() / 4


def test_route_ties_go_to_the_higher_expert():
    experts, weights = route(torch.zeros(2, 6), 3, False)
    assert experts.tolist() == [[5, 4, 3], [5, 4, 3]]
    assert torch.allclose(weights, torch.full((2, 3), 1 / 6))
    # equal logits through onnxruntime: the same experts (their weights differ, so the output tells)
    ins = moe_inputs(T=2, E=6)
    ins["router_probs"] = np.zeros((2, 6), np.float32)
    ins["fc1"][3:] *= 3.0
    check("MoE", ins, [("out", TP.FLOAT)], atol=2e-5, rtol=1e-5, k=3, activation_type="swiglu", swiglu_fusion=1)


# ---------------------------------------------------------------------------------------------------- QMoE


def quantized(E, N, K, bits, block_size, zero_points, dtype=np.float32):
    q = RNG.integers(0, 1 << bits, size=(E, N, K))
    blocks = K // block_size if block_size else 0
    scales = (RNG.random((E, N, blocks) if block_size else (E, N)) * 0.05 + 0.01).astype(dtype)
    zp = None
    if zero_points:
        per = 8 // bits
        if block_size:
            zp = pack(RNG.integers(0, 1 << bits, size=(E, N, -(-blocks // per) * per)), bits)
        else:
            zp = pack(RNG.integers(0, 1 << bits, size=(E, -(-N // per) * per)), bits)
    return pack(q, bits), scales, zp


def qmoe_inputs(T=5, H=64, inter=32, E=4, bits=4, block_size=32, zero_points=False, act="swiglu", bias=True,
                router_weights=False, dtype=np.float32):
    n1 = 2 * inter if act == "swiglu" else inter
    w1, s1, z1 = quantized(E, n1, H, bits, block_size, zero_points, dtype)
    w2, s2, z2 = quantized(E, H, inter, bits, block_size, zero_points, dtype)
    ins = dict(input=RNG.standard_normal((T, H)).astype(dtype), router_probs=RNG.standard_normal((T, E)).astype(dtype),
               fc1=w1, s1=s1, b1=(RNG.standard_normal((E, n1)) * 0.1).astype(dtype) if bias else None,
               fc2=w2, s2=s2, b2=(RNG.standard_normal((E, H)) * 0.1).astype(dtype) if bias else None,
               fc3=None, s3=None, b3=None, z1=z1, z2=z2, z3=None,
               rw=RNG.random((T, E)).astype(dtype) if router_weights else None)
    return _trim(ins)


QMOE_CASES = [
    dict(),
    dict(bits=8),
    dict(block_size=0),
    dict(block_size=0, bits=8),
    dict(zero_points=True),
    dict(zero_points=True, bits=8),
    dict(zero_points=True, block_size=0),
    dict(block_size=16),
    dict(block_size=16, accuracy_level=4),
    dict(accuracy_level=4, zero_points=True),
    dict(router_weights=True),
    dict(router_weights=True, normalize_routing_weights=1),
    dict(act="silu", normalize_routing_weights=0),
    dict(bias=False, T=1),
    dict(T=24, E=8, k=3),
]


@pytest.mark.parametrize("case", QMOE_CASES, ids=[",".join(f"{k}={v}" for k, v in c.items()) or "int4" for c in QMOE_CASES])
def test_qmoe_matches_onnxruntime(case):
    case = dict(case)
    attrs = {n: case.pop(n) for n in ("accuracy_level", "normalize_routing_weights", "k") if n in case}
    ins = qmoe_inputs(**case)
    bits, bs, act = case.get("bits", 4), case.get("block_size", 32), case.get("act", "swiglu")
    if bs:
        attrs["block_size"] = bs
    scale = float(np.abs(run_both(*single_node_model(
        "QMoE", ins, [("out", TP.FLOAT)], expert_weight_bits=bits, activation_type=act,
        swiglu_fusion=1 if act == "swiglu" else 0, **{"k": 2, **attrs}))[0][0]).max())
    check("QMoE", ins, [("out", TP.FLOAT)], atol=2e-6 * max(scale, 1.0), rtol=1e-5, expert_weight_bits=bits,
          activation_type=act, swiglu_fusion=1 if act == "swiglu" else 0, **{"k": 2, **attrs})


def test_qmoe_fp16_matches_onnxruntime():
    ins = qmoe_inputs(dtype=np.float16)
    check("QMoE", ins, [("out", TP.FLOAT16)], atol=2e-2, rtol=1e-2, expert_weight_bits=4, block_size=32, k=2,
          activation_type="swiglu", swiglu_fusion=1)


# ---------------------------------------------------------------------------------------------------- errors


def _error(op_type, ins, **attrs) -> str:
    import crossml

    model, feeds = single_node_model(op_type, ins, [("out", TP.FLOAT)], **attrs)
    with pytest.raises(Exception) as info:
        crossml.InferenceSession(model.SerializeToString()).run(None, feeds)
    return str(info.value)


def test_moe_errors_name_the_input_and_the_fix():
    base = dict(k=2, activation_type="swiglu", swiglu_fusion=1)
    assert "use_sparse_mixer=1" in _error("MoE", moe_inputs(), use_sparse_mixer=1, **base)
    assert "activation_type 'tanh'" in _error("MoE", moe_inputs(act="relu"), k=2, activation_type="tanh")
    assert "k=5 must be in 1 .. num_experts (4)" in _error("MoE", moe_inputs(), **dict(base, k=5))
    bad = moe_inputs()
    bad["router_probs"] = bad["router_probs"][:, :3]
    assert "router_probs has 3 experts but fc1_experts_weights has 4" in _error("MoE", bad, **base)
    assert "needs fc3_experts_weights" in _error("MoE", moe_inputs(fusion=0), **dict(base, swiglu_fusion=0))
    assert "activation_alpha=1.702 is not defined for activation_type 'geglu'" in _error(
        "MoE", moe_inputs(act="geglu"), **dict(base, activation_type="geglu", activation_alpha=1.702))
    assert "quant_type 'fp4' is not supported" in _error("QMoE", qmoe_inputs(), quant_type="fp4", block_size=32, **base)
    assert "fc1_scales (4, 64, 2) must be [4, 64, 4]" in _error("QMoE", qmoe_inputs(), block_size=16, **base)
    prepacked = qmoe_inputs()  # onnxruntime CUDA's layout: [E, K, N / 2]
    prepacked["fc2"] = np.ascontiguousarray(np.zeros((4, 32, 32), np.uint8))
    assert "qmoe_weights_prepacked=0" in _error("QMoE", prepacked, block_size=32, **base)
    assert "weight bits 2 are not supported" in _error("QMoE", qmoe_inputs(), expert_weight_bits=2, block_size=32,
                                                       **base)


@pytest.mark.parametrize("mode", ["gather", "dense"])
@pytest.mark.parametrize("op_type", ["MoE", "QMoE"])
def test_device_modes_match_onnxruntime(mode, op_type, monkeypatch):
    """The two ways a GPU runs the experts without reading the routing on the host (the chosen experts' weights
    per (token, slot); every expert over every row, weighted zero where not chosen), forced on the CPU."""
    from crossml.ops.contrib import moe as moe_module

    monkeypatch.setattr(moe_module, "expert_mode", lambda *args: mode)
    T = 2 if mode == "gather" else 9
    attrs = dict(k=2, activation_type="swiglu", swiglu_fusion=1, normalize_routing_weights=1, swiglu_limit=2.0,
                 activation_alpha=1.702, activation_beta=1.0)
    if op_type == "MoE":
        check("MoE", moe_inputs(T=T, E=4), [("out", TP.FLOAT)], atol=2e-5, rtol=1e-5, **attrs)
    else:
        check("QMoE", qmoe_inputs(T=T, E=4, zero_points=True), [("out", TP.FLOAT)], atol=2e-5, rtol=1e-5,
              expert_weight_bits=4, block_size=32, **attrs)


@pytest.mark.parametrize("case", ["MoE", "MoE_fc3", "QMoE_zero_points", "QMoE_int8_per_row"])
def test_gather_mode_on_the_expert_kernel_matches_onnxruntime(case, monkeypatch):
    """"gather" mode through the Triton expert GEMV (what a GPU decode step runs), forced on CPU tensors in Triton's
    interpreter: onnxruntime's result (fc3: the float64 reference), and every projection went through the kernel."""
    pytest.importorskip("triton")
    from crossml.kernels._launch import INTERPRET

    if not INTERPRET:
        pytest.skip("Triton is not interpreting (a GPU is present): tests/gpu/test_moe_gpu.py runs the kernel there")
    import crossml
    from crossml.kernels import moe as moe_kernels
    from crossml.ops.contrib import moe as moe_module
    from tests.kernels._common import record_calls

    monkeypatch.setattr(moe_module, "expert_mode", lambda *args: "gather")
    monkeypatch.setattr(moe_module, "use_expert_kernel", lambda device: True)
    calls = record_calls(monkeypatch, moe_kernels, "expert_gemv")
    attrs = dict(k=2, activation_type="swiglu", swiglu_fusion=1, normalize_routing_weights=1, swiglu_limit=2.0,
                 activation_alpha=1.702, activation_beta=1.0)
    if case == "MoE":
        check("MoE", moe_inputs(T=2, E=4), [("out", TP.FLOAT)], atol=2e-5, rtol=1e-5, **attrs)
    elif case == "MoE_fc3":
        ins = moe_inputs(T=3, E=6, fusion=0)
        ins.update(fc3=(RNG.standard_normal((6, 16, 32)) * 0.3).astype(np.float32),
                   b3=(RNG.standard_normal((6, 16)) * 0.1).astype(np.float32))
        model, feeds = single_node_model("MoE", ins, [("out", TP.FLOAT)], **dict(attrs, swiglu_fusion=0))
        got = crossml.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
        want = _moe_reference(ins, 2, True, 0, alpha=1.702, beta=1.0, limit=2.0)
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
    elif case == "QMoE_zero_points":
        check("QMoE", qmoe_inputs(T=2, E=4, zero_points=True), [("out", TP.FLOAT)], atol=2e-5, rtol=1e-5,
              expert_weight_bits=4, block_size=32, **attrs)
    else:
        ins = qmoe_inputs(T=2, E=4, bits=8, block_size=0, zero_points=True)
        scale = float(np.abs(run_both(*single_node_model("QMoE", ins, [("out", TP.FLOAT)], expert_weight_bits=8,
                                                          **attrs))[0][0]).max())
        check("QMoE", ins, [("out", TP.FLOAT)], atol=2e-6 * max(scale, 1.0), rtol=1e-5, expert_weight_bits=8, **attrs)
    # fc1 and fc2 per crossml run (fc1, fc3 and fc2 with fc3; the int8 case runs crossml twice)
    assert len(calls) == {"MoE": 2, "MoE_fc3": 3, "QMoE_zero_points": 2, "QMoE_int8_per_row": 4}[case], calls


@pytest.mark.parametrize("dtype,tp", [(np.float32, TP.FLOAT), (np.float16, TP.FLOAT16)])
@pytest.mark.parametrize("shape", [(2, 3, 8), (5, 16), (7,)])
def test_gated_add_matches_onnxruntime(dtype, tp, shape):
    rng = np.random.default_rng(3)
    inputs = {"X": rng.standard_normal(shape).astype(dtype), "Y": rng.standard_normal(shape).astype(dtype),
              "gate": rng.random((*shape[:-1], 1)).astype(dtype)}
    model, feeds = single_node_model("GatedAdd", inputs, [("out", tp)])
    ref, got = run_both(model, feeds)
    np.testing.assert_array_equal(got[0], ref[0])  # the product rounded to the type, then the sum: bit for bit


def test_gated_add_refuses_a_gate_of_another_shape():
    x = np.ones((2, 4), np.float32)
    model, feeds = single_node_model("GatedAdd", {"X": x, "Y": x, "gate": np.ones((2, 4), np.float32)},
                                     [("out", TP.FLOAT)])
    with pytest.raises(Exception, match=r"GatedAdd: .*gate \(2, 4\).*\(2, 1\)"):
        crossml.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
