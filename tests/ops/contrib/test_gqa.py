"""GroupQueryAttention against onnxruntime CPU: prompts (padded batches), decode steps, shared buffers."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
import torch
from onnx import TensorProto as TP

if not torch.cuda.is_available():  # before triton's first import: the kernel-path tests interpret the kernels
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tests.ops.contrib._ort import run_both, single_node_model

RNG = np.random.default_rng(3)


def caches(max_pos, half, dtype):
    inv = 1.0 / (10000 ** (np.arange(half) / half))
    ang = np.arange(max_pos)[:, None] * inv[None, :]
    return np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)


def gqa_io(B, S, N, Nk, H, seqlens, past=None, total=None, packed=False, rotary=False, dtype=np.float32,
           position_ids=None, attention_bias=False, head_sink=False, max_pos=64):
    """Inputs of one GQA call; ``seqlens`` are the total lengths per batch entry."""
    q = RNG.standard_normal((B, S, N * H)).astype(dtype)
    k = RNG.standard_normal((B, S, Nk * H)).astype(dtype)
    v = RNG.standard_normal((B, S, Nk * H)).astype(dtype)
    ins = {}
    if packed:
        ins["query"] = np.concatenate([q, k, v], axis=-1)
        ins["key"] = ins["value"] = None
    else:
        ins.update(query=q, key=k, value=v)
    if past is None:
        ins["past_key"] = ins["past_value"] = None
    else:
        ins["past_key"], ins["past_value"] = past
    total = max(seqlens) if total is None else total
    ins["seqlens_k"] = np.array(seqlens, np.int32) - 1
    ins["total_sequence_length"] = np.array(total, np.int32)
    if rotary:
        ins["cos_cache"], ins["sin_cache"] = caches(max_pos, H // 2, dtype)
    else:
        ins["cos_cache"] = ins["sin_cache"] = None
    ins["position_ids"] = position_ids
    ins["attention_bias"] = RNG.standard_normal((B, 1, S, total)).astype(dtype) if attention_bias else None
    ins["head_sink"] = RNG.standard_normal(N).astype(dtype) if head_sink else None
    return ins


def run_gqa(ins, N, Nk, **attrs):
    t = TP.FLOAT if ins["query"].dtype == np.float32 else TP.FLOAT16
    for name in ("head_sink", "attention_bias", "position_ids", "cos_cache", "sin_cache"):
        if ins.get(name) is None:
            ins.pop(name, None)
    order = ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache",
             "sin_cache", "position_ids", "attention_bias", "head_sink"]
    ins = {n: ins.get(n) for n in order}
    while list(ins)[-1] and ins[list(ins)[-1]] is None and list(ins)[-1] != "total_sequence_length":
        ins.pop(list(ins)[-1])
    outs = [("out", t), ("present_key", t), ("present_value", t)]
    model, feeds = single_node_model("GroupQueryAttention", ins, outs, num_heads=N, kv_num_heads=Nk, **attrs)
    return run_both(model, feeds)


def compare(ref, got, seqlens, S, first_prompt, tol):
    """Outputs of rows that are real tokens; present rows below each entry's total length."""
    out_r, pk_r, pv_r = ref
    out_g, pk_g, pv_g = (np.asarray(x) for x in got)
    assert out_g.shape == out_r.shape and pk_g.shape == pk_r.shape and pv_g.shape == pv_r.shape
    worst = 0.0
    for b, tot in enumerate(seqlens):
        rows = min(S, tot) if first_prompt else S
        for r, g in ((out_r[b, :rows], out_g[b, :rows]), (pk_r[b, :, :tot], pk_g[b, :, :tot]),
                     (pv_r[b, :, :tot], pv_g[b, :, :tot])):
            np.testing.assert_allclose(g.astype(np.float64), r.astype(np.float64), atol=tol, rtol=tol)
            worst = max(worst, float(np.abs(g.astype(np.float64) - r.astype(np.float64)).max()))
    return worst


