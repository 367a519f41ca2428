"""A prompt's delta-rule recurrence on one GPU: the chunked form (crossml.kernels.chunked_delta) against the token
walk (crossml.kernels.linear_attention), its tiles and product precision, and the prompt length where it takes over.

One layer of Qwen3.5-0.8B (16 key and 16 value heads of 128), batch 1, fp16 activations: LinearAttention's K-major
fp16 state (normalized keys, log decays, beta) and GatedDeltaNet's V-major float32 state (raw heads, the L2 norms, Qwen's
gate and sigmoid beta in the kernels). Each call is recorded into a CUDA graph (as the prompt graphs of
crossml.genai are) and each timing is the minimum over four interleaved rounds of 30-event medians of its replay:
the GPU work, not the host's launches. "max diff" is the largest difference of the chunked output from the walk's
(same inputs, same card), for the precision choice.

    python benchmarks/chunked_delta.py [--out DIR]
"""

from __future__ import annotations

import itertools
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
sys.path.insert(0, os.path.dirname(__file__))

from _common import machine, results_parser, write  # noqa: E402
from linear_attention_tiles import HEADS, D, layer_inputs, median_ms  # noqa: E402

from crossml.kernels import chunked_delta  # noqa: E402
from crossml.kernels.linear_attention import CHUNK, CHUNKED_FROM, CHUNKED_FROM_V_MAJOR, linear_attention  # noqa: E402

SWEEP_PROMPT = 512
PROMPTS = (64, 128, 192, 256, 384, 512, 2048)
# the walking program's tiles (columns, warps; one pipeline stage: two overflowed shared memory at every tile of the
# first sweep) at the default preparation, then the preparation's warps and the products' precision at the default
# walk (IEEE float32 products, 15 times slower in the first sweep, are left out)
SWEEP = sorted({(c, w, 1, chunked_delta.TILES[3], "tf32") for c, w in itertools.product((16, 32, 64), (4, 8))}
               | {(*chunked_delta.TILES[:3], w, p) for w, p in itertools.product((4, 8), ("tf32x3", "tf32"))})
ROUNDS, RUNS = 4, 30
LAYOUTS = (("LinearAttention, K-major fp16 state", False), ("GatedDeltaNet, V-major float32 state", True))


def _graphed(call):
    """``call`` recorded into a CUDA graph, as a prompt's layers run in a recorded prompt graph: the replay times the
    GPU work, not the Python launches (which, at a fraction of a millisecond of work, they would otherwise be)."""
    for _ in range(3):  # compile and warm
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return graph.replay


def _best(calls: dict) -> dict:
    replays = {key: _graphed(call) for key, call in calls.items()}
    torch.cuda.synchronize()
    best: dict = {}
    for _ in range(ROUNDS):
        for key, replay in replays.items():
            best[key] = min(best.get(key, float("inf")), median_ms(replay, RUNS))
    return best


def _call(tensors, options, state_dtype, **kw):
    return lambda: linear_attention(*tensors, HEADS, HEADS, HEADS, D ** -0.5, state_dtype, None, **options, **kw)


def main() -> None:
    args = results_parser(__doc__).parse_args()
    sweep, diffs, failed = {}, {}, {}
    for layout, v_major in LAYOUTS:
        tensors, options, state_dtype = layer_inputs(v_major, SWEEP_PROMPT, seed=SWEEP_PROMPT)
        want = _call(tensors, options, state_dtype, chunk=0)()[0].float()
        for tiles in SWEEP:
            call = _call(tensors, options, state_dtype, chunk=CHUNK, tiles=tiles)
            try:
                diffs[(layout, tiles)] = (call()[0].float() - want).abs().max().item()
            except triton.runtime.errors.OutOfResources as e:  # a tile too large for the card: reported, not timed
                failed[(layout, tiles)] = str(e).split(".")[0]
                continue
            sweep[(layout, tiles)] = call
        sweep[(layout, None)] = _call(tensors, options, state_dtype, chunk=0)
    best = _best(sweep)
    prompts = {}
    for (layout, v_major), tokens in itertools.product(LAYOUTS, PROMPTS):
        tensors, options, state_dtype = layer_inputs(v_major, tokens, seed=tokens)
        prompts[(layout, tokens, "walk")] = _call(tensors, options, state_dtype, chunk=0)
        prompts[(layout, tokens, "chunks")] = _call(tensors, options, state_dtype, chunk=CHUNK)
    by_prompt = _best(prompts)
    rows = [{"layout": layout, "form": "walk" if tiles is None else "chunks", "tiles": tiles, "ms": ms,
             "max_diff": diffs.get((layout, tiles), 0.0)} for (layout, tiles), ms in best.items()]
    rows += [{"layout": layout, "form": "chunks", "tiles": tiles, "ms": None, "max_diff": None, "error": error}
             for (layout, tiles), error in failed.items()]
    lengths = [{"layout": layout, "tokens": tokens, "walk_ms": by_prompt[(layout, tokens, "walk")],
                "chunks_ms": by_prompt[(layout, tokens, "chunks")]} for layout, _ in LAYOUTS for tokens in PROMPTS]
    lines = ["# A prompt's delta rule in chunks against the token walk", "",
             f"GPU: {machine()['gpu']}; torch {torch.__version__}. One layer of {HEADS} heads of {D}, batch 1, fp16 "
             f"activations; ms, the minimum over {ROUNDS} interleaved rounds of {RUNS}-timing medians of a CUDA "
             "graph's replay (GPU work, not host launches). "
             f"Defaults: chunks of {CHUNK} from {CHUNKED_FROM} tokens (K-major) and {CHUNKED_FROM_V_MAJOR} (V-major), "
             f"tiles {chunked_delta.TILES}.", "",
             f"## Tiles and precision, {SWEEP_PROMPT}-token prompt", "",
             "| layout | form | columns | walk warps | walk stages | prepare warps | precision | ms | max diff from "
             "the walk |", "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: |"]
    for r in sorted(rows, key=lambda r: (r["layout"], r["ms"] is None, r["ms"] or 0.0)):
        t = r["tiles"] or ("",) * 5
        timing = (f"{r['ms']:.3f} | {r['max_diff']:.2e}" if r["ms"] is not None else f"{r['error']} | ")
        lines.append(f"| {r['layout']} | {r['form']} | {' | '.join(str(x) for x in t)} | {timing} |")
    lines += ["", "## Prompt length (default tiles)", "", "| layout | tokens | walk ms | chunks ms | walk / chunks |",
              "| --- | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['layout']} | {r['tokens']} | {r['walk_ms']:.3f} | {r['chunks_ms']:.3f} | "
              f"{r['walk_ms'] / r['chunks_ms']:.2f} |" for r in lengths]
    lines += ["", "Produced by benchmarks/chunked_delta.py."]
    write("chunked_delta", {"machine": machine(), "sweep": rows, "prompts": lengths}, "\n".join(lines) + "\n",
          args.out)


if __name__ == "__main__":
    main()
