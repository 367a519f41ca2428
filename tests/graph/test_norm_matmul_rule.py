"""The norm + 4-bit product rule (SimplifiedLayerNormalization or SkipSimplifiedLayerNormalization feeding a
MatMulNBits => com.crossml NormMatMulNBits): what it fuses, what it refuses (with a reason), and the fused
model's results. On the CPU the fused op composes the two ops, so the results are equal bit for bit; the
one-launch GPU kernel is checked in tests/kernels/test_matmul_nbits.py and on the GPU LLM tests."""

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
from crossml.graph.load import prepare
from crossml.graph.passes import apply_rules
from crossml.graph.passes.gate_up import GATE_UP, GATE_UP_NBITS
from crossml.graph.passes.norm_matmul import NORM_MATMUL, NORM_MATMUL_CPU
from crossml.graph.passes.sibling_matmul import SIBLING_MATMUL
from crossml.runtime.session import fusion_rules
from tests.conftest import make_model
from tests.graph._rules import rule_reason, unfused_session
from tests.ops.contrib.test_matmul_nbits import quantized_weight

MS = "com.microsoft"
K, N = 64, 40
RNG = np.random.default_rng(5)


def layer(*, skip: bool = True, level: int = 0, h_twice: bool = False, stat_used: bool = False,
          bias: bool = False, axis: int = -1) -> onnx.ModelProto:
    """x (+ skip) -> norm -> MatMulNBits -> y; the skip norm's sum is an output too (a residual)."""
    B, scales, _ = quantized_weight(N, K, 4, 32, None)
    inits = [numpy_helper.from_array(B, "B"), numpy_helper.from_array(scales, "scales"),
             numpy_helper.from_array((RNG.random(K) + 0.5).astype(np.float32), "gamma")]
    inputs = [h.make_tensor_value_info("x", T.FLOAT, ["batch", "seq", K])]
    outputs = [h.make_tensor_value_info("y", T.FLOAT, None)]
    if skip:
        inputs.append(h.make_tensor_value_info("skip", T.FLOAT, ["batch", "seq", K]))
        norm_in = ["x", "skip", "gamma"]
        if bias:
            inits.append(numpy_helper.from_array(np.ones(K, np.float32), "nbias"))
            norm_in.append("nbias")
        norm = h.make_node("SkipSimplifiedLayerNormalization", norm_in, ["h", "", "inv" if stat_used else "", "sum"],
                           name="norm", domain=MS, epsilon=1e-6)
        outputs.append(h.make_tensor_value_info("sum", T.FLOAT, None))
    else:
        norm = h.make_node("SimplifiedLayerNormalization", ["x", "gamma"], ["h", "inv" if stat_used else ""],
                           name="norm", epsilon=1e-6, axis=axis)
    if stat_used:
        outputs.append(h.make_tensor_value_info("inv", T.FLOAT, None))
    nodes = [norm, h.make_node("MatMulNBits", ["h", "B", "scales"], ["y"], name="proj", domain=MS, K=K, N=N, bits=4,
                               block_size=32, accuracy_level=level)]
    if h_twice:
        nodes.append(h.make_node("Relu", ["h"], ["r"], name="other"))
        outputs.append(h.make_tensor_value_info("r", T.FLOAT, None))
    m = make_model(nodes, inputs, outputs, inits)
    m.opset_import.append(h.make_opsetid(MS, 1))
    return prepare(m)


