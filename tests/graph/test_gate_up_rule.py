"""The gate/up rule (MatMul, MatMul, SiluMul => one MatMul with [Wg | Wu], SiluMul of its halves; the
same for MatMulNBits): what it merges, what it refuses (with a reason, graph untouched), same results
as the unfused model, and apply_rules dropping the replaced weights but no initializer still in use."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

import crossml
from crossml.graph.load import prepare
from crossml.graph.passes import GraphView, Match, Rule, apply_rules
from crossml.graph.passes.gate_casts import GATE_CASTS
from crossml.graph.passes.gate_up import GATE_UP, GATE_UP_NBITS
from crossml.graph.passes.gather_norm import GATHER_NORM
from crossml.graph.passes.gelu import RULE as GELU
from crossml.graph.passes.mask_lengths import MASK_LENGTHS
from crossml.graph.passes.norm_casts import FOLD_SKIP_NORM, NORM_CASTS
from crossml.graph.passes.norm_matmul import NORM_MATMUL, NORM_MATMUL_CPU
from crossml.graph.passes.norm_rotary import NORM_ROTARY
from crossml.graph.passes.query_scale import QUERY_SCALE
from crossml.graph.passes.rotary_casts import ROTARY_CASTS
from crossml.graph.passes.sibling_matmul import SIBLING_MATMUL
from crossml.graph.passes.skip_layer_norm import SKIP_LAYER_NORM
from crossml.graph.passes.swiglu import GEGLU, SWIGLU
from crossml.runtime.session import fusion_rules
from tests.conftest import make_model
from tests.graph._rules import rule_reason, unfused_session
from tests.graph.test_swiglu_rule import HIDDEN, INTER, feeds, mlp
from tests.ops.contrib.test_matmul_nbits import quantized_weight

RNG = np.random.default_rng(3)
MS = "com.microsoft"


def _inits(m: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}


def _fused(m: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, int]]:
    fused = onnx.ModelProto()
    fused.CopyFrom(m)
    return fused, apply_rules(fused, [SWIGLU, GATE_UP])


# fp16: two layers (the random weights grow activations past fp16's range in a third)
@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")  # the evaluator's fp16 σ
@pytest.mark.filterwarnings("ignore:invalid value encountered in divide:RuntimeWarning")
@pytest.mark.parametrize(("dtype", "layers", "tol"), [(T.FLOAT, 3, 1e-5), (T.FLOAT16, 2, 2e-2)])
def test_merged_model_matches_reference_evaluator(dtype: int, layers: int, tol: float):
    m = mlp(dtype=dtype, layers=layers)
    f = feeds(m, onnx.helper.tensor_dtype_to_np_dtype(dtype))
    want = ReferenceEvaluator(m).run(None, f)
    fused, fired = _fused(m)
    assert fired == {"FuseSwiGLU": layers, "MergeGateUp": layers}
    ops = [n.op_type for n in fused.graph.node]
    assert ops.count("MatMul") == 2 * layers and ops.count("SiluMul") == layers  # a merged product and down_proj per layer
    onnx.checker.check_model(fused)
    got = crossml.InferenceSession(fused, providers=["CPUExecutionProvider"]).run(None, f)
    assert got[0].dtype == want[0].dtype
    # outputs reach 1e4 after three float32 layers: an element near zero is a difference of such sums, whose
    # rounding follows the summation order (thread count), so the absolute tolerance scales with the output
    scale = max(1.0, float(np.abs(want[0].astype(np.float32)).max()))
    np.testing.assert_allclose(got[0].astype(np.float32), want[0].astype(np.float32), rtol=tol, atol=tol * scale)


def test_merged_node_reads_the_concatenated_weight_and_the_old_ones_are_gone():
    m = mlp(layers=2)
    before = _inits(m)
    fused, _ = _fused(m)
    after = _inits(fused)
    for p in ("l0_", "l1_"):
        (merged,) = [n for n in fused.graph.node if n.op_type == "MatMul" and n.name.startswith(p + "gate_proj")]
        assert merged.input[0] == ("x" if p == "l0_" else "l0_y")
        assert list(merged.output) == [p + "g_gate_up"]
        np.testing.assert_array_equal(after[merged.input[1]], np.concatenate([before[p + "Wg"], before[p + "Wu"]], 1))
        (silu,) = [n for n in fused.graph.node if n.op_type == "SiluMul" and n.output[0] == p + "gated"]
        assert list(silu.input) == [p + "g_gate_up"] and silu.domain == "com.crossml"
        assert p + "Wg" not in after and p + "Wu" not in after
        assert p + "Wd" in after
    assert len(after) == len(before) - 2


def test_registered_after_swiglu_the_cpu_merging_4bit_products_only():
    rules = fusion_rules(None, torch.device("cpu"))
    assert GATE_UP not in rules and rules[rules.index(SWIGLU) + 2] is GATE_UP_NBITS  # after GeGLU's
    for gpu in (None, SimpleNamespace(disable_metacommands=False)):
        rules = fusion_rules(gpu, torch.device("cuda"))
        assert rules[rules.index(SWIGLU) + 1:rules.index(SWIGLU) + 3] == [GEGLU, GATE_UP]
    assert fusion_rules(SimpleNamespace(disable_metacommands=True), torch.device("cuda")) == [
        GELU, SWIGLU, GEGLU, GATE_UP, SIBLING_MATMUL, NORM_MATMUL, GATHER_NORM, MASK_LENGTHS, SKIP_LAYER_NORM,
        QUERY_SCALE, ROTARY_CASTS, GATE_CASTS, NORM_CASTS, FOLD_SKIP_NORM, NORM_ROTARY]
    assert fusion_rules(SimpleNamespace(disable_metacommands=True), torch.device("cpu")) == [
        GELU, SWIGLU, GEGLU, GATE_UP_NBITS, NORM_MATMUL_CPU]


def test_cpu_session_keeps_the_two_products():
    m = mlp(layers=2)
    sess = crossml.InferenceSession(m, providers=["CPUExecutionProvider"])
    ops = [n.op_type for n in sess._model.graph.node]
    assert ops.count("MatMul") == 6 and ops.count("SiluMul") == 2
    assert all(len(n.input) == 2 for n in sess._model.graph.node if n.op_type == "SiluMul")


def layer(*, weights: str = "init", up_reads: str = "x", g_extra: bool = False, g_output: bool = False,
          wu_shape: tuple[int, ...] = (HIDDEN, INTER), wu_dtype: int = T.FLOAT) -> onnx.ModelProto:
    """One SwiGLU MLP (g = x @ Wg, up = <up_reads> @ Wu, Sigmoid/Mul/Mul) for the refusals.

    ``weights``: 'init' (initializers), 'input' (graph inputs, no initializers) or 'overridable'
    (initializers also listed as graph inputs). ``g_extra`` gives g a second consumer, ``g_output``
    makes it a graph output."""
    x = [h.make_tensor_value_info(n, T.FLOAT, ["batch", "seq", HIDDEN]) for n in sorted({"x", up_reads})]
    arrays = {"Wg": RNG.standard_normal((HIDDEN, INTER)).astype(np.float32),
              "Wu": RNG.standard_normal(wu_shape).astype(onnx.helper.tensor_dtype_to_np_dtype(wu_dtype))}
    inits = [] if weights == "input" else [numpy_helper.from_array(a, n) for n, a in arrays.items()]
    if weights != "init":
        x += [h.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
              for n, a in arrays.items()]
    nodes = [h.make_node("MatMul", ["x", "Wg"], ["g"], name="gate_proj"),
             h.make_node("MatMul", [up_reads, "Wu"], ["up"], name="up_proj"),
             h.make_node("Sigmoid", ["g"], ["s"], name="sigmoid"),
             h.make_node("Mul", ["g", "s"], ["a"], name="act"),
             h.make_node("Mul", ["a", "up"], ["y"], name="mul")]
    outputs = [h.make_tensor_value_info("y", T.FLOAT, None)]
    if g_extra:
        nodes.append(h.make_node("Neg", ["g"], ["neg_g"], name="other_use"))
        outputs.append(h.make_tensor_value_info("neg_g", T.FLOAT, None))
    if g_output:
        outputs.append(h.make_tensor_value_info("g", T.FLOAT, None))
    m = prepare(make_model(nodes, x, outputs, inits))
    assert apply_rules(m, [SWIGLU]) == {"FuseSwiGLU": 1}
    return m


def _reason(m: onnx.ModelProto) -> str | None:
    return rule_reason(GATE_UP, m, "SiluMul")


def test_accepts_the_plain_layer():
    m = layer()
    assert _reason(m) is None
    assert apply_rules(m, [GATE_UP]) == {"MergeGateUp": 1}


@pytest.mark.parametrize(("kw", "says"), [
    ({"weights": "input"}, "weight ('Wg') of 'gate_proj' is not an initializer"),
    ({"weights": "overridable"}, "weight ('Wg') of 'gate_proj' is a graph input (a feed may override it)"),
    ({"up_reads": "x2"}, "'gate_proj' and 'up_proj' read different activations: 'x' and 'x2'"),
    ({"g_extra": True}, "g ('g') is used elsewhere"),
    ({"g_output": True}, "g ('g') is used elsewhere"),
    ({"wu_shape": (1, HIDDEN, INTER)},
     "weight of 'gate_proj' and 'up_proj' differ: [8, 24] FLOAT and [1, 8, 24] FLOAT"),
    ({"wu_dtype": T.DOUBLE}, "weight of 'gate_proj' and 'up_proj' differ: [8, 24] FLOAT and [8, 24] DOUBLE"),
])
def test_refuses_with_a_reason_and_leaves_the_graph(kw: dict, says: str):
    m = layer(**kw)
    assert _reason(m) == says
    before = m.SerializeToString()
    assert apply_rules(m, [GATE_UP]) == {}
    assert m.SerializeToString() == before


def test_does_not_match_other_silu_muls():
    m = layer()
    silu = next(n for n in m.graph.node if n.op_type == "SiluMul")
    # one input already (merged), or a producer that is not a product
    one = h.make_node("SiluMul", ["g"], ["y"], domain="com.crossml")
    assert GATE_UP.match(GraphView.of(m.graph), one) is None
    silu.input[1] = "x"
    assert GATE_UP.match(GraphView.of(m.graph), silu) is None


# ---------------------------------------------------------------- MatMulNBits


K, N = 64, 24


def nbits_mlp(*, block_size: int, zp_kind: str | None, flat: bool, level: int = 0, dtype=np.float32,
              up_block_size: int | None = None, up_bias: bool = False) -> onnx.ModelProto:
    """g = MatMulNBits(x, gate weight), up = MatMulNBits(x, up weight), SiLU-gated (Sigmoid/Mul/Mul).

    ``flat``: scales and zero points as 1-D [N * n_blocks] / [N * zp_bytes] (else 2-D)."""
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inits, nodes = [], []
    for p, bs in (("gate", block_size), ("up", up_block_size or block_size)):
        B, scales, zp = quantized_weight(N, K, 4, bs, zp_kind, dtype)
        arrays = {"B": B, "scales": scales.reshape(-1) if flat else scales}
        if zp is not None:
            arrays["zp"] = zp.reshape(-1) if flat else zp
        if p == "up" and up_bias:
            arrays["bias"] = RNG.standard_normal(N).astype(dtype)
        inits += [numpy_helper.from_array(a, f"{p}_{n}") for n, a in arrays.items()]
        names = ["x", f"{p}_B", f"{p}_scales", f"{p}_zp" if zp is not None else ""]
        if "bias" in arrays:
            names += ["", f"{p}_bias"]
        nodes.append(h.make_node("MatMulNBits", names, [p], name=f"{p}_proj", domain=MS, K=K, N=N, bits=4,
                                 block_size=bs, accuracy_level=level))
    nodes += [h.make_node("Sigmoid", ["gate"], ["s"], name="sigmoid"),
              h.make_node("Mul", ["gate", "s"], ["a"], name="act"),
              h.make_node("Mul", ["a", "up"], ["y"], name="mul")]
    m = make_model(nodes, [h.make_tensor_value_info("x", elem, ["batch", "seq", K])],
                   [h.make_tensor_value_info("y", elem, None)], inits)
    m.opset_import.append(h.make_opsetid(MS, 1))
    return prepare(m)


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("zp_kind", [None, "packed", "float"])
@pytest.mark.parametrize("flat", [False, True])
@pytest.mark.parametrize("level", [0, 4])
def test_nbits_merged_equals_unfused_exactly(block_size: int, zp_kind: str | None, flat: bool, level: int):
    m = nbits_mlp(block_size=block_size, zp_kind=zp_kind, flat=flat, level=level)
    before = _inits(m)
    fused, fired = _fused(m)
    assert fired == {"FuseSwiGLU": 1, "MergeGateUp": 1}
    (merged,) = [n for n in fused.graph.node if n.op_type == "MatMulNBits"]
    attrs = {a.name: h.get_attribute_value(a) for a in merged.attribute}
    assert attrs == {"K": K, "N": 2 * N, "bits": 4, "block_size": block_size, "accuracy_level": level}
    after = _inits(fused)
    for i, what in enumerate(["B", "scales", "zp"][:len(merged.input) - 1], start=1):
        np.testing.assert_array_equal(after[merged.input[i]],
                                      np.concatenate([before[f"gate_{what}"], before[f"up_{what}"]]))
    assert set(after) == set(merged.input[1:])  # the four (six) old tensors are gone
    f = {"x": RNG.standard_normal((2, 3, K)).astype(np.float32)}
    want = unfused_session(m).run(None, f)
    got = crossml.InferenceSession(fused, providers=["CPUExecutionProvider"]).run(None, f)
    # columns of a product are independent: dequantization and accumulation per column are the same. Blocks of 32
    # take the CPU's packed int4 kernel at these few rows, whose arithmetic depends on a column's lane in its
    # vector registers (the up half moves by N columns when merged): there the results may differ by a rounding
    if block_size in (32, 64, 128, 256):
        np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-7)
    else:
        np.testing.assert_array_equal(got[0], want[0])


def test_nbits_fp16_merged_equals_unfused_exactly():
    m = nbits_mlp(block_size=32, zp_kind="packed", flat=True, dtype=np.float16)
    fused, fired = _fused(m)
    assert fired == {"FuseSwiGLU": 1, "MergeGateUp": 1}
    f = {"x": RNG.standard_normal((1, 4, K)).astype(np.float16)}
    want = unfused_session(m).run(None, f)
    got = crossml.InferenceSession(fused, providers=["CPUExecutionProvider"]).run(None, f)
    np.testing.assert_array_equal(got[0], want[0])


@pytest.mark.parametrize("rows", [(1, 1), (2, 3), (1, 20)])
@pytest.mark.parametrize(("block_size", "level"), [(32, 4), (64, 4), (32, 0), (16, 4)])
def test_cpu_session_merges_4bit_products_exactly(block_size: int, level: int, rows: tuple[int, int]):
    """A CPU session merges 4-bit gate and up products (GATE_UP_NBITS) and gets the unmerged graph's values bit for
    bit: decode-sized rows on the int8 kernel (level 4, blocks of 32-256) or numba's float kernel (level 0, blocks of
    16), 20 rows on the prompt's dequantizing product."""
    pytest.importorskip("numba", reason="the exact merge holds on the numba kernels (the test extra installs numba)")
    m = nbits_mlp(block_size=block_size, zp_kind="packed", flat=False, level=level)
    sess = crossml.InferenceSession(m, providers=["CPUExecutionProvider"])
    ops = [n.op_type for n in sess._model.graph.node]
    assert ops.count("MatMulNBits") == 1 and ops.count("SiluMul") == 1
    f = {"x": RNG.standard_normal((*rows, K)).astype(np.float32)}
    for _ in range(2):  # the first run keeps the kernels' per-weight data, the second reads it
        np.testing.assert_array_equal(sess.run(None, f)[0], unfused_session(m).run(None, f)[0])