def past_cache(B, Nk, P, H, dtype=np.float32):
    return (RNG.standard_normal((B, Nk, P, H)).astype(dtype), RNG.standard_normal((B, Nk, P, H)).astype(dtype))


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("groups", [(4, 4), (4, 2), (6, 1)])
@pytest.mark.parametrize("with_past", [False, True])
def test_prompt(packed, groups, with_past):
    N, Nk = groups
    B, S, H = 2, 6, 16
    past = past_cache(B, Nk, 0, H) if with_past else None
    ins = gqa_io(B, S, N, Nk, H, [S, S], past=past, packed=packed)
    ref, got = run_gqa(ins, N, Nk)
    compare(ref, got, [S, S], S, True, 1e-5)


@pytest.mark.parametrize("share", [False, True])
def test_prompt_right_padding(share):
    """Batched first prompt: entry 1 is shorter and right-padded."""
    N, Nk, B, S, H = 4, 2, 3, 7, 16
    seqlens = [7, 4, 1]
    past = past_cache(B, Nk, 12 if share else 0, H)
    ins = gqa_io(B, S, N, Nk, H, seqlens, past=past, total=S)
    ref, got = run_gqa(ins, N, Nk)
    compare(ref, got, seqlens, S, True, 1e-5)


@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("rotary", [False, True])
def test_decode_ragged_batch(share, rotary):
    """One new token per entry, entries at different lengths; past buffer grown or max-length (shared)."""
    N, Nk, B, H = 4, 2, 3, 32
    seqlens = [5, 9, 3]  # totals including the new token
    P = 16 if share else max(seqlens) - 1
    ins = gqa_io(B, 1, N, Nk, H, seqlens, past=past_cache(B, Nk, P, H), rotary=rotary)
    ref, got = run_gqa(ins, N, Nk, do_rotary=int(rotary))
    compare(ref, got, seqlens, 1, False, 1e-5)


@pytest.mark.parametrize("attrs", [{}, {"causal": 0}, {"local_window_size": 4}, {"qk_output": 1}],
                         ids=lambda a: "-".join(a) or "plain")
@pytest.mark.parametrize("phase", ["prompt", "decode"])
def test_shared_buffer_tail_is_not_read(attrs, phase):
    """A max-length buffer's rows past the longest sequence (``total``) hold NaN (never written): onnxruntime does not
    read them, and neither does crossml (on the CPU it cuts them before the attention, so a decode step's cost does
    not grow with max_length); masked NaN rows would otherwise turn the output NaN."""
    N, Nk, B, H, P = 4, 2, 2, 16, 64
    S, seqlens = (6, [6, 4]) if phase == "prompt" else (1, [9, 6])
    pk, pv = past_cache(B, Nk, P, H)
    pk[:, :, max(seqlens):] = np.nan
    pv[:, :, max(seqlens):] = np.nan
    ins = gqa_io(B, S, N, Nk, H, seqlens, past=(pk, pv), total=S if phase == "prompt" else None)
    order = ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length"]
    outs = [("out", TP.FLOAT), ("pk", TP.FLOAT), ("pv", TP.FLOAT)] + ([("qk", TP.FLOAT)] if attrs.get("qk_output")
                                                                     else [])
    model, feeds = single_node_model("GroupQueryAttention", {n: ins[n] for n in order}, outs, num_heads=N,
                                     kv_num_heads=Nk, **attrs)
    ref, got = run_both(model, feeds)
    rows = [min(S, t) if phase == "prompt" else S for t in seqlens]
    for b in range(B):
        assert np.isfinite(ref[0][b, :rows[b]]).all()
        np.testing.assert_allclose(np.asarray(got[0])[b, :rows[b]], ref[0][b, :rows[b]], atol=1e-5, rtol=1e-5)
    compare(ref[:3], got[:3], seqlens, S, phase == "prompt", 1e-5)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("packed", [False, True])
