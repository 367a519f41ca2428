"""FoldSkipNorm: the nodes around the residual stream's SkipSimplifiedLayerNormalization that the builder's Gemma
exports write (Gemma 4's layer-scalar Muls on both inputs, the post-attention / post-feed-forward RMSNorm on the skip,
the Cast of the result to float16) fold into one com.crossml SkipSimplifiedLayerNormalization. What it folds, what it
leaves, and the folded model's values against the nodes' (bit for bit on the torch path and on the Triton kernel
interpreted on the CPU; within an ulp or two compiled, in the ``gpu`` case)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before triton's first import: the kernel case interprets it on the CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import pytest  # noqa: E402
from onnx import TensorProto as T  # noqa: E402
from onnx import helper as h  # noqa: E402
from onnx import numpy_helper  # noqa: E402

import crossml  # noqa: E402
import crossml.ops.contrib.norm as norm_ops  # noqa: E402
from crossml.graph.passes import apply_rules  # noqa: E402
from crossml.graph.passes.norm_casts import FOLD_SKIP_NORM, NORM_CASTS  # noqa: E402
from crossml.kernels._launch import INTERPRET  # noqa: E402
from crossml.runtime.session import fusion_rules  # noqa: E402
from tests.graph._rules import contrib_model, unfused_session  # noqa: E402

RNG = np.random.default_rng(23)
H = 64


def residual(*, x_scale: bool = True, skip_scale: bool = True, skip_norm: str | None = "cast", cast_out: bool = True,
             dtype: int = T.FLOAT, vector_scale: bool = False, scale_input: bool = False, stats: bool = False,
             scaled_twice: bool = False) -> onnx.ModelProto:
    """r (dtype) -> [Mul(r, 1.2)] -> x;  y (float16) -> [Cast(float32) ->] [SimplifiedLayerNormalization(w1)] ->
    [Mul(·, 0.7)] -> k;  SkipSimplifiedLayerNormalization(x, k, gamma) -> (n, -, -, sum) -> [Cast(float16)].
    ``skip_norm``: "cast" (Gemma's float32 norm of a float16 product), "plain" (a norm of y of dtype), None (y of
    dtype is the skip). ``vector_scale``: the first Mul's constant is an [H] vector; ``scale_input``: it is a graph
    input; ``stats``: the norm's inverse deviation is an output; ``scaled_twice``: Mul(r) is read twice."""
    np_dtype = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    c1 = (np.full(H, 1.2) if vector_scale else np.array(1.2)).astype(np_dtype)
    inits = [numpy_helper.from_array(c1, "c1"), numpy_helper.from_array(np.array(0.7, np_dtype), "c2"),
             numpy_helper.from_array((1 + 0.1 * RNG.standard_normal(H)).astype(np_dtype), "gamma"),
             numpy_helper.from_array((1 + 0.1 * RNG.standard_normal(H)).astype(np_dtype), "w1")]
    inputs = [h.make_tensor_value_info("r", dtype, ["batch", "seq", H]),
              h.make_tensor_value_info("y", T.FLOAT16 if skip_norm == "cast" else dtype, ["batch", "seq", H])]
    nodes, outputs = [], []
    x = "r"
    if x_scale:
        nodes.append(h.make_node("Mul", ["r", "c1"], ["rs"], name="layer_scalar/Mul_root"))
        x = "rs"
    k = "y"
    if skip_norm == "cast":
        nodes.append(h.make_node("Cast", ["y"], ["y32"], name="post/Cast", to=T.FLOAT))
        k = "y32"
    if skip_norm is not None:
        nodes.append(h.make_node("SimplifiedLayerNormalization", [k, "w1"], ["kn"], name="post/LayerNorm",
                                 epsilon=1e-6, axis=-1, stash_type=1))
        k = "kn"
    if skip_scale:
        nodes.append(h.make_node("Mul", [k, "c2"], ["ks"], name="layer_scalar/Mul_skip"))
        k = "ks"
    nodes.append(h.make_node("SkipSimplifiedLayerNormalization", [x, k, "gamma"], ["n", "", "inv" if stats else "",
                                                                                   "sum"],
                             name="input_layernorm/SkipLayerNorm", domain="com.microsoft", epsilon=1e-6))
    if cast_out:
        nodes.append(h.make_node("Cast", ["n"], ["out"], name="input_layernorm/Cast", to=T.FLOAT16))
        outputs.append(h.make_tensor_value_info("out", T.FLOAT16, None))
    else:
        outputs.append(h.make_tensor_value_info("n", dtype, None))
    outputs.append(h.make_tensor_value_info("sum", dtype, None))
    if stats:
        outputs.append(h.make_tensor_value_info("inv", T.FLOAT, None))
    if scaled_twice:
        nodes.append(h.make_node("Neg", ["rs"], ["neg"], name="other"))
        outputs.append(h.make_tensor_value_info("neg", dtype, None))
    m = contrib_model(nodes, inputs, outputs, inits)
    if scale_input:
        m.graph.input.append(h.make_tensor_value_info("c1", dtype, list(c1.shape)))
    return m


def _fold(m: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, int]]:
    out = onnx.ModelProto()
    out.CopyFrom(m)
    return out, apply_rules(out, [NORM_CASTS, FOLD_SKIP_NORM])


