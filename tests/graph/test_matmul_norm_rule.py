"""The product + residual norm rule (MatMul or Linear feeding SkipSimplifiedLayerNormalization's skip input =>
com.crossml MatMulSkipNorm): what it fuses, what it refuses (with a reason), and the fused model's results.
On the CPU the fused op runs the two ops, so the results are equal bit for bit; on a GPU at decode sizes it runs
the GEMV and the add-and-normalize kernel (checked against the unfused kernels in tests/kernels/test_gemv.py),
compared here with the CPU session and with the GPU session without graph fusion."""

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
import crossml.graph.passes.matmul_norm as matmul_norm_module
from crossml.graph.passes import apply_rules
from crossml.graph.passes.linear import RULE as LINEAR
from crossml.graph.passes.matmul_norm import MATMUL_NORM, MATMUL_SILU_MUL, SILU_MUL_NORM
from crossml.runtime.session import fusion_rules
from tests.graph._rules import contrib_model, rule_reason

MS = "com.microsoft"
K, N = 64, 40
RNG = np.random.default_rng(7)


def layer(*, dtype: type = np.float32, bias: bool = False, y_twice: bool = False, stat_used: bool = False,
          norm_bias: bool = False, want_sum: bool = True, gamma_len: int | None = None, k: int = K,
          n: int = N) -> onnx.ModelProto:
    """h -> MatMul (+ Add bias) -> y; SkipSimplifiedLayerNormalization(r, y, gamma) -> (normed, sum)."""
    et = T.FLOAT if dtype == np.float32 else T.FLOAT16
    inits = [numpy_helper.from_array((RNG.standard_normal((k, n)) * 0.1).astype(dtype), "W"),
             numpy_helper.from_array((RNG.random(gamma_len or n) + 0.5).astype(dtype), "gamma")]
    inputs = [h.make_tensor_value_info("h", et, ["batch", "seq", k]),
              h.make_tensor_value_info("r", et, ["batch", "seq", n])]
    outputs = [h.make_tensor_value_info("normed", et, None)]
    nodes = [h.make_node("MatMul", ["h", "W"], ["p" if bias else "y"], name="proj")]
    if bias:
        inits.append(numpy_helper.from_array(RNG.standard_normal(n).astype(dtype), "b"))
        nodes.append(h.make_node("Add", ["p", "b"], ["y"], name="bias"))
    norm_in = ["r", "y", "gamma"]
    if norm_bias:
        inits.append(numpy_helper.from_array(np.ones(n, dtype), "nbias"))
        norm_in.append("nbias")
    nodes.append(h.make_node("SkipSimplifiedLayerNormalization", norm_in,
                             ["normed", "", "inv" if stat_used else "", "sum" if want_sum else ""],
                             name="norm", domain=MS, epsilon=1e-6))
    if want_sum:
        outputs.append(h.make_tensor_value_info("sum", et, None))
    if stat_used:
        outputs.append(h.make_tensor_value_info("inv", T.FLOAT, None))
    if y_twice:
        nodes.append(h.make_node("Relu", ["y"], ["ry"], name="other"))
        outputs.append(h.make_tensor_value_info("ry", et, None))
    return contrib_model(nodes, inputs, outputs, inits)


def _feeds(m: onnx.ModelProto, rows: int = 3, dtype: type = np.float32, k: int = K,
           n: int = N) -> dict[str, np.ndarray]:
    return {"h": RNG.standard_normal((1, rows, k)).astype(dtype), "r": RNG.standard_normal((1, rows, n)).astype(dtype)}


@pytest.mark.parametrize("bias", [False, True], ids=["matmul", "linear"])
@pytest.mark.parametrize("want_sum", [True, False], ids=["sum", "final-norm"])
def test_fused_model_equals_unfused(bias: bool, want_sum: bool) -> None:
    m = layer(bias=bias, want_sum=want_sum)
    f = _feeds(m)
    want = crossml.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, f)
    fused = onnx.ModelProto()
    fused.CopyFrom(m)
    rules = [LINEAR, MATMUL_NORM] if bias else [MATMUL_NORM]
    assert apply_rules(fused, rules)["MatMulSkipNorm"] == 1
    (node,) = fused.graph.node
    assert node.op_type == "MatMulSkipNorm" and node.domain == "com.crossml"
    assert list(node.input) == ["h", "W", "b" if bias else "", "r", "gamma"]
    assert list(node.output) == (["normed", "sum"] if want_sum else ["normed"])
    got = crossml.InferenceSession(fused, providers=["CPUExecutionProvider"]).run(None, f)
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(("kw", "says"), [
    ({"y_twice": True}, "used elsewhere"),
    ({"stat_used": True}, "a statistic"),
    ({"norm_bias": True}, "bias input"),
    ({"gamma_len": N + 1}, f"is not a constant of N={N} values"),
])
def test_refuses_with_a_reason_and_leaves_the_graph(kw: dict, says: str) -> None:
    m = layer(**kw)
    assert says in (rule_reason(MATMUL_NORM, m, "SkipSimplifiedLayerNormalization") or "")
    before = m.SerializeToString()
    assert apply_rules(m, [MATMUL_NORM]) == {}
    assert m.SerializeToString() == before


