"""The attention + output projection rule (GroupQueryAttention feeding a MatMulSkipNorm => com.crossml
AttentionSkipNorm): what it fuses, what it refuses (with a reason), and the fused op's results. On the CPU the fused
op runs the two ops, so the results are equal bit for bit; on a GPU the decode step's split attention goes to
``combine_product`` and the skip-norm kernel, compared here with the two ops on the GPU and with the CPU."""

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
from crossml.graph.passes.matmul_norm import ATTENTION_NORM, MATMUL_NORM, SILU_MUL_NORM
from crossml.ops import fused as fused_ops
from crossml.ops.contrib.attention import group_query_attention
from crossml.ops.fused import attention_skip_norm, matmul_skip_norm
from crossml.ops.registry import OpContext
from crossml.runtime.session import fusion_rules
from tests.graph._rules import contrib_model, rule_reason

MS = "com.microsoft"
RNG = np.random.default_rng(11)


def layer(*, N: int = 4, Nk: int = 2, H: int = 16, L: int = 32, n: int = 24, dtype: type = np.float32,
          o_twice: bool = False, want_sum: bool = True) -> onnx.ModelProto:
    """Packed QKV -> GroupQueryAttention (rotary, past and present) -> o; MatMul(o, Wo) -> y;
    SkipSimplifiedLayerNormalization(r, y, gamma) -> (normed, sum)."""
    et = T.FLOAT if dtype == np.float32 else T.FLOAT16
    half = H // 2
    ang = np.arange(L)[:, None] / (10000 ** (np.arange(half) / half))[None, :]
    inits = [numpy_helper.from_array(np.cos(ang).astype(dtype), "cos"),
             numpy_helper.from_array(np.sin(ang).astype(dtype), "sin"),
             numpy_helper.from_array((RNG.standard_normal((N * H, n)) * 0.1).astype(dtype), "Wo"),
             numpy_helper.from_array((RNG.random(n) + 0.5).astype(dtype), "gamma")]
    inputs = [h.make_tensor_value_info("qkv", et, ["batch", "seq", (N + 2 * Nk) * H]),
              h.make_tensor_value_info("past_key", et, ["batch", Nk, L, H]),
              h.make_tensor_value_info("past_value", et, ["batch", Nk, L, H]),
              h.make_tensor_value_info("seqlens_k", T.INT32, ["batch"]),
              h.make_tensor_value_info("total_sequence_length", T.INT32, []),
              h.make_tensor_value_info("r", et, ["batch", "seq", n])]
    outputs = [h.make_tensor_value_info("normed", et, None), h.make_tensor_value_info("sum", et, None),
               h.make_tensor_value_info("present_key", et, None), h.make_tensor_value_info("present_value", et, None)]
    if not want_sum:
        del outputs[1]
    nodes = [h.make_node("GroupQueryAttention", ["qkv", "", "", "past_key", "past_value", "seqlens_k",
                                                 "total_sequence_length", "cos", "sin"],
                         ["o", "present_key", "present_value"], name="attn", domain=MS, num_heads=N,
                         kv_num_heads=Nk, do_rotary=1),
             h.make_node("MatMul", ["o", "Wo"], ["y"], name="o_proj"),
             h.make_node("SkipSimplifiedLayerNormalization", ["r", "y", "gamma"],
                         ["normed", "", "", "sum" if want_sum else ""], name="norm", domain=MS, epsilon=1e-6)]
    if o_twice:
        nodes.append(h.make_node("Relu", ["o"], ["ro"], name="other"))
        outputs.append(h.make_tensor_value_info("ro", et, None))
    return contrib_model(nodes, inputs, outputs, inits)


def _feeds(B: int = 2, S: int = 1, past: int = 9, N: int = 4, Nk: int = 2, H: int = 16, L: int = 32, n: int = 24,
           dtype: type = np.float32) -> dict[str, np.ndarray]:
    return {"qkv": RNG.standard_normal((B, S, (N + 2 * Nk) * H)).astype(dtype),
            "past_key": RNG.standard_normal((B, Nk, L, H)).astype(dtype),
            "past_value": RNG.standard_normal((B, Nk, L, H)).astype(dtype),
            "seqlens_k": np.array([past + S - 1 - b for b in range(B)], np.int32),
            "total_sequence_length": np.array(past + S, np.int32),
            "r": RNG.standard_normal((B, S, n)).astype(dtype)}


