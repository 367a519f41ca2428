"""MoE and QMoE decode steps on the GPU: captured in a CUDA graph, replayed with new activations and router logits
(so other experts each replay), the Triton expert GEMV gives the CPU op's outputs."""

from __future__ import annotations

import pytest
import torch

from crossml.ops.contrib import moe as moe_module

pytestmark = pytest.mark.gpu

T, H, INTER, E, K = 2, 256, 128, 8, 2  # T * K <= E: the "gather" mode of a decode step
ATTRS = dict(k=K, activation_type="swiglu", swiglu_fusion=1, normalize_routing_weights=1, swiglu_limit=7.0,
             activation_alpha=1.702, activation_beta=1.0)


def _moe_weights(g: torch.Generator, dtype: torch.dtype) -> list[torch.Tensor | None]:
    """MoE inputs 3..6 (fc1 weights, bias, fc2 weights, bias), gpt-oss layout (interleaved swiglu, biases)."""
    return [(torch.randn(E, 2 * INTER, H, generator=g) * 0.1).to(dtype),
            (torch.randn(E, 2 * INTER, generator=g) * 0.1).to(dtype),
            (torch.randn(E, H, INTER, generator=g) * 0.1).to(dtype),
            (torch.randn(E, H, generator=g) * 0.1).to(dtype)]


def _qmoe_weights(g: torch.Generator, dtype: torch.dtype, block: int = 32) -> list[torch.Tensor | None]:
    """QMoE inputs 3..14 (int4, block-wise scales, packed zero points; no fc3)."""

    def quantized(N: int, Kd: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        blocks = Kd // block
        w = torch.randint(0, 256, (E, N, Kd // 2), generator=g, dtype=torch.uint8)
        s = (torch.rand(E, N, blocks, generator=g) * 0.02 + 0.005).to(dtype)
        z = torch.randint(0, 256, (E, N, (blocks + 1) // 2), generator=g, dtype=torch.uint8)
        return w, s, z

    w1, s1, z1 = quantized(2 * INTER, H)
    w2, s2, z2 = quantized(H, INTER)
    b1 = (torch.randn(E, 2 * INTER, generator=g) * 0.1).to(dtype)
    b2 = (torch.randn(E, H, generator=g) * 0.1).to(dtype)
    return [w1, s1, b1, w2, s2, b2, None, None, None, z1, z2, None]


@pytest.mark.parametrize("op_type,dtype", [("MoE", torch.float32), ("MoE", torch.float16),
                                           ("QMoE", torch.float16), ("QMoE", torch.float32)])
def test_decode_step_captured_matches_cpu(op_type: str, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    pytest.importorskip("triton")
    from crossml.kernels import moe as moe_kernels
    from tests.kernels._common import record_calls

    dev = torch.device("cuda")
    assert moe_module.expert_mode(dev, T, K, E) == "gather"
    assert moe_module.use_expert_kernel(dev), "the expert GEMV does not run on this GPU"
    calls = record_calls(monkeypatch, moe_kernels, "expert_gemv")
    g = torch.Generator().manual_seed(0)
    weights = _moe_weights(g, dtype) if op_type == "MoE" else _qmoe_weights(g, dtype)
    fn = moe_module.moe if op_type == "MoE" else moe_module.qmoe
    attrs = dict(ATTRS, **({} if op_type == "MoE" else dict(expert_weight_bits=4, block_size=32)))
    weights_d = [None if w is None else w.to(dev) for w in weights]
    x = torch.zeros(T, H, dtype=dtype, device=dev)
    logits = torch.zeros(T, E, dtype=dtype, device=dev)

    def step() -> torch.Tensor:
        return fn(x, logits, *weights_d, **attrs)

    x.normal_()
    logits.normal_()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # warm up: compiles the kernel
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    assert calls == ["expert_gemv"] * 4, "fc1 and fc2 did not run on the expert GEMV"

    routes = set()
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    for i in range(6):
        gi = torch.Generator().manual_seed(100 + i)
        x_cpu = torch.randn(T, H, generator=gi).to(dtype)
        logits_cpu = (torch.randn(T, E, generator=gi) * 3).to(dtype)
        x.copy_(x_cpu)
        logits.copy_(logits_cpu)
        graph.replay()
        torch.cuda.synchronize()
        want = fn(x_cpu, logits_cpu, *weights, **attrs)  # the CPU op ("grouped" mode, torch)
        torch.testing.assert_close(out.cpu().float(), want.float(), **tol)
        routes.add(tuple(moe_module.route(logits_cpu.float(), K, True)[0].flatten().tolist()))
    assert len(routes) > 3, "the replays did not route to different experts"