@pytest.mark.parametrize("which", ["MatMulSkipNorm", "MatMulSiluMul"])
def test_weight_fed_at_run_time_is_not_fused(which: str) -> None:
    """The product's weight an input of the graph, not a constant: neither rule takes it."""
    m, rule, at = ((layer(), MATMUL_NORM, "SkipSimplifiedLayerNormalization") if which == "MatMulSkipNorm"
                   else (mlp_layer(), MATMUL_SILU_MUL, "SiluMul"))
    w = m.graph.initializer[0]
    m.graph.input.append(h.make_tensor_value_info(w.name, T.FLOAT, list(w.dims)))
    del m.graph.initializer[0]
    assert "not a 2-D constant" in rule_reason(rule, m, at)


def test_registered_on_gpu_sessions_without_disable_metacommands() -> None:
    assert MATMUL_NORM not in fusion_rules(None, torch.device("cpu"))
    assert MATMUL_NORM not in fusion_rules(SimpleNamespace(disable_metacommands=True), torch.device("cuda"))
    assert SILU_MUL_NORM not in fusion_rules(SimpleNamespace(disable_metacommands=True), torch.device("cuda"))
    assert MATMUL_SILU_MUL not in fusion_rules(SimpleNamespace(disable_metacommands=True), torch.device("cuda"))
    for gpu in (None, SimpleNamespace(disable_metacommands=False)):
        rules = fusion_rules(gpu, torch.device("cuda"))
        assert rules.index(SILU_MUL_NORM) == rules.index(MATMUL_SILU_MUL) + 1 == rules.index(MATMUL_NORM) + 2 \
            > rules.index(LINEAR) + 2