@pytest.mark.parametrize(("B", "S", "want_sum"), [(2, 1, True), (1, 3, True), (2, 1, False)],
                         ids=["decode", "prompt_chunk", "no_sum"])
def test_fused_model_equals_unfused(B: int, S: int, want_sum: bool) -> None:
    m = layer(want_sum=want_sum)
    f = _feeds(B=B, S=S)
    want = crossml.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, f)
    fused = onnx.ModelProto()
    fused.CopyFrom(m)
    assert apply_rules(fused, [MATMUL_NORM, ATTENTION_NORM]) == {"MatMulSkipNorm": 1, "AttentionSkipNorm": 1}
    (node,) = fused.graph.node
    assert node.op_type == "AttentionSkipNorm" and node.domain == "com.crossml"
    attrs = {a.name: h.get_attribute_value(a) for a in node.attribute}
    assert attrs["gqa_inputs"] == 9 and attrs["num_heads"] == 4 and attrs["kv_num_heads"] == 2
    assert list(node.input[9:]) == ["Wo", "", "r", "gamma"]
    assert list(node.output) == ["normed", "sum" if want_sum else "", "present_key", "present_value"]
    got = crossml.InferenceSession(fused, providers=["CPUExecutionProvider"]).run(None, f)
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_refuses_with_a_reason_and_leaves_the_graph() -> None:
    m = layer(o_twice=True)
    apply_rules(m, [MATMUL_NORM])
    assert "is used elsewhere" in (rule_reason(ATTENTION_NORM, m, "MatMulSkipNorm") or "")
    before = m.SerializeToString()
    assert apply_rules(m, [ATTENTION_NORM]) == {}
    assert m.SerializeToString() == before


def test_registered_last_on_gpu_sessions() -> None:
    assert ATTENTION_NORM not in fusion_rules(None, torch.device("cpu"))
    assert ATTENTION_NORM not in fusion_rules(SimpleNamespace(disable_metacommands=True), torch.device("cuda"))
    rules = fusion_rules(None, torch.device("cuda"))
    assert rules.index(ATTENTION_NORM) > rules.index(SILU_MUL_NORM) > rules.index(MATMUL_NORM)


def _ctx(op_type: str, outputs: int, device: torch.device) -> OpContext:
    return OpContext("n", op_type, 1, outputs, (None,) * outputs, (True,) * outputs, device)


def _both(device: str, B: int, N: int, Nk: int, H: int, L: int, n: int, past: int, dtype: torch.dtype,
          bias: bool = False) -> tuple[tuple, tuple]:
    """(fused op's results, the two ops' results) of one decode step on ``device``."""
    g = torch.Generator().manual_seed(3)
    dev = torch.device(device)

    def rnd(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(shape, generator=g) * scale).to(dtype).to(dev)

    half = H // 2
    ang = torch.arange(L + 8, dtype=torch.float64)[:, None] / (10000 ** (torch.arange(half) / half))[None, :]
    cos, sin = ang.cos().to(dtype).to(dev), ang.sin().to(dtype).to(dev)
    qkv = rnd(B, 1, (N + 2 * Nk) * H)
    pk, pv = rnd(B, Nk, L, H), rnd(B, Nk, L, H)
    seqlens = torch.tensor([past - b for b in range(B)], dtype=torch.int32, device=dev)
    total = torch.tensor(past + 1, dtype=torch.int32)
    w, r, gamma = rnd(N * H, n, scale=(N * H) ** -0.5), rnd(B, 1, n), rnd(n).abs() + 0.5
    b = rnd(n) if bias else None
    gqa = (qkv, None, None, pk.clone(), pv.clone(), seqlens, total, cos, sin)
    attrs = {"num_heads": N, "kv_num_heads": Nk, "do_rotary": 1}
    fused = attention_skip_norm(*gqa, w, b, r, gamma, gqa_inputs=len(gqa), epsilon=1e-6,
                                ctx=_ctx("AttentionSkipNorm", 4, dev), **attrs)
    gqa = (qkv, None, None, pk.clone(), pv.clone(), seqlens, total, cos, sin)
    o, k, v = group_query_attention(*gqa, **attrs, ctx=_ctx("GroupQueryAttention", 3, dev))[:3]
    normed, s = matmul_skip_norm(o, w, b, r, gamma, epsilon=1e-6, ctx=_ctx("MatMulSkipNorm", 2, dev))
    return tuple(fused), (normed, s, k, v)