def _feeds(m: onnx.ModelProto) -> dict[str, np.ndarray]:
    types = {vi.name: onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type) for vi in m.graph.input}
    return {"r": (RNG.standard_normal((2, 3, H)) * 4).astype(types["r"]),
            "y": (RNG.standard_normal((2, 3, H)) * 3).astype(types["y"])}


FORMS = {"gemma4": {}, "no-scales": {"x_scale": False, "skip_scale": False},
         "scales-only": {"skip_norm": None, "cast_out": False}, "plain-norm": {"skip_norm": "plain"},
         "fp16": {"dtype": T.FLOAT16, "skip_norm": "plain"}}


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("kernel", [False, pytest.param(True, marks=pytest.mark.skipif(
    not INTERPRET, reason="the kernel case runs the Triton kernel on CPU tensors, in the interpreter"))],
    ids=["torch", "kernel"])
def test_folds_with_the_nodes_values(form: str, kernel: bool, monkeypatch) -> None:
    m = residual(**FORMS[form])
    folded, counts = _fold(m)
    assert counts["FoldSkipNorm"] == 1
    (node,) = folded.graph.node
    assert (node.domain, node.op_type) == ("com.crossml", "SkipSimplifiedLayerNormalization")
    attrs = {a.name: h.get_attribute_value(a) for a in node.attribute}
    kw = FORMS[form]
    assert ("input_scale" in attrs) == kw.get("x_scale", True) and ("skip_scale" in attrs) == kw.get("skip_scale", True)
    assert (len(node.input) == 5) == (kw.get("skip_norm", "cast") is not None)
    assert attrs.get("to") == (T.FLOAT16 if kw.get("cast_out", True) else None)
    assert node.input[0] == "r" and node.input[1] == "y"
    f = _feeds(m)
    if kernel:  # both models' norms take the ops' GPU branches on CPU tensors, interpreted (as on a GPU both would)
        import crossml.kernels.rmsnorm as module

        monkeypatch.setattr(norm_ops, "_use_kernel", lambda *t: True)
        monkeypatch.setattr(norm_ops, "_rmsnorm_kernels", lambda: module)
        calls = []
        real = module.folded_skip_rms_norm
        monkeypatch.setattr(module, "folded_skip_rms_norm", lambda *a, **k: calls.append(1) or real(*a, **k))
    want = unfused_session(m).run(None, f)
    got = unfused_session(folded).run(None, f)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)
    if kernel:
        assert calls == [1]


def test_what_it_leaves() -> None:
    # a vector constant, a constant fed as a graph input, a Mul read twice: that Mul stays, the rest folds
    for kw in ({"vector_scale": True}, {"scale_input": True}, {"scaled_twice": True}):
        folded, counts = _fold(residual(**kw))
        assert counts["FoldSkipNorm"] == 1
        ops = [n.op_type for n in folded.graph.node]
        assert ops.count("Mul") == 1 and "SkipSimplifiedLayerNormalization" in ops, kw
        node = next(n for n in folded.graph.node if n.op_type == "SkipSimplifiedLayerNormalization")
        assert node.input[0] == "rs" and "input_scale" not in {a.name for a in node.attribute}
    # the statistics read: nothing folds into the norm
    assert "FoldSkipNorm" not in _fold(residual(stats=True))[1]
    # nothing around the norm: nothing to fold
    assert "FoldSkipNorm" not in _fold(residual(x_scale=False, skip_scale=False, skip_norm=None, cast_out=False))[1]


def test_folded_model_values_with_the_sessions_rules() -> None:
    """The CPU session keeps the nodes (the rule runs off the CPU only); a session of the folded graph gives their
    values, the sum output included."""
    m = residual()
    assert FOLD_SKIP_NORM not in fusion_rules(None, torch.device("cpu"))
    rules = fusion_rules(None, torch.device("cuda"))
    assert rules.index(FOLD_SKIP_NORM) == len(rules) - 1 - rules[::-1].index(FOLD_SKIP_NORM) > rules.index(NORM_CASTS)
    folded, _ = _fold(m)
    f = _feeds(m)
    sess = crossml.InferenceSession(folded, providers=["CPUExecutionProvider"])
    for g, w in zip(sess.run(None, f), unfused_session(m).run(None, f)):
        np.testing.assert_array_equal(g, w)


@pytest.mark.gpu
@pytest.mark.parametrize("form", list(FORMS))
def test_gpu_session_matches_unfused(form: str) -> None:
    """On the GPU: the session folds (one node) and gives the values of the session without graph fusion, whose
    nodes run their own kernels, within an ulp or two (the compiled kernels may contract a product and a sum into one
    FMA at different steps)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU: torch sees none on this machine")
    m = residual(**FORMS[form])
    sess = crossml.InferenceSession(m, providers=["GPUExecutionProvider"])
    assert [n.op_type for n in sess._model.graph.node] == ["SkipSimplifiedLayerNormalization"]
    f = _feeds(m)
    for g, w in zip(sess.run(None, f), unfused_session(m, "GPUExecutionProvider").run(None, f)):
        assert g.dtype == w.dtype
        tol = 2e-3 if g.dtype == np.float16 else 1e-5
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol, atol=tol)
