"""Chat turns on one GPU with continuation prompts recorded in chunk buckets, against running them eagerly.

A chat turn appended to a started generator (a continuation prompt) is right-padded to its chunk bucket (a power of
two, ``crossml.genai.model.chunk_bucket``) and fed like a decode step; a bucket's first turn runs its plan eagerly,
its second records a CUDA graph, later ones replay it. The eager route (``Model._prompt_graphs`` off for the turn)
runs every op from the host, as every turn did before.

For each of the GenAI benchmark's models (random weights, builder folders under --workdir, built on first use): a
512-token prompt and 4 tokens, then --turns chat turns of varied lengths. Each turn is taken on both routes in turn
(the order alternating), rewinding between them, and then kept: ms from ``append_tokens`` until the host holds the
turn's first new token (then 3 more tokens, untimed). Each route's first token is checked to be the same. The
recorded route's turns are labelled with what their bucket did: ``first`` (eager run of a new bucket), ``records``
or ``replay``.

    PYTHONPATH=src python benchmarks/recorded_turns.py --workdir /tmp/work --out benchmarks/results

Writes OUT/recorded_turns.{json,md}.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
#: chat-turn lengths in tokens (a user message in its chat template), cycled
LENGTHS = (100, 57, 130, 88, 100, 45, 120, 70, 95, 60, 110, 85, 140, 52, 98, 77)


def turns(folder: str, count: int) -> list[dict[str, Any]]:
    import numpy as np
    import torch
    from _common import chat_generator

    import crossml.genai as og
    from crossml.genai.model import chunk_bucket

    model = og.Model(folder)
    if not model._prompt_graphs:
        raise RuntimeError("the session does not record prompts (needs a GPU with graph capture)")
    gen = chat_generator(og, model)
    seen: dict[int, int] = {}  # bucket -> recorded-route turns so far

    def turn(ids: Any, recorded: bool) -> tuple[float, int]:
        model._prompt_graphs = recorded
        try:
            t0 = time.perf_counter()
            gen.append_tokens(ids)
            gen.generate_next_token()
            token = int(gen.get_next_tokens()[0])
            torch.cuda.synchronize()
            return (time.perf_counter() - t0) * 1e3, token
        finally:
            model._prompt_graphs = True

    rows = []
    for i in range(count):
        n = LENGTHS[i % len(LENGTHS)]
        ids = np.arange(7 + i, 7 + i + n, dtype=np.int32) % 1000 + 3
        bucket = chunk_bucket(n + 1)  # the turn feeds the last generated token too (not yet in the KV cache)
        done = seen.get(bucket, 0)
        state = ("first", "records", "replay")[min(done, 2)]
        seen[bucket] = done + 1
        start = gen.token_count()
        row: dict[str, Any] = {"tokens": n, "bucket": bucket, "recorded_state": state, "context": start}
        for k, recorded in enumerate((True, False) if i % 2 == 0 else (False, True)):
            ms, token = turn(ids, recorded)
            row["recorded_ms" if recorded else "eager_ms"] = ms
            row["recorded_token" if recorded else "eager_token"] = token
            if k == 0:
                gen.rewind_to(start)
        for _ in range(3):
            gen.generate_next_token()
        rows.append(row)
    return rows


def markdown(payload: dict[str, Any]) -> str:
    m = payload["machine"]
    lines = ["# Chat turns: continuation prompts recorded in chunk buckets vs run eagerly", "",
             f"GPU: {m.get('gpu')}; torch {m.get('torch')}; Python {m.get('python')}. Batch 1, greedy, max_length "
             "4096; a 512-token prompt, then chat turns of the lengths below, each taken on both routes in one "
             "process (order alternating, rewound between them). ms until the host holds the turn's first token.", "",
             "| model | precision | recorded, replays: median ms | eager: median ms | recorded: bucket's first run, "
             "median ms | recorded: recording run, median ms | same first tokens |",
             "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for r in payload["models"]:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['precision']} | error: {r['error'][:160]} | | | | |")
            continue
        t = r["turns"]

        def med(state: str | None, key: str, t: list[dict[str, Any]] = t) -> str:
            v = [x[key] for x in t if state is None or x["recorded_state"] == state]
            return f"{statistics.median(v):.1f}" if v else "-"

        same = all(x["recorded_token"] == x["eager_token"] for x in t)
        lines.append(f"| {r['model']} | {r['precision']} | {med('replay', 'recorded_ms')} | {med(None, 'eager_ms')} | "
                     f"{med('first', 'recorded_ms')} | {med('records', 'recorded_ms')} | {'yes' if same else 'NO'} |")
    lines += ["", "Per turn (tokens -> bucket, recorded route's state: recorded ms / eager ms):", ""]
    for r in payload["models"]:
        if "error" not in r:
            cells = [f"{x['tokens']}->{x['bucket']} {x['recorded_state']}: {x['recorded_ms']:.1f} / {x['eager_ms']:.1f}"
                     for x in r["turns"]]
            lines.append(f"- {r['model']} {r['precision']}: " + "; ".join(cells))
    lines += ["", f"Wall time: {payload['wall_s']:.0f} s. Produced by benchmarks/recorded_turns.py.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    sys.path.insert(0, HERE)
    from _common import genai_models, genai_parser, machine, write

    ap = genai_parser(__doc__)
    ap.add_argument("--turns", type=int, default=16)
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        sys.exit("recorded_turns.py needs a CUDA GPU")
    t_start = time.perf_counter()
    folders = genai_models(args)
    payload: dict[str, Any] = {"machine": machine(), "models": []}
    for (name, prec), folder in folders.items():
        row: dict[str, Any] = {"model": name, "precision": prec}
        try:
            row["turns"] = turns(folder, args.turns)
        except Exception as exc:  # noqa: BLE001 - reported in the table
            row["error"] = f"{type(exc).__name__}: {exc}"
        payload["models"].append(row)
        print({k: v for k, v in row.items() if k != "turns"}, row.get("turns", [])[-1:], flush=True)
    payload["wall_s"] = time.perf_counter() - t_start
    print(*write("recorded_turns", payload, markdown(payload), args.out), sep="\n")


if __name__ == "__main__":
    main()
