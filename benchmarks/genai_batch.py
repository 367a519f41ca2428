"""Batched LLM generation on one GPU: crossml.genai vs onnxruntime-genai (CUDA) at batch sizes 1 to 16.

The GenAI benchmark (``genai_bench.py``) measures batch 1. Here each (model, precision, runtime) generates for
batches of B prompts of --prompt tokens each (distinct random token ids, equal lengths, so no row is padded),
--new tokens per row, greedy, EOS held off with min_length; per batch size, after a warm-up of two batches (crossml
runs a bucket's first prompt eagerly and records its graph on the second, and records the decode step of each
batch size on its first use), the median of --repeats runs of a batch's prompt and of its decode:

* prefill tokens/s: B x prompt tokens / the ``append_tokens`` call (until the device is idle);
* decode tokens/s: B x new tokens / the decode loop (``generate_next_token`` + ``get_next_tokens`` per step,
  the host reading each step's tokens as a streaming caller does).

Runtimes: crossml (graphs recorded), onnxruntime-genai CUDA with its CUDA graph (``enable_cuda_graph=1``) and
without. The models are genai_bench's (Qwen2.5-0.5B- and Llama-3.2-1B-shaped, random weights, builder fp16 and
int4 for CUDA), built under --workdir on first use. Each (model, precision, runtime) runs in a fresh process.

    PYTHONPATH=src:$ORT_GENAI_CUDA python benchmarks/genai_batch.py --workdir /root/work --out benchmarks/results

``--set MODULE.ATTRIBUTE=VALUE`` (repeatable) overrides a module constant in each child before its model loads, to
measure the code before a change beside it (e.g. ``--set crossml.ops.matmul.GEMV_MAX_M=4``); the settings are
recorded in the results.

Writes OUT/genai_batch.json and OUT/genai_batch.md.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import traceback
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
RUNTIMES = ("crossml", "ortgenai-graph", "ortgenai")


def _batch_loop(og: Any, model: Any, prompts: Any, new: int, repeats: int) -> dict[str, Any]:
    """Prefill and decode timings of one batch (``prompts`` an int32 [B, P] array) through the onnxruntime_genai
    API of module ``og``."""
    from genai_bench import _sync, timed_runs

    rows, width = prompts.shape
    total = width + new

    def generator() -> Any:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=total, min_length=total, do_sample=False, batch_size=rows)
        return og.Generator(model, params)

    for _ in range(2):  # warm-up: crossml runs the prompt's bucket eagerly, then records it
        gen = generator()
        gen.append_tokens(prompts)
        for _ in range(4):
            gen.generate_next_token()
            gen.get_next_tokens()
        del gen
    _sync()
    prefill, decode = timed_runs(generator, prompts, new, repeats, rows=rows, total=total)
    dt = statistics.median(decode)
    return {"prefill_tok_s": rows * width / statistics.median(prefill), "decode_tok_s": rows * new / dt,
            "decode_ms_per_step": dt / new * 1e3, "decode_runs_ms_per_step": [round(d / new * 1e3, 4) for d in decode]}


def child(folder: str, runtime: str, batches: list[int], prompt: int, new: int, repeats: int) -> dict[str, Any]:
    """One (model folder, runtime) in this process: a result per batch size."""
    import numpy as np
    import torch
    from _common import SETTINGS_ENV, apply_settings, genai_config

    apply_settings(json.loads(os.environ.get(SETTINGS_ENV, "{}")))
    og, config = genai_config(folder, runtime)
    model = og.Model(config)
    g = torch.Generator().manual_seed(0)
    out: dict[str, Any] = {}
    for b in batches:
        prompts = torch.randint(3, 300, (b, prompt), generator=g).numpy().astype(np.int32)
        try:
            out[str(b)] = _batch_loop(og, model, prompts, new, repeats)
        except Exception as exc:  # noqa: BLE001 - reported in its cell
            out[str(b)] = {"error": f"{type(exc).__name__}: {exc}".replace("\n", " ")[:300],
                           "traceback": traceback.format_exc()[-2000:]}
    return out


def markdown(payload: dict[str, Any]) -> str:
    m = payload["machine"]
    batches = payload["batches"]
    lines = [
        "# Batched LLM generation on one GPU: crossml.genai vs onnxruntime-genai", "",
        f"GPU: {m.get('gpu')}; torch {m.get('torch')}; onnxruntime-genai {payload.get('ortgenai_version')}.",
        f"Greedy; B prompts of {payload['prompt']} tokens each (no padding), {payload['new']} new tokens per row; "
        f"random weights; medians of {payload['repeats']} runs per batch size; each (model, precision, runtime) in "
        "a fresh process. Tokens/s count every row's tokens.", "",
        *([f"Settings (--set): {', '.join(f'{k}={v!r}' for k, v in payload['settings'].items())}.", ""]
          if payload.get("settings") else []),
        "## Decode tokens/s", "",
        "| model | precision | runtime | " + " | ".join(f"B={b}" for b in batches) + " |",
        "| --- | --- | --- | " + " | ".join("---:" for _ in batches) + " |",
    ]

    def short(err: str) -> str:
        """An error for a table cell: onnxruntime's status message alone, where there is one."""
        return "error: " + err.split("Status Message: ")[-1].replace("|", "/")[:90]

    def cells(r: dict[str, Any], key: str, fmt: str) -> list[str]:
        if "error" in r:
            return [short(r["error"])] + [""] * (len(batches) - 1)
        out = []
        for b in batches:
            c = r["batches"].get(str(b), {})
            out.append(format(c[key], fmt) if key in c else short(c.get("error", "-")))
        return out

    for r in payload["rows"]:
        lines.append(f"| {r['model']} | {r['precision']} | {r['runtime']} | "
                     + " | ".join(cells(r, "decode_tok_s", ",.0f")) + " |")
    lines += ["", "## crossml decode against onnxruntime-genai's best (with or without its graph)", "",
              "| model | precision | " + " | ".join(f"B={b}" for b in batches) + " |",
              "| --- | --- | " + " | ".join("---:" for _ in batches) + " |"]
    keys = list(dict.fromkeys((r["model"], r["precision"]) for r in payload["rows"]))

    def tok(rs: dict[str, Any], rt: str, b: int) -> float | None:
        return rs.get(rt, {}).get("batches", {}).get(str(b), {}).get("decode_tok_s")

    for model, prec in keys:
        rs = {r["runtime"]: r for r in payload["rows"] if (r["model"], r["precision"]) == (model, prec)}
        cells_ = []
        for b in batches:
            ours = tok(rs, "crossml", b)
            peer = max((t for t in (tok(rs, "ortgenai-graph", b), tok(rs, "ortgenai", b)) if t), default=None)
            cells_.append(f"{ours / peer:.2f}x" if ours and peer else "-")
        lines.append(f"| {model} | {prec} | " + " | ".join(cells_) + " |")
    lines += ["", "## Prefill tokens/s", "",
              "| model | precision | runtime | " + " | ".join(f"B={b}" for b in batches) + " |",
              "| --- | --- | --- | " + " | ".join("---:" for _ in batches) + " |"]
    for r in payload["rows"]:
        lines.append(f"| {r['model']} | {r['precision']} | {r['runtime']} | "
                     + " | ".join(cells(r, "prefill_tok_s", ",.0f")) + " |")
    lines += ["", "Decode ms per step (all rows), each run: see genai_batch.json.", "",
              f"Wall time: {payload['wall_s']:.0f} s. Produced by benchmarks/genai_batch.py.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    sys.path.insert(0, HERE)
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "--child":
        folder, runtime, batches, prompt, new, repeats = argv[1:7]
        out = child(folder, runtime, [int(b) for b in batches.split(",")], int(prompt), int(new), int(repeats))
        print("RESULT " + json.dumps(out), flush=True)
        return
    from _common import SETTINGS_ENV, child_result, genai_models, genai_parser, machine, parse_settings, write

    ap = genai_parser(__doc__)
    ap.add_argument("--runtimes", default=",".join(RUNTIMES), help=f"any of {','.join(RUNTIMES)}")
    ap.add_argument("--batches", default="1,4,8,16")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--set", action="append", default=[], metavar="MODULE.ATTRIBUTE=VALUE",
                    help="override a module constant in every child (repeatable), e.g. crossml.ops.matmul.GEMV_MAX_M=4")
    args = ap.parse_args(argv)
    try:
        settings = parse_settings(args.set)
    except ValueError as exc:
        ap.error(str(exc))
    os.environ[SETTINGS_ENV] = json.dumps(settings)
    t_start = time.perf_counter()
    import torch

    if not torch.cuda.is_available():
        sys.exit("genai_batch needs a CUDA GPU (torch.cuda.is_available() is False)")
    runtimes = [r for r in args.runtimes.split(",") if r]
    if any(r not in RUNTIMES for r in runtimes):
        ap.error(f"runtimes: any of {list(RUNTIMES)}")
    batches = [int(b) for b in args.batches.split(",") if b]
    folders = genai_models(args)
    try:
        import genai_bench

        version = genai_bench._import_ortgenai().__version__
    except Exception as exc:  # noqa: BLE001 - reported, not fatal
        version = f"unavailable ({type(exc).__name__})"
    rows = []
    for (name, prec), folder in folders.items():
        for rt in runtimes:
            row: dict[str, Any] = {"model": name, "precision": prec, "runtime": rt}
            try:
                row["batches"] = child_result(__file__, folder, rt, ",".join(map(str, batches)), str(args.prompt),
                                              str(args.new), str(args.repeats))
            except Exception as exc:  # noqa: BLE001 - one runtime failing does not stop the table
                row["error"] = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:600]
            print(f"[{time.perf_counter() - t_start:6.1f}s] {name} {prec} {rt}: "
                  + json.dumps({b: round(c.get("decode_tok_s", 0)) for b, c in row.get("batches", {}).items()}
                               if "batches" in row else row["error"][:300]), flush=True)
            rows.append(row)
    payload = {"benchmark": "genai_batch", "machine": machine(), "ortgenai_version": version, "prompt": args.prompt,
               "new": args.new, "repeats": args.repeats, "batches": batches, "settings": settings, "rows": rows,
               "wall_s": time.perf_counter() - t_start}
    md = markdown(payload)
    write("genai_batch", payload, md, args.out)
    print(md)


if __name__ == "__main__":
    main()