def test_rotary_prompt(interleaved, packed):
    N, Nk, B, S, H = 4, 2, 2, 5, 32
    ins = gqa_io(B, S, N, Nk, H, [S, 3], past=past_cache(B, Nk, 0, H), total=S, packed=packed, rotary=True)
    ref, got = run_gqa(ins, N, Nk, do_rotary=1, rotary_interleaved=interleaved)
    compare(ref, got, [S, 3], S, True, 1e-5)


def test_subsequent_prompt():
    """A second prompt chunk (S > 1) on top of 4 cached tokens, batch 1, rotary."""
    N, Nk, H, S = 4, 2, 32, 3
    ins = gqa_io(1, S, N, Nk, H, [7], past=past_cache(1, Nk, 10, H), rotary=True)
    ref, got = run_gqa(ins, N, Nk, do_rotary=1)
    compare(ref, got, [7], S, False, 1e-5)


@pytest.mark.parametrize("attrs", [{"local_window_size": 3}, {"softcap": 2.0}, {"smooth_softmax": 1},
                                   {"scale": 0.3}, {"local_window_size": 2, "softcap": 1.5}],
                         ids=lambda a: "-".join(a))
@pytest.mark.parametrize("phase", ["prompt", "decode"])
def test_attributes(attrs, phase):
    N, Nk, B, H = 4, 2, 2, 16
    if phase == "prompt":
        S, seqlens, past = 8, [8, 5], past_cache(B, Nk, 0, H)
    else:
        S, seqlens, past = 1, [9, 6], past_cache(B, Nk, 12, H)
    ins = gqa_io(B, S, N, Nk, H, seqlens, past=past, total=8 if phase == "prompt" else None)
    ref, got = run_gqa(ins, N, Nk, **attrs)
    compare(ref, got, seqlens, S, phase == "prompt", 1e-5)


@pytest.mark.parametrize("phase", ["prompt", "decode"])
def test_head_sink_and_bias(phase):
    N, Nk, B, H = 4, 2, 2, 16
    if phase == "prompt":
        S, seqlens, past = 6, [6, 6], past_cache(B, Nk, 0, H)
    else:
        S, seqlens, past = 1, [7, 7], past_cache(B, Nk, 6, H)
    ins = gqa_io(B, S, N, Nk, H, seqlens, past=past, head_sink=True)
    ref, got = run_gqa(dict(ins), N, Nk)
    compare(ref, got, seqlens, S, phase == "prompt", 1e-5)
    ins = gqa_io(B, S, N, Nk, H, seqlens, past=past, attention_bias=True)
    ref, got = run_gqa(ins, N, Nk)
    compare(ref, got, seqlens, S, phase == "prompt", 1e-5)


def test_position_ids_input():
    N, Nk, B, S, H = 4, 2, 2, 4, 32
    pos = np.array([[3, 4, 5, 6], [10, 11, 12, 13]], np.int64)
    ins = gqa_io(B, S, N, Nk, H, [S, S], past=past_cache(B, Nk, 0, H), rotary=True, position_ids=pos)
    ref, got = run_gqa(ins, N, Nk, do_rotary=1)
    compare(ref, got, [S, S], S, True, 1e-5)


@pytest.mark.parametrize("phase", ["prompt", "decode"])
def test_fp16(phase):
    N, Nk, B, H = 4, 2, 2, 32
    if phase == "prompt":
        S, seqlens, past = 6, [6, 4], past_cache(B, Nk, 0, H, np.float16)
    else:
        S, seqlens, past = 1, [7, 5], past_cache(B, Nk, 10, H, np.float16)
    ins = gqa_io(B, S, N, Nk, H, seqlens, past=past, total=6 if phase == "prompt" else None, rotary=True,
                 dtype=np.float16)
    ref, got = run_gqa(ins, N, Nk, do_rotary=1)
    compare(ref, got, seqlens, S, phase == "prompt", 3e-3)


