"""The GeGLU rule (Gelu(approximate="tanh"), Mul => com.crossml SiluMul(activation="gelu_tanh"); Gemma's MLPs as the
builder writes them): what it fuses, what it refuses (with a reason), the rules after it carrying the activation (the
gate/up merge, the 4-bit down projection's SiluMulMatMulNBits; the GEMV's SiLU-only rules leave it), and the fused
models' values: the unfused nodes' bit for bit on the CPU, within fp16 rounding on a GPU."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

import crossml
from crossml.graph.passes import GraphView, apply_rules
from crossml.graph.passes.gate_up import GATE_UP, GATE_UP_NBITS
from crossml.graph.passes.matmul_norm import MATMUL_SILU_MUL, SILU_MUL_NBITS, SILU_MUL_NORM
from crossml.graph.passes.swiglu import GEGLU, SWIGLU
from crossml.runtime.session import fusion_rules
from tests.graph._rules import contrib_model, fold_copy, rule_reason, unfused_session
from tests.ops.contrib.test_matmul_nbits import quantized_weight

RNG = np.random.default_rng(5)
HIDDEN, INTER = 64, 96


def geglu_mlp(*, nbits: bool = False, approximate: str = "tanh", up_first: bool = False, twice: bool = False,
              up_shape: list | None = None, dtype: int = T.FLOAT) -> onnx.ModelProto:
    """x -> gate, up products (MatMul, or 4-bit MatMulNBits of block 32) -> Gelu(gate) * up -> down product -> y.
    ``twice``: gelu(gate) is a graph output too; ``up_shape``: up is a graph input of that shape instead."""
    np_dtype = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    inits, nodes = [], []
    inputs = [h.make_tensor_value_info("x", dtype, ["batch", "seq", HIDDEN])]
    for name, k, n in (("gate", HIDDEN, INTER), ("up", HIDDEN, INTER), ("down", INTER, HIDDEN)):
        src = "x" if name != "down" else "a"
        if name == "up" and up_shape is not None:
            inputs.append(h.make_tensor_value_info("up", dtype, up_shape))
            continue
        if nbits:
            B, scales, _ = quantized_weight(n, k, 4, 32, None)
            inits += [numpy_helper.from_array(B, f"{name}_B"),
                      numpy_helper.from_array(scales.astype(np_dtype), f"{name}_scales")]
            nodes.append(h.make_node("MatMulNBits", [src, f"{name}_B", f"{name}_scales"], [name], name=f"{name}_proj",
                                     domain="com.microsoft", K=k, N=n, bits=4, block_size=32))
        else:
            inits.append(numpy_helper.from_array((RNG.standard_normal((k, n)) * 0.3).astype(np_dtype), f"W{name}"))
            nodes.append(h.make_node("MatMul", [src, f"W{name}"], [name], name=f"{name}_proj"))
    gelu = h.make_node("Gelu", ["gate"], ["g"], name="act_fn/FastGelu", approximate=approximate)
    nodes.insert(-1, gelu)
    nodes.insert(-1, h.make_node("Mul", ["up", "g"] if up_first else ["g", "up"], ["a"], name="mlp/Mul"))
    outputs = [h.make_tensor_value_info("down", dtype, None)]
    if twice:
        outputs.append(h.make_tensor_value_info("g", dtype, None))
    m = contrib_model(nodes, inputs, outputs, inits)
    m.opset_import[0].version = max(m.opset_import[0].version, 20)  # Gelu is ai.onnx opset 20
    return m


def _feeds(m: onnx.ModelProto, dtype=np.float32) -> dict[str, np.ndarray]:
    return {vi.name: RNG.standard_normal([d.dim_value or 3 for d in vi.type.tensor_type.shape.dim]).astype(dtype)
            for vi in m.graph.input}


@pytest.mark.parametrize("up_first", [False, True])
def test_fuses_with_the_nodes_values(up_first: bool) -> None:
    m = geglu_mlp(up_first=up_first)
    fused, counts = fold_copy(m, GEGLU)
    assert counts == {"FuseGeGLU": 1}
    node = next(n for n in fused.graph.node if n.op_type == "SiluMul")
    assert node.domain == "com.crossml" and list(node.input) == ["gate", "up"] and list(node.output) == ["a"]
    assert {a.name: h.get_attribute_value(a) for a in node.attribute} == {"activation": b"gelu_tanh"}
    assert "Gelu" not in [n.op_type for n in fused.graph.node]
    f = _feeds(m)
    np.testing.assert_array_equal(unfused_session(fused).run(None, f)[0], unfused_session(m).run(None, f)[0])


def test_refuses_with_a_reason() -> None:
    assert fold_copy(geglu_mlp(approximate="none"), GEGLU)[1] == {}  # the erf form is not matched
    assert "used elsewhere" in rule_reason(GEGLU, geglu_mlp(twice=True), "Gelu")
    assert "differ in shape" in rule_reason(GEGLU, geglu_mlp(up_shape=[2, 1, INTER]), "Gelu")


def test_the_merge_carries_the_activation_and_the_gemv_rules_leave_it() -> None:
    m = geglu_mlp()
    fused = onnx.ModelProto()
    fused.CopyFrom(m)
    assert apply_rules(fused, [GEGLU, GATE_UP, MATMUL_SILU_MUL, SILU_MUL_NORM]) == {"FuseGeGLU": 1, "MergeGateUp": 1}
    silu = next(n for n in fused.graph.node if n.op_type == "SiluMul")
    assert len(silu.input) == 1 and h.get_attribute_value(silu.attribute[0]) == b"gelu_tanh"
    view = GraphView.of(fused.graph)
    assert MATMUL_SILU_MUL.match(view, silu) is None  # the GEMV stores SiLU's gate only
    f = _feeds(m)
    np.testing.assert_allclose(unfused_session(fused).run(None, f)[0], unfused_session(m).run(None, f)[0],
                               rtol=1e-5, atol=1e-5)


def test_four_bit_chain_folds_to_two_nodes_with_the_nodes_values() -> None:
    """Gate and up MatMulNBits merged, the gate in the down projection's SiluMulMatMulNBits (activation carried):
    on the CPU each column computed alone and the gate by torch's ops, so the values are the nodes' bit for bit."""
    m = geglu_mlp(nbits=True)
    fused = onnx.ModelProto()
    fused.CopyFrom(m)
    assert apply_rules(fused, [SWIGLU, GEGLU, GATE_UP_NBITS, SILU_MUL_NBITS]) == {
        "FuseGeGLU": 1, "MergeGateUp": 1, "SiluMulMatMulNBits": 1}
    merged, down = fused.graph.node
    assert merged.op_type == "MatMulNBits" and {a.name: h.get_attribute_value(a) for a in merged.attribute}["N"] == 2 * INTER
    assert down.op_type == "SiluMulMatMulNBits"
    assert {a.name: h.get_attribute_value(a) for a in down.attribute}["activation"] == b"gelu_tanh"
    for rows in (1, 4):
        f = {"x": RNG.standard_normal((1, rows, HIDDEN)).astype(np.float32)}
        np.testing.assert_array_equal(unfused_session(fused).run(None, f)[0], unfused_session(m).run(None, f)[0])
    # and the CPU session's own rules give the same
    f = {"x": RNG.standard_normal((1, 2, HIDDEN)).astype(np.float32)}
    sess = crossml.InferenceSession(m, providers=["CPUExecutionProvider"])
    assert "SiluMulMatMulNBits" in [n.op_type for n in sess._model.graph.node]
    np.testing.assert_array_equal(sess.run(None, f)[0], unfused_session(m).run(None, f)[0])


def test_registered_after_swiglu_and_before_the_merges() -> None:
    for device in ("cpu", "cuda"):
        rules = fusion_rules(None, torch.device(device))
        merge = GATE_UP if device == "cuda" else GATE_UP_NBITS
        assert rules.index(SWIGLU) < rules.index(GEGLU) < rules.index(merge)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 5], ids=["decode", "prompt"])
@pytest.mark.parametrize("nbits", [False, True], ids=["fp16", "int4"])
def test_gpu_session_matches_unfused(rows: int, nbits: bool) -> None:
    """fp16 on the GPU: the fused session (merged gate/up product, the GeGLU kernel, for 4 bits in the down
    projection's node) within fp16 rounding of the session without graph fusion."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU: torch sees none on this machine")
    m = geglu_mlp(nbits=nbits, dtype=T.FLOAT16)
    f = {"x": (RNG.standard_normal((1, rows, HIDDEN)) * 0.5).astype(np.float16)}
    sess = crossml.InferenceSession(m, providers=["GPUExecutionProvider"])
    ops = [n.op_type for n in sess._model.graph.node]
    assert "Gelu" not in ops and ("SiluMulMatMulNBits" in ops if nbits else "SiluMul" in ops)
    (y,), (y0,) = sess.run(None, f), unfused_session(m, "GPUExecutionProvider").run(None, f)
    np.testing.assert_allclose(y.astype(np.float32), y0.astype(np.float32), rtol=2e-2, atol=2e-2)