def _feeds(m: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {vi.name: RNG.standard_normal((2, 3, K)).astype(np.float32) for vi in m.graph.input}


@pytest.mark.parametrize("rows", [(2, 3), (1, 1), (1, 12)], ids=["6-rows", "decode", "prompt"])
@pytest.mark.parametrize("level", [0, 4])
@pytest.mark.parametrize("skip", [True, False], ids=["skip", "first-layer"])
def test_fused_model_equals_unfused(skip: bool, level: int, rows: tuple[int, int],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused node's values are the two ops' bit for bit on the CPU: at accuracy level 4 (the CPU's rule) with a
    skip, the rows (any number at these 32-value blocks) run the skip norm's kernel and the int8 kernel from the fused
    node once the first run has kept the weight's arrays (two runs; checked with a spy where that kernel runs here)."""
    calls = _spy_int8(monkeypatch, "norm_matmul")
    m = layer(skip=skip, level=level)
    fused = onnx.ModelProto()
    fused.CopyFrom(m)
    assert apply_rules(fused, [NORM_MATMUL_CPU if level == 4 else NORM_MATMUL]) == {"NormMatMulNBits": 1}
    (node,) = fused.graph.node
    assert node.op_type == "NormMatMulNBits" and node.domain == "com.crossml"
    assert list(node.output) == (["y", "sum"] if skip else ["y"])
    assert list(node.input[:3]) == (["x", "skip", "gamma"] if skip else ["x", "", "gamma"])
    assert {a.name: h.get_attribute_value(a) for a in node.attribute}.get("accuracy_level", 0) == level
    sess = crossml.InferenceSession(fused, providers=["CPUExecutionProvider"])
    for _ in range(2):
        f = {vi.name: RNG.standard_normal((*rows, K)).astype(np.float32) for vi in m.graph.input}
        want = unfused_session(m).run(None, f)
        for a, b in zip(sess.run(None, f), want, strict=True):
            np.testing.assert_array_equal(a, b)
    if calls is not None:
        assert len(calls) == (1 if skip and level == 4 else 0)  # blocks of 32: any number of rows (CPU_INT8_ANY_ROWS)


def _spy_int8(monkeypatch: pytest.MonkeyPatch, name: str) -> list | None:
    """Calls of ``crossml.kernels.cpu_int8.<name>`` from here on; None where that kernel does not run here (no numba,
    no AVX2)."""
    try:
        from crossml.kernels import cpu_int8
    except ImportError:
        return None
    if not cpu_int8.AVAILABLE:
        return None
    calls = []
    real = getattr(cpu_int8, name)
    monkeypatch.setattr(cpu_int8, name, lambda *a, **kw: calls.append(1) or real(*a, **kw))
    return calls


def _reason(m: onnx.ModelProto) -> str | None:
    return rule_reason(NORM_MATMUL, m, "MatMulNBits")


@pytest.mark.parametrize(("kw", "says"), [
    ({"h_twice": True}, "used elsewhere"),
    ({"stat_used": True}, "a statistic"),
    ({"level": 4}, "accuracy_level=4"),
    ({"bias": True}, "bias input"),
    ({"skip": False, "axis": 1}, "axis=1"),
])
def test_refuses_with_a_reason_and_leaves_the_graph(kw: dict, says: str) -> None:
    m = layer(**kw)
    assert says in (_reason(m) or "")
    before = m.SerializeToString()
    assert apply_rules(m, [NORM_MATMUL]) == {}
    assert m.SerializeToString() == before


def test_cpu_rule_takes_level_4() -> None:
    assert rule_reason(NORM_MATMUL_CPU, layer(level=4), "MatMulNBits") is None


def test_registered_after_gate_up_the_cpu_taking_level_4() -> None:
    rules = fusion_rules(None, torch.device("cpu"))
    assert NORM_MATMUL not in rules and rules.index(NORM_MATMUL_CPU) == rules.index(GATE_UP_NBITS) + 1
    for gpu in (None, SimpleNamespace(disable_metacommands=False), SimpleNamespace(disable_metacommands=True)):
        rules = fusion_rules(gpu, torch.device("cuda"))
        # after the products are merged (MergeGateUp, then MergeSiblingMatMul)
        assert rules.index(NORM_MATMUL) == rules.index(SIBLING_MATMUL) + 1 == rules.index(GATE_UP) + 2


@pytest.mark.gpu
@pytest.mark.parametrize("skip", [True, False], ids=["skip", "first-layer"])
def test_gpu_session_fuses_and_matches_the_cpu(skip: bool) -> None:
    """A GPU session applies the rule and runs the one-launch kernel (6 rows, K=64); its outputs match the CPU
    session's within fp32 rounding (the kernel does not round the normalized activations)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU: torch sees none on this machine")
    m = layer(skip=skip)
    f = _feeds(m)
    want = crossml.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, f)
    sess = crossml.InferenceSession(m, providers=["GPUExecutionProvider"])
    assert [n.op_type for n in sess._model.graph.node] == ["NormMatMulNBits"]
    got = sess.run(None, f)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_wide_norms_fuse_where_the_pair_kernel_takes_k_in_one_step() -> None:
    """norm_fuses at the GenAI benchmark's shapes on a 132-SM GPU: K <= 1024 always fuses; Llama-3.2-1B's qkv
    (K=2048, N=3072: 8 rows by all of K) fuses, its gate+up (N=16384: 512-wide steps) does not, nor anything wider
    than 1024 that the fp16-pair kernel does not take."""
    from crossml.kernels.matmul_nbits import pick_pair_tiles
    from crossml.ops.fused import NORM_FUSE_MAX_K, norm_fuses

    assert norm_fuses(896, None) and norm_fuses(NORM_FUSE_MAX_K, None)
    assert norm_fuses(2048, pick_pair_tiles(1, 3072, 2048, 32, 132))
    assert not norm_fuses(2048, pick_pair_tiles(1, 16384, 2048, 32, 132))
    assert not norm_fuses(2048, None)


@pytest.mark.gpu
@pytest.mark.parametrize("skip", [True, False], ids=["skip", "first-layer"])
def test_gpu_wide_norm_in_one_step_matches_the_two_ops(skip: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """NormMatMulNBits at Llama-3.2-1B's qkv shape (fp16, K=2048, N=3072, one row) is one launch of the 4-bit
    kernel with the norm; its output matches the RMSNorm then the 4-bit product (within fp16 rounding of the
    products) and its sum is x + skip exactly."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU: torch sees none on this machine")
    from crossml.kernels import matmul_nbits as kernels
    from crossml.ops.contrib.matmul_nbits import matmul_nbits
    from crossml.ops.fused import norm_matmul_nbits
    from crossml.ops.registry import OpContext

    k, n, dev = 2048, 3072, torch.device("cuda")
    B, scales, _ = quantized_weight(n, k, 4, 32, None)
    B, scales = torch.from_numpy(B).to(dev), torch.from_numpy(scales).half().to(dev)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1, 1, k, generator=gen).half().to(dev)
    sk = torch.randn(1, 1, k, generator=gen).half().to(dev) if skip else None
    gamma = (torch.rand(k, generator=gen) + 0.5).half().to(dev)
    fused_calls = []
    real = kernels.matmul_nbits
    monkeypatch.setattr(kernels, "matmul_nbits",
                        lambda *a, **kw: fused_calls.append(kw.get("norm") is not None) or real(*a, **kw))
    ctx = OpContext("norm_proj", "NormMatMulNBits", 1, 2, (None, None), (True, skip), dev)
    y, s = norm_matmul_nbits(x, sk, gamma, B, scales, epsilon=1e-6, K=k, N=n, block_size=32, ctx=ctx)
    assert fused_calls == [True]
    h32 = x.float() + (sk.float() if skip else 0.0)
    normed = (h32 * torch.rsqrt(h32.square().mean(-1, keepdim=True) + 1e-6) * gamma.float()).half()
    want = matmul_nbits(normed, B, scales, K=k, N=n, block_size=32)
    torch.testing.assert_close(y.float(), want.float(), rtol=2e-2, atol=2e-2 * want.float().abs().max().item())
    if skip:
        assert torch.equal(s, h32.half())
    else:
        assert s is None


@pytest.mark.gpu
def test_gpu_batched_rows_run_the_norm_then_the_matrix_unit_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """At 8 fp16 rows (a batched decode step) NormMatMulNBits runs the norm kernel, then the 4-bit product on a
    matrix-unit kernel (the Gluon mma kernel where it applies, as here; no fused norm, whose per-row arithmetic would
    grow with the rows): the two ops' results, bit for bit."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU: torch sees none on this machine")
    from crossml.kernels import matmul_nbits as kernels
    from crossml.kernels import nbits_mma
    from crossml.ops.contrib.matmul_nbits import matmul_nbits
    from crossml.ops.contrib.norm import skip_simplified_layer_normalization
    from crossml.ops.fused import norm_matmul_nbits
    from crossml.ops.registry import OpContext

    k, n, rows, dev = 896, 1152, 8, torch.device("cuda")
    B, scales, _ = quantized_weight(n, k, 4, 32, None)
    B, scales = torch.from_numpy(B).to(dev), torch.from_numpy(scales).half().to(dev)
    gen = torch.Generator().manual_seed(4)
    x, sk = (torch.randn(rows, 1, k, generator=gen).half().to(dev) for _ in range(2))
    gamma = (torch.rand(k, generator=gen) + 0.5).half().to(dev)
    dot_calls = []
    for module, name in ((kernels, "_dot_product"), (nbits_mma, "mma_product")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _r=real, _n=name, **kw: dot_calls.append(_n) or _r(*a, **kw))
    ctx = OpContext("norm_proj", "NormMatMulNBits", 1, 2, (None, None), (True, True), dev)
    y, s = norm_matmul_nbits(x, sk, gamma, B, scales, epsilon=1e-6, K=k, N=n, block_size=32, ctx=ctx)
    assert dot_calls == ["mma_product"]
    sub = OpContext("norm", "SkipSimplifiedLayerNormalization", 1, 4, (None,) * 4, (True, False, False, True), dev)
    normed, _, _, want_s = skip_simplified_layer_normalization(x, sk, gamma, epsilon=1e-6, ctx=sub)
    assert torch.equal(y, matmul_nbits(normed, B, scales, K=k, N=n, block_size=32))
    assert torch.equal(s, want_s)
