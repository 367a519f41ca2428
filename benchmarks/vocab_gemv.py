"""One-row vocabulary products (an LLM's lm_head) in CUDA graphs: the vendor GEMM against crossml's GEMVs.

For the lm_head shapes of Qwen2.5-0.5B (K x N = 896 x 151936) and Llama-3.2-1B (2048 x 128256), fp16, one row of
activations, it times per product (µs, GB/s of weight read):

* cuBLAS on the weight as ONNX gives it (``a @ W``, W row-major: what a session runs today) and on its transpose
  (``F.linear(a, W^T)``);
* the GEMV (``crossml.kernels.gemv.gemv``, column-major W) at its tile rule;
* the streaming kernel (``_stream_kernel``: persistent programs, each walking its column blocks with the next
  blocks' tiles in flight) at a sweep of (tile values, programs per SM, tiles ahead, warps).

Each product is preceded by the RMSNorm kernel that writes its activations (as in a decode step, where the lm_head
follows the final norm), both captured in one CUDA graph over distinct copies of the weight (together larger than
the L2 cache), programmatic dependent launch between kernels; µs are per (norm + product) pair, the norm alone
timed the same way and subtracted. Writes OUT/vocab_gemv.{json,md}.

    python benchmarks/vocab_gemv.py [--out benchmarks/results] [--quick]
"""

from __future__ import annotations

import itertools
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from _common import in_graph_us, machine, results_parser, write  # noqa: E402

from crossml.kernels import gemv as g  # noqa: E402
from crossml.kernels.rmsnorm import rms_norm  # noqa: E402

SHAPES = [("qwen2.5-0.5b", 896, 151936), ("llama-3.2-1b", 2048, 128256)]
#: weight copies of one graph (each 272-525 MB: two are past any L2)
COPIES = 3


def measure(K: int, N: int, quick: bool) -> dict:
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(1, K, device=dev, dtype=torch.float16, generator=gen)
    gamma = torch.ones(K, device=dev, dtype=torch.float16)
    rows = [torch.randn(K, N, device=dev, dtype=torch.float16, generator=gen) * 0.02 for _ in range(COPIES)]
    cols = [r.t().contiguous().t() for r in rows]  # column-major copies (their transpose contiguous)
    mb = K * N * 2 / 1e6

    def norm() -> torch.Tensor:
        return rms_norm(x, gamma, 1e-6)[0]

    base = in_graph_us([norm for _ in rows])

    def timed(product) -> dict:
        us = in_graph_us([lambda i=i: product(norm(), i) for i in range(COPIES)]) - base
        return {"us": round(us, 2), "gbs": round(mb / us * 1e3, 1)}

    ref = (norm().float() @ rows[0].float()).half()

    def check(y: torch.Tensor) -> float:
        return float((y.float() - ref.float()).abs().max())

    out = {"mb": round(mb, 1), "norm_us": round(base, 2)}
    out["cublas_rows"] = timed(lambda a, i: a @ rows[i])
    out["cublas_cols"] = timed(lambda a, i: F.linear(a, cols[i].t()))
    saved = (g.STREAM, g.STREAM_TILE, g.STREAM_PROGRAMS, g.STREAM_AHEAD, g.STREAM_WARPS)
    g.STREAM = False
    out["gemv"] = timed(lambda a, i: g.gemv(a, cols[i], const_w=True))
    out["gemv"]["diff"] = check(g.gemv(norm(), cols[0], const_w=True))
    sweep = []
    g.STREAM = True
    grid = itertools.product([8192, 16384] if not quick else [8192], [2, 4, 8] if not quick else [4], [2, 3],
                             [4, 8] if not quick else [4])
    for tile, programs, ahead, warps in grid:
        g.STREAM_TILE, g.STREAM_PROGRAMS, g.STREAM_AHEAD, g.STREAM_WARPS = tile, programs, ahead, warps
        if g.stream_tiles(1, K, N, g.rule_processors(x)) is None:
            continue
        r = timed(lambda a, i: g.gemv(a, cols[i], const_w=True))
        r.update(tile=tile, programs=programs, ahead=ahead, warps=warps,
                 diff=check(g.gemv(norm(), cols[0], const_w=True)))
        sweep.append(r)
        print(K, N, r, flush=True)
    g.STREAM, g.STREAM_TILE, g.STREAM_PROGRAMS, g.STREAM_AHEAD, g.STREAM_WARPS = saved
    sweep.sort(key=lambda r: r["us"])
    out["stream"] = sweep
    return out


def markdown(payload: dict) -> str:
    lines = ["# One-row vocabulary products: vendor GEMM against the GEMV and the streaming kernel", "",
             f"GPU: {payload['machine'].get('gpu')}; torch {payload['machine'].get('torch')}. fp16, in CUDA graphs "
             "after the RMSNorm kernel that writes the activations (its time subtracted), weights not in L2. µs per "
             "product (GB/s of weight read).", "",
             "| model | MB | cuBLAS a @ W | cuBLAS on W^T | GEMV | best streaming (tile, programs/SM, ahead, warps) "
             "| next two |", "| --- | ---: | ---: | ---: | ---: | --- | --- |"]

    def cell(r: dict) -> str:
        return f"{r['us']:.1f} ({r['gbs']:.0f})"

    for name, r in payload["rows"].items():
        best = [f"{cell(s)} ({s['tile']}, {s['programs']}, {s['ahead']}, {s['warps']})" for s in r["stream"][:3]]
        lines.append(f"| {name} | {r['mb']} | {cell(r['cublas_rows'])} | {cell(r['cublas_cols'])} | "
                     f"{cell(r['gemv'])} | {best[0] if best else '-'} | {'; '.join(best[1:])} |")
    lines += ["", "Produced by benchmarks/vocab_gemv.py."]
    return "\n".join(lines)


def main() -> None:
    parser = results_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="one streaming variant")
    args = parser.parse_args()
    payload = {"machine": machine(), "rows": {name: measure(K, N, args.quick) for name, K, N in SHAPES}}
    print(write("vocab_gemv", payload, markdown(payload), args.out))


if __name__ == "__main__":
    main()