@pytest.mark.gpu
@pytest.mark.parametrize("bias", [False, True], ids=["matmul", "linear"])
@pytest.mark.parametrize("rows", [1, 3, 7], ids=["decode", "decode3", "prompt"])
def test_gpu_session_fuses_and_matches_unfused(bias: bool, rows: int) -> None:
    """fp16 on the GPU: the fused session (the GEMV + add-and-normalize kernels at 1 and 3 rows, the two ops at 7)
    against the same session without graph fusion (the MatMul (+ Add) and RMSNorm kernels): sums and normalized
    values within fp16 rounding (the partial sums are added in another order; the unfused Add rounds the product
    before adding the bias); and near the CPU session. K and N of a GEMV-eligible product."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU: torch sees none on this machine")
    m = layer(dtype=np.float16, bias=bias, k=320, n=256)
    f = _feeds(m, rows, np.float16, 320, 256)
    sess = crossml.InferenceSession(m, providers=["GPUExecutionProvider"])
    assert [n.op_type for n in sess._model.graph.node] == ["MatMulSkipNorm"]
    so = crossml.SessionOptions()
    so.add_session_config_entry("ep.dml.disable_graph_fusion", "1")
    plain = crossml.InferenceSession(m, so, providers=["GPUExecutionProvider"])
    assert "MatMulSkipNorm" not in [n.op_type for n in plain._model.graph.node]
    (normed, total), (normed0, total0) = sess.run(None, f), plain.run(None, f)
    tol = 1e-2 if bias else 2e-3  # the unfused Add rounds the product to fp16 before adding the bias
    np.testing.assert_allclose(total.astype(np.float32), total0.astype(np.float32), rtol=tol, atol=tol)
    np.testing.assert_allclose(normed.astype(np.float32), normed0.astype(np.float32), rtol=tol, atol=tol)
    cpu = crossml.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, f)
    np.testing.assert_allclose(normed.astype(np.float32), cpu[0].astype(np.float32), rtol=1e-2, atol=1e-2)


def _gated_tail(dtype: type, k: int, n: int) -> tuple[list, list, list, list]:
    """com.crossml SiluMul(gu) -> h -> MatMul(W) -> y; SkipSimplifiedLayerNormalization(r, y, gamma): its nodes, its
    initializers (W [k, n], gamma), the residual input r and the outputs (normed, sum)."""
    et = T.FLOAT if dtype == np.float32 else T.FLOAT16
    inits = [numpy_helper.from_array((RNG.standard_normal((k, n)) * 0.1).astype(dtype), "W"),
             numpy_helper.from_array((RNG.random(n) + 0.5).astype(dtype), "gamma")]
    outputs = [h.make_tensor_value_info("normed", et, None), h.make_tensor_value_info("sum", et, None)]
    nodes = [h.make_node("SiluMul", ["gu"], ["h"], name="gate", domain="com.crossml"),
             h.make_node("MatMul", ["h", "W"], ["y"], name="down"),
             h.make_node("SkipSimplifiedLayerNormalization", ["r", "y", "gamma"], ["normed", "", "", "sum"],
                         name="norm", domain=MS, epsilon=1e-6)]
    return nodes, inits, [h.make_tensor_value_info("r", et, ["batch", "seq", n])], outputs


def _crossml_model(nodes: list, inputs: list, outputs: list, inits: list) -> onnx.ModelProto:
    return contrib_model(nodes, inputs, outputs, inits, "com.crossml")


def gated_layer(*, dtype: type = np.float32, h_twice: bool = False, k: int = K, n: int = N) -> onnx.ModelProto:
    """gu [.., 2k] -> com.crossml SiluMul -> h -> MatMul -> y; SkipSimplifiedLayerNormalization(r, y, gamma)."""
    et = T.FLOAT if dtype == np.float32 else T.FLOAT16
    nodes, inits, inputs, outputs = _gated_tail(dtype, k, n)
    inputs.insert(0, h.make_tensor_value_info("gu", et, ["batch", "seq", 2 * k]))
    if h_twice:
        nodes.append(h.make_node("Relu", ["h"], ["rh"], name="other"))
        outputs.append(h.make_tensor_value_info("rh", et, None))
    return _crossml_model(nodes, inputs, outputs, inits)


def _gated_feeds(rows: int = 3, dtype: type = np.float32, k: int = K, n: int = N) -> dict[str, np.ndarray]:
    return {"gu": RNG.standard_normal((1, rows, 2 * k)).astype(dtype),
            "r": RNG.standard_normal((1, rows, n)).astype(dtype)}


def test_gate_folded_into_the_down_projection_equals_unfused() -> None:
    m = gated_layer()
    f = _gated_feeds()
    want = crossml.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, f)
    fused = onnx.ModelProto()
    fused.CopyFrom(m)
    assert apply_rules(fused, [MATMUL_NORM, SILU_MUL_NORM]) == {"MatMulSkipNorm": 1, "SiluMulSkipNorm": 1}
    (node,) = fused.graph.node
    assert node.op_type == "MatMulSkipNorm" and list(node.input) == ["gu", "W", "", "r", "gamma"]
    assert {a.name: h.get_attribute_value(a) for a in node.attribute}["silu_mul"] == 1
    got = crossml.InferenceSession(fused, providers=["CPUExecutionProvider"]).run(None, f)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_gate_used_elsewhere_is_not_folded() -> None:
    m = gated_layer(h_twice=True)
    assert apply_rules(m, [MATMUL_NORM, SILU_MUL_NORM]) == {"MatMulSkipNorm": 1}
    assert "used elsewhere" in rule_reason(SILU_MUL_NORM, m, "MatMulSkipNorm")


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 4, 6], ids=["decode", "decode4", "prompt"])
@pytest.mark.parametrize("gate_in", ["down", "gate_up"])
def test_gpu_gated_session_matches_unfused(rows: int, gate_in: str) -> None:
    """fp16 on the GPU, the gate computed in the down projection GEMV's loads (a gated layer fed [g | up]) or stored by
    the gate/up product's GEMV (an MLP from its merged product) at 1 and 4 rows, or by the SiluMul op at 6 rows: sums
    and normalized values within fp16 rounding of the session without graph fusion."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU: torch sees none on this machine")
    if gate_in == "down":
        m, f, nodes = gated_layer(dtype=np.float16, k=320, n=256), _gated_feeds(rows, np.float16, 320, 256), \
            ["MatMulSkipNorm"]
    else:
        m, f, nodes = mlp_layer(dtype=np.float16, k=256, i=320, n=256), _mlp_feeds(rows, np.float16, 256, 256), \
            ["MatMulSiluMul", "MatMulSkipNorm"]
    sess = crossml.InferenceSession(m, providers=["GPUExecutionProvider"])
    assert [n.op_type for n in sess._model.graph.node] == nodes
    so = crossml.SessionOptions()
    so.add_session_config_entry("ep.dml.disable_graph_fusion", "1")
    plain = crossml.InferenceSession(m, so, providers=["GPUExecutionProvider"])
    (normed, total), (normed0, total0) = sess.run(None, f), plain.run(None, f)
    np.testing.assert_allclose(total.astype(np.float32), total0.astype(np.float32), rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(normed.astype(np.float32), normed0.astype(np.float32), rtol=2e-3, atol=2e-3)


def mlp_layer(*, dtype: type = np.float32, gu_twice: bool = False, k: int = K, i: int = N, n: int = K,
              odd: bool = False) -> onnx.ModelProto:
    """x -> MatMul([Wg | Wu]) -> gu, then ``_gated_tail``: an MLP after the gate/up merge (``odd``: an odd number of
    product columns)."""
    et = T.FLOAT if dtype == np.float32 else T.FLOAT16
    nodes, inits, inputs, outputs = _gated_tail(dtype, i, n)
    inits.insert(0, numpy_helper.from_array((RNG.standard_normal((k, 2 * i + odd)) * 0.1).astype(dtype), "Wgu"))
    inputs.insert(0, h.make_tensor_value_info("x", et, ["batch", "seq", k]))
    nodes.insert(0, h.make_node("MatMul", ["x", "Wgu"], ["gu"], name="gate_up"))
    if gu_twice:
        nodes.append(h.make_node("Relu", ["gu"], ["rgu"], name="other"))
        outputs.append(h.make_tensor_value_info("rgu", et, None))
    return _crossml_model(nodes, inputs, outputs, inits)


def _mlp_feeds(rows: int = 3, dtype: type = np.float32, k: int = K, n: int = K) -> dict[str, np.ndarray]:
    return {"x": RNG.standard_normal((1, rows, k)).astype(dtype), "r": RNG.standard_normal((1, rows, n)).astype(dtype)}


GPU_RULES = [MATMUL_NORM, MATMUL_SILU_MUL, SILU_MUL_NORM]


def test_gate_folded_into_the_gate_up_product_equals_unfused() -> None:
    """MatMulSiluMul takes the SiluMul before SiluMulSkipNorm can; on the CPU the fused op runs the MatMul and
    SiluMul ops, bit for bit the unfused model's results."""
    m = mlp_layer()
    f = _mlp_feeds()
    want = crossml.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, f)
    fused = onnx.ModelProto()
    fused.CopyFrom(m)
    assert apply_rules(fused, GPU_RULES) == {"MatMulSkipNorm": 1, "MatMulSiluMul": 1}
    gate, down = fused.graph.node
    assert (gate.op_type, list(gate.input), list(gate.output)) == ("MatMulSiluMul", ["x", "Wgu"], ["h"])
    assert down.op_type == "MatMulSkipNorm" and down.input[0] == "h"
    assert "silu_mul" not in {a.name for a in down.attribute}
    got = crossml.InferenceSession(fused, providers=["CPUExecutionProvider"]).run(None, f)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_gate_product_switched_off_leaves_the_gate_to_the_down_projection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(matmul_norm_module, "GATE_IN_PRODUCT", False)
    m = mlp_layer()
    assert apply_rules(m, GPU_RULES) == {"MatMulSkipNorm": 1, "SiluMulSkipNorm": 1}


@pytest.mark.parametrize(("kw", "says"), [({"gu_twice": True}, "used elsewhere"), ({"odd": True}, "an even N")])
def test_gate_product_refuses_with_a_reason(kw: dict, says: str) -> None:
    m = mlp_layer(**kw)
    assert "MatMulSiluMul" not in apply_rules(m, [MATMUL_NORM, MATMUL_SILU_MUL])
    assert says in rule_reason(MATMUL_SILU_MUL, m, "SiluMul")
