"""A process's first prompt on one GPU: the compile-ahead dry runs with and without their launch dedupe.

The first prompt of a process (warm on-disk caches) runs the prompt and a decode step once as dry runs inside
``crossml.kernels.CompileAhead.collect`` (Triton's launches compile side by side and run nothing), then for real.
Inside a dry run, a launch of the same kind as one already handed over returns at once (``_launch_key``); without
that, Triton prepares and hashes each launch again until its compile is finalized (about 640 launches for the
Qwen2.5-0.5B model), making cyclic garbage that brings Python's full collections forward.

Each (model, variant) runs in a fresh process, the variants alternated over --rounds rounds after one unreported
warm-up process per model: ``on`` as shipped, ``off`` with ``crossml.kernels._launch_key`` returning None (no
dedupe). Reported per process: ``Model(config)``, the dry runs (``Generator._compile_ahead``), the first prompt of
512 tokens until the host holds its first token, the next 8 tokens, and the full (generation 2) garbage
collections during the first prompt and the next 8 tokens.

    PYTHONPATH=src:$ORT_GENAI_CUDA python benchmarks/first_prompt.py --out benchmarks/results

(onnxruntime-genai's model builder makes the models, as for genai_bench.py.) Writes OUT/first_prompt.json and
OUT/first_prompt.md.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
VARIANTS = ("on", "off")


def child(folder: str, variant: str) -> dict[str, Any]:
    """One process's first prompt (this process)."""
    import gc

    full: list[tuple[float, float]] = []  # (start, ms) of each generation-2 collection
    started: list[float] = []

    def watch(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[:] = [time.perf_counter()]
        elif info["generation"] == 2 and started:
            full.append((started[0], (time.perf_counter() - started[0]) * 1e3))

    gc.callbacks.append(watch)
    import numpy as np
    import torch

    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    import crossml.genai as og
    import crossml.kernels as kernels
    from crossml.genai import generator

    if variant == "off":
        kernels._launch_key = lambda *a, **k: None
    out: dict[str, Any] = {}
    dry = generator.Generator._compile_ahead

    def timed_dry(self: Any, *args: Any) -> None:
        t0 = time.perf_counter()
        dry(self, *args)
        out["dry_runs_ms"] = (time.perf_counter() - t0) * 1e3

    generator.Generator._compile_ahead = timed_dry
    t0 = time.perf_counter()
    model = og.Model(folder)
    out["load_ms"] = (time.perf_counter() - t0) * 1e3
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=2048)
    gen = og.Generator(model, params)
    t_prompt = time.perf_counter()
    gen.append_tokens(np.arange(3, 515, dtype=np.int32))
    gen.generate_next_token()
    gen.get_next_tokens()
    t_next = time.perf_counter()
    out["first_prompt_ms"] = (t_next - t_prompt) * 1e3
    for _ in range(8):
        gen.generate_next_token()
        gen.get_next_tokens()
    t_end = time.perf_counter()
    out["next8_ms"] = (t_end - t_next) * 1e3
    out["full_gc_prompt_ms"] = [ms for t, ms in full if t_prompt <= t < t_next]
    out["full_gc_next8_ms"] = [ms for t, ms in full if t_next <= t < t_end]
    return out


def run_child(folder: str, variant: str) -> dict[str, Any]:
    from _common import child_result

    return child_result(__file__, folder, variant)


def process_rows(rows: list[dict[str, Any]]) -> list[str]:
    """The per-process table (``child``'s timings, one row each) in markdown lines."""
    lines = ["| model | precision | variant | round | load | dry runs | first prompt | next 8 tokens | full GCs, prompt "
             "| full GCs, next 8 |", "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for r in rows:
        head = f"| {r['model']} | {r['precision']} | {r['variant']} | {r['round']} |"
        if "error" in r:
            lines.append(f"{head} error: {r['error'][:120]} | | | | | |")
            continue
        gcs = [" ".join(f"{x:.0f}" for x in r[k]) or "-" for k in ("full_gc_prompt_ms", "full_gc_next8_ms")]
        lines.append(f"{head} {r['load_ms']:.0f} | {r.get('dry_runs_ms', float('nan')):.0f} | "
                     f"{r['first_prompt_ms']:.0f} | {r['next8_ms']:.0f} | {gcs[0]} | {gcs[1]} |")
    return lines


def median_rows(rows: list[dict[str, Any]], variants: tuple[str, ...],
                columns: dict[str, Any]) -> list[str]:
    """Medians over the rounds, per (model, precision, variant) in markdown lines; ``columns``: header -> a
    function of a row."""
    lines = ["| model | precision | variant | " + " | ".join(columns) + " |",
             "| --- | --- | --- |" + " ---: |" * len(columns)]
    for model, prec in sorted({(r["model"], r["precision"]) for r in rows}):
        for v in variants:
            rs = [r for r in rows if (r["model"], r["precision"], r["variant"]) == (model, prec, v) and "error" not in r]
            if rs:
                lines.append(f"| {model} | {prec} | {v} | " + " | ".join(
                    f"{statistics.median(fn(r) for r in rs):.0f}" for fn in columns.values()) + " |")
    return lines


def markdown(payload: dict[str, Any]) -> str:
    m = payload["machine"]
    lines = ["# A process's first prompt: the compile-ahead dry runs with and without their launch dedupe", "",
             f"GPU: {m.get('gpu')}; torch {m.get('torch')}; Python {m.get('python')}. Fresh processes, warm on-disk "
             "caches, variants alternated; a 512-token prompt, max_length 2048. ms; full GCs: Python's generation-2 "
             "collections in the phase.", "", *process_rows(payload["rows"]), "", "Medians over the rounds:", "",
             *median_rows(payload["rows"], VARIANTS, {
                 "dry runs": lambda r: r["dry_runs_ms"], "first prompt": lambda r: r["first_prompt_ms"],
                 "first prompt + next 8": lambda r: r["first_prompt_ms"] + r["next8_ms"]}),
             "", f"Wall time: {payload['wall_s']:.0f} s. Produced by benchmarks/first_prompt.py.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        print("RESULT " + json.dumps(child(sys.argv[2], sys.argv[3])), flush=True)
        return
    sys.path.insert(0, HERE)
    from _common import genai_models, genai_parser, machine, write

    ap = genai_parser(__doc__, models="qwen2.5-0.5b")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    folders = genai_models(args)
    rows: list[dict[str, Any]] = []
    for (name, prec), folder in folders.items():
        run_child(folder, "on")  # warms the on-disk caches (Triton's kernels, the model files)
        for r in range(args.rounds):
            for v in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
                row: dict[str, Any] = {"model": name, "precision": prec, "variant": v, "round": r + 1}
                try:
                    row.update(run_child(folder, v))
                except Exception as exc:  # noqa: BLE001 - reported in the table
                    row["error"] = f"{type(exc).__name__}: {exc}"
                rows.append(row)
                print(row, flush=True)
    payload = {"machine": machine(), "rows": rows, "wall_s": time.perf_counter() - t_start}
    print(*write("first_prompt", payload, markdown(payload), args.out), sep="\n")


if __name__ == "__main__":
    main()