@pytest.mark.parametrize("share", [False, True])
def test_generation_loop(share):
    """Prompt then decode steps, feeding the present buffers back as past (a batch of two lengths)."""
    N, Nk, B, H, max_len = 4, 2, 2, 32, 16
    prompt = [5, 3]
    S = max(prompt)
    past = past_cache(B, Nk, max_len if share else 0, H)
    ins = gqa_io(B, S, N, Nk, H, prompt, past=past, total=S, rotary=True)
    ref, got = run_gqa(ins, N, Nk, do_rotary=1)
    compare(ref, got, prompt, S, True, 1e-5)
    lens = list(prompt)
    pr, pg = ref[1:], [np.asarray(x) for x in got[1:]]
    for _ in range(4):
        lens = [n + 1 for n in lens]
        ins = gqa_io(B, 1, N, Nk, H, lens, past=pr, rotary=True)
        ref, _ = run_gqa(dict(ins), N, Nk, do_rotary=1)
        ins["past_key"], ins["past_value"] = pg
        _, got = run_gqa(ins, N, Nk, do_rotary=1)
        compare(ref, got, lens, 1, False, 1e-5)
        pr, pg = ref[1:], [np.asarray(x) for x in got[1:]]


def test_position_ids_decode():
    N, Nk, B, H = 4, 2, 2, 32
    seqlens = [6, 4]
    pos = np.array([[9], [2]], np.int64)
    ins = gqa_io(B, 1, N, Nk, H, seqlens, past=past_cache(B, Nk, 8, H), rotary=True, position_ids=pos)
    ref, got = run_gqa(ins, N, Nk, do_rotary=1)
    compare(ref, got, seqlens, 1, False, 1e-5)


@pytest.mark.parametrize("attrs", [{"causal": 0}, {"qk_output": 1}, {"qk_output": 2}], ids=str)
@pytest.mark.parametrize("phase", ["prompt", "decode"])
def test_causal_off_and_qk_output(attrs, phase):
    N, Nk, B, H = 4, 2, 2, 16
    if phase == "prompt":
        S, seqlens, past = 6, [6, 6], past_cache(B, Nk, 0, H)
    else:
        S, seqlens, past = 1, [5, 5], past_cache(B, Nk, 7, H)
    ins = gqa_io(B, S, N, Nk, H, seqlens, past=past)
    order = ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length"]
    outs = [("out", TP.FLOAT), ("pk", TP.FLOAT), ("pv", TP.FLOAT)]
    if "qk_output" in attrs:
        outs.append(("qk", TP.FLOAT))
    model, feeds = single_node_model("GroupQueryAttention", {n: ins[n] for n in order}, outs, num_heads=N,
                                     kv_num_heads=Nk, **attrs)
    ref, got = run_both(model, feeds)
    compare(ref[:3], got[:3], seqlens, S, phase == "prompt", 1e-5)
    if len(ref) > 3:
        np.testing.assert_allclose(np.asarray(got[3]), ref[3], atol=1e-5, rtol=1e-5)


def test_kv_inplace_hook():
    """ctx.extra['kv_inplace'] writes the new rows into a shared past buffer and returns it as present."""
    import torch

    from crossml.ops.contrib.attention import group_query_attention
    from crossml.ops.registry import OpContext

    B, N, Nk, H, max_len = 2, 4, 2, 16, 8
    pk, pv = (torch.randn(B, Nk, max_len, H) for _ in range(2))
    q, k, v = torch.randn(B, 1, N * H), torch.randn(B, 1, Nk * H), torch.randn(B, 1, Nk * H)
    seqlens = torch.tensor([3, 5], dtype=torch.int32)
    args = (q, k, v, pk, pv, seqlens, torch.tensor(6, dtype=torch.int32))
    ctx = OpContext("gqa", "GroupQueryAttention", 1, 3, (None,) * 3, (True,) * 3)
    before = pk.clone()
    out, k_copy, _, _ = group_query_attention(*args, num_heads=N, kv_num_heads=Nk, ctx=ctx)
    assert torch.equal(pk, before) and k_copy.data_ptr() != pk.data_ptr()
    ctx.extra["kv_inplace"] = True
    out2, k_same, v_same, _ = group_query_attention(*args, num_heads=N, kv_num_heads=Nk, ctx=ctx)
    assert k_same.data_ptr() == pk.data_ptr() and v_same.data_ptr() == pv.data_ptr()
    assert torch.equal(k_same, k_copy) and torch.allclose(out, out2)
    assert torch.equal(pk[0, :, 3], k.reshape(B, Nk, H)[0]) and torch.equal(pk[1, :, 5], k.reshape(B, Nk, H)[1])


