"""Many independent requests of varied lengths on one GPU, in a fresh process: crossml.genai vs onnxruntime-genai.

A serving loop: one model, a new generator per request, prompts of lengths drawn (seeded) between 16 and 600
tokens, so a length rarely comes twice. Each request is timed until the host holds its first new token. The
process's first request (512 tokens, compiling) is reported apart; the others in blocks of 16, in order, to show
how the cost per request settles as the process goes on (crossml records a carried-state model's prompts in pieces
of power-of-two widths, ``crossml.genai.model.state_pieces``, once the model has run STATE_PIECE_AFTER prompts:
every width's first runs are slow, later ones replay).

Each (model, precision, runtime) runs in its own process, twice, the second reported (on-disk caches warm, as in
genai_chat.py). ``--set MODULE.ATTRIBUTE=VALUE`` (repeatable) overrides a module constant in crossml's child
processes, e.g. ``--set crossml.genai.model.STATE_PIECE_MAX=0`` for the code before pieces.

    PYTHONPATH=src:$ORT_GENAI_CUDA python benchmarks/genai_requests.py --models lfm2-350m,qwen3.5-0.8b \
        --precisions fp16 --out benchmarks/results

Writes OUT/NAME.json and OUT/NAME.md (NAME: --name, default genai_requests).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
RUNTIMES = ("crossml", "ortgenai-graph", "ortgenai")
MAX_LENGTH = 2048
BLOCK = 16


def lengths(n: int, seed: int = 0) -> list[int]:
    import numpy as np

    return np.random.default_rng(seed).integers(16, 601, size=n).tolist()


def session(runtime: str, folder: str, requests: int) -> dict[str, Any]:
    """One serving loop in this process: the first request's ms and every later request's ms."""
    import numpy as np
    import torch

    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    sys.path.insert(0, HERE)
    from _common import SETTINGS_ENV, apply_settings, genai_config

    if runtime == "crossml":
        apply_settings(json.loads(os.environ.get(SETTINGS_ENV, "{}")))
    og, config = genai_config(folder, runtime)
    model = og.Model(config)

    def request(n: int) -> float:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=MAX_LENGTH, do_sample=False)
        gen = og.Generator(model, params)
        ids = np.arange(3, 3 + n, dtype=np.int32)
        torch.cuda.synchronize()
        t = time.perf_counter()
        gen.append_tokens(ids)
        gen.generate_next_token()
        gen.get_next_tokens()
        ms = (time.perf_counter() - t) * 1e3
        del gen
        return ms

    first = request(512)
    return {"first_ms": first, "ms": [request(n) for n in lengths(requests)]}


def markdown(payload: dict[str, Any]) -> str:
    m = payload["machine"]
    n = payload["requests"]
    blocks = [(i, min(i + BLOCK, n)) for i in range(0, n, BLOCK)]
    lines = [
        "# Independent requests of varied lengths in a fresh process: crossml.genai vs onnxruntime-genai", "",
        f"GPU: {m.get('gpu')}; torch {m.get('torch')}; onnxruntime-genai {payload.get('ortgenai_version')}. "
        f"Batch 1, greedy, max_length {MAX_LENGTH}; random-weight builder models; a new generator per request, "
        f"{n} requests of 16-600 tokens (seeded), after a first 512-token request. Each runtime in its own process, "
        "the second of two (on-disk caches warm); ms until the host holds the request's first new token, mean over "
        "each block of requests in order.", "",
    ]
    if payload.get("settings"):
        lines += [f"Settings of crossml's processes (--set): "
                  f"{', '.join(f'{k}={v!r}' for k, v in payload['settings'].items())}.", ""]
    lines += ["| model | precision | runtime | first request ms | "
              + " | ".join(f"requests {a + 1}-{b} ms" for a, b in blocks) + " | all: mean / median ms |",
              "| --- | --- | --- | ---: | " + " | ".join("---:" for _ in blocks) + " | ---: |"]
    for r in payload["rows"]:
        head = f"| {r['model']} | {r['precision']} | {r['runtime']} |"
        if "error" in r:
            lines.append(f"{head} error: {r['error'].replace('|', '/')[:160]} |" + " |" * (len(blocks) + 1))
            continue
        ms = r["ms"]
        cells = " | ".join(f"{statistics.mean(ms[a:b]):.1f}" for a, b in blocks)
        lines.append(f"{head} {r['first_ms']:.0f} | {cells} | {statistics.mean(ms):.1f} / "
                     f"{statistics.median(ms):.1f} |")
    lines += ["", f"Wall time: {payload['wall_s']:.0f} s. Produced by benchmarks/genai_requests.py.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        print("RESULT " + json.dumps(session(sys.argv[2], sys.argv[3], int(sys.argv[4]))), flush=True)
        return
    sys.path.insert(0, HERE)
    import genai_bench as gb
    from _common import SETTINGS_ENV, child_result, genai_parser, machine, parse_settings, write

    ap = genai_parser(__doc__, models="lfm2-350m,qwen3.5-0.8b")
    ap.add_argument("--runtimes", default=",".join(RUNTIMES), help=f"any of {','.join(RUNTIMES)}")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--set", action="append", default=[], metavar="MODULE.ATTRIBUTE=VALUE",
                    help="a module constant for crossml's child processes (repeatable)")
    ap.add_argument("--name", default="genai_requests", help="result files OUT/NAME.json and OUT/NAME.md")
    args = ap.parse_args(argv)
    settings = parse_settings(args.set)
    os.environ[SETTINGS_ENV] = json.dumps(settings)
    t_start = time.perf_counter()
    names = [n for n in args.models.split(",") if n]
    runtimes = [r for r in args.runtimes.split(",") if r]
    unknown = [n for n in names if n not in gb.SHAPES] + [r for r in runtimes if r not in RUNTIMES]
    if unknown:
        ap.error(f"unknown model/runtime {unknown}; models: {list(gb.SHAPES)}, runtimes: {list(RUNTIMES)}")
    os.makedirs(args.workdir, exist_ok=True)
    folders = gb.build_all(args.workdir, names, [p for p in args.precisions.split(",") if p], print)
    try:
        ort_version = gb._import_ortgenai().__version__
    except Exception as exc:  # noqa: BLE001 - reported, not fatal
        ort_version = f"unavailable ({type(exc).__name__})"
    rows: list[dict[str, Any]] = []
    for (name, prec), folder in folders.items():
        for rt in runtimes:
            row: dict[str, Any] = {"model": name, "precision": prec, "runtime": rt}
            try:
                child_result(__file__, rt, folder, str(args.requests))  # warms the on-disk caches
                row.update(child_result(__file__, rt, folder, str(args.requests)))
            except Exception as exc:  # noqa: BLE001 - one row's failure is reported in the table
                row["error"] = f"{type(exc).__name__}: {exc}"
            print(json.dumps({k: v for k, v in row.items() if k != "ms"}), flush=True)
            rows.append(row)
    payload = {"machine": machine(), "ortgenai_version": ort_version, "requests": args.requests, "lengths":
               lengths(args.requests), "settings": settings, "wall_s": time.perf_counter() - t_start, "rows": rows}
    write(args.name, payload, markdown(payload), args.out)


if __name__ == "__main__":
    main()
