"""LFM2's short-convolution block rule (Transpose, Split, Mul, com.microsoft CausalConvWithState, Mul, Transpose =>
com.crossml ShortConv): what it fuses, what it refuses (with a reason), and the fused model's values, the six nodes'
bit for bit on the CPU (numba's kernel, and the op's torch path where the kernel does not take it)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

import crossml
from crossml.graph.passes import GraphView, apply_rules
from crossml.graph.passes.short_conv import SHORT_CONV
from crossml.runtime.session import fusion_rules
from tests.graph._rules import contrib_model, unfused_session

RNG = np.random.default_rng(21)
C, K = 8, 3


def block(*, bias: bool = True, activation: str = "none", dilation: int = 1, perm: list[int] | None = None,
          split: list[int] | None = None, split_const: bool = True, c_twice: bool = False,
          state_window: int = 0) -> onnx.ModelProto:
    """h [batch, length, 3C] -> the builder's six nodes -> y [batch, length, C], present [batch, C, span]."""
    inits = [numpy_helper.from_array(RNG.standard_normal((C, 1, K)).astype(np.float32), "w")]
    if bias:
        inits.append(numpy_helper.from_array(RNG.standard_normal(C).astype(np.float32), "b"))
    sizes = split or [C, C, C]
    nodes = [h.make_node("Transpose", ["h"], ["t"], name="t1", perm=perm or [0, 2, 1])]
    if split_const:
        nodes.append(h.make_node("Constant", [], ["sizes"], name="sizes",
                                 value=numpy_helper.from_array(np.array(sizes, np.int64))))
    nodes += [h.make_node("Split", ["t", "sizes" if split_const else ""], ["b_", "c_", "x_"], name="split", axis=1),
              h.make_node("Mul", ["b_", "x_"], ["bx"], name="m1"),
              h.make_node("CausalConvWithState", ["bx", "w", "b" if bias else "", "past"], ["conv", "present"],
                          name="conv", domain="com.microsoft", activation=activation, dilation=dilation,
                          **({"state_window": state_window} if state_window else {})),
              h.make_node("Mul", ["c_", "conv"], ["y_"], name="m2"),
              h.make_node("Transpose", ["y_"], ["y"], name="t2", perm=[0, 2, 1])]
    span = (K - 1) * dilation
    inputs = [h.make_tensor_value_info("h", T.FLOAT, ["batch", "length", 3 * C]),
              h.make_tensor_value_info("past", T.FLOAT, ["batch", C, span])]
    outputs = [h.make_tensor_value_info("y", T.FLOAT, None), h.make_tensor_value_info("present", T.FLOAT, None)]
    if c_twice:
        nodes.append(h.make_node("Relu", ["c_"], ["rc"], name="other"))
        outputs.append(h.make_tensor_value_info("rc", T.FLOAT, None))
    return contrib_model(nodes, inputs, outputs, inits)


def _feeds(rows: int, length: int, dilation: int = 1) -> dict[str, np.ndarray]:
    return {"h": RNG.standard_normal((rows, length, 3 * C)).astype(np.float32),
            "past": RNG.standard_normal((rows, C, (K - 1) * dilation)).astype(np.float32)}


@pytest.mark.parametrize("kw", [{}, {"bias": False}, {"dilation": 2}, {"activation": "silu"}],
                         ids=["plain", "no-bias", "dilation", "silu"])
@pytest.mark.parametrize("rows,length", [(1, 1), (2, 1), (1, 7), (3, 5)])
def test_cpu_session_fuses_and_equals_the_six_nodes(kw: dict, rows: int, length: int, monkeypatch) -> None:
    from crossml.kernels import load, warm_cpu

    kernels = load("cpu_conv")
    calls = []
    warm_cpu({"ShortConv"})  # the session's first creation in a process warms the kernel by calling it: not counted
    if kernels is not None:
        real = kernels.short_conv
        monkeypatch.setattr(kernels, "short_conv", lambda *a: calls.append(1) or real(*a))
    m = block(**kw)
    fused = onnx.ModelProto()
    fused.CopyFrom(m)
    assert apply_rules(fused, [SHORT_CONV]) == {"ShortConv": 1}
    assert [n.op_type for n in fused.graph.node] == ["Constant", "ShortConv"] or \
        [n.op_type for n in fused.graph.node] == ["ShortConv"]
    feeds = _feeds(rows, length, kw.get("dilation", 1))
    got = crossml.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feeds)
    want = unfused_session(m).run(None, feeds)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    # the kernel takes no activation (torch's sigmoid is not numba's): the op's torch path runs then
    assert bool(calls) == (kernels is not None and kw.get("activation", "none") == "none")


def test_fusion_rules_include_it() -> None:
    import torch

    assert SHORT_CONV in fusion_rules(None, torch.device("cpu"))
    assert SHORT_CONV in fusion_rules(None, torch.device("cuda"))


@pytest.mark.parametrize("kw,says", [({"perm": [1, 0, 2]}, "perm [1, 0, 2]"),
                                     ({"split": [C - 2, C + 2, C]}, "three equal parts"),
                                     ({"c_twice": True}, "'c_' is read outside the block"),
                                     ({"state_window": 2}, "state_window=2")])
def test_refuses_with_a_reason(kw: dict, says: str) -> None:
    m = block(**kw)
    view = GraphView.of(m.graph)
    last = [n for n in m.graph.node if n.op_type == "Transpose"][-1]  # the match starts at the block's last node
    reason = SHORT_CONV.check(view, SHORT_CONV.match(view, last))
    assert reason is not None and says in reason
    fused = onnx.ModelProto()
    fused.CopyFrom(m)
    assert apply_rules(fused, [SHORT_CONV]) == {}
