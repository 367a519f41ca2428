"""GroupQueryAttention's numba decode step on the CPU (crossml.kernels.cpu_attention) against the op's torch path:
the cache rows bit for bit, the output up to float32 summation order; which steps take it."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("numba", reason="the CPU kernel is compiled by numba (the test extra installs it)")

from crossml.kernels import cpu_attention  # noqa: E402
from crossml.ops.contrib import attention  # noqa: E402
from crossml.ops.contrib.attention import group_query_attention  # noqa: E402
from crossml.ops.registry import OpContext  # noqa: E402


def _ctx() -> OpContext:
    return OpContext("gqa", "GroupQueryAttention", 1, 3, (None,) * 3, (True,) * 3)


def _inputs(B, N, Nk, H, L, seqlens, *, packed, rot, position_ids=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, 1, N * H, generator=g)
    k = torch.randn(B, 1, Nk * H, generator=g)
    v = torch.randn(B, 1, Nk * H, generator=g)
    args = [torch.cat([q, k, v], -1), None, None] if packed else [q, k, v]
    pk, pv = torch.randn(B, Nk, L, H, generator=g), torch.randn(B, Nk, L, H, generator=g)
    seq = torch.tensor(seqlens, dtype=torch.int32) - 1
    args += [pk, pv, seq, torch.tensor(max(seqlens), dtype=torch.int32)]
    if rot:
        args += [torch.randn(64, rot // 2, generator=g), torch.randn(64, rot // 2, generator=g)]
        if position_ids:
            args.append(torch.randint(0, 80, (B, 1), generator=g))  # some past the caches: clamped
    return args


CASES = [  # B, N, Nk, H, L, seqlens, packed, rotary channels, attributes
    (1, 14, 2, 64, 40, [29], True, 64, {}),
    (3, 4, 2, 32, 16, [5, 9, 3], False, 32, {}),
    (2, 4, 4, 16, 12, [12, 7], True, 0, {}),
    (2, 6, 1, 32, 20, [17, 4], False, 16, {"rotary_interleaved": 1}),
    (2, 8, 2, 16, 24, [20, 9], True, 8, {"local_window_size": 5}),
    (1, 4, 2, 16, 8, [8], False, 16, {"scale": 0.3}),
    (2, 4, 2, 16, 20, [17, 6], True, 16, {"softcap": 0.5}),  # Gemma 2's: capped scores of about its size
    (2, 8, 4, 32, 24, [20, 9], False, 32, {"softcap": 2.0, "local_window_size": 5}),
]


def _spy(monkeypatch) -> list[bool]:
    """Per call of the kernels' common wrapper, whether it computed the step (False: it declined)."""
    calls = []
    real = cpu_attention._decode

    def spy(*a, **kw):
        out = real(*a, **kw)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(cpu_attention, "_decode", spy)
    return calls


def _run(args, N, Nk, rot, attrs, *, kernel: bool, monkeypatch):
    real = attention.load
    if not kernel:
        monkeypatch.setattr(attention, "load", lambda name: None if name == "cpu_attention" else real(name))
    taken = _spy(monkeypatch) if kernel else []
    try:
        out = group_query_attention(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args], num_heads=N,
                                    kv_num_heads=Nk, do_rotary=int(rot > 0), ctx=_ctx(), **attrs)
    finally:
        monkeypatch.undo()
    assert bool(taken) == kernel
    return out


@pytest.mark.parametrize("position_ids", [False, True])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"B{c[0]}_N{c[1]}_Nk{c[2]}_H{c[3]}_rot{c[7]}_{'-'.join(c[8])}")
def test_kernel_matches_the_torch_path(case, position_ids, monkeypatch):
    B, N, Nk, H, L, seqlens, packed, rot, attrs = case
    args = _inputs(B, N, Nk, H, L, seqlens, packed=packed, rot=rot, position_ids=position_ids and rot > 0)
    got = _run(args, N, Nk, rot, attrs, kernel=True, monkeypatch=monkeypatch)
    ref = _run(args, N, Nk, rot, attrs, kernel=False, monkeypatch=monkeypatch)
    assert torch.equal(got[1], ref[1]) and torch.equal(got[2], ref[2])  # the caches, new rows included
    torch.testing.assert_close(got[0], ref[0], rtol=1e-5, atol=1e-6)


def test_threaded_and_serial_agree(monkeypatch):
    """Long rows run the heads on numba's threads: the same result bit for bit as the calling thread's."""
    B, N, Nk, H, L, seqlens = 2, 8, 2, 32, 300, [280, 150]
    args = _inputs(B, N, Nk, H, L, seqlens, packed=True, rot=32)
    serial = _run(args, N, Nk, 32, {}, kernel=True, monkeypatch=monkeypatch)
    monkeypatch.setattr(cpu_attention, "PARALLEL_MIN_WORK", 0)
    calls = []
    threaded = cpu_attention._threaded
    monkeypatch.setattr(cpu_attention, "_threaded", lambda *a: calls.append(1) or threaded(*a))
    parallel = group_query_attention(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args], num_heads=N,
                                     kv_num_heads=Nk, do_rotary=1, ctx=_ctx())
    assert calls and all(torch.equal(a, b) for a, b in zip(serial[:3], parallel[:3]))


