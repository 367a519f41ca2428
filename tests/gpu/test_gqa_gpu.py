"""GroupQueryAttention with window-sized KV buffers (sliding_window_cache=1) on the GPU: a decode step captured
in a CUDA graph and replayed across eviction boundaries gives the CPU op's outputs and resident rows, with and
without a softcap (Gemma-2), with attention sinks (gpt-oss), on the Triton decode kernels."""

from __future__ import annotations

import pytest
import torch

from crossml.ops.contrib import attention
from crossml.ops.contrib.attention import group_query_attention, resident_length
from crossml.ops.registry import OpContext

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(("softcap", "sinks"), [(0.0, False), (2.0, False), (0.0, True)])
def test_windowed_decode_step_captured_matches_cpu(softcap: float, sinks: bool, monkeypatch: pytest.MonkeyPatch
                                                   ) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    pytest.importorskip("triton")
    from tests.kernels._common import record_calls

    calls = record_calls(monkeypatch, attention, "_fast_decode")
    B, N, Nk, H, W, C, steps = 2, 4, 2, 32, 6, 9, 30
    g = torch.Generator().manual_seed(0)
    cos = torch.rand(128, H // 2, generator=g)
    sin = torch.rand(128, H // 2, generator=g)
    ctx = OpContext("gqa", "GroupQueryAttention", 1, 3, (None,) * 3, (True,) * 3)
    ctx.extra["kv_inplace"] = True
    attrs = dict(num_heads=N, kv_num_heads=Nk, do_rotary=1, local_window_size=W, sliding_window_cache=1, ctx=ctx,
                 softcap=softcap)
    # both entries start past a prompt the CPU ran: entry 1 is 3 tokens behind entry 0
    start = torch.tensor([12, 9])
    cpu_k, cpu_v = torch.randn(B, Nk, C, H, generator=g), torch.randn(B, Nk, C, H, generator=g)
    dev = torch.device("cuda")
    gk, gv = cpu_k.to(dev), cpu_v.to(dev)
    q = torch.zeros(B, 1, (N + 2 * Nk) * H, device=dev)
    seqlens = torch.zeros(B, dtype=torch.int32, device=dev)
    total = torch.tensor(int(start.max()) + 1, dtype=torch.int32)  # a host input: the same for every step here

    cos_d, sin_d = cos.to(dev), sin.to(dev)
    sink = torch.linspace(-1.0, 2.0, N) if sinks else None
    sink_d = sink.to(dev) if sinks else None

    def step():
        return group_query_attention(q, None, None, gk, gv, seqlens, total, cos_d, sin_d, None, None, sink_d,
                                     **attrs)

    seqlens.copy_(start.to(torch.int32))
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # warm up (also a real step: undo it below by restoring the caches)
    torch.cuda.current_stream().wait_stream(s)
    gk.copy_(cpu_k.to(dev))
    gv.copy_(cpu_v.to(dev))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()[0]
    assert calls == ["_fast_decode"] * 2, "the decode step did not run on the kernels"
    for i in range(steps):
        x = torch.randn(B, 1, (N + 2 * Nk) * H, generator=g)
        lens = (start + i).to(torch.int32)
        q.copy_(x.to(dev))
        seqlens.copy_(lens.to(dev))
        graph.replay()
        ref = group_query_attention(x, None, None, cpu_k, cpu_v, lens, torch.tensor(int(lens.max()) + 1), cos, sin,
                                    None, None, sink, **attrs)
        torch.testing.assert_close(out.cpu(), ref[0], atol=2e-3, rtol=2e-3)  # TF32 products on the GPU
        resident = resident_length(lens.long() + 1, C, W)
        for b in range(B):
            n = int(resident[b])
            torch.testing.assert_close(gk[b, :, :n].cpu(), cpu_k[b, :, :n], atol=2e-3, rtol=2e-3)
            torch.testing.assert_close(gv[b, :, :n].cpu(), cpu_v[b, :, :n], atol=2e-3, rtol=2e-3)


def test_early_reads_wait_for_the_product() -> None:
    """``rotary_decode_attention(early=True)`` reads lengths, positions and caches before its PDL wait, and q, k, v
    after it: right behind the GEMV that writes the packed QKV (launched with PDL, as in a decode step), replayed
    in a CUDA graph with new activations each time, it matches the reference on that replay's QKV."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    pytest.importorskip("triton")
    from crossml.kernels.decode_attention import rotary_decode_attention, rotary_decode_attention_reference
    from crossml.kernels.gemv import gemv

    dev = torch.device("cuda")
    B, N, Nk, H, L, K = 1, 14, 2, 64, 600, 896
    g = torch.Generator(device=dev).manual_seed(0)
    w = torch.randn(K, (N + 2 * Nk) * H, generator=g, device=dev, dtype=torch.float16) * 0.05
    x = torch.zeros(B, K, device=dev, dtype=torch.float16)
    half = H // 2
    ang = torch.arange(L, device=dev, dtype=torch.float32)[:, None] / (10000 ** (torch.arange(half, device=dev) / half))
    cos, sin = ang.cos().half(), ang.sin().half()
    kc = torch.randn(B, Nk, L, H, generator=g, device=dev, dtype=torch.float16)
    vc = torch.randn(B, Nk, L, H, generator=g, device=dev, dtype=torch.float16)
    seqlens = torch.tensor([517], dtype=torch.int32, device=dev)

    def step() -> tuple[torch.Tensor, torch.Tensor]:
        qkv = gemv(x, w, const_w=True)
        q, k, v = (t.reshape(B, -1, H) for t in qkv.split([N * H, Nk * H, Nk * H], dim=-1))
        return qkv, rotary_decode_attention(q, k, v, cos, sin, seqlens, kc, vc, seqlens, 0.125, early=True)

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        qkv, out = step()
    for i in range(20):
        x.copy_(torch.randn(B, K, generator=g, device=dev, dtype=torch.float16))
        graph.replay()
        torch.cuda.synchronize()
        q, k, v = (t.reshape(B, -1, H) for t in qkv.split([N * H, Nk * H, Nk * H], dim=-1))
        kc_ref, vc_ref = kc.clone(), vc.clone()
        kc_ref[:, :, 517], vc_ref[:, :, 517] = 0, 0  # the row this step writes, from this replay's k and v
        ref = rotary_decode_attention_reference(q, k, v, cos, sin, seqlens, kc_ref, vc_ref, seqlens, 0.125, -1,
                                                interleaved=False, do_rotary=True)
        torch.testing.assert_close(out.double(), ref.to(out.device), rtol=2e-3, atol=2e-3, msg=f"replay {i}")
        assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref), f"replay {i}: cache rows"