def _qk_norm_case(step: str, rotary: bool):
    """(inputs, total lengths, S, q / k norm weights, onnxruntime's outputs on Q and K normalized per head
    beforehand, eps) of a GroupQueryAttention call with q_norm_weight / k_norm_weight: a first prompt (S = 5) or a
    decode step on a shared max-length cache."""
    N, Nk, B, H, eps = 4, 2, 2, 32, 1e-5
    S, totals, P = (5, [5, 5], 0) if step == "prompt" else (1, [9, 6], 12)
    ins = gqa_io(B, S, N, Nk, H, totals, past=past_cache(B, Nk, P, H), rotary=rotary)
    wq, wk = RNG.standard_normal(H).astype(np.float32), RNG.standard_normal(H).astype(np.float32)

    def rms(x, w, heads):
        x = x.reshape(B, S, heads, H)
        return (x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w).reshape(B, S, heads * H).astype(np.float32)

    normed = dict(ins, query=rms(ins["query"], wq, N), key=rms(ins["key"], wk, Nk))
    ref, _ = run_gqa(normed, N, Nk, do_rotary=int(rotary))
    return ins, totals, S, (wq, wk), ref, eps


_GQA_NAMES = ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache",
              "sin_cache", "position_ids", "attention_bias", "head_sink", "k_scale", "v_scale"]


@pytest.mark.parametrize("step", ["prompt", "decode"])
@pytest.mark.parametrize("rotary", [False, True])
def test_qk_norm(rotary, step, monkeypatch):
    """q_norm_weight / k_norm_weight (inputs 14, 15; onnxruntime CPU rejects them, CUDA has them): crossml with
    the weights equals onnxruntime without them on Q and K normalized per head beforehand. A decode step normalizes
    the heads, then runs numba's CPU step (which takes no norms)."""
    import torch

    from crossml.ops.contrib import attention
    from crossml.ops.registry import OpContext
    from tests.kernels._common import record_calls

    ins, totals, S, (wq, wk), ref, eps = _qk_norm_case(step, rotary)
    steps = record_calls(monkeypatch, attention, "_cpu_step")
    args = [None if ins.get(n) is None else torch.from_numpy(ins[n]) for n in _GQA_NAMES]
    ctx = OpContext("gqa", "GroupQueryAttention", 1, 3, (None,) * 3, (True,) * 3)
    got = attention.group_query_attention(*args, torch.from_numpy(wq), torch.from_numpy(wk), num_heads=4,
                                          kv_num_heads=2, do_rotary=int(rotary), qk_norm_epsilon=eps, ctx=ctx)
    compare(ref, [t.numpy() for t in got[:3]], totals, S, step == "prompt", 1e-5)
    numba = importlib.util.find_spec("numba") is not None and "cpu" not in attention.TRITON_DEVICES
    assert steps == (["_cpu_step"] if step == "decode" and numba else [])