@pytest.mark.parametrize(("kw", "says"), [
    ({"up_block_size": 16}, "'gate_proj' and 'up_proj' differ in block_size: 32 and 16"),
    ({"up_bias": True}, "'up_proj' has g_idx or bias inputs"),
])
def test_nbits_refuses(kw: dict, says: str):
    m = nbits_mlp(block_size=32, zp_kind="packed", flat=False, **kw)
    assert apply_rules(m, [SWIGLU]) == {"FuseSwiGLU": 1}
    assert _reason(m) == says
    before = m.SerializeToString()
    assert apply_rules(m, [GATE_UP]) == {}
    assert m.SerializeToString() == before


def test_nbits_refuses_zero_points_on_one_side_only():
    m = nbits_mlp(block_size=32, zp_kind="packed", flat=False)
    up = next(n for n in m.graph.node if n.name == "up_proj")
    del up.input[3:]
    apply_rules(m, [SWIGLU])
    assert _reason(m) == "one of 'gate_proj' and 'up_proj' has zero points, the other not"


# ---------------------------------------------------------------- apply_rules' initializer cleanup


def _drop_adds() -> Rule:
    """A test rule: Add(x, c) => Identity(x), so the Add's constant ``c`` is no longer read there."""
    def match(view: GraphView, node: onnx.NodeProto) -> Match | None:
        return Match([node]) if node.op_type == "Add" else None

    def rewrite(view: GraphView, m: Match) -> list[onnx.NodeProto]:
        add = m.nodes[0]
        return [h.make_node("Identity", [add.input[0]], list(add.output), name=add.name)]

    return Rule("DropAdds", match, lambda view, m: None, rewrite)


