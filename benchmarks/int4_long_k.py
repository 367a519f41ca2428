"""The 4-bit decode GEMV's down projections (narrow N, long K) with BLOCK_K past 2048: alone and in the decode step.

``crossml.kernels.matmul_nbits.pick_pair_tiles`` caps a K step at 2048 values, so the MLP's down projection walks
K in three or four dependent steps per program (Qwen2.5-0.5B: 896 x 4864, float32 kernel, one row per program;
Llama-3.2-1B: 2048 x 8192, fp16-pair kernel, 8 rows by 2048). The alternative rule measured here: about two
programs per SM, each holding 4096 packed words a step (BLOCK_N rows by up to all of K) at four warps, the
fp16-pair kernel (Qwen: 4 rows by 8192, one step; Llama: 8 rows by 4096, two steps).

1. The products alone: in-graph µs per call of like products on copies of a random weight larger than L2 together
   (``gemv_tiles.int4_inputs``), at the current rule's choice and at the alternative's tiles.
2. The decode step: the GenAI benchmark's int4 models (``genai_bench.py``, built under --workdir), the recorded
   decode step replayed back to back (``decode_replay.replay_ms``) with the current rule and with the alternative
   patched in, alternated --rounds times in one process.

    python benchmarks/int4_long_k.py [--workdir W] [--rounds 3] [--out benchmarks/results]

Writes OUT/int4_long_k.{json,md}. Needs a CUDA GPU and onnxruntime-genai's model builder for part 2.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import decode_replay  # noqa: E402
from _common import genai_models, genai_parser, in_graph_us, machine, write  # noqa: E402
from gemv_tiles import BLOCK_SIZE, int4_inputs  # noqa: E402

import crossml.kernels.matmul_nbits as nbits  # noqa: E402
from crossml.kernels._launch import cdiv, next_power_of_2, processors  # noqa: E402

#: (model, N, K) of the down projections
SHAPES = (("qwen2.5-0.5b", 896, 4864), ("llama-3.2-1b", 2048, 8192))


def long_k_tiles(M: int, N: int, K: int, block_size: int, sms: int) -> tuple[int, int, int, int] | None:
    """The alternative rule: for K > 2048 and N <= 16 per SM, about two programs per SM of 4096 packed words a step
    at four warps; ``pick_pair_tiles`` elsewhere."""
    if K > 2048 and N <= 16 * sms:
        block_n = min(16, max(4, next_power_of_2(cdiv(N, 2 * sms))))
        k2 = next_power_of_2(max(K, 16))
        return min(nbits.MAX_BLOCK_M, next_power_of_2(max(M, 1))), block_n, max(block_size, min(k2, 32768 // block_n)), 4
    return current(M, N, K, block_size, sms)


current = nbits.pick_pair_tiles


def _product_us(N: int, K: int, a: torch.Tensor, ws: list, tiles: tuple[int, int, int, int] | None,
                pairs: bool | None) -> float:
    return in_graph_us([lambda w=w: nbits.matmul_nbits(a, *w, K=K, N=N, block_size=BLOCK_SIZE, tiles=tiles,
                                                       const_w=True, pairs=pairs) for w in ws])


def alone() -> list[dict]:
    dev = torch.device("cuda")
    rows = []
    for name, N, K in SHAPES:
        a, ws = int4_inputs(N, K, dev)
        sms = processors(a)

        def run(tiles: tuple[int, int, int, int] | None, pairs: bool | None, N=N, K=K, a=a, ws=ws) -> float:
            return _product_us(N, K, a, ws, tiles, pairs)

        pair = current(1, N, K, BLOCK_SIZE, sms)
        now = ("fp16 pairs", pair) if pair is not None else ("float32", nbits.pick_tiles(1, N, K, BLOCK_SIZE, sms))
        alt = long_k_tiles(1, N, K, BLOCK_SIZE, sms)
        rows.append({"model": name, "N": N, "K": K, "current": f"{now[0]} {now[1]}", "current_us": run(None, None),
                     "alternative": f"fp16 pairs {alt}", "alternative_us": run(alt, True)})
        print(rows[-1], flush=True)
    return rows


def in_step(args) -> list[dict]:
    folders = genai_models(args)
    rows = []
    for rnd in range(args.rounds):
        for label, rule in (("current", current), ("alternative", long_k_tiles)):
            nbits.pick_pair_tiles = rule
            try:
                for (name, prec), folder in folders.items():
                    ms, _ = decode_replay.replay_ms(folder, args.replays, False)
                    rows.append({"model": name, "precision": prec, "rule": label, "round": rnd, "replay_ms": ms})
                    print(f"{name} {prec} {label} round {rnd}: {ms:.4f} ms per replay", flush=True)
            finally:
                nbits.pick_pair_tiles = current
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = genai_parser(__doc__)
    ap.set_defaults(precisions="int4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--replays", type=int, default=500)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("int4_long_k.py needs a CUDA GPU")
    products, steps = alone(), in_step(args)
    lines = ["# 4-bit down projections with K steps past 2048: alone and in the decode step", "",
             f"GPU: {machine()['gpu']}; torch {torch.__version__}. Block size 32, packed zero points, fp16 activations.",
             "", "## The products alone (in-graph µs per call, weights not in L2)", "",
             "| model | N | K | current rule | µs | alternative | µs |", "| --- | ---: | ---: | --- | ---: | --- | ---: |"]
    lines += [f"| {r['model']} | {r['N']} | {r['K']} | {r['current']} | {r['current_us']:.2f} | {r['alternative']} | "
              f"{r['alternative_us']:.2f} |" for r in products]
    lines += ["", f"## The int4 decode step ({args.replays} back-to-back replays, mean; rules alternated in one process)",
              "", "| model | rule | round | ms per replay |", "| --- | --- | ---: | ---: |"]
    lines += [f"| {r['model']} | {r['rule']} | {r['round']} | {r['replay_ms']:.4f} |" for r in steps]
    lines += ["", "Produced by benchmarks/int4_long_k.py."]
    write("int4_long_k", {"machine": machine(), "products": products, "steps": steps}, "\n".join(lines) + "\n",
          out=args.out)


if __name__ == "__main__":
    main()