@pytest.mark.parametrize("step", ["prompt", "decode"])
def test_qk_norm_on_kernels(step, monkeypatch):
    """With q / k norms (LFM2's attention) the heads are normalized by the RMSNorm kernel (not torch's ops), and a
    decode step still runs the Triton decode kernel; onnxruntime's outputs on Q and K normalized beforehand. On the
    GPU, or without one on CPU tensors in Triton's interpreter."""
    pytest.importorskip("triton")
    from crossml.kernels._launch import INTERPRET
    from crossml.ops import _util
    from crossml.ops.contrib import attention
    from crossml.ops.registry import OpContext
    from tests.kernels._common import record_calls

    if not INTERPRET and not torch.cuda.is_available():
        pytest.skip("needs a GPU, or Triton interpreting (TRITON_INTERPRET=1 before triton's first import)")
    device = "cpu" if INTERPRET else "cuda"
    ins, totals, S, (wq, wk), ref, eps = _qk_norm_case(step, True)
    if INTERPRET:
        monkeypatch.setattr(attention, "TRITON_DEVICES", ("cpu", "cuda", "xpu"))
        monkeypatch.setattr(_util, "TRITON_DEVICES", ("cpu", "cuda", "xpu"))
        monkeypatch.setattr(_util, "load_compiled", _util.load)  # the interpreter's kernels
    calls = record_calls(monkeypatch, attention, "_fast_decode", "_fast_prompt", "_rms")
    args = [None if ins.get(n) is None else torch.from_numpy(ins[n]).to(device) for n in _GQA_NAMES]
    args[6] = torch.from_numpy(ins["total_sequence_length"])  # a host input
    ctx = OpContext("gqa", "GroupQueryAttention", 1, 3, (None,) * 3, (True,) * 3)
    got = attention.group_query_attention(*args, torch.from_numpy(wq).to(device), torch.from_numpy(wk).to(device),
                                          num_heads=4, kv_num_heads=2, do_rotary=1, qk_norm_epsilon=eps, ctx=ctx)
    assert calls == (["_fast_decode"] if step == "decode" else [])  # no torch-op norm (_rms)
    compare(ref, [t.cpu().numpy() for t in got[:3]], totals, S, step == "prompt", 1e-4)


def _resident(total: int, capacity: int, window: int) -> int:
    """onnxruntime's resident count L(T) of a window-sized cache (the formula of its operator description)."""
    g = capacity - window + 1
    return total if total <= capacity else total - g * -(-(total - capacity) // g)


def _compare_windowed(ref, got, totals, rows, capacity, window, tol):
    """Outputs of real rows, and the resident rows 0 .. L(T) of the present buffers (the rest is unspecified)."""
    for b, tot in enumerate(totals):
        n = _resident(tot, capacity, window)
        for r, g in ((ref[0][b, :rows[b]], got[0][b, :rows[b]]), (ref[1][b, :, :n], got[1][b, :, :n]),
                     (ref[2][b, :, :n], got[2][b, :, :n])):
            np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(r, np.float64), atol=tol, rtol=tol)


@pytest.mark.parametrize("capacity", [6, 9], ids=lambda c: f"C{c}")
@pytest.mark.parametrize("extra", [{}, {"softcap": 2.0}, {"bias": True}], ids=["plain", "softcap", "bias"])
def test_sliding_window_cache_generation(capacity, extra):
    """sliding_window_cache=1: a prompt longer than the capacity, a later chunk, then decode steps across every
    eviction boundary; outputs and the resident rows match onnxruntime, and the cache never grows."""
    N, Nk, H, W = 4, 2, 16, 6
    attrs = dict(do_rotary=1, local_window_size=W, sliding_window_cache=1,
                 **({"softcap": extra["softcap"]} if "softcap" in extra else {}))
    bias = "bias" in extra
    pr = pg = past_cache(1, Nk, capacity, H)
    total = 0
    for S in [11, 3] + [1] * 14:  # prompt, a later chunk (batch 1), decode steps
        total += S
        ins = gqa_io(1, S, N, Nk, H, [total], past=pr, total=total, rotary=True, attention_bias=bias)
        ref, _ = run_gqa(dict(ins), N, Nk, **attrs)
        ins["past_key"], ins["past_value"] = pg
        _, got = run_gqa(ins, N, Nk, **attrs)
        got = [np.asarray(x) for x in got]
        assert got[1].shape == (1, Nk, capacity, H)
        _compare_windowed(ref, got, [total], [S], capacity, W, 1e-5)
        pr, pg = ref[1:], got[1:]


