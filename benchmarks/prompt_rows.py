"""A prompt's logits at its last position only, against every position: time to the first token on one GPU (or the CPU).

crossml.genai computes a prompt's (and a chat turn's) logits at each row's last real position only (the session's
row selection, ``crossml.genai.model.SELECT_LOGITS``: a GatherRows node in front of the lm_head product). This
measures what that saves, on the GenAI benchmark's builder models (random weights, ``genai_bench.build_all``): two
models of one folder in one process, one selecting and one computing every position, alternated (the order swapped
every round), each round a new generator appending a --prompt-token prompt (a recorded prompt bucket, warmed first)
and taking its first token (``generate_next_token`` + ``get_next_tokens``). Medians and min-max of --rounds rounds:
ms until the prompt's run is done (``append_tokens`` and a device sync) and until the host holds the first token,
and ms per token of the --decode tokens after it (where the two must be level: decode steps never select). The two
models' first tokens must agree.

    PYTHONPATH=src:$GENAI python benchmarks/prompt_rows.py [--workdir W] [--models M1,M2] [--precisions fp16,int4]
                                                          [--prompts 128,512] [--rounds 15] [--decode 0] [--out DIR]
    python benchmarks/prompt_rows.py --cpu --models gemma4-12l --prompts 128 --rounds 4 --decode 16 --tag cpu_gemma4

``--cpu``: the builder's int4 CPU folder of each model (``cpu_genai.build``) on the CPU. Writes
OUT/prompt_rows[_TAG].{json,md}. Needs onnxruntime-genai's model builder (first use of --workdir), and a CUDA GPU
without --cpu.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import genai_bench as gb  # noqa: E402
from _common import machine, results_parser, write  # noqa: E402


def _first_token(og, model, ids: np.ndarray, decode: int = 0) -> tuple[float, float, float, int]:
    """(ms until the prompt has run, ms until the host holds the first token, ms per token of ``decode`` more tokens
    (0 where none), the first token)."""
    params = og.GeneratorParams(model)
    total = len(ids) + decode + 8
    params.set_search_options(max_length=total, min_length=total)
    gen = og.Generator(model, params)
    gb._sync()
    t0 = time.perf_counter()
    gen.append_tokens(ids)
    gb._sync()
    t1 = time.perf_counter()
    gen.generate_next_token()
    token = int(gen.get_next_tokens()[0])
    t2 = time.perf_counter()
    for _ in range(decode):
        gen.generate_next_token()
        gen.get_next_tokens()
    t3 = time.perf_counter()
    del gen
    return (t1 - t0) * 1e3, (t2 - t0) * 1e3, (t3 - t2) * 1e3 / max(decode, 1), token


def measure(folder: str, prompt_lengths: list[int], rounds: int, decode: int = 0) -> list[dict]:
    import crossml.genai as og
    import crossml.genai.model as genai_model

    models = {}
    for select in (True, False):
        genai_model.SELECT_LOGITS = select
        models[select] = og.Model(folder)
    genai_model.SELECT_LOGITS = True
    assert models[True].rows_input is not None and models[False].rows_input is None
    rng = np.random.default_rng(0)
    rows = []
    for n in prompt_lengths:
        ids = rng.integers(3, 900, n).astype(np.int32)
        for m in models.values():
            for _ in range(3 if m.device.type != "cpu" else 1):  # the bucket's eager run, its recording, a replay
                _first_token(og, m, ids)
        runs: dict[bool, list[tuple[float, float, float]]] = {True: [], False: []}
        for r in range(rounds):
            tokens = {}
            for select in ((True, False) if r % 2 == 0 else (False, True)):
                prompt_ms, first_ms, decode_ms, tokens[select] = _first_token(og, models[select], ids, decode)
                runs[select].append((prompt_ms, first_ms, decode_ms))
            if tokens[True] != tokens[False]:
                raise RuntimeError(f"first tokens differ: {tokens[True]} selecting, {tokens[False]} every position")
        row = {"prompt": n, "rounds": rounds}
        for select, name in ((True, "last"), (False, "every")):
            p = [x[0] for x in runs[select]]
            f = [x[1] for x in runs[select]]
            row[name] = {"prompt_ms": statistics.median(p), "prompt_min": min(p), "prompt_max": max(p),
                         "first_token_ms": statistics.median(f), "first_min": min(f), "first_max": max(f),
                         "decode_ms": [round(x[2], 3) for x in runs[select]] if decode else []}
        row["first_token_ratio"] = row["last"]["first_token_ms"] / row["every"]["first_token_ms"]
        rows.append(row)
    return rows


def main() -> None:
    ap = results_parser(__doc__)
    ap.add_argument("--workdir", default=os.path.join(os.path.dirname(__file__), ".genai_work"))
    ap.add_argument("--models", default="qwen2.5-0.5b,llama-3.2-1b")
    ap.add_argument("--precisions", default="fp16,int4")
    ap.add_argument("--prompts", default="128,512")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--decode", type=int, default=0, help="tokens timed after the first (ms per token of each round)")
    ap.add_argument("--cpu", action="store_true", help="the builder's int4 CPU folders, on the CPU")
    ap.add_argument("--tag", default="", help="results file suffix: prompt_rows_TAG.{json,md}")
    args = ap.parse_args()
    names, precisions = args.models.split(","), args.precisions.split(",")
    if args.cpu:
        import cpu_genai

        precisions = ["int4"]
        folders = {(name, "int4"): cpu_genai.build(args.workdir, name) for name in names}
    else:
        folders = gb.build_all(args.workdir, names, precisions, print)
    lengths = [int(x) for x in args.prompts.split(",")]
    results: list[dict] = []
    for name in names:
        for prec in precisions:
            for row in measure(folders[(name, prec)], lengths, args.rounds, args.decode):
                results.append({"model": name, "precision": prec, **row})
                print(results[-1], flush=True)
            report(args, results)  # after each model, so a run cut short keeps what it measured


def report(args, results: list[dict]) -> None:
    m = machine()
    where = (f"CPU: {m['platform']}, {m['cpu_count']} CPUs (builder `-p int4 -e cpu` folders)" if args.cpu
             else f"GPU: {m.get('gpu', '?')}")
    lines = ["# A prompt's logits at its last position only, against every position", "",
             f"{where}; torch {m['torch']}. Builder models with random weights, batch 1, greedy; two "
             f"models of one folder in one process, alternated over {args.rounds} rounds (medians, min-max); each "
             "round a new generator: the prompt's run (" + ("an eager run" if args.cpu else "a replayed prompt bucket")
             + ") until a device sync, and until the host holds the first token.", "",
             "| model | precision | prompt | last position: prompt ms | every position: prompt ms | last: first token ms "
             "| every: first token ms | ratio (first token) |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        a, b = r["last"], r["every"]
        lines.append(f"| {r['model']} | {r['precision']} | {r['prompt']} | {a['prompt_ms']:.3f} ({a['prompt_min']:.3f}-"
                     f"{a['prompt_max']:.3f}) | {b['prompt_ms']:.3f} ({b['prompt_min']:.3f}-{b['prompt_max']:.3f}) | "
                     f"{a['first_token_ms']:.3f} | {b['first_token_ms']:.3f} | {r['first_token_ratio']:.3f} |")
    if args.decode:
        lines += ["", f"Decode ms per token over the {args.decode} tokens after the first, each round in order (last "
                  "position / every position):", ""]
        lines += [f"- {r['model']} {r['precision']} prompt {r['prompt']}: {r['last']['decode_ms']} / "
                  f"{r['every']['decode_ms']}" for r in results]
    lines += ["", "Produced by benchmarks/prompt_rows.py."]
    write("prompt_rows" + (f"_{args.tag}" if args.tag else ""), {"machine": m, "rows": results},
          "\n".join(lines) + "\n", out=args.out)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
