"""com.microsoft CausalConvWithState against onnxruntime CPU; its state window (which onnxruntime's CPU kernel does
not take) against the op run on each prefix."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP

import crossml
from tests.ops.contrib._ort import check, single_node_model

RNG = np.random.default_rng(5)
OUT = [("y", TP.FLOAT), ("present", TP.FLOAT)]


def _inputs(b, c, length, k, *, dilation=1, bias=True, past=True, last=False, dtype=np.float32):
    span = (k - 1) * dilation
    x = RNG.standard_normal((b, length, c) if last else (b, c, length)).astype(dtype)
    state = RNG.standard_normal((b, span, c) if last else (b, c, span)).astype(dtype)
    return {"input": x, "weight": RNG.standard_normal((c, 1, k)).astype(dtype),
            "bias": RNG.standard_normal(c).astype(dtype) if bias else None, "past_state": state if past else None}


@pytest.mark.parametrize("k", [1, 2, 3, 4])
@pytest.mark.parametrize("length", [1, 2, 7])
@pytest.mark.parametrize("activation", ["none", "silu", "swish"])
def test_matches_onnxruntime(k, length, activation):
    check("CausalConvWithState", _inputs(2, 5, length, k), OUT, activation=activation)


@pytest.mark.parametrize("bias,past", [(False, True), (True, False), (False, False)])
def test_optional_inputs(bias, past):
    check("CausalConvWithState", _inputs(1, 4, 3, 3, bias=bias, past=past), OUT)


@pytest.mark.parametrize("dilation", [2, 3])
def test_dilation(dilation):
    check("CausalConvWithState", _inputs(2, 3, 6, 3, dilation=dilation), OUT, dilation=dilation, activation="silu")


@pytest.mark.parametrize("length", [1, 5])
def test_channels_last(length):
    check("CausalConvWithState", _inputs(2, 6, length, 4, last=True), OUT, channels_last=1)


def test_half_precision():
    inputs = _inputs(2, 8, 5, 4, dtype=np.float16)
    check("CausalConvWithState", inputs, [("y", TP.FLOAT16), ("present", TP.FLOAT16)], atol=3e-3, rtol=3e-3,
          activation="silu")


def _run(inputs, **attrs):
    model, feeds = single_node_model("CausalConvWithState", inputs, OUT, **attrs)
    return crossml.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("length", [1, 2, 6])
@pytest.mark.parametrize("last", [False, True])
def test_state_window_slots_are_prefix_states(length, last):
    """Slot j of a windowed present state is the plain present state of the call on the input up to position
    length - W + j; slots before the call's first position are zeros; the past state comes from slot W - 1."""
    w = 3
    inputs = _inputs(2, 4, length, 3, last=last)
    window = np.stack([RNG.standard_normal(inputs["past_state"].shape).astype(np.float32) for _ in range(w)])
    y, present = _run({**inputs, "past_state": window}, state_window=w, channels_last=int(last))
    plain = {**inputs, "past_state": window[w - 1]}
    want_y, _ = _run(plain, channels_last=int(last))
    np.testing.assert_array_equal(y, want_y)
    assert present.shape == (w, *inputs["past_state"].shape)
    for j in range(w):
        end = length - w + j + 1
        if end <= 0:
            assert not present[j].any()
            continue
        part = inputs["input"][:, :end] if last else inputs["input"][:, :, :end]
        _, want = _run({**plain, "input": np.ascontiguousarray(part)}, channels_last=int(last))
        np.testing.assert_array_equal(present[j], want)


@pytest.mark.parametrize("attrs,needle", [
    ({"ndim": 2}, "ndim=2"),
    ({"state_length": 4}, "state_length=4"),
    ({"input_channels": 2}, "input_channels=2"),
    ({"state_window": 9}, "state_window"),
    ({"activation": "gelu"}, "unsupported activation 'gelu'"),
])
def test_unsupported_attributes_are_named(attrs, needle):
    with pytest.raises(Exception, match=needle):
        _run(_inputs(1, 2, 3, 3), **attrs)


def test_bad_past_state_shape():
    inputs = _inputs(1, 2, 3, 3)
    inputs["past_state"] = inputs["past_state"][:, :, :1].copy()
    with pytest.raises(Exception, match=r"past_state must have shape \(1, 2, 2\)"):
        _run(inputs)


@pytest.mark.parametrize("length,dilation,bias", [(1, 1, True), (1, 2, False), (9, 1, True), (9, 3, True)])
def test_cpu_kernel_matches_the_torch_path(length, dilation, bias):
    """float32 CPU tensors take numba's kernel (crossml.kernels.cpu_conv); the torch path (kept where the caller
    needs the padded sequence) gives the same outputs within a rounding."""
    import torch

    from crossml.kernels import load
    from crossml.ops.attention import causal_conv

    if load("cpu_conv") is None:
        pytest.skip("numba is not installed: the torch path is the only one")
    x, w = torch.randn(2, 6, length), torch.randn(6, 1, 4)
    b = torch.randn(6) if bias else None
    past = torch.randn(2, 6, 3 * dilation)
    out, present, padded = causal_conv(x, w, b, past, "silu", dilation)
    assert padded is None  # the kernel ran
    ref_out, ref_present, _ = causal_conv(x, w, b, past, "silu", dilation, keep_padded=True)
    torch.testing.assert_close(out, ref_out, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(present, ref_present, atol=0, rtol=0)


@pytest.mark.parametrize("length,dilation,bias", [(1, 1, True), (2, 2, False), (8, 1, True), (9, 1, True),
                                                  (33, 3, False), (130, 2, True)])
def test_cpu_kernel_loop_orders_are_bit_identical(length, dilation, bias):
    """numba's two loop orders for the plain layout (each tap over all channels, for a few positions; each tap over
    a channel's positions, for more) add the same products in the same order, so they give the same bits at every
    width. (LFM2's gated block always takes the first; test_short_conv_rule checks it against the six nodes.)"""
    import numpy as np

    from crossml.kernels import load

    kernels = load("cpu_conv")
    if kernels is None:
        pytest.skip("numba is not installed: the torch path is the only one")
    rng = np.random.default_rng(length * 10 + dilation)
    rows, channels, taps = 2, 37, 4
    h = rng.standard_normal((rows, channels, length)).astype(np.float32)
    past = rng.standard_normal((rows, channels, (taps - 1) * dilation)).astype(np.float32)
    w = rng.standard_normal((channels, taps)).astype(np.float32)
    b = rng.standard_normal(channels).astype(np.float32)
    got = []
    for fn, gated in ((kernels._across_channels, (False,)), (kernels._channel_at_a_time, ()),
                      (kernels._conv, (False,))):
        y = np.full((rows, channels, length), np.nan, np.float32)
        present = np.full(past.shape, np.nan, np.float32)
        fn(h, past, w, b, bias, dilation, *gated, y, present)
        got.append((y, present))
    assert not np.isnan(got[0][0]).any() and not np.isnan(got[0][1]).any()
    for y, present in got[1:]:
        np.testing.assert_array_equal(got[0][0], y)
        np.testing.assert_array_equal(got[0][1], present)
