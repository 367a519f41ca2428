"""A process's first prompt and first 8 tokens on one GPU: the full garbage collections and the greedy step's compiles.

Two first-use costs of a fresh process, each measured against the tree without it, variants alternated in fresh
processes per model:

* warm on-disk caches (Triton's kernels and launchers, bytecode): ``shipped`` against ``gc-on``
  (``CROSSML_GC_FREEZE=0``: the first ``Model()`` does not freeze the objects that exist then, so the full
  collections that the first prompt's and steps' allocations bring on walk the imported modules' objects);
* a cold Triton cache (each process its own empty ``TRITON_CACHE_DIR``, as after an install): ``cold`` against
  ``cold-no-greedy-ahead`` (``Generator._greedy_ahead`` a no-op: the greedy step's kernels and launchers compile
  on the main thread at the first two ``generate_next_token`` calls instead of in the compile-ahead pool).

Reported per process (``first_prompt.child``): ``Model(config)``, the compile-ahead dry runs, the first prompt of 512
tokens until the host holds its first token, the next 8 tokens, and the full (generation 2) collections in the two
phases.

    PYTHONPATH=src:$ORT_GENAI_CUDA python benchmarks/first_tokens.py --models lfm2-350m,qwen2.5-0.5b --out OUT

(onnxruntime-genai's model builder makes the models, as for genai_bench.py.) Writes OUT/first_tokens.json and
OUT/first_tokens.md.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
WARM = ("shipped", "gc-on")
COLD = ("cold", "cold-no-greedy-ahead")


def child(folder: str, variant: str) -> dict[str, Any]:
    """One process's first prompt and tokens under ``variant`` (this process)."""
    sys.path.insert(0, HERE)
    import first_prompt

    if variant == "gc-on":
        os.environ["CROSSML_GC_FREEZE"] = "0"
    if variant == "cold-no-greedy-ahead":
        from crossml.genai import generator

        generator.Generator._greedy_ahead = lambda self, logits, col: None
    return first_prompt.child(folder, "on")


def run_child(folder: str, variant: str) -> dict[str, Any]:
    from _common import child_result

    if not variant.startswith("cold"):
        return child_result(__file__, folder, variant)
    with tempfile.TemporaryDirectory() as cache:
        return child_result(__file__, folder, variant, env={"TRITON_CACHE_DIR": cache})


def markdown(payload: dict[str, Any]) -> str:
    from first_prompt import median_rows, process_rows

    m = payload["machine"]
    lines = ["# A process's first prompt and first 8 tokens: full collections and the greedy step's compiles", "",
             f"GPU: {m.get('gpu')}; torch {m.get('torch')}; Python {m.get('python')}. Fresh processes, variants "
             "alternated; a 512-token prompt, max_length 2048. ms; full GCs: Python's generation-2 collections in "
             "the phase. `shipped` / `gc-on`: warm on-disk caches, with and without the first Model()'s gc.freeze; "
             "`cold` / `cold-no-greedy-ahead`: an empty Triton cache per process, with and without the greedy "
             "step's kernels in the compile-ahead pool.", "", *process_rows(payload["rows"]), "",
             "Medians over the rounds:", "",
             *median_rows(payload["rows"], (*WARM, *COLD), {
                 "load": lambda r: r["load_ms"], "first prompt": lambda r: r["first_prompt_ms"],
                 "next 8 tokens": lambda r: r["next8_ms"],
                 "first prompt + next 8": lambda r: r["first_prompt_ms"] + r["next8_ms"]}),
             "", f"Wall time: {payload['wall_s']:.0f} s. Produced by benchmarks/first_tokens.py.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        print("RESULT " + json.dumps(child(sys.argv[2], sys.argv[3])), flush=True)
        return
    sys.path.insert(0, HERE)
    from _common import genai_models, genai_parser, machine, write

    ap = genai_parser(__doc__, models="lfm2-350m,qwen2.5-0.5b")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the warm variants")
    ap.add_argument("--cold-rounds", type=int, default=1, help="rounds of the cold variants (0: none)")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    folders = genai_models(args)
    rows: list[dict[str, Any]] = []
    for (name, prec), folder in folders.items():
        plan = [(r, v) for r in range(args.cold_rounds) for v in (COLD if r % 2 == 0 else COLD[::-1])]
        run_child(folder, "shipped")  # warms the on-disk caches (Triton's kernels, the model files, bytecode)
        plan += [(r, v) for r in range(args.rounds) for v in (WARM if r % 2 == 0 else WARM[::-1])]
        for r, v in plan:
            row: dict[str, Any] = {"model": name, "precision": prec, "variant": v, "round": r + 1}
            try:
                row.update(run_child(folder, v))
            except Exception as exc:  # noqa: BLE001 - reported in the table
                row["error"] = f"{type(exc).__name__}: {exc}"
            rows.append(row)
            print(row, flush=True)
    payload = {"machine": machine(), "rows": rows, "wall_s": time.perf_counter() - t_start}
    print(*write("first_tokens", payload, markdown(payload), args.out), sep="\n")


if __name__ == "__main__":
    main()