def test_sliding_window_cache_batch_decode_and_full_cache():
    """A decode step of two entries at different lengths (one evicting this step) matches onnxruntime, and the
    windowed cache gives the outputs of the same attention over a full-length cache (local_window_size alone)."""
    import torch

    from crossml.ops.contrib.attention import group_query_attention
    from crossml.ops.registry import OpContext

    N, Nk, H, W, C, L = 4, 2, 16, 5, 7, 24
    totals = [20, 8]  # entry 0 evicts at T=20 (G=3: 7 -> ... ), entry 1 is one past the capacity
    full_k, full_v = past_cache(2, Nk, L, H)
    ins = gqa_io(2, 1, N, Nk, H, totals, rotary=True)
    win = []
    for full in (full_k, full_v):  # the resident rows of each entry before the step, taken from the full cache
        buf = RNG.standard_normal((2, Nk, C, H)).astype(np.float32)
        for b, tot in enumerate(totals):
            n = _resident(tot - 1, C, W)
            buf[b, :, :n] = full[b, :, tot - 1 - n:tot - 1]
        win.append(buf)
    ins["past_key"], ins["past_value"] = win
    attrs = dict(do_rotary=1, local_window_size=W)
    ref, got = run_gqa(dict(ins), N, Nk, sliding_window_cache=1, **attrs)
    _compare_windowed(ref, [np.asarray(x) for x in got], totals, [1, 1], C, W, 1e-5)
    names = ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache",
             "sin_cache"]
    args = [torch.from_numpy(ins[n]) for n in names]
    args[3], args[4] = torch.from_numpy(full_k), torch.from_numpy(full_v)
    ctx = OpContext("gqa", "GroupQueryAttention", 1, 3, (None,) * 3, (True,) * 3)
    dense = group_query_attention(*args, num_heads=N, kv_num_heads=Nk, ctx=ctx, **attrs)
    np.testing.assert_allclose(dense[0].numpy(), np.asarray(got[0]), atol=1e-5, rtol=1e-5)
    for b, tot in enumerate(totals):  # the resident rows are the full cache's last L(T) positions
        n = _resident(tot, C, W)
        np.testing.assert_allclose(np.asarray(got[1])[b, :, :n], dense[1][b, :, tot - n:tot].numpy(), atol=1e-6)


@pytest.mark.parametrize("case", ["small", "no_window", "no_past", "qk"])
def test_sliding_window_cache_errors(case):
    import crossml

    N, Nk, H = 4, 2, 16
    ins = gqa_io(1, 1, N, Nk, H, [5], past=past_cache(1, Nk, 3 if case == "small" else 8, H))
    attrs = dict(sliding_window_cache=1, local_window_size=-1 if case == "no_window" else 4)
    if case == "no_past":
        ins["past_key"] = ins["past_value"] = None
    order = ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length"]
    outs = [("out", TP.FLOAT), ("pk", TP.FLOAT), ("pv", TP.FLOAT)] + ([("qk", TP.FLOAT)] if case == "qk" else [])
    model, feeds = single_node_model("GroupQueryAttention", {n: ins[n] for n in order}, outs, num_heads=N,
                                     kv_num_heads=Nk, qk_output=int(case == "qk"), **attrs)
    sess = crossml.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = {"small": r"capacity \(3\) must be at least local_window_size \(4\)", "no_window": "local_window_size > 0",
            "no_past": "needs past_key and past_value", "qk": "qk_output is not supported"}[case]
    with pytest.raises(Exception, match=want):
        sess.run(None, feeds)