def test_cleanup_keeps_initializers_still_read_or_listed_as_inputs():
    c = {n: numpy_helper.from_array(np.full(4, i, np.float32), n)
         for i, n in enumerate(["only_add", "also_neg", "also_input", "in_subgraph", "never_read"])}
    branch = h.make_graph([h.make_node("Identity", ["in_subgraph"], ["b"])], "branch", [],
                          [h.make_tensor_value_info("b", T.FLOAT, [4])])
    nodes = [h.make_node("Add", ["x", n], [f"y_{n}"], name=f"add_{n}")
             for n in ("only_add", "also_neg", "also_input", "in_subgraph")]
    nodes += [h.make_node("Neg", ["also_neg"], ["neg"], name="neg"),
              h.make_node("If", ["cond"], ["z"], then_branch=branch, else_branch=branch, name="if")]
    inputs = [h.make_tensor_value_info("x", T.FLOAT, [4]), h.make_tensor_value_info("cond", T.BOOL, []),
              h.make_tensor_value_info("also_input", T.FLOAT, [4])]
    outputs = [h.make_tensor_value_info(o, T.FLOAT, [4]) for n in nodes for o in n.output]
    m = make_model(nodes, inputs, outputs, c.values())
    assert apply_rules(m, [_drop_adds()]) == {"DropAdds": 4}
    assert {t.name for t in m.graph.initializer} == {"also_neg", "also_input", "in_subgraph", "never_read"}


def test_cleanup_keeps_a_weight_shared_with_another_product():
    m = layer()
    x2 = h.make_node("MatMul", ["x", "Wg"], ["other"], name="shares_Wg")
    m.graph.node.append(x2)
    m.graph.output.append(h.make_tensor_value_info("other", T.FLOAT, None))
    assert apply_rules(m, [GATE_UP]) == {"MergeGateUp": 1}
    names = {t.name for t in m.graph.initializer}
    assert "Wg" in names and "Wu" not in names and "gate_proj_gate_up_weight" in names
