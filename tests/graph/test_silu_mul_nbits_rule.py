"""The gate + 4-bit down projection rule (com.crossml SiluMul(gu) feeding a MatMulNBits => com.crossml
SiluMulMatMulNBits): what it fuses, what it refuses (with a reason), and the fused model's results. On the CPU, and
off one row on a GPU, the fused op runs the two ops, so the results are equal bit for bit; at one row on a GPU it
launches the same two kernels (the gate's letting the product launch early), compared with the session without
graph fusion."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

import crossml
from crossml.graph.passes import apply_rules
from crossml.graph.passes.gate_up import GATE_UP_NBITS
from crossml.graph.passes.matmul_norm import SILU_MUL_NBITS, SILU_MUL_NORM
from crossml.graph.passes.swiglu import SWIGLU
from crossml.runtime.session import fusion_rules
from tests.graph._rules import contrib_model, rule_reason, unfused_session
from tests.ops.contrib.test_matmul_nbits import quantized_weight

MS = "com.microsoft"
RNG = np.random.default_rng(11)


def gated_down(*, k: int = 64, n: int = 40, dtype: type = np.float32, h_twice: bool = False, g_idx: bool = False,
               zero_points: bool = False, bias: bool = False, level: int = 0) -> onnx.ModelProto:
    """gu [.., 2k] -> com.crossml SiluMul -> h -> MatMulNBits (k -> n, block 32) -> y."""
    et = T.FLOAT if dtype == np.float32 else T.FLOAT16
    B, scales, zp = quantized_weight(n, k, 4, 32, "packed" if zero_points else None)
    inits = [numpy_helper.from_array(B, "B"), numpy_helper.from_array(scales.astype(dtype), "scales")]
    ins = ["h", "B", "scales", "", "", ""]
    if zero_points:
        inits.append(numpy_helper.from_array(zp, "zp"))
        ins[3] = "zp"
    if g_idx:
        inits.append(numpy_helper.from_array(np.arange(k, dtype=np.int32) // 32, "g_idx"))
        ins[4] = "g_idx"
    if bias:
        inits.append(numpy_helper.from_array(RNG.standard_normal(n).astype(dtype), "bias"))
        ins[5] = "bias"
    while ins[-1] == "":
        ins.pop()
    nodes = [h.make_node("SiluMul", ["gu"], ["h"], name="gate", domain="com.crossml"),
             h.make_node("MatMulNBits", ins, ["y"], name="down", domain=MS, K=k, N=n, bits=4, block_size=32,
                         **({"accuracy_level": level} if level else {}))]
    inputs = [h.make_tensor_value_info("gu", et, ["batch", "seq", 2 * k])]
    outputs = [h.make_tensor_value_info("y", et, None)]
    if h_twice:
        nodes.append(h.make_node("Relu", ["h"], ["rh"], name="other"))
        outputs.append(h.make_tensor_value_info("rh", et, None))
    return contrib_model(nodes, inputs, outputs, inits, "com.crossml")


@pytest.mark.parametrize("kw", [{}, {"zero_points": True, "bias": True}, {"level": 4}, {"level": 4, "zero_points": True}],
                         ids=["plain", "zero-points-bias", "int8", "int8-zero-points"])
@pytest.mark.parametrize("rows", [1, 3, 12])
def test_fused_model_equals_unfused(kw: dict, rows: int) -> None:
    """The fused node's values are the two ops' bit for bit on the CPU; at accuracy level 4, decode-sized rows run the
    SiluMul kernel and the int8 kernel from the fused node once the first run has kept the weight's arrays (the
    second run)."""
    m = gated_down(**kw)
    fused = onnx.ModelProto()
    fused.CopyFrom(m)
    assert apply_rules(fused, [SILU_MUL_NBITS]) == {"SiluMulMatMulNBits": 1}
    (node,) = fused.graph.node
    assert node.op_type == "SiluMulMatMulNBits" and node.domain == "com.crossml"
    assert list(node.input[:3]) == ["gu", "B", "scales"] and list(node.output) == ["y"]
    assert {a.name: h.get_attribute_value(a) for a in node.attribute} == {
        "K": 64, "N": 40, "bits": 4, "block_size": 32, **({"accuracy_level": 4} if kw.get("level") else {})}
    sess = crossml.InferenceSession(fused, providers=["CPUExecutionProvider"])
    for _ in range(2):
        f = {"gu": RNG.standard_normal((1, rows, 128)).astype(np.float32)}
        np.testing.assert_array_equal(sess.run(None, f)[0], unfused_session(m).run(None, f)[0])


@pytest.mark.parametrize(("kw", "says"), [({"h_twice": True}, "used elsewhere"), ({"g_idx": True}, "g_idx")])
def test_refuses_with_a_reason_and_leaves_the_graph(kw: dict, says: str) -> None:
    m = gated_down(**kw)
    assert apply_rules(m, [SILU_MUL_NBITS]) == {}
    assert [n.op_type for n in m.graph.node][:2] == ["SiluMul", "MatMulNBits"]
    assert says in rule_reason(SILU_MUL_NBITS, m, "MatMulNBits")


def test_registered_after_the_gate_rules() -> None:
    cpu = fusion_rules(None, torch.device("cpu"))
    assert cpu.index(SILU_MUL_NBITS) > max(cpu.index(SWIGLU), cpu.index(GATE_UP_NBITS))
    assert SILU_MUL_NBITS not in fusion_rules(SimpleNamespace(disable_metacommands=True), torch.device("cuda"))
    rules = fusion_rules(None, torch.device("cuda"))
    assert rules.index(SILU_MUL_NBITS) == rules.index(SILU_MUL_NORM) + 1


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 2, 5], ids=["decode", "decode2", "prompt"])
@pytest.mark.parametrize(("k", "n"), [(128, 2048), (4096, 2048), (4096, 896)], ids=["short-k", "long-k", "narrow"])
def test_gpu_session_matches_unfused(rows: int, k: int, n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """fp16 on the GPU: the fused session's products within fp16 rounding of the session without graph fusion, at
    one row (the early-launching gate and the long-K tiles past K 2048; narrow products on the fp16-pair kernel,
    EARLY_NARROW) and off it (the two ops); replays of the one-row step recorded in a CUDA graph give the eager
    result bit for bit."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU: torch sees none on this machine")
    import crossml.kernels.matmul_nbits as nbits_module

    monkeypatch.setattr(nbits_module, "EARLY_NARROW", True)
    m = gated_down(k=k, n=n, dtype=np.float16, bias=True)
    f = {"gu": (RNG.standard_normal((1, rows, 2 * k)) * 0.5).astype(np.float16)}
    sess = crossml.InferenceSession(m, providers=["GPUExecutionProvider"])
    assert [n.op_type for n in sess._model.graph.node] == ["SiluMulMatMulNBits"]
    plain = unfused_session(m, "GPUExecutionProvider")
    (y,), (y0,) = sess.run(None, f), plain.run(None, f)
    np.testing.assert_allclose(y.astype(np.float32), y0.astype(np.float32), rtol=2e-2, atol=2e-2)
    if rows == 1:
        from crossml.kernels import load
        from crossml.kernels.swiglu import silu_mul_packed

        kernels = load("matmul_nbits")
        gu = torch.from_numpy(f["gu"]).cuda()
        B, scales, bias = (torch.from_numpy(numpy_helper.to_array(t)).cuda() for t in m.graph.initializer)
        step = lambda: kernels.matmul_nbits(silu_mul_packed(gu, early=True), B, scales, None, bias, K=k, N=n,  # noqa: E731
                                            block_size=32, const_w=True, early_input=True)
        eager = step()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step()
        for _ in range(5):
            graph.replay()
            assert torch.equal(out, eager)
