"""The decode attention's split combine fused with the output projection, in a chain of layers (CUDA graphs).

Each layer of the chain is the attention half of an LLM decoder layer at batch 1 on fp16 weights of the GenAI
benchmark's shapes: the QKV GEMV, the rotary decode attention over a KV cache of ``--length`` rows (its key range
split), and the output projection with the residual stream's RMSNorm. Two variants:

* ``gemv``: the attention's combine kernel, then ``gemv_skip_norm`` (the projection's GEMV writing split-K partial
  sums, then the skip-norm kernel), as GPU sessions run it;
* ``fused``: the attention's partial results to ``combine_product`` (the combine and the projection in one launch,
  partial sums over groups of heads), then the same skip-norm kernel (``partials_skip_norm``): one launch fewer.

Weights are distinct per layer and stored column-major as GPU plans store them; the graphs of both variants are
replayed back to back in alternated rounds in one process. Prints and writes OUT/attention_product_chain.{json,md}.

    PYTHONPATH=src python benchmarks/attention_product.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from crossml.kernels.decode_attention import combine_product, rotary_decode_attention  # noqa: E402
from crossml.kernels.gemv import gemv, gemv_skip_norm, partials_skip_norm  # noqa: E402

#: name -> (layers, hidden, query heads, KV heads, head size)
MODELS = {"qwen2.5-0.5b": (24, 896, 14, 2, 64), "llama-3.2-1b": (16, 2048, 32, 8, 64)}


def _colmajor(t: torch.Tensor) -> torch.Tensor:
    return t.t().contiguous().t()


def build(model: str, length: int, dev: str = "cuda") -> dict:
    layers, hidden, N, Nk, H = MODELS[model]
    g = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(shape, generator=g, device=dev) * scale).half()

    L = length + 128
    half = H // 2
    inv = 1.0 / (10000 ** (torch.arange(half, device=dev, dtype=torch.float64) / half))
    ang = torch.arange(L, device=dev, dtype=torch.float64)[:, None] * inv[None, :]
    return {
        "shape": (layers, hidden, N, Nk, H),
        "wqkv": [_colmajor(rnd(hidden, (N + 2 * Nk) * H, scale=hidden ** -0.5)) for _ in range(layers)],
        "wo": [_colmajor(rnd(N * H, hidden, scale=(N * H) ** -0.5)) for _ in range(layers)],
        "gamma": [rnd(hidden).abs() + 0.5 for _ in range(layers)],
        "kc": [rnd(1, Nk, L, H) for _ in range(layers)],
        "vc": [rnd(1, Nk, L, H) for _ in range(layers)],
        "cos": ang.cos().half(), "sin": ang.sin().half(),
        "seqlens": torch.tensor([length], dtype=torch.int32, device=dev),
        "x": rnd(1, hidden), "res": rnd(1, hidden),
    }


def chain(m: dict, fused: tuple[int, int] | None) -> torch.Tensor:
    """The layers; ``fused``: (heads a program, columns a program) of ``combine_product``, or None (the GEMV)."""
    layers, hidden, N, Nk, H = m["shape"]
    x, res = m["x"], m["res"]
    pos = m["seqlens"]
    for i in range(layers):
        qkv = gemv(x, m["wqkv"][i])
        q, k, v = (t.reshape(1, -1, H) for t in qkv.split([N * H, Nk * H, Nk * H], dim=-1))
        out = rotary_decode_attention(q, k, v, m["cos"], m["sin"], pos, m["kc"][i], m["vc"][i], m["seqlens"],
                                      1.0 / math.sqrt(H), early=True, partials=fused is not None)
        if fused is not None and isinstance(out, tuple):
            ws = combine_product(out, m["wo"][i], heads_per_program=fused[0], block_n=fused[1])
            x, res = partials_skip_norm(ws, None, res, m["gamma"][i], 1e-6)
        else:
            x, res = gemv_skip_norm(out.reshape(1, N * H), m["wo"][i], None, res, m["gamma"][i], 1e-6)
    return x


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--length", type=int, default=640, help="KV cache rows attended")
    ap.add_argument("--replays", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tiles", default="4:32", help="comma-separated HEADS:COLUMNS of combine_product programs")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    for model in args.models.split(","):
        m = build(model, args.length)
        graphs, outs = {}, {}
        variants = {"gemv": None}
        variants.update({f"fused {t}": tuple(int(v) for v in t.split(":")) for t in args.tiles.split(",")})
        for name, fused in variants.items():
            chain(m, fused)  # compile
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outs[name] = chain(m, fused)
            graphs[name] = graph
        for graph in graphs.values():
            graph.replay()
        torch.cuda.synchronize()
        diff = max((outs["gemv"].float() - o.float()).abs().max().item() for o in outs.values())
        for rnd_ in range(args.rounds):
            for name, graph in graphs.items():
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(args.replays):
                    graph.replay()
                end.record()
                end.synchronize()
                us = start.elapsed_time(end) * 1000 / args.replays / m["shape"][0]
                rows.append({"model": model, "variant": name, "round": rnd_, "us_per_layer": round(us, 3),
                             "max_abs_diff": diff})
                print(f"{model} {name} round {rnd_}: {us:.2f} us a layer (outputs differ by at most {diff:.3g})")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        gpu = torch.cuda.get_device_name()
        with open(os.path.join(args.out, "attention_product_chain.json"), "w") as f:
            json.dump({"gpu": gpu, "torch": torch.__version__, "length": args.length, "rows": rows}, f, indent=1)
        lines = ["# The decode attention's combine fused with the output projection (chain of layers, CUDA graphs)", "",
                 f"GPU: {gpu}; torch {torch.__version__}; {args.length} cached rows; {args.replays} replays a round.",
                 "", "| model | variant | round | us a layer |", "| --- | --- | ---: | ---: |"]
        lines += [f"| {r['model']} | {r['variant']} | {r['round']} | {r['us_per_layer']:.2f} |" for r in rows]
        lines += ["", "Produced by benchmarks/attention_product.py."]
        with open(os.path.join(args.out, "attention_product_chain.md"), "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
