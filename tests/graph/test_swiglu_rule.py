"""The SwiGLU rule (Sigmoid, Mul, Mul => SiluMul): what it fuses (the onnxruntime-genai model
builder's MLP, either Mul operand order), what it refuses (with a reason), same results as onnx's
ReferenceEvaluator on the unfused model."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx.reference import ReferenceEvaluator

import crossml
from crossml.graph.load import prepare
from crossml.graph.passes import GraphView, apply_rules
from crossml.graph.passes.swiglu import SWIGLU
from tests.conftest import make_model
from tests.graph._rules import rule_reason

RNG = np.random.default_rng(0)
HIDDEN, INTER = 8, 24


def mlp(*, g_first: bool = True, act_first: bool = True, dtype: int = T.FLOAT, up_shape: tuple[int, ...] | None = None,
        extra: str | None = None, layers: int = 1) -> onnx.ModelProto:
    """The builder's MLP: g = x @ Wg, up = x @ Wu, y = (g · σ(g) · up) @ Wd, ``layers`` times.

    ``g_first``: Mul(g, σ) (the builder's order) or Mul(σ, g); ``act_first``: Mul(act, up) or Mul(up, act).
    ``up_shape``: an ``up`` input of that shape instead of x @ Wu (to broadcast). ``extra``: 's' / 'a'
    makes σ(g) / g·σ(g) also a graph output, 's_node' / 'a_node' gives it a second consumer.
    """
    np_dtype = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    inits, nodes = [], []
    inputs = [h.make_tensor_value_info("x", dtype, ["batch", "seq", HIDDEN])]
    outputs = []
    x = "x"
    for i in range(layers):
        p = f"l{i}_"
        for w, shape in (("Wg", (HIDDEN, INTER)), ("Wu", (HIDDEN, INTER)), ("Wd", (INTER, HIDDEN))):
            inits.append(onnx.numpy_helper.from_array((RNG.standard_normal(shape) * 0.5).astype(np_dtype), p + w))
        g, s, a, up, y = p + "g", p + "s", p + "a", p + "up", p + "y"
        nodes.append(h.make_node("MatMul", [x, p + "Wg"], [g], name=p + "gate_proj"))
        if up_shape is None:
            nodes.append(h.make_node("MatMul", [x, p + "Wu"], [up], name=p + "up_proj"))
        else:
            inputs.append(h.make_tensor_value_info(up, dtype, list(up_shape)))
        nodes += [
            h.make_node("Sigmoid", [g], [s], name=p + "act_fn/Sigmoid"),
            h.make_node("Mul", [g, s] if g_first else [s, g], [a], name=p + "act_fn/Mul"),
            h.make_node("Mul", [a, up] if act_first else [up, a], [p + "gated"], name=p + "Mul"),
            h.make_node("MatMul", [p + "gated", p + "Wd"], [y], name=p + "down_proj"),
        ]
        x = y
    outputs.append(h.make_tensor_value_info(x, dtype, None))
    if extra in ("s", "a"):
        outputs.append(h.make_tensor_value_info("l0_" + extra, dtype, None))
    elif extra in ("s_node", "a_node"):
        nodes.append(h.make_node("Neg", ["l0_" + extra[0]], ["other"], name="other_use"))
        outputs.append(h.make_tensor_value_info("other", dtype, None))
    return prepare(make_model(nodes, inputs, outputs, inits))


def feeds(m: onnx.ModelProto, dtype=np.float32) -> dict[str, np.ndarray]:
    out = {}
    for vi in m.graph.input:
        shape = [d.dim_value or 3 for d in vi.type.tensor_type.shape.dim]
        out[vi.name] = RNG.standard_normal(shape).astype(dtype)
    return out


def run_both(m: onnx.ModelProto, f: dict[str, np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    want = ReferenceEvaluator(m).run(None, f)
    fused = onnx.ModelProto()
    fused.CopyFrom(m)
    fired = apply_rules(fused, [SWIGLU])
    assert fired == {"FuseSwiGLU": sum(n.op_type == "Sigmoid" for n in m.graph.node)}
    ops = [n.op_type for n in fused.graph.node]
    assert "Sigmoid" not in ops and "Mul" not in ops and "SiluMul" in ops
    assert any(o.domain == "com.crossml" for o in fused.opset_import)
    got = crossml.InferenceSession(fused, providers=["CPUExecutionProvider"]).run(None, f)
    return got, want


@pytest.mark.parametrize("g_first", [True, False])
@pytest.mark.parametrize("act_first", [True, False])
def test_fuses_builder_mlp_in_either_operand_order(g_first: bool, act_first: bool):
    m = mlp(g_first=g_first, act_first=act_first, layers=2)
    got, want = run_both(m, feeds(m))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_fused_node_keeps_output_name_and_inputs():
    m = mlp(g_first=False, act_first=False)
    apply_rules(m, [SWIGLU])
    (node,) = [n for n in m.graph.node if n.op_type == "SiluMul"]
    assert list(node.input) == ["l0_g", "l0_up"] and list(node.output) == ["l0_gated"]
    assert node.domain == "com.crossml"
    onnx.checker.check_model(m)


def test_fp16_matches_reference_evaluator():
    m = mlp(dtype=T.FLOAT16)
    got, want = run_both(m, feeds(m, np.float16))
    assert got[0].dtype == np.float16
    np.testing.assert_allclose(got[0].astype(np.float32), want[0].astype(np.float32), rtol=2e-2, atol=2e-2)


def _reason(m: onnx.ModelProto) -> str | None:
    return rule_reason(SWIGLU, m, "Sigmoid")


@pytest.mark.parametrize(("extra", "says"), [
    ("s", "σ(g) ('l0_s') is used elsewhere"),
    ("s_node", "σ(g) ('l0_s') is used elsewhere"),
    ("a", "g·σ(g) ('l0_a') is used elsewhere"),
    ("a_node", "g·σ(g) ('l0_a') is used elsewhere"),
])
def test_refuses_when_an_intermediate_has_another_use(extra: str, says: str):
    m = mlp(extra=extra)
    assert _reason(m) == says
    assert apply_rules(m, [SWIGLU]) == {}
    assert "Sigmoid" in {n.op_type for n in m.graph.node}


@pytest.mark.parametrize("up_shape", [(INTER,), (1, 1, INTER), ("batch", 1, INTER)])
def test_refuses_broadcasting_shapes(up_shape):
    m = mlp(up_shape=up_shape)
    assert "differ in shape" in _reason(m)
    assert apply_rules(m, [SWIGLU]) == {}


def test_accepts_same_symbolic_shapes():
    m = mlp(up_shape=("batch", "seq", INTER))
    assert _reason(m) is None
    got, want = run_both(m, feeds(m))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)


def test_does_not_match_other_products():
    # σ(x) · y (not gated by its own input) and g · σ(g) with no second Mul
    nodes = [h.make_node("Sigmoid", ["g"], ["s"]), h.make_node("Mul", ["s", "up"], ["a"]),
             h.make_node("Mul", ["a", "up"], ["y"])]
    io = [h.make_tensor_value_info(n, T.FLOAT, [2, 4]) for n in ("g", "up")]
    m = prepare(make_model(nodes, io, [h.make_tensor_value_info("y", T.FLOAT, None)]))
    assert SWIGLU.match(GraphView.of(m.graph), m.graph.node[0]) is None
    nodes = [h.make_node("Sigmoid", ["g"], ["s"]), h.make_node("Mul", ["g", "s"], ["y"])]
    m = prepare(make_model(nodes, io[:1], [h.make_tensor_value_info("y", T.FLOAT, None)]))
    assert apply_rules(m, [SWIGLU]) == {}