def test_sliding_window_cache_ignores_rows_it_does_not_hold():
    """Rows past the resident ones are unspecified: NaN there changes neither the output nor the resident rows."""
    import torch

    from crossml.ops.contrib.attention import group_query_attention
    from crossml.ops.registry import OpContext

    N, Nk, H, W, C = 4, 2, 16, 4, 8
    totals = [6, 3]  # entries hold 5 and 2 positions before the step
    ins = gqa_io(2, 1, N, Nk, H, totals, past=past_cache(2, Nk, C, H), rotary=True)
    names = ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache",
             "sin_cache"]
    ctx = OpContext("gqa", "GroupQueryAttention", 1, 3, (None,) * 3, (True,) * 3)
    attrs = dict(num_heads=N, kv_num_heads=Nk, do_rotary=1, local_window_size=W, sliding_window_cache=1, ctx=ctx)
    clean = group_query_attention(*[torch.from_numpy(ins[n]) for n in names], **attrs)
    for b, tot in enumerate(totals):
        for name in ("past_key", "past_value"):
            ins[name][b, :, tot - 1:] = np.nan
    dirty = group_query_attention(*[torch.from_numpy(ins[n]) for n in names], **attrs)
    assert torch.equal(dirty[0], clean[0]) and not dirty[0].isnan().any()
    for b, tot in enumerate(totals):
        assert torch.equal(dirty[1][b, :, :tot], clean[1][b, :, :tot])


@pytest.mark.parametrize("windowed", [False, True], ids=["shared", "windowed"])
def test_softcap_decode_on_kernels(windowed, monkeypatch):
    """A softcapped decode step (Gemma-2's attention) runs the Triton decode kernel (on a max-length shared cache,
    and on a window-sized one with an eviction this step) and matches onnxruntime, as the torch path does. The op
    runs on the GPU, or without one on CPU tensors in Triton's interpreter."""
    pytest.importorskip("triton")
    from crossml.kernels._launch import INTERPRET
    from crossml.ops.contrib import attention
    from crossml.ops.registry import OpContext
    from tests.kernels._common import record_calls

    if not INTERPRET and not torch.cuda.is_available():
        pytest.skip("needs a GPU, or Triton interpreting (TRITON_INTERPRET=1 before triton's first import)")
    device = "cpu" if INTERPRET else "cuda"
    N, Nk, H, C, W = 4, 2, 16, 7, 5
    totals = [20, 8] if windowed else [9, 6]  # windowed: entry 0 evicts this step, entry 1 one past the capacity
    past = past_cache(2, Nk, C if windowed else 12, H)
    ins = gqa_io(2, 1, N, Nk, H, totals, past=past, rotary=True)
    attrs = dict(do_rotary=1, softcap=2.0)  # scores of about unit size: the cap matters
    if windowed:
        attrs.update(local_window_size=W, sliding_window_cache=1)
    ref, torch_path = run_gqa(dict(ins), N, Nk, **attrs)  # onnxruntime, and crossml's CPU (torch) path

    if INTERPRET:
        monkeypatch.setattr(attention, "TRITON_DEVICES", ("cpu", "cuda", "xpu"))
    calls = record_calls(monkeypatch, attention, "_fast_decode")
    names = ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache",
             "sin_cache"]
    args = [torch.from_numpy(ins[n]).to(device) for n in names]
    args[6] = torch.from_numpy(ins["total_sequence_length"])  # a host input
    ctx = OpContext("gqa", "GroupQueryAttention", 1, 3, (None,) * 3, (True,) * 3)
    got = [t.cpu().numpy() for t in attention.group_query_attention(*args, num_heads=N, kv_num_heads=Nk, ctx=ctx,
                                                                     **attrs)[:3]]
    assert calls == ["_fast_decode"]
    for outs, tol in ((torch_path, 1e-5), (got, 1e-4)):
        if windowed:
            _compare_windowed(ref, [np.asarray(x) for x in outs], totals, [1, 1], C, W, tol)
        else:
            compare(ref, outs, totals, 1, False, tol)
