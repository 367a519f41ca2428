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
    sys.path.insert(0, HERE)
    from _common import child_model, first_token_ms

    og, model, _ = child_model(runtime, folder)

    def request(n: int) -> float:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=MAX_LENGTH, do_sample=False)
        return first_token_ms(og.Generator(model, params), n)  # the generator is dropped on return

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
    import _common as common

    ap = common.genai_parser(__doc__, models="lfm2-350m,qwen3.5-0.8b")
    ap.add_argument("--runtimes", default=",".join(RUNTIMES), help=f"any of {','.join(RUNTIMES)}")
    ap.add_argument("--requests", type=int, default=64)
    common.add_child_settings(ap, "genai_requests")
    args = ap.parse_args(argv)
    settings = common.export_settings(args)
    t_start = time.perf_counter()
    folders, runtimes, ort_version = common.runtime_models(ap, args, RUNTIMES)
    rows = common.warm_process_rows(__file__, folders, runtimes, str(args.requests))
    payload = {"machine": common.machine(), "ortgenai_version": ort_version, "requests": args.requests, "lengths":
               lengths(args.requests), "settings": settings, "wall_s": time.perf_counter() - t_start, "rows": rows}
    common.write(args.name, payload, markdown(payload), args.out)


if __name__ == "__main__":
    main()
