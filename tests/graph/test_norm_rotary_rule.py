"""NormRotary: Gemma 3/4's per-head query / key RMSNorm (Reshape, SimplifiedLayerNormalization between float32 Casts,
Reshape back) before a com.microsoft RotaryEmbedding folds into com.crossml RotaryEmbedding, whose kernel normalizes
each head before rotating it. What it folds, what it refuses (with a reason), and the folded model's values against
the nodes': bit for bit on the torch path, within an ulp on the rotary kernel (interpreted on the CPU; compiled in
the ``gpu`` case), whose sum of squares is added in another order than the norm kernel's."""

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
import crossml.ops.contrib.rotary as rotary_ops  # noqa: E402
from crossml.graph.passes import apply_rules  # noqa: E402
from crossml.graph.passes.norm_casts import NORM_CASTS  # noqa: E402
from crossml.graph.passes.norm_rotary import NORM_ROTARY  # noqa: E402
from crossml.kernels._launch import INTERPRET  # noqa: E402
from crossml.runtime.session import fusion_rules  # noqa: E402
from tests.graph._rules import contrib_model, rule_reason, unfused_session  # noqa: E402

RNG = np.random.default_rng(29)
MAX_POS = 64


def norm_rope(*, heads: int = 4, head: int = 32, rot: int | None = None, interleaved: int = 0, casts: bool = True,
              inner_shape: list[int] | None = None, outer_shape: list[int] | None = None,
              read_twice: bool = False) -> onnx.ModelProto:
    """x [B, S, heads * head] (float16) -> Reshape [0, -1, head] -> [Cast float32] -> SimplifiedLayerNormalization ->
    [Cast float16] -> Reshape [0, -1, D] -> RotaryEmbedding (``rot`` channels of each head; all by default)."""
    D = heads * head
    rot = rot or head
    inits = [numpy_helper.from_array(np.array(inner_shape or [0, -1, head], np.int64), "s1"),
             numpy_helper.from_array(np.array(outer_shape or [0, -1, D], np.int64), "s2"),
             numpy_helper.from_array((1 + 0.2 * RNG.standard_normal(head)).astype(np.float32 if casts else np.float16),
                                     "w")]
    ang = np.arange(MAX_POS)[:, None] * (1.0 / 10000 ** (np.arange(rot // 2) / (rot // 2)))[None, :]
    inits += [numpy_helper.from_array(np.cos(ang).astype(np.float16), "cos"),
              numpy_helper.from_array(np.sin(ang).astype(np.float16), "sin")]
    nodes = [h.make_node("Reshape", ["x", "s1"], ["r1"], name="q_norm/Reshape_1")]
    src = "r1"
    if casts:
        nodes.append(h.make_node("Cast", ["r1"], ["r1f"], name="q_norm/Cast", to=T.FLOAT))
        src = "r1f"
    nodes.append(h.make_node("SimplifiedLayerNormalization", [src, "w"], ["n"], name="q_norm/SLN", epsilon=1e-6,
                             axis=-1, stash_type=1))
    n = "n"
    if casts:
        nodes.append(h.make_node("Cast", ["n"], ["nh"], name="q_norm/Cast_1", to=T.FLOAT16))
        n = "nh"
    nodes.append(h.make_node("Reshape", [n, "s2"], ["r2"], name="q_norm/Reshape_2"))
    attrs = {"interleaved": interleaved}
    if rot != head:
        attrs.update(num_heads=heads, rotary_embedding_dim=rot)
    nodes.append(h.make_node("RotaryEmbedding", ["r2", "pos", "cos", "sin"], ["y"], name="q_rotary",
                             domain="com.microsoft", **attrs))
    inputs = [h.make_tensor_value_info("x", T.FLOAT16, ["batch", "seq", D]),
              h.make_tensor_value_info("pos", T.INT64, ["batch", "seq"])]
    outputs = [h.make_tensor_value_info("y", T.FLOAT16, None)]
    if read_twice:
        outputs.append(h.make_tensor_value_info(n, T.FLOAT16, None))
    return contrib_model(nodes, inputs, outputs, inits)


def _fold(m: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, int]]:
    out = onnx.ModelProto()
    out.CopyFrom(m)
    return out, apply_rules(out, [NORM_CASTS, NORM_ROTARY])


def _feeds(m: onnx.ModelProto, S: int = 3) -> dict[str, np.ndarray]:
    D = m.graph.input[0].type.tensor_type.shape.dim[2].dim_value
    return {"x": (RNG.standard_normal((2, S, D)) * 3).astype(np.float16),
            "pos": np.array([[5, 6, 7][:S], [0, 1, 2][:S]], np.int64)}


FORMS = {"gemma": {}, "head-256": {"heads": 2, "head": 256}, "partial": {"rot": 16}, "interleaved": {"interleaved": 1},
         "no-casts": {"casts": False}}


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("kernel", [False, pytest.param(True, marks=pytest.mark.skipif(
    not INTERPRET, reason="the kernel case runs the Triton kernels on CPU tensors, in the interpreter"))],
    ids=["torch", "kernel"])
def test_folds_with_the_nodes_values(form: str, kernel: bool, monkeypatch) -> None:
    m = norm_rope(**FORMS[form])
    folded, counts = _fold(m)
    assert counts["NormRotary"] == 1
    (node,) = folded.graph.node
    assert (node.domain, node.op_type) == ("com.crossml", "RotaryEmbedding")
    assert list(node.input) == ["x", "pos", "cos", "sin", "w"]
    f = _feeds(m)
    if kernel:  # both models take the ops' GPU branches on CPU tensors, interpreted (as on a GPU both would)
        import crossml.kernels.mrope as mrope
        import crossml.kernels.rmsnorm as rmsnorm

        monkeypatch.setattr(norm_ops, "_use_kernel", lambda *t: True)
        monkeypatch.setattr(norm_ops, "_rmsnorm_kernels", lambda: rmsnorm)
        monkeypatch.setattr(rotary_ops, "gpu_kernels", lambda name, *t: mrope)
    (want,), (got,) = unfused_session(m).run(None, f), unfused_session(folded).run(None, f)
    assert got.dtype == want.dtype == np.float16
    if kernel:
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=2e-3)
        assert np.mean(got != want) < 0.05  # most values bit for bit
    else:
        np.testing.assert_array_equal(got, want)


def _casts_folded(m: onnx.ModelProto) -> onnx.ModelProto:
    apply_rules(m, [NORM_CASTS])
    return m


def test_refuses_with_a_reason() -> None:
    m = _casts_folded(norm_rope(inner_shape=[0, 3, -1]))
    assert "not [0, -1, n]" in rule_reason(NORM_ROTARY, m, "RotaryEmbedding")
    m = _casts_folded(norm_rope(outer_shape=[0, -1, 48]))
    assert "whole heads" in rule_reason(NORM_ROTARY, m, "RotaryEmbedding")
    m = norm_rope(read_twice=True)
    assert _fold(m)[1].get("NormRotary") is None
    assert "read by another node" in rule_reason(NORM_ROTARY, _casts_folded(m), "RotaryEmbedding")


def test_runs_off_the_cpu_after_fold_norm_casts() -> None:
    """Off the CPU only, after FoldNormCasts; a CPU session of the folded graph gives the nodes' values."""
    assert NORM_ROTARY not in fusion_rules(None, torch.device("cpu"))
    rules = fusion_rules(None, torch.device("cuda"))
    assert rules.index(NORM_ROTARY) > rules.index(NORM_CASTS)
    m = norm_rope()
    folded, _ = _fold(m)
    f = _feeds(m)
    sess = crossml.InferenceSession(folded, providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(sess.run(None, f)[0], unfused_session(m).run(None, f)[0])


@pytest.mark.gpu
@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("S", [1, 3], ids=["decode", "prompt"])
def test_gpu_session_matches_unfused(form: str, S: int) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU: torch sees none on this machine")
    m = norm_rope(**FORMS[form])
    sess = crossml.InferenceSession(m, providers=["GPUExecutionProvider"])
    assert [n.op_type for n in sess._model.graph.node] == ["RotaryEmbedding"]
    f = _feeds(m, S)
    (got,), (want,) = sess.run(None, f), unfused_session(m, "GPUExecutionProvider").run(None, f)
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=2e-3)