def test_op_on_the_cpu_equals_the_two_ops() -> None:
    fused, plain = _both("cpu", 2, 4, 2, 16, 40, 24, 30, torch.float32, bias=True)
    for a, b in zip(fused, plain, strict=True):
        assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize(("B", "N", "Nk", "H", "L", "n", "past", "dtype", "bias"), [
    (1, 14, 2, 64, 768, 896, 640, torch.float16, False),  # Qwen2.5-0.5B's shapes: one head a program
    (1, 32, 8, 64, 768, 2048, 700, torch.float16, False),  # Llama-3.2-1B's: four heads a program
    (2, 6, 2, 128, 300, 320, 250, torch.bfloat16, True),
    (3, 12, 4, 64, 256, 192, 200, torch.float16, True),
])
@pytest.mark.parametrize("rows_rule", ["one_row", "all_rows"])
def test_gpu_op_matches_the_two_ops(B: int, N: int, Nk: int, H: int, L: int, n: int, past: int, dtype: torch.dtype,
                                    bias: bool, rows_rule: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused decode step (the split attention's partials to ``combine_product``, then the skip-norm kernel)
    against the GroupQueryAttention and MatMulSkipNorm ops on the GPU and the fp32 CPU ops: normalized values and
    sums within the dtype's rounding (the projection adds its products in another order), caches equal. Past
    ATTENTION_PRODUCT_ROWS batch rows (``one_row``: the rule's 1) the op runs the two ops' kernels, bit for bit."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU: torch sees none on this machine")
    from crossml.kernels import decode_attention
    from tests.kernels._common import record_calls

    monkeypatch.setattr(fused_ops, "ATTENTION_PRODUCT_ROWS", max(B, 1) if rows_rule == "all_rows" else 1)
    calls = record_calls(monkeypatch, decode_attention, "combine_product")
    fused, plain = _both("cuda", B, N, Nk, H, L, n, past, dtype, bias)
    if B > 1 and rows_rule == "one_row":  # the combine kernel and the GEMV, as the two ops run them
        assert calls == []
        for a, b in zip(fused, plain, strict=True):
            assert torch.equal(a, b)
        return
    assert calls == ["combine_product"], "the fused path did not run"
    tol = 2e-2 if dtype == torch.bfloat16 else 4e-3
    for a, b in zip(fused[:2], plain[:2], strict=True):
        torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol)
    for a, b in zip(fused[2:], plain[2:], strict=True):
        assert torch.equal(a, b)
    cpu = _both("cpu", B, N, Nk, H, L, n, past, torch.float32, bias)[1]
    torch.testing.assert_close(fused[0].float().cpu(), cpu[0], rtol=5 * tol, atol=5 * tol)


def test_product_tiles() -> None:
    """``combine_product``'s programs: the fewest heads whose partial-sum rows the skip-norm kernel adds in one tile
    (Qwen2.5-0.5B 1, Llama-3.2-1B 4; more than 8: the two ops) if their splits' partial results stay within 4096
    values (else the two ops), 128 columns or fewer within a weight tile of 32K values."""
    from crossml.ops.fused import _product_tiles

    assert _product_tiles(14, 64, 896, 12) == (1, 128)  # 16 rows x 1024 columns in one tile
    assert _product_tiles(32, 64, 2048, 12) == (4, 128)  # 16 splits x 256 channels of partial results
    assert _product_tiles(32, 64, 2048, 17) is None  # 32 x 256
    assert _product_tiles(16, 128, 2048, 4) == (2, 128)
    assert _product_tiles(32, 128, 4096, 4) == (8, 32)  # 1024 weight rows a program: fewer columns
    assert _product_tiles(32, 128, 4096, 12) is None  # a Llama-3-8B shape, 16 x 1024 partial results
    assert _product_tiles(64, 128, 8192, 2) is None  # 32 heads a program would be needed
