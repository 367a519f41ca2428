"""A chat session's latencies on one GPU, in a fresh process: crossml.genai vs onnxruntime-genai (CUDA).

The GenAI benchmark (``genai_bench.py``) measures steady-state prefill and decode. An interactive caller also
waits for what comes once: the process's first prompt, each chat turn appended to a running generator (a
continuation prompt: new tokens on top of the KV cache), and each new generator's prompt of a width not seen
before. This benchmark times those, each phase ending when the host holds the phase's first new token:

* ``load``: ``Model(config)``;
* ``first prompt``: a new generator, a --prompt-token prompt and its first token (the process's first run);
* ``turns``: five continuation prompts of 100, 57, 130, 88 and 100 tokens on that generator, 15 tokens
  generated after each (the median of the five, and the first);
* ``new widths``: five new generators in turn, prompts of 300, 300, 300, 1000 and 37 tokens (the first, second
  and third prompt of one width, then two new widths; crossml runs a width's first prompt eagerly on the plan
  specialised for its bucket, records that plan's graph on the second, without a warm-up run, and replays it
  from the third);
* ``turns again``: a new generator, the same first prompt and the same five turns (what a longer chat settles to:
  crossml's recordings of the first round's widths are made by then).

Models that carry layer states (LFM2, Qwen3.5) run prompts and turns in pieces of exact widths
(``crossml.genai.model.state_pieces``), recorded as they recur. ``--set MODULE.ATTRIBUTE=VALUE`` (repeatable)
overrides a module constant in crossml's child processes, e.g. ``--set crossml.genai.model.STATE_PIECE_MAX=0``
for the code before pieces; ``--name`` names the result files.

Every generator asks for max_length 2048. Each (model, precision, runtime) runs in its own process, twice: the
first run warms the on-disk caches (Triton's kernels; the model files; Python's bytecode, which an installed
package has: ``_common.child_result``) and is not reported, the second is the "warm process" a user's next start
would be. Models are the GenAI benchmark's (random weights, builder folders
under --workdir, built on first use).

    PYTHONPATH=src:$ORT_GENAI_CUDA python benchmarks/genai_chat.py --out benchmarks/results

Writes OUT/genai_chat.json and OUT/genai_chat.md.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
RUNTIMES = ("crossml", "ortgenai", "ortgenai-graph")
TURNS = (100, 57, 130, 88, 100)
WIDTHS = (300, 300, 300, 1000, 37)
MAX_LENGTH = 2048


def session(runtime: str, folder: str, prompt: int) -> dict[str, Any]:
    """One chat session in this process: the phases' wall times in ms (and load in s)."""
    sys.path.insert(0, HERE)
    from _common import child_model
    from _common import first_token_ms as timed

    og, model, load_s = child_model(runtime, folder)
    out: dict[str, Any] = {"load_s": load_s}

    def generator() -> Any:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=MAX_LENGTH, min_length=MAX_LENGTH, do_sample=False)
        return og.Generator(model, params)

    def more(gen: Any, n: int) -> None:
        for _ in range(n):
            gen.generate_next_token()
            gen.get_next_tokens()

    def chat(key: str) -> float:
        """The first prompt and the turns on a new generator: the prompt's ms (the turns' in out[key])."""
        gen = generator()
        first = timed(gen, prompt)
        more(gen, 15)
        out[key] = []
        for n in TURNS:
            out[key].append(timed(gen, n))
            more(gen, 15)
        return first

    out["first_prompt_ms"] = chat("turn_ms")
    out["width_ms"] = []
    for n in WIDTHS:
        gen = generator()
        out["width_ms"].append(timed(gen, n))
        del gen
    out["again_prompt_ms"] = chat("again_turn_ms")
    return out


def markdown(payload: dict[str, Any]) -> str:
    m = payload["machine"]
    lines = [
        "# A chat session's latencies in a fresh process: crossml.genai vs onnxruntime-genai", "",
        f"GPU: {m.get('gpu')}; torch {m.get('torch')}; onnxruntime-genai {payload.get('ortgenai_version')}. "
        f"Batch 1, greedy, max_length {MAX_LENGTH}; random-weight builder models. Each runtime in its own process, "
        "the second of two (on-disk caches warm, Python's bytecode caches included); ms until the host holds the "
        "phase's first new token.", "",
        f"Turns: continuation prompts of {', '.join(map(str, TURNS))} tokens on the first generator. New widths: "
        f"new generators with prompts of {', '.join(map(str, WIDTHS))} tokens. Again: a new generator, the first "
        "prompt and the same turns (each turn's ms).", "",
        "| model | precision | runtime | load s | first prompt ms | first turn ms | turns median ms "
        "| width 300: 1st / 2nd / 3rd ms | width 1000 ms | width 37 ms | again: prompt ms | again: turns ms |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    if payload.get("settings"):
        lines[-4:-4] = [f"Settings of crossml's processes (--set): "
                        f"{', '.join(f'{k}={v!r}' for k, v in payload['settings'].items())}.", ""]
    for r in payload["rows"]:
        head = f"| {r['model']} | {r['precision']} | {r['runtime']} |"
        if "error" in r:
            lines.append(f"{head} error: {r['error'].replace('|', '/')[:160]} | | | | | | | | |")
            continue
        w = r["width_ms"]
        again = " / ".join(f"{t:.1f}" for t in r["again_turn_ms"])
        lines.append(f"{head} {r['load_s']:.2f} | {r['first_prompt_ms']:.0f} | {r['turn_ms'][0]:.1f} | "
                     f"{statistics.median(r['turn_ms']):.1f} | {w[0]:.1f} / {w[1]:.1f} / {w[2]:.1f} | {w[3]:.1f} | "
                     f"{w[4]:.1f} | {r['again_prompt_ms']:.1f} | {again} |")
    lines += ["", f"Wall time: {payload['wall_s']:.0f} s. Produced by benchmarks/genai_chat.py.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        print("RESULT " + json.dumps(session(sys.argv[2], sys.argv[3], int(sys.argv[4]))), flush=True)
        return
    sys.path.insert(0, HERE)
    from _common import (
        add_child_settings,
        export_settings,
        genai_parser,
        machine,
        runtime_models,
        warm_process_rows,
        write,
    )

    ap = genai_parser(__doc__)
    ap.add_argument("--runtimes", default=",".join(RUNTIMES), help=f"any of {','.join(RUNTIMES)}")
    ap.add_argument("--prompt", type=int, default=512)
    add_child_settings(ap, "genai_chat")
    args = ap.parse_args(argv)
    settings = export_settings(args)
    t_start = time.perf_counter()
    folders, runtimes, ort_version = runtime_models(ap, args, RUNTIMES)
    rows = warm_process_rows(__file__, folders, runtimes, str(args.prompt))
    payload = {"machine": machine(), "ortgenai_version": ort_version, "prompt": args.prompt, "settings": settings,
               "wall_s": time.perf_counter() - t_start, "rows": rows}
    write(args.name, payload, markdown(payload), args.out)


if __name__ == "__main__":
    main()
