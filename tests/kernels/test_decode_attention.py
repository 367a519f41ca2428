"""The Triton decode step of GroupQueryAttention (crossml.kernels.decode_attention) against its torch
references, and the op's fast path against its torch path. CPU cases run in Triton's interpreter (the op's
device gate is opened for CPU tensors there); ``gpu`` cases compile the kernels."""

from __future__ import annotations

import functools
import math
import os
import subprocess
import sys

import torch

if not torch.cuda.is_available():  # before triton's first import: interpret the kernels on the CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from crossml.kernels import decode_attention as decode_attention_module  # noqa: E402
from crossml.kernels.decode_attention import (  # noqa: E402
    decode_attention,
    decode_attention_reference,
    rotary_cache_write,
    rotary_cache_write_reference,
    rotary_decode_attention,
    rotary_decode_attention_reference,
)
from crossml.ops.contrib import attention  # noqa: E402
from crossml.ops.registry import OpContext  # noqa: E402
from tests.kernels._common import DEVICES, INTERPRET, TOL, rand  # noqa: E402


def _caches(max_pos: int, half: int, dtype: torch.dtype, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float64) / half))
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None, :]
    return ang.cos().to(dtype).to(device), ang.sin().to(dtype).to(device)


def _rotary_mode(mode: str, H: int) -> tuple[bool, bool, int]:
    """(do_rotary, interleaved, rotary dim) of a test case name."""
    return {"off": (False, False, H), "halves": (True, False, H), "interleaved": (True, True, H),
            "partial": (True, False, H // 2), "partial_interleaved": (True, True, H // 2)}[mode]


def _ids(value: object) -> str:
    return str(value).replace("torch.", "").replace(" ", "")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("dtype", "heads", "H", "mode"), [
    (torch.float32, (4, 2), 16, "halves"),
    (torch.float32, (14, 2), 64, "interleaved"),
    (torch.float32, (8, 8), 16, "partial"),
    (torch.float32, (4, 2), 64, "partial_interleaved"),
    (torch.float16, (14, 2), 16, "halves"),
    (torch.float16, (8, 8), 64, "interleaved"),
    (torch.float16, (4, 2), 64, "partial"),
    (torch.float16, (4, 2), 16, "off"),
    (torch.bfloat16, (4, 2), 16, "interleaved"),
], ids=_ids)
def test_rotary_cache_write(device: str, dtype: torch.dtype, heads: tuple[int, int], H: int, mode: str) -> None:
    """Rotated q and the written k/v rows equal the torch helpers bit for bit; other cache rows are untouched."""
    N, Nk = heads
    B, L, max_pos = 2, 24, 40
    do_rotary, interleaved, rot = _rotary_mode(mode, H)
    # the query/key/value of a packed QKV row: strided views, as the op passes them
    qkv = rand(B, (N + 2 * Nk) * H, dtype=dtype, device=device, seed=1)
    q, k, v = (t.reshape(B, -1, H) for t in qkv.split([N * H, Nk * H, Nk * H], dim=-1))
    cos, sin = _caches(max_pos, rot // 2, dtype, device)
    pos = torch.tensor([5, 45], device=device)  # 45 is past the cos cache: clamped to its last row
    write_pos = torch.tensor([3, 23], dtype=torch.int32, device=device)
    kc, vc = (rand(B, Nk, L, H, dtype=dtype, device=device, seed=s) for s in (2, 3))
    kc_ref, vc_ref = kc.clone(), vc.clone()
    q_ref = rotary_cache_write_reference(q, k, v, cos, sin, pos, kc_ref, vc_ref, write_pos, interleaved, do_rotary)
    q_out = rotary_cache_write(q, k, v, cos, sin, pos, kc, vc, write_pos, interleaved, do_rotary)
    assert q_out.shape == (B, N, H) and q_out.dtype == dtype
    if dtype == torch.bfloat16 and INTERPRET:  # the interpreter rounds fp32 -> bf16 toward zero: 1 ulp
        same = functools.partial(torch.testing.assert_close, rtol=2 ** -7, atol=1e-3)
    else:
        same = functools.partial(torch.testing.assert_close, rtol=0, atol=0)
    same(q_out, q_ref)
    same(kc, kc_ref)  # written rows and untouched rows
    assert torch.equal(vc, vc_ref)
    if do_rotary:
        assert not torch.equal(kc[1, :, 23], k[1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("dtype", "heads", "H", "window", "splits", "softcap"), [
    (torch.float32, (4, 2), 16, -1, 1, 0.0),
    (torch.float32, (14, 2), 64, 5, 3, 0.0),
    (torch.float32, (8, 8), 16, -1, 3, 0.0),
    (torch.float16, (4, 2), 64, 5, 1, 0.0),
    (torch.float16, (14, 2), 16, -1, 3, 0.0),
    (torch.float16, (8, 8), 64, 5, 1, 0.0),
    (torch.float32, (4, 2), 16, -1, 1, 1.5),
    (torch.float32, (14, 2), 64, 5, 3, 2.0),
    (torch.float16, (8, 8), 64, -1, 3, 1.5),
    (torch.bfloat16, (4, 2), 16, 5, 1, 2.0),
    (torch.float16, (4, 2), 512, -1, 3, 30.0),  # Gemma 4's global layers
    (torch.float32, (8, 1), 256, 5, 1, 0.0),
], ids=_ids)
def test_decode_attention(device: str, dtype: torch.dtype, heads: tuple[int, int], H: int, window: int,
                          splits: int, softcap: float) -> None:
    """The kernel against its fp64 reference; ``softcap`` cases cap scores of about unit size (a cap that matters:
    uncapped, the outputs differ by far more than the tolerance)."""
    N, Nk = heads
    B, L = 2, 40
    q = rand(B, N, H, dtype=dtype, device=device, seed=4)
    kc, vc = (rand(B, Nk, L, H, dtype=dtype, device=device, seed=s) for s in (5, 6))
    seqlens_k = torch.tensor([6, 37], dtype=torch.int32, device=device)  # totals 7 and 38 of 40 rows
    scale = 1.0 / math.sqrt(H)
    out = decode_attention(q, kc, vc, seqlens_k, scale, window, len_offset=1, num_splits=splits, softcap=softcap)
    ref = decode_attention_reference(q, kc, vc, seqlens_k, scale, window, len_offset=1, softcap=softcap)
    assert out.dtype == dtype and out.device.type == device
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(out.double().cpu(), ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("device", DEVICES)
def test_decode_attention_edges(device: str) -> None:
    """Odd head size and group count (padded tiles), a length past the buffer (all rows), length 1, bf16,
    more splits than key blocks."""
    B, N, Nk, H, L = 3, 6, 2, 24, 21
    for dtype, splits in ((torch.float32, 1), (torch.bfloat16, 8)):
        q = rand(B, N, H, dtype=dtype, device=device, seed=7)
        kc, vc = (rand(B, Nk, L, H, dtype=dtype, device=device, seed=s) for s in (8, 9))
        total = torch.tensor([1, 30, 21], device=device)
        ref = decode_attention_reference(q, kc, vc, total, 0.3)
        out = decode_attention(q, kc, vc, total, 0.3, num_splits=splits)
        rtol, atol = TOL[dtype]
        torch.testing.assert_close(out.double().cpu(), ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("splits", [1, 3])
def test_decode_attention_softcap_saturates(device: str, splits: int) -> None:
    """Scores hundreds of times the cap: tanh saturates to +-1 (no overflow, no NaN), and keys tied at the cap
    share the weight as in the reference."""
    B, N, Nk, H, L = 2, 4, 2, 32, 40
    q = rand(B, N, H, device=device, seed=40) * 100.0
    kc, vc = (rand(B, Nk, L, H, device=device, seed=s) for s in (41, 42))
    total = torch.tensor([9, 40], device=device)
    out = decode_attention(q, kc, vc, total, 1.0 / math.sqrt(H), num_splits=splits, softcap=1.0)
    ref = decode_attention_reference(q, kc, vc, total, 1.0 / math.sqrt(H), softcap=1.0)
    assert not out.isnan().any()
    rtol, atol = TOL[torch.float32]
    torch.testing.assert_close(out.double().cpu(), ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("dtype", "splits", "window", "softcap"), [
    (torch.float32, 1, -1, 0.0), (torch.float32, 3, -1, 0.0), (torch.float16, 4, 5, 0.0), (torch.float32, 3, -1, 2.0),
])
def test_sinks(device: str, dtype: torch.dtype, splits: int, window: int, softcap: float) -> None:
    """Attention sinks (one more logit per head in the softmax denominator, GroupQueryAttention's head_sink) in
    decode_attention and the one-launch step, split or not: large sinks take most of the weight, so a sink counted
    twice or dropped moves the output. Entry 2 attends no key: its output is 0 (all weight on the sink)."""
    B, N, Nk, H, L = 3, 8, 2, 32, 40
    q = rand(B, N, H, dtype=dtype, device=device, seed=50)
    kc, vc = (rand(B, Nk, L, H, dtype=dtype, device=device, seed=s) for s in (51, 52))
    sink = (torch.arange(N, dtype=torch.float32, device=device) - 2.0).to(dtype)
    total = torch.tensor([9, 40, 0], device=device)
    out = decode_attention(q, kc, vc, total, 0.3, window, num_splits=splits, softcap=softcap, sink=sink)
    ref = decode_attention_reference(q, kc, vc, total, 0.3, window, softcap=softcap, sink=sink)
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(out.double().cpu(), ref, rtol=rtol, atol=atol)
    assert not ref[2].any()
    no_sink = decode_attention_reference(q, kc, vc, total, 0.3, window, softcap=softcap)
    assert (ref[:2] - no_sink[:2]).abs().max() > 0.05  # the sinks matter at this tolerance
    k, v = (rand(B, Nk, H, dtype=dtype, device=device, seed=s) for s in (53, 54))
    seqlens = torch.tensor([6, 39, 0], dtype=torch.int32, device=device)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    ref = rotary_decode_attention_reference(q, k, v, None, None, None, kc_ref, vc_ref, seqlens, 0.3, window,
                                            do_rotary=False, softcap=softcap, sink=sink)
    out = rotary_decode_attention(q, k, v, None, None, None, kc, vc, seqlens, 0.3, window, do_rotary=False,
                                  num_splits=splits, softcap=softcap, sink=sink)
    torch.testing.assert_close(out.double().cpu(), ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("dtype", "heads", "H", "mode", "window", "splits", "softcap"), [
    (torch.float32, (4, 2), 16, "halves", -1, 1, 0.0),
    (torch.float32, (14, 2), 64, "interleaved", 5, 3, 0.0),
    (torch.float32, (8, 8), 16, "partial", -1, 4, 0.0),
    (torch.float16, (14, 2), 64, "halves", -1, 3, 0.0),
    (torch.float16, (4, 2), 64, "partial_interleaved", 5, 1, 0.0),
    (torch.float16, (4, 2), 16, "off", -1, 3, 0.0),
    (torch.bfloat16, (6, 2), 24, "interleaved", -1, 2, 0.0),
    (torch.float32, (4, 2), 16, "halves", 5, 1, 2.0),
    (torch.float16, (14, 2), 64, "interleaved", -1, 3, 3.0),
    (torch.float16, (4, 2), 512, "off", -1, 3, 0.0),  # Gemma 4's global layers: their RoPE runs before
], ids=_ids)
@pytest.mark.parametrize("early", [False] if INTERPRET else [False, True], ids=lambda e: "early" if e else "wait_first")
def test_rotary_decode_attention(device: str, dtype: torch.dtype, heads: tuple[int, int], H: int, mode: str,
                                 window: int, splits: int, softcap: float, early: bool) -> None:
    """The one-launch decode step equals rotary_cache_write + decode_attention's references: cache rows bit for
    bit (written and untouched), the attention output within the dtype's tolerance. Entry 1's length is past
    the buffer (its row is clamped to the last), entry 2 attends only its new row. ``early``: lengths, positions
    and caches read before the PDL wait (compiled kernels; the interpreter has no wait)."""
    N, Nk = heads
    B, L, max_pos = 3, 40, 48
    do_rotary, interleaved, rot = _rotary_mode(mode, H)
    qkv = rand(B, (N + 2 * Nk) * H, dtype=dtype, device=device, seed=31)  # packed QKV: strided views
    q, k, v = (t.reshape(B, -1, H) for t in qkv.split([N * H, Nk * H, Nk * H], dim=-1))
    cos, sin = _caches(max_pos, rot // 2, dtype, device) if do_rotary else (None, None)
    pos = torch.tensor([5, 45, 50], device=device) if do_rotary else None  # 50: past the cos cache, clamped
    seqlens = torch.tensor([6, 44, 0], dtype=torch.int32, device=device)
    kc, vc = (rand(B, Nk, L, H, dtype=dtype, device=device, seed=s) for s in (32, 33))
    kc_ref, vc_ref = kc.clone(), vc.clone()
    ref = rotary_decode_attention_reference(q, k, v, cos, sin, pos, kc_ref, vc_ref, seqlens, 0.3, window,
                                            interleaved=interleaved, do_rotary=do_rotary, softcap=softcap)
    out = rotary_decode_attention(q, k, v, cos, sin, pos, kc, vc, seqlens, 0.3, window, interleaved=interleaved,
                                  do_rotary=do_rotary, num_splits=splits, softcap=softcap, early=early)
    assert out.shape == (B, N, H) and out.dtype == dtype
    if dtype == torch.bfloat16 and INTERPRET:  # the interpreter rounds fp32 -> bf16 toward zero: 1 ulp
        torch.testing.assert_close(kc, kc_ref, rtol=2 ** -7, atol=1e-3)
    else:
        assert torch.equal(kc, kc_ref)
    assert torch.equal(vc, vc_ref)
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(out.double().cpu(), ref, rtol=rtol, atol=atol)


def _cluster_combine_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """CLUSTER_COMBINE on, and the GPU one that takes it (else the test skips, saying why)."""
    if not decode_attention_module.cluster_capable(torch.empty(0, device="cuda"), 16):
        pytest.skip("thread-block clusters of 16 need an NVIDIA GPU of compute capability 9.x or 10.x")
    monkeypatch.setattr(decode_attention_module, "CLUSTER_COMBINE", True)


@pytest.mark.gpu
@pytest.mark.parametrize(("dtype", "heads", "H", "B", "L", "splits", "window", "softcap", "sink"), [
    (torch.float16, (14, 2), 64, 1, 768, 12, -1, 0.0, False),  # Qwen2.5-0.5B's decode (splits padded to 16)
    (torch.float16, (32, 8), 64, 1, 768, 12, -1, 0.0, False),  # Llama-3.2-1B's
    (torch.bfloat16, (32, 8), 128, 2, 300, 8, -1, 0.0, False),
    (torch.float16, (16, 2), 128, 3, 200, 5, 37, 0.0, True),
    (torch.float32, (4, 2), 16, 2, 100, 16, -1, 2.0, True),  # 16 splits over a 16-channel tile: one a program
    (torch.float16, (40, 4), 96, 1, 500, 2, -1, 0.0, False),  # head dim 96 in a 128-channel tile
    (torch.float16, (24, 2), 64, 1, 520, 3, -1, 1.5, False),  # 12 query heads a KV head: one 16-row block
], ids=_ids)
@pytest.mark.parametrize("early", [False, True], ids=lambda e: "early" if e else "wait_first")
def test_gpu_cluster_combine(dtype: torch.dtype, heads: tuple[int, int], H: int, B: int, L: int, splits: int,
                             window: int, softcap: float, sink: bool, early: bool,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The splits combined in the attention launch (thread-block clusters) against the references: the decode step
    with its new token (cache rows bit for bit) and the plain decode attention, at lengths from one row to the
    whole buffer, and replayed in a CUDA graph, where it gives the eager result bit for bit."""
    _cluster_combine_on(monkeypatch)
    N, Nk = heads
    assert decode_attention_module._cluster_size(torch.empty(0, device="cuda"), splits, max(16, H)) >= splits
    dev = "cuda"
    qkv = rand(B, (N + 2 * Nk) * H, dtype=dtype, device=dev, seed=41)
    q, k, v = (t.reshape(B, -1, H) for t in qkv.split([N * H, Nk * H, Nk * H], dim=-1))
    cos, sin = _caches(L + 8, H // 2, dtype, dev)
    seqlens = torch.tensor([L - 1, 0, L // 3][:B], dtype=torch.int32, device=dev)
    pos = seqlens.long()
    kc, vc = (rand(B, Nk, L, H, dtype=dtype, device=dev, seed=s) for s in (42, 43))
    snk = rand(N, dtype=torch.float32, device=dev, seed=44) if sink else None
    kc_ref, vc_ref = kc.clone(), vc.clone()
    ref = rotary_decode_attention_reference(q, k, v, cos, sin, pos, kc_ref, vc_ref, seqlens, 0.3, window,
                                            softcap=softcap, sink=snk)

    def step() -> torch.Tensor:
        return rotary_decode_attention(q, k, v, cos, sin, pos, kc, vc, seqlens, 0.3, window, num_splits=splits,
                                       softcap=softcap, sink=snk, early=early)

    out = step()
    assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref)
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(out.double().cpu(), ref, rtol=rtol, atol=atol)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = step()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(replayed, out)
    plain = decode_attention(q, kc, vc, seqlens, 0.3, window, len_offset=1, num_splits=splits, softcap=softcap,
                             sink=snk)
    plain_ref = decode_attention_reference(q, kc, vc, seqlens, 0.3, window, len_offset=1, softcap=softcap, sink=snk)
    torch.testing.assert_close(plain.double().cpu(), plain_ref, rtol=rtol, atol=atol)


@pytest.mark.gpu
def test_gpu_cluster_size_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the clusters combine the splits: after a 4-bit product or with 4 clusters or more (CLUSTER_COMBINE
    None), or always (True), never (False); 2 to 16 splits, padded to a power of two (at most CLUSTER_SPLITS) no
    wider than the head dimension's tile; one split or more than 16 keep the combine kernel."""
    _cluster_combine_on(monkeypatch)
    t = torch.empty(0, device="cuda")
    size = decode_attention_module._cluster_size
    assert [size(t, s, 64) for s in (1, 2, 3, 5, 8, 9, 12, 16, 17, 64)] == [0, 2, 4, 8, 8, 16, 16, 16, 0, 0]
    assert size(t, 12, 16) == 16 and size(t, 12, 8) == 0
    monkeypatch.setattr(decode_attention_module, "CLUSTER_SPLITS", 8)
    assert size(t, 12, 64) == 8 and size(t, 3, 64) == 4
    monkeypatch.setattr(decode_attention_module, "CLUSTER_SPLITS", 16)
    monkeypatch.setattr(decode_attention_module, "CLUSTER_COMBINE", None)
    assert size(t, 12, 64, "MatMulNBits") == 16 and size(t, 12, 64, "NormMatMulNBits") == 16
    assert size(t, 12, 64, "MatMul") == 0 and size(t, 12, 64) == 0 and size(t, 12, 64, "MatMul", 3) == 0
    assert size(t, 12, 64, "MatMul", 4) == 16 and size(t, 12, 64, "", 8) == 16  # 4 clusters or more: any product
    monkeypatch.setattr(decode_attention_module, "CLUSTER_COMBINE", False)
    assert size(t, 12, 64, "MatMulNBits") == 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("dtype", "heads", "H", "hp", "bn"), [
    (torch.float32, (6, 2), 16, 1, 16),
    (torch.float32, (6, 2), 16, 4, 32),  # a program's heads past the last: masked
    (torch.float16, (8, 4), 32, 2, 64),
    (torch.bfloat16, (3, 1), 24, 2, 16),  # head size 24 in a 32-channel tile
], ids=_ids)
def test_combine_product(device: str, dtype: torch.dtype, heads: tuple[int, int], H: int, hp: int, bn: int) -> None:
    """The split attention's partial results combined and multiplied with the output projection, summed over the
    programs' head groups, against the combine kernel's output times w (float64), and the skip-norm of those partial
    sums against ``gemv_skip_norm`` of the combined output; ``combine_partials`` equals the one-launch step's output."""
    from crossml.kernels.decode_attention import combine_partials, combine_product
    from crossml.kernels.gemv import partials_skip_norm

    N, Nk = heads
    B, L, n_out = 2, 48, 40
    qkv = rand(B, (N + 2 * Nk) * H, dtype=dtype, device=device, seed=51)
    q, k, v = (t.reshape(B, -1, H) for t in qkv.split([N * H, Nk * H, Nk * H], dim=-1))
    kc, vc = (rand(B, Nk, L, H, dtype=dtype, device=device, seed=s) for s in (52, 53))
    seqlens = torch.tensor([40, 11], dtype=torch.int32, device=device)
    whole = rotary_decode_attention(q, k, v, None, None, None, kc.clone(), vc.clone(), seqlens, 0.3, do_rotary=False,
                                    num_splits=3)
    parts = rotary_decode_attention(q, k, v, None, None, None, kc.clone(), vc.clone(), seqlens, 0.3,
                                    do_rotary=False, num_splits=3, partials=True)
    assert isinstance(parts, tuple) and parts[0].shape == (B, N, 3, H)
    assert torch.equal(combine_partials(parts, dtype), whole)
    w = rand(N * H, n_out, dtype=dtype, device=device, seed=54) * 0.2
    ws = combine_product(parts, w.t().contiguous().t(), heads_per_program=hp, block_n=bn)  # column-major w
    assert ws.shape == (-(-N // hp), B, n_out) and ws.dtype == torch.float32
    ref = whole.reshape(B, N * H).double().cpu() @ w.double().cpu()
    rtol, atol = TOL[torch.float32]
    torch.testing.assert_close(ws.sum(0).double().cpu(), ref, rtol=rtol, atol=atol)
    res, gamma = rand(B, n_out, dtype=dtype, device=device, seed=55), rand(n_out, dtype=dtype, device=device, seed=56)
    normed, total = partials_skip_norm(ws, None, res, gamma, 1e-6)
    from crossml.kernels.gemv import gemv_skip_norm

    normed0, total0 = gemv_skip_norm(whole.reshape(B, N * H), w, None, res, gamma, 1e-6)
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(normed.double().cpu(), normed0.double().cpu(), rtol=rtol, atol=atol)
    torch.testing.assert_close(total.double().cpu(), total0.double().cpu(), rtol=rtol, atol=atol)


# ---------------------------------------------------------------------------------------------- the op's fast path


def _gqa(args: list, kw: dict, inplace: bool) -> tuple:
    ctx = OpContext("gqa", "GroupQueryAttention", 1, 3, (None,) * 3, (True,) * 3)
    ctx.extra["kv_inplace"] = inplace
    return attention.group_query_attention(*args, **kw, ctx=ctx)


@pytest.fixture
def fast_path(monkeypatch):
    """``enable()`` opens the op's fast path (under the interpreter for CPU tensors too; before it, CPU tensors
    take the torch path) and returns the list its calls are counted in."""
    calls: list[int] = []

    def enable() -> list[int]:
        if INTERPRET:
            monkeypatch.setattr(attention, "TRITON_DEVICES", ("cpu", "cuda", "xpu"))
        for name in ("_fast_decode", "_fast_prompt", "_fast_continue"):
            original = getattr(attention, name)

            def spy(*a, _original=original, _name=name, **k):
                calls.append(_name)
                return _original(*a, **k)

            monkeypatch.setattr(attention, name, spy)
        return calls

    return enable


def _check_fast_path(args: list, kw: dict, device: str, inplace: bool, fast_path, path: str,
                     out_shape: tuple[int, ...]) -> None:
    """group_query_attention on ``device`` through its fast path ``path`` equals its torch path run on CPU copies:
    the attention output, the present buffers (new rows bit for bit, other rows untouched), written in place
    into the past buffers or, when not in place, into new ones leaving the inputs as they were."""
    out_ref, pk_ref, pv_ref, _ = _gqa([None if a is None else a.clone() for a in args], kw, False)
    fast_path_calls = fast_path()
    dev_args = [None if a is None else a.to(device) for a in args]
    dev_args[6] = args[6]  # total_sequence_length is a host scalar
    past_k, past_v = dev_args[3].clone(), dev_args[4].clone()
    out, pk_out, pv_out, qk = _gqa(dev_args, kw, inplace)
    assert fast_path_calls == [path], f"group_query_attention did not take {path}"
    dtype = args[0].dtype
    assert qk is None and out.shape == out_shape and out.dtype == dtype
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(out.cpu(), out_ref, rtol=rtol, atol=atol)
    assert torch.equal(pk_out.cpu(), pk_ref) and torch.equal(pv_out.cpu(), pv_ref)
    if inplace:
        assert pk_out.data_ptr() == dev_args[3].data_ptr() and pv_out.data_ptr() == dev_args[4].data_ptr()
    else:  # the op must not modify its inputs
        assert torch.equal(dev_args[3], past_k) and torch.equal(dev_args[4], past_v)
        assert pk_out.data_ptr() != dev_args[3].data_ptr()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", [
    dict(dtype=torch.float32, heads=(4, 2), H=16, rotary="halves", inplace=True),
    dict(dtype=torch.float32, heads=(14, 2), H=64, rotary="interleaved", packed=True),
    dict(dtype=torch.float16, heads=(8, 8), H=16, rotary="partial", position_ids=True, inplace=True),
    dict(dtype=torch.float16, heads=(4, 2), H=64, rotary="off", local_window_size=4, scale=0.2),
    dict(dtype=torch.float32, heads=(4, 2), H=16, rotary="partial_interleaved", position_ids=True, packed=True,
         local_window_size=3, inplace=True),
    dict(dtype=torch.float32, heads=(4, 2), H=16, rotary="halves", causal=0, local_window_size=3),
    dict(dtype=torch.float32, heads=(4, 2), H=16, rotary="halves", softcap=2.0, inplace=True),
    dict(dtype=torch.float16, heads=(8, 4), H=64, rotary="interleaved", packed=True, local_window_size=4,
         softcap=3.0),
    dict(dtype=torch.float32, heads=(4, 2), H=16, rotary="halves", head_sink=True, inplace=True),
    dict(dtype=torch.float16, heads=(8, 4), H=64, rotary="interleaved", packed=True, smooth_softmax=1),
], ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()).replace("torch.", ""))
def test_gqa_fast_path_matches_torch(device: str, case: dict, fast_path) -> None:
    """group_query_attention's decode step on the kernels equals its torch path (run on CPU copies):
    the attention output, the present buffers (new rows bit for bit, other rows untouched), in place or not;
    softcapped scores (Gemma-2) included."""
    dtype, (N, Nk), H = case["dtype"], case["heads"], case["H"]
    B, L, max_pos = 2, 20, 32
    do_rotary, interleaved, rot = _rotary_mode(case["rotary"], H)
    seqlens_k = torch.tensor([4, 17], dtype=torch.int32)
    q, k, v = (rand(B, 1, n * H, dtype=dtype, seed=s) for s, n in ((10, N), (11, Nk), (12, Nk)))
    pk, pv = (rand(B, Nk, L, H, dtype=dtype, seed=s) for s in (13, 14))
    cos, sin = _caches(max_pos, rot // 2, dtype, "cpu") if do_rotary else (None, None)
    pos = torch.tensor([[9], [2]]) if case.get("position_ids") else None
    if case.get("packed"):
        q, k, v = torch.cat([q, k, v], dim=-1), None, None
    sink = (torch.arange(N, dtype=torch.float32) * 0.5 - 1.0).to(dtype) if case.get("head_sink") else None
    args = [q, k, v, pk, pv, seqlens_k, torch.tensor(18, dtype=torch.int32), cos, sin, pos, None, sink]
    kw = dict(num_heads=N, kv_num_heads=Nk, do_rotary=int(do_rotary), rotary_interleaved=int(interleaved),
              scale=case.get("scale", 0.0), local_window_size=case.get("local_window_size", -1),
              causal=case.get("causal", 1), softcap=case.get("softcap", 0.0),
              smooth_softmax=case.get("smooth_softmax", 0))
    _check_fast_path(args, kw, device, case.get("inplace", False), fast_path, "_fast_decode", (B, 1, N * H))


@pytest.mark.parametrize("device", DEVICES)
def test_gqa_fast_path_declines(device: str, fast_path) -> None:
    """Grown caches, bias, one-token prompts and softcapped, sinked or non-causal prompts and prompt chunks stay on
    the torch path; softcapped and sinked decode steps take the kernels."""
    fast_path_calls = fast_path()
    B, N, Nk, H = 1, 4, 2, 16
    pk, pv = (rand(B, Nk, 8, H, seed=s, device=device) for s in (1, 2))
    q, k, v = (rand(B, 1, n * H, seed=s, device=device) for s, n in ((3, N), (4, Nk), (5, Nk)))
    seqlens_k = torch.tensor([4], dtype=torch.int32, device=device)
    base = [q, k, v, pk, pv, seqlens_k, torch.tensor(5, dtype=torch.int32)]
    prompt = [t.expand(B, 3, -1) for t in (q, k, v)] + [pk, pv, torch.tensor([2], dtype=torch.int32, device=device),
                                                       torch.tensor(3, dtype=torch.int32)]
    kw = dict(num_heads=N, kv_num_heads=Nk)
    _gqa(base[:3] + [pk[:, :, :4], pv[:, :, :4]] + base[5:], kw, False)  # past shorter than total: grown
    _gqa(base + [None, None, None, torch.zeros(B, 1, 1, 5, device=device)], kw, False)  # attention_bias
    _gqa(base[:6] + [torch.tensor(1, dtype=torch.int32)], kw, False)  # first prompt of one token
    _gqa(prompt, dict(kw, softcap=2.0), False)  # SDPA has no softcap
    _gqa(prompt + [None, None, None, None, torch.zeros(N, device=device)], kw, False)  # nor sinks
    _gqa(prompt, dict(kw, smooth_softmax=1), False)
    chunk = [t.expand(B, 3, -1) for t in (q, k, v)] + [pk, pv, seqlens_k, torch.tensor(5, dtype=torch.int32)]
    _gqa(chunk, dict(kw, softcap=2.0), False)  # a later prompt chunk: SDPA has no softcap
    _gqa(chunk, dict(kw, causal=0), False)
    _gqa(chunk[:3] + [pk[:, :, :4], pv[:, :, :4]] + chunk[5:], kw, False)  # grown cache
    assert not fast_path_calls
    _gqa(chunk, kw, False)
    assert fast_path_calls == ["_fast_continue"]
    fast_path_calls.clear()
    _gqa(prompt, kw, False)
    _gqa(base, dict(kw, softcap=2.0), False)
    _gqa(base + [None, None, None, None, torch.zeros(N, device=device)], kw, False)  # head_sink
    _gqa(base, dict(kw, smooth_softmax=1), False)
    assert fast_path_calls == ["_fast_prompt"] + ["_fast_decode"] * 3


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", [
    dict(dtype=torch.float32, heads=(4, 2), H=16, rotary="halves", inplace=True),
    dict(dtype=torch.float32, heads=(14, 2), H=64, rotary="interleaved", packed=True, position_ids=True),
    dict(dtype=torch.float16, heads=(8, 8), H=16, rotary="partial", inplace=True, scale=0.3),
    dict(dtype=torch.float16, heads=(4, 2), H=64, rotary="off", packed=True),
], ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()).replace("torch.", ""))
def test_gqa_fast_prompt_matches_torch(device: str, case: dict, fast_path) -> None:
    """A first prompt on the rotary/cache-write kernel + causal SDPA equals the torch path (run on CPU copies):
    the output (right-padded entries included), the written cache rows bit for bit, other rows untouched."""
    dtype, (N, Nk), H = case["dtype"], case["heads"], case["H"]
    B, S, L, max_pos = 2, 5, 12, 32
    do_rotary, interleaved, rot = _rotary_mode(case["rotary"], H)
    seqlens_k = torch.tensor([4, 2], dtype=torch.int32)  # the second entry is right-padded
    q, k, v = (rand(B, S, n * H, dtype=dtype, seed=s) for s, n in ((20, N), (21, Nk), (22, Nk)))
    pk, pv = (rand(B, Nk, L, H, dtype=dtype, seed=s) for s in (23, 24))
    cos, sin = _caches(max_pos, rot // 2, dtype, "cpu") if do_rotary else (None, None)
    pos = torch.arange(3, 3 + S).repeat(B, 1) if case.get("position_ids") else None
    if case.get("packed"):
        q, k, v = torch.cat([q, k, v], dim=-1), None, None
    args = [q, k, v, pk, pv, seqlens_k, torch.tensor(S, dtype=torch.int32), cos, sin, pos]
    kw = dict(num_heads=N, kv_num_heads=Nk, do_rotary=int(do_rotary), rotary_interleaved=int(interleaved),
              scale=case.get("scale", 0.0))
    _check_fast_path(args, kw, device, case.get("inplace", False), fast_path, "_fast_prompt", (B, S, N * H))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", [
    dict(dtype=torch.float32, heads=(4, 2), H=16, rotary="halves", inplace=True),
    dict(dtype=torch.float32, heads=(14, 2), H=64, rotary="interleaved", packed=True, position_ids=True),
    dict(dtype=torch.float16, heads=(8, 8), H=16, rotary="partial", inplace=True, scale=0.3, total=16),
    dict(dtype=torch.float16, heads=(4, 2), H=64, rotary="off", packed=True, local_window_size=3),
    dict(dtype=torch.float32, heads=(4, 2), H=16, rotary="partial_interleaved", local_window_size=5, total=13),
], ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()).replace("torch.", ""))
@pytest.mark.parametrize("route", ["decode", "sdpa"])
def test_gqa_fast_continue_matches_torch(device: str, case: dict, route: str, fast_path, monkeypatch) -> None:
    """A later prompt chunk (a chat turn: batch 1, 1 < S < total) on the rotary/cache-write kernel, then the
    decode kernel with a token per batch entry (chunks up to CHUNK_DECODE_ROWS tokens x KV heads) or masked SDPA
    over the first ``total`` rows (larger ones), equals the torch path over the whole buffer (run on CPU copies): the
    output, the written cache rows bit for bit, other rows untouched; ``total`` past the real length (a
    max-length mask's width) and local windows included."""
    S, Nk = 4, case["heads"][1]
    monkeypatch.setattr(attention, "CHUNK_DECODE_ROWS", S * Nk if route == "decode" else S * Nk - 1)
    decode_calls = []
    original = decode_attention_module.decode_attention
    monkeypatch.setattr(decode_attention_module, "decode_attention",
                        lambda *a, **k: decode_calls.append(1) or original(*a, **k))
    dtype, N, H = case["dtype"], case["heads"][0], case["H"]
    L, max_pos, past = 16, 32, 6
    do_rotary, interleaved, rot = _rotary_mode(case["rotary"], H)
    seqlens_k = torch.tensor([past + S - 1], dtype=torch.int32)
    q, k, v = (rand(1, S, n * H, dtype=dtype, seed=s) for s, n in ((40, N), (41, Nk), (42, Nk)))
    pk, pv = (rand(1, Nk, L, H, dtype=dtype, seed=s) for s in (43, 44))
    cos, sin = _caches(max_pos, rot // 2, dtype, "cpu") if do_rotary else (None, None)
    pos = torch.arange(past + 2, past + 2 + S).reshape(1, S) if case.get("position_ids") else None
    if case.get("packed"):
        q, k, v = torch.cat([q, k, v], dim=-1), None, None
    args = [q, k, v, pk, pv, seqlens_k, torch.tensor(case.get("total", past + S), dtype=torch.int32), cos, sin, pos]
    kw = dict(num_heads=N, kv_num_heads=Nk, do_rotary=int(do_rotary), rotary_interleaved=int(interleaved),
              scale=case.get("scale", 0.0), local_window_size=case.get("local_window_size", -1))
    _check_fast_path(args, kw, device, case.get("inplace", False), fast_path, "_fast_continue", (1, S, N * H))
    assert len(decode_calls) == (route == "decode")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", [
    dict(dtype=torch.float32, heads=(4, 2), H=16, rotary="halves", capacity=9, window=6),
    dict(dtype=torch.float16, heads=(8, 8), H=64, rotary="interleaved", capacity=6, window=6, packed=True),
    dict(dtype=torch.float32, heads=(4, 2), H=16, rotary="off", capacity=7, window=3, position_ids=True),
    dict(dtype=torch.float32, heads=(4, 2), H=16, rotary="halves", capacity=7, window=5, softcap=1.5),
    dict(dtype=torch.float16, heads=(4, 2), H=16, rotary="halves", capacity=8, window=5, head_sink=True),
], ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()).replace("torch.", ""))
def test_gqa_windowed_decode_matches_torch(device: str, case: dict, fast_path) -> None:
    """Decode steps on a window-sized cache (sliding_window_cache=1) on the kernels (evict_rows, then the decode
    kernel) equal the torch path step by step across evictions: outputs, and the resident rows bit for bit."""
    dtype, (N, Nk), H, C, W = case["dtype"], case["heads"], case["H"], case["capacity"], case["window"]
    B = 2
    do_rotary, interleaved, rot = _rotary_mode(case["rotary"], H)
    cos, sin = _caches(64, rot // 2, dtype, "cpu") if do_rotary else (None, None)
    kw = dict(num_heads=N, kv_num_heads=Nk, do_rotary=int(do_rotary), rotary_interleaved=int(interleaved),
              local_window_size=W, sliding_window_cache=1, softcap=case.get("softcap", 0.0))
    ref_k, ref_v = (rand(B, Nk, C, H, dtype=dtype, seed=s) for s in (30, 31))
    dev_k, dev_v = ref_k.to(device), ref_v.to(device)
    # the reference buffers' rows are not contiguous, which keeps them on the torch path (under the interpreter
    # CPU tensors may take the kernels too)
    ref_k, ref_v = (t.transpose(2, 3).contiguous().transpose(2, 3) for t in (ref_k, ref_v))
    calls = fast_path()
    lens = torch.tensor([C - 2, 3])  # positions already held (the first entry evicts after 3 steps)
    for step in range(2 * C):
        q, k, v = (rand(B, 1, n * H, dtype=dtype, seed=100 + 3 * step + i) for i, n in enumerate((N, Nk, Nk)))
        if case.get("packed"):
            q, k, v = torch.cat([q, k, v], dim=-1), None, None
        pos = (lens + 5).reshape(B, 1) if case.get("position_ids") else None
        sink = (torch.arange(N, dtype=torch.float32) - 1.0).to(dtype) if case.get("head_sink") else None
        args = [q, k, v, ref_k, ref_v, lens.to(torch.int32), torch.tensor(int(lens.max()) + 1, dtype=torch.int32),
                cos, sin, pos, None, sink]
        out_ref, ref_k, ref_v, _ = _gqa(args, kw, True)
        dev_args = [None if a is None else a.to(device) for a in args]
        dev_args[3], dev_args[4], dev_args[6] = dev_k, dev_v, args[6]
        out, dev_k, dev_v, _ = _gqa(dev_args, kw, True)
        rtol, atol = TOL[dtype]
        torch.testing.assert_close(out.cpu(), out_ref, rtol=rtol, atol=atol)
        held = attention.resident_length(lens + 1, C, W)
        for b in range(B):
            assert torch.equal(dev_k[b, :, :held[b]].cpu(), ref_k[b, :, :held[b]])
            assert torch.equal(dev_v[b, :, :held[b]].cpu(), ref_v[b, :, :held[b]])
        lens = lens + 1
    assert calls == ["_fast_decode"] * (2 * C)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", [
    dict(dtype=torch.float32, heads=(4, 2), H=16, rotary="halves", capacity=9, window=6, inplace=True),
    dict(dtype=torch.float16, heads=(8, 8), H=64, rotary="off", capacity=6, window=5, packed=True),
    dict(dtype=torch.float16, heads=(4, 2), H=64, rotary="interleaved", capacity=24, window=8, position_ids=True),
], ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()).replace("torch.", ""))
def test_gqa_windowed_first_prompt_matches_torch(device: str, case: dict, fast_path) -> None:
    """A first prompt no longer than the window and the window-sized cache (sliding_window_cache=1: Gemma 2/3/4's and
    gpt-oss' local layers) takes the full-length cache's fast prompt (rotary/cache-write kernel, causal SDPA), equal to
    the torch path's window-sized computation: the output (right-padded entries included) and each entry's resident
    rows bit for bit (rows past an entry's length are unspecified); a prompt longer than the window stays on the
    torch path."""
    dtype, (N, Nk), H, C, W = case["dtype"], case["heads"], case["H"], case["capacity"], case["window"]
    B, S = 2, 5
    do_rotary, interleaved, rot = _rotary_mode(case["rotary"], H)
    seqlens_k = torch.tensor([4, 2], dtype=torch.int32)  # the second entry is right-padded
    q, k, v = (rand(B, S, n * H, dtype=dtype, seed=s) for s, n in ((50, N), (51, Nk), (52, Nk)))
    pk, pv = (rand(B, Nk, C, H, dtype=dtype, seed=s) for s in (53, 54))
    cos, sin = _caches(32, rot // 2, dtype, "cpu") if do_rotary else (None, None)
    pos = torch.arange(3, 3 + S).repeat(B, 1) if case.get("position_ids") else None
    if case.get("packed"):
        q, k, v = torch.cat([q, k, v], dim=-1), None, None
    args = [q, k, v, pk, pv, seqlens_k, torch.tensor(S, dtype=torch.int32), cos, sin, pos]
    kw = dict(num_heads=N, kv_num_heads=Nk, do_rotary=int(do_rotary), rotary_interleaved=int(interleaved),
              local_window_size=W, sliding_window_cache=1)
    out_ref, pk_ref, pv_ref, _ = _gqa([None if a is None else a.clone() for a in args], kw, False)
    calls = fast_path()
    dev_args = [None if a is None else a.to(device) for a in args]
    dev_args[6] = args[6]
    out, pk_out, pv_out, _ = _gqa(dev_args, kw, case.get("inplace", False))
    assert calls == ["_fast_prompt"]
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(out.cpu(), out_ref, rtol=rtol, atol=atol)
    for b, held in enumerate(attention.resident_length(seqlens_k.long() + 1, C, W).tolist()):
        assert torch.equal(pk_out[b, :, :held].cpu(), pk_ref[b, :, :held])
        assert torch.equal(pv_out[b, :, :held].cpu(), pv_ref[b, :, :held])
    calls.clear()
    _gqa(dev_args, dict(kw, local_window_size=S - 1), False)  # the window binds: the torch path
    assert calls == []


def test_import_does_not_load_triton() -> None:
    code = "import sys, crossml, crossml.ops.contrib.attention; assert 'triton' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": "src"})


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("route", ["combine_product", "combine_partials"])
def test_attention_skip_norm_routes(device: str, route: str, fast_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """com.crossml AttentionSkipNorm's decode step on the kernels (three key-range splits forced, as the interpreter
    otherwise takes one): ``combine_product`` and the skip-norm kernel, or, where no head grouping fits the skip-norm
    kernel's tile, the partials combined by ``combine_partials`` and the MatMulSkipNorm op. Against the
    GroupQueryAttention and MatMulSkipNorm ops on the CPU; the present buffers bit for bit."""
    from crossml.ops import fused as fused_ops
    from tests.kernels._common import record_calls

    B, N, Nk, H, L, n = 1, 4, 2, 16, 48, 24
    cos, sin = _caches(L, H // 2, torch.float32, "cpu")
    ins = [rand(B, 1, (N + 2 * Nk) * H, seed=61), None, None, rand(B, Nk, L, H, seed=62), rand(B, Nk, L, H, seed=63),
           torch.tensor([30], dtype=torch.int32), torch.tensor(31, dtype=torch.int32), cos, sin]
    w, r, gamma = rand(N * H, n, seed=64) * 0.2, rand(B, 1, n, seed=65), rand(n, seed=66).abs() + 0.5
    attrs = {"num_heads": N, "kv_num_heads": Nk, "do_rotary": 1}
    o, pk, pv, _ = _gqa([None if a is None else a.clone() for a in ins], attrs, False)  # the torch path: before
    mctx = OpContext("m", "MatMulSkipNorm", 1, 2, (None,) * 2, (True,) * 2)
    want = (*fused_ops.matmul_skip_norm(o, w, None, r, gamma, epsilon=1e-6, ctx=mctx), pk, pv)
    calls = fast_path()
    monkeypatch.setattr(decode_attention_module, "_num_splits", lambda *a: 3)
    if route == "combine_partials":
        monkeypatch.setattr(fused_ops, "_product_tiles", lambda *a: None)
    routed = record_calls(monkeypatch, decode_attention_module, "combine_product", "combine_partials")
    ctx = OpContext("asn", "AttentionSkipNorm", 1, 4, (None,) * 4, (True,) * 4)
    on_dev = [a if a is None or i == 6 else a.to(device) for i, a in enumerate(ins)]
    got = fused_ops.attention_skip_norm(*on_dev, w.to(device), None, r.to(device), gamma.to(device),
                                        gqa_inputs=len(ins), epsilon=1e-6, ctx=ctx, **attrs)
    assert calls == ["_fast_decode"] and routed == [route]
    for a, b in zip(got[:2], want[:2], strict=True):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-4)
    for a, b in zip(got[2:], want[2:], strict=True):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-5)
