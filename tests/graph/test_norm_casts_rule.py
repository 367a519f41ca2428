"""FoldNormCasts: the float32 Casts around an RMSNorm (SimplifiedLayerNormalization) of a half-precision model
(Gemma 2/3/4's builder exports) go. What it folds, what it leaves, and the folded model's values against the nodes'
(bit for bit), on the torch path and on the Triton kernel (interpreted on the CPU)."""

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

import crossml.ops.contrib.norm as norm_ops  # noqa: E402
from crossml.graph.passes.norm_casts import FOLD_SKIP_NORM, NORM_CASTS  # noqa: E402
from crossml.graph.passes.norm_rotary import NORM_ROTARY  # noqa: E402
from crossml.kernels._launch import INTERPRET  # noqa: E402
from crossml.runtime.session import fusion_rules  # noqa: E402
from tests.graph._rules import contrib_model, fold_copy, rule_reason, unfused_session  # noqa: E402

RNG = np.random.default_rng(21)
H = 64


def cast_norm(*, inner: int | None = T.FLOAT, outer: int | None = T.FLOAT16, src: int = T.FLOAT16,
              stash_type: int = 1, second_reader: bool = False) -> onnx.ModelProto:
    """x (src) -> [Cast(inner)] -> SimplifiedLayerNormalization (float32 scale) -> [Cast(outer)]."""
    inputs = [h.make_tensor_value_info("x", src, ["batch", "length", H])]
    inits = [numpy_helper.from_array((1.0 + 0.1 * RNG.standard_normal(H)).astype(np.float32), "w")]
    nodes, x = [], "x"
    if inner is not None:
        nodes.append(h.make_node("Cast", ["x"], ["x32"], name="in_cast", to=inner))
        x = "x32"
    nodes.append(h.make_node("SimplifiedLayerNormalization", [x, "w"], ["n"], name="norm", epsilon=1e-6, axis=-1,
                             stash_type=stash_type))
    outputs = []
    if outer is not None:
        nodes.append(h.make_node("Cast", ["n"], ["y"], name="out_cast", to=outer))
        outputs.append(h.make_tensor_value_info("y", outer, None))
    else:
        outputs.append(h.make_tensor_value_info("n", T.FLOAT, None))
    if second_reader:
        nodes.append(h.make_node("Neg", ["n"], ["m"], name="other"))
        outputs.append(h.make_tensor_value_info("m", T.FLOAT, None))
    return contrib_model(nodes, inputs, outputs, inits)


@pytest.mark.parametrize("casts", ["both", "inner", "outer"])
@pytest.mark.parametrize("kernel", [False, pytest.param(True, marks=pytest.mark.skipif(
    not INTERPRET, reason="the kernel case runs the Triton kernel on CPU tensors, in the interpreter"))],
    ids=["torch", "kernel"])
def test_folds_the_casts_with_the_same_values(casts: str, kernel: bool, monkeypatch) -> None:
    m = cast_norm(inner=T.FLOAT if casts != "outer" else None, outer=T.FLOAT16 if casts != "inner" else None,
                  src=T.FLOAT16 if casts != "outer" else T.FLOAT)
    folded, counts = fold_copy(m, NORM_CASTS)
    assert counts == {"FoldNormCasts": 1}
    (node,) = folded.graph.node
    assert node.op_type == "SimplifiedLayerNormalization" and node.domain == "com.crossml"
    assert node.input[0] == "x" and node.output[0] == ("n" if casts == "inner" else "y")
    dtype = np.float32 if casts == "outer" else np.float16
    x = {"x": (RNG.standard_normal((2, 5, H)) * 3).astype(dtype)}
    calls = []
    if kernel:  # both models' norms take the op's GPU branch on CPU tensors, interpreted (as on a GPU both would)
        import crossml.kernels.rmsnorm as module

        monkeypatch.setattr(norm_ops, "_use_kernel", lambda *t: calls.append(1) or True)
        monkeypatch.setattr(norm_ops, "_rmsnorm_kernels", lambda: module)
    want, = unfused_session(m).run(None, x)
    got, = unfused_session(folded).run(None, x)
    assert got.dtype == want.dtype == (np.float32 if casts == "inner" else np.float16)
    np.testing.assert_array_equal(got, want)
    assert len(calls) == (2 if kernel else 0)


def test_what_it_leaves() -> None:
    assert fold_copy(cast_norm(inner=None, outer=None), NORM_CASTS)[1] == {}  # no Cast to fold
    # an inner Cast from float32 (nothing to widen) or to float16 is left, the outer one still folds
    folded, counts = fold_copy(cast_norm(src=T.FLOAT), NORM_CASTS)
    assert counts == {"FoldNormCasts": 1} and [n.op_type for n in folded.graph.node] == ["Cast",
                                                                                          "SimplifiedLayerNormalization"]
    assert fold_copy(cast_norm(outer=None, second_reader=True), NORM_CASTS)[1] == {"FoldNormCasts": 1}
    folded, _ = fold_copy(cast_norm(second_reader=True), NORM_CASTS)  # the float32 norm is read elsewhere too
    assert [n.op_type for n in folded.graph.node].count("Cast") == 1
    assert "stash_type is not 1" in rule_reason(NORM_CASTS, cast_norm(stash_type=0), "SimplifiedLayerNormalization")


def test_runs_off_the_cpu_after_the_other_rules() -> None:
    rules = fusion_rules(None, torch.device("cuda"))
    later = (NORM_CASTS, FOLD_SKIP_NORM, NORM_ROTARY)  # the last two take the norms it folds
    others = [i for i, r in enumerate(rules) if r not in later and "Norm" in r.name]
    assert max(others) < rules.index(NORM_CASTS) < min(rules.index(FOLD_SKIP_NORM), rules.index(NORM_ROTARY))
    assert NORM_CASTS not in fusion_rules(None, torch.device("cpu"))
