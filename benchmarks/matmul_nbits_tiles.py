"""The 4-bit decode GEMV's tiles at LLM decode shapes, timed inside CUDA graphs (as decode replays it).

For each (N, K) of Qwen2.5-0.5B and Llama-3.2-1B decode (qkv, o, gate, up / merged gate+up, down,
lm_head; one row of fp16 activations, block size 32, no zero points) it times the tiles
``crossml.kernels.matmul_nbits.pick_tiles`` chooses, every (BLOCK_N, BLOCK_K, num_warps) of a sweep,
and cuBLAS on the fp16 weight of the same shape, each as the mean over graph replays of 20 calls.
``pick_tiles``' BLOCK_K table comes from these results. Writes results/matmul_nbits_tiles.{json,md}.

    python benchmarks/matmul_nbits_tiles.py [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from collections.abc import Callable

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _common import machine  # noqa: E402

from crossml.kernels._launch import processors  # noqa: E402
from crossml.kernels.matmul_nbits import matmul_nbits, pick_tiles  # noqa: E402

#: (model, layer, N, K)
SHAPES = [
    ("qwen2.5-0.5b", "qkv", 1152, 896), ("qwen2.5-0.5b", "o", 896, 896),
    ("qwen2.5-0.5b", "gate+up", 9728, 896), ("qwen2.5-0.5b", "down", 896, 4864),
    ("qwen2.5-0.5b", "lm_head", 151936, 896),
    ("llama-3.2-1b", "qkv", 3072, 2048), ("llama-3.2-1b", "o", 2048, 2048),
    ("llama-3.2-1b", "gate+up", 16384, 2048), ("llama-3.2-1b", "down", 2048, 8192),
    ("llama-3.2-1b", "lm_head", 128256, 2048),
]
BLOCK_SIZE = 32


def in_graph_us(fn: Callable[[], object], calls: int = 20, replays: int = 10) -> float:
    """Mean µs of one ``fn()`` among ``calls`` captured in one CUDA graph (no launch gaps between them)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / replays / calls * 1e3


def measure(model: str, layer: str, N: int, K: int, dev: torch.device) -> dict:
    nb = K // BLOCK_SIZE
    g = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(1, K, device=dev, dtype=torch.float16, generator=g)
    b = torch.randint(0, 256, (N, nb, BLOCK_SIZE // 2), device=dev, dtype=torch.uint8, generator=g)
    scales = torch.rand(N * nb, device=dev, dtype=torch.float16, generator=g) * 0.01
    w16 = torch.randn(K, N, device=dev, dtype=torch.float16, generator=g)

    def run(tiles: tuple[int, int, int, int] | None) -> torch.Tensor:
        return matmul_nbits(a, b, scales, K=K, N=N, block_size=BLOCK_SIZE, tiles=tiles)

    default = pick_tiles(1, N, K, BLOCK_SIZE, processors(a))
    sweep = []
    for bn, bk, warps in itertools.product([1, 2, 4, 8, 16, 32], [256, 512, 1024, 2048], [2, 4, 8]):
        if 512 <= bn * bk <= 16384:
            sweep.append((in_graph_us(lambda t=(1, bn, bk, warps): run(t)), bn, bk, warps))
    sweep.sort()
    return {"model": model, "layer": layer, "N": N, "K": K, "default_tiles": list(default),
            "default_us": in_graph_us(lambda: run(None)), "cublas_fp16_us": in_graph_us(lambda: a @ w16),
            "best": [{"us": us, "block_n": bn, "block_k": bk, "num_warps": w} for us, bn, bk, w in sweep[:4]],
            "packed_mb": b.numel() / 1e6}


def markdown(payload: dict) -> str:
    lines = ["# 4-bit decode GEMV tiles (in-graph µs per call, one fp16 row, block size 32)", "",
             f"GPU: {payload['machine'].get('gpu')}; torch {payload['machine'].get('torch')}. GB/s: packed weight "
             "bytes / time.", "",
             "| model | layer | N | K | default tiles (M, N, K, warps) | default µs | GB/s | best two (µs, N, K, warps) | "
             "cuBLAS fp16 µs |", "| --- | --- | ---: | ---: | --- | ---: | ---: | --- | ---: |"]
    for r in payload["rows"]:
        best = "; ".join(f"{b['us']:.1f}, {b['block_n']}, {b['block_k']}, {b['num_warps']}" for b in r["best"][:2])
        lines.append(f"| {r['model']} | {r['layer']} | {r['N']} | {r['K']} | {tuple(r['default_tiles'])} | "
                     f"{r['default_us']:.1f} | {r['packed_mb'] / r['default_us'] * 1e3:.0f} | {best} | "
                     f"{r['cublas_fp16_us']:.1f} |")
    return "\n".join([*lines, "", "Produced by benchmarks/matmul_nbits_tiles.py.", ""])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("matmul_nbits_tiles: needs a GPU")
    rows = []
    for shape in SHAPES:
        rows.append(measure(*shape, torch.device("cuda")))
        r = rows[-1]
        print(f"{r['model']} {r['layer']} N={r['N']} K={r['K']}: default {tuple(r['default_tiles'])} "
              f"{r['default_us']:.1f} µs, best {r['best'][0]}, cuBLAS fp16 {r['cublas_fp16_us']:.1f} µs", flush=True)
    payload = {"machine": machine(), "block_size": BLOCK_SIZE, "rows": rows}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "matmul_nbits_tiles.json"), "w") as f:
        json.dump(payload, f, indent=1)
    with open(os.path.join(args.out, "matmul_nbits_tiles.md"), "w") as f:
        f.write(markdown(payload))


if __name__ == "__main__":
    main()
