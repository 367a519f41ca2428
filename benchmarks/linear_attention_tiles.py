"""The token walk of a Gated DeltaNet prompt on one GPU: value columns and warps per program of
``crossml.kernels.linear_attention``, LinearAttention's K-major fp16 state against GatedDeltaNet's V-major float32 one
(with its query / key L2 norms, Qwen gate and sigmoid beta in the walk).

One layer of 16 key and 16 value heads of 128 (Qwen3.5-0.8B), batch 1, a 512-token prompt, the kernel alone. Each
(layout, tiles) is timed in four rounds, interleaved with the others, each the median of 30 CUDA-event timings; the
table gives the minimum over the rounds (the host's and the card's noise moves single medians by about 10 %).
The kernel's default for prompts is the smallest time here (``tiles``: value columns, warps).

    python benchmarks/linear_attention_tiles.py [--out DIR]
"""

from __future__ import annotations

import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
sys.path.insert(0, os.path.dirname(__file__))

from _common import machine, results_parser, write  # noqa: E402

from crossml.kernels.linear_attention import linear_attention  # noqa: E402

HEADS, D, PROMPT = 16, 128, 512
TILES = ((2, 1), (4, 1), (8, 1), (8, 2))
ROUNDS, RUNS = 4, 30


def layer_inputs(v_major: bool, tokens: int = PROMPT, seed: int = 0):
    """(tensors, options, state dtype) of one layer's prompt of ``tokens``: LinearAttention's or GatedDeltaNet's
    (shared with benchmarks/chunked_delta.py)."""
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(seed)
    shape = (1, tokens, HEADS * D)
    q, k, v = (torch.randn(shape, device=dev, generator=g).half() for _ in range(3))
    if v_major:  # raw heads, the raw a and b projections, a float32 V-major state
        state = 0.1 * torch.randn(1, HEADS, D, D, device=dev, generator=g)
        a, b = (torch.randn(1, tokens, HEADS, device=dev, generator=g) for _ in range(2))
        gate = (0.5 * torch.randn(HEADS, device=dev, generator=g), torch.randn(HEADS, device=dev, generator=g))
        options = dict(v_major=True, qk_l2=True, qwen_gate=gate, sigmoid_beta=True)
        return (q, k, v, state, a, b), options, torch.float32
    k = torch.nn.functional.normalize(k.float().reshape(1, tokens, HEADS, D), dim=-1).reshape(shape).half()
    state = (0.1 * torch.randn(1, HEADS, D, D, device=dev, generator=g)).half()
    decay = -torch.rand(1, tokens, HEADS, device=dev, generator=g).half()
    beta = torch.rand(1, tokens, HEADS, device=dev, generator=g).half()
    return (q, k, v, state, decay, beta), {}, torch.float16


def median_ms(fn, runs: int = RUNS) -> float:
    """The median of ``runs`` CUDA-event timings of ``fn()``, each synchronized."""
    ts = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        ts.append(start.elapsed_time(end))
    return statistics.median(ts)


def main() -> None:
    args = results_parser(__doc__).parse_args()
    calls = {}
    for layout, v_major in (("LinearAttention, K-major fp16 state", False), ("GatedDeltaNet, V-major float32 state",
                                                                             True)):
        tensors, options, state_dtype = layer_inputs(v_major)
        for tiles in TILES:
            def call(tensors=tensors, options=options, state_dtype=state_dtype, tiles=tiles):
                return linear_attention(*tensors, HEADS, HEADS, HEADS, 0.1, state_dtype, None, **options, tiles=tiles)
            for _ in range(3):  # compile and warm
                call()
            calls[(layout, tiles)] = call
    torch.cuda.synchronize()
    best: dict[tuple, float] = {}
    for _ in range(ROUNDS):
        for key, call in calls.items():
            best[key] = min(best.get(key, float("inf")), median_ms(call))
    rows = [{"layout": layout, "columns": tiles[0], "warps": tiles[1], "ms": ms} for (layout, tiles), ms in best.items()]
    lines = ["# A Gated DeltaNet prompt's token walk: value columns and warps per program", "",
             f"GPU: {machine()['gpu']}; torch {torch.__version__}. One layer of {HEADS} heads of {D}, a {PROMPT}-token "
             f"prompt, the kernel alone; ms, the minimum over {ROUNDS} interleaved rounds of {RUNS}-timing medians.", "",
             "| layout | columns | warps | ms |", "| --- | ---: | ---: | ---: |"]
    lines += [f"| {r['layout']} | {r['columns']} | {r['warps']} | {r['ms']:.3f} |" for r in rows]
    lines += ["", "Produced by benchmarks/linear_attention_tiles.py."]
    write("linear_attention_tiles", {"machine": machine(), "rows": rows}, "\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