@pytest.mark.parametrize("change", ["fp16", "sink", "bias", "not_shared", "prompt", "qk_output", "rows_past_buffer"])
def test_kernel_only_where_it_applies(change, monkeypatch):
    """Steps the kernel does not compute keep the torch path: half precision, sinks, an attention bias, a
    cache shorter than the sequence (not shared), a prompt, the scores as an output, a seqlens_k past the buffer
    (total_sequence_length saying less)."""
    B, N, Nk, H, L, seqlens = 2, 4, 2, 16, 12, [9, 5]
    args = _inputs(B, N, Nk, H, L, seqlens, packed=False, rot=16)
    kw = {}
    if change == "fp16":
        args = [a.half() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
    elif change == "sink":
        args += [None, None, torch.randn(N)]
    elif change == "bias":
        args += [None, torch.randn(B, 1, 1, max(seqlens))]
    elif change == "not_shared":
        args[3], args[4] = args[3][:, :, :max(seqlens) - 1], args[4][:, :, :max(seqlens) - 1]
    elif change == "prompt":
        args[0], args[1], args[2] = (t.expand(B, 3, t.shape[-1]).contiguous() for t in args[:3])
        args[5], args[6] = torch.tensor([2, 2], dtype=torch.int32), torch.tensor(3, dtype=torch.int32)
    elif change == "qk_output":
        kw["qk_output"] = 1
    elif change == "rows_past_buffer":
        args[5] = torch.tensor([L, 4], dtype=torch.int32)
    calls = _spy(monkeypatch)
    group_query_attention(*args, num_heads=N, kv_num_heads=Nk, do_rotary=1, ctx=_ctx(), **kw)
    assert not any(calls)
    assert calls == ([False] if change == "rows_past_buffer" else [])  # the kernel itself declines those rows


@pytest.mark.parametrize("rows", [[3, 12], [-1, 2]])
def test_rows_outside_the_caches_write_nothing(rows):
    """The kernel declines a step with a seqlens_k row outside [0, L) before it writes any cache row."""
    B, N, Nk, H, L = 2, 4, 2, 16, 12
    q, k, v = torch.randn(B, N * H), torch.randn(B, Nk * H), torch.randn(B, Nk * H)
    kc, vc = torch.randn(B, Nk, L, H), torch.randn(B, Nk, L, H)
    before = kc.clone(), vc.clone()
    table = torch.randn(16, H // 2)
    seq = torch.tensor(rows, dtype=torch.int32)
    assert cpu_attention.decode(q, k, v, kc, vc, seq, seq, table, table, interleaved=False, scale=1.0, window=-1,
                                keys=L) is None
    assert torch.equal(kc, before[0]) and torch.equal(vc, before[1])


@pytest.mark.parametrize("case", [
    dict(heads=(4, 2), H=16, rot=16, capacity=9, window=6, position_ids=True),
    dict(heads=(8, 8), H=32, rot=0, capacity=6, window=6, packed=True),
    dict(heads=(4, 1), H=16, rot=8, capacity=7, window=3),
    dict(heads=(4, 2), H=16, rot=16, capacity=8, window=5, softcap=0.5),  # Gemma 2's local layers
], ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_windowed_steps_match_the_torch_path(case, monkeypatch):
    """Decode steps on window-sized caches (sliding_window_cache=1: Gemma 2/3/4's local layers) on the kernel (the rows
    kept moved down in place on an evicting step, then the kernel at row L(T) - 1 with the window) equal the torch path
    step by step across evictions: the outputs, and each entry's resident rows bit for bit; rotary positions absolute."""
    (N, Nk), H, rot, C, W = case["heads"], case["H"], case["rot"], case["capacity"], case["window"]
    B = 2
    g = torch.Generator().manual_seed(7)
    cos, sin = torch.randn(64, max(rot, 2) // 2, generator=g), torch.randn(64, max(rot, 2) // 2, generator=g)
    got_k, got_v = torch.randn(B, Nk, C, H, generator=g), torch.randn(B, Nk, C, H, generator=g)
    ref_k, ref_v = got_k.clone(), got_v.clone()
    lens = torch.tensor([C - 2, 3])  # positions already held (the first entry evicts after 3 steps)
    attrs = dict(local_window_size=W, sliding_window_cache=1, softcap=case.get("softcap", 0.0))
    for _ in range(2 * C):
        q, k, v = (torch.randn(B, 1, n * H, generator=g) for n in (N, Nk, Nk))
        args = [torch.cat([q, k, v], -1), None, None] if case.get("packed") else [q, k, v]
        pos = (lens + 5).reshape(B, 1) if case.get("position_ids") else None
        tail = [lens.to(torch.int32), torch.tensor(int(lens.max()) + 1, dtype=torch.int32)]
        tail += [cos, sin, pos] if rot else []
        got = _run(args + [got_k, got_v] + tail, N, Nk, rot, attrs, kernel=True, monkeypatch=monkeypatch)
        ref = _run(args + [ref_k, ref_v] + tail, N, Nk, rot, attrs, kernel=False, monkeypatch=monkeypatch)
        torch.testing.assert_close(got[0], ref[0], rtol=1e-5, atol=1e-6)
        got_k, got_v, ref_k, ref_v = got[1], got[2], ref[1], ref[2]
        held = attention.resident_length(lens + 1, C, W)
        for b in range(B):
            assert torch.equal(got_k[b, :, :held[b]], ref_k[b, :, :held[b]])
            assert torch.equal(got_v[b, :, :held[b]], ref_v[b, :, :held[b]])
        lens = lens + 1
