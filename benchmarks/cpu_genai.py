"""LLM generation on the CPU: crossml.genai vs onnxruntime-genai on a builder int4 CPU model.

The GenAI benchmark's Qwen2.5-0.5B-shaped random-weight model (``genai_bench.make_hf``) converted by onnxruntime-genai's
model builder for the CPU (``-p int4 -e cpu``: MatMulNBits with accuracy_level 4), built under --workdir on first
use. Each runtime in its own process: ``Model()``, a --prompt-token prompt, then --new greedy tokens (EOS held off
with min_length), the host reading each token; ms for the prompt (until its logits) and per decode token.

    python benchmarks/cpu_genai.py [--workdir W] [--prompt 128] [--new 32] [--out benchmarks/results]

Writes OUT/cpu_genai.{json,md}. Needs onnxruntime-genai (the builder, and the peer).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from _common import child_result, machine, write  # noqa: E402

MODEL = "qwen2.5-0.5b"
RUNTIMES = {"crossml": "crossml.genai", "onnxruntime-genai": "onnxruntime_genai"}


def build(work: str) -> str:
    """The builder's int4 CPU folder of the benchmark model under ``work`` (made on first use)."""
    import genai_bench

    hf, dst = os.path.join(work, f"hf_{MODEL}"), os.path.join(work, f"{MODEL}_int4_cpu")
    if not os.path.isfile(os.path.join(dst, "genai_config.json")):
        genai_bench.make_hf(MODEL, hf)
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
        subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", hf, "-o", dst, "-p", "int4",
                        "-e", "cpu", "-c", os.path.join(work, f"cache_{MODEL}_int4_cpu")], env=env, check=True,
                       capture_output=True)
    return dst


def child(module: str, folder: str, prompt: int, new: int) -> None:
    """One runtime's timings, printed as the RESULT line ``child_result`` reads."""
    import numpy as np

    og = __import__(module, fromlist=["Model"])
    t0 = time.perf_counter()
    model = og.Model(folder)
    load = time.perf_counter() - t0
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=prompt + new, min_length=prompt + new)
    gen = og.Generator(model, params)
    t1 = time.perf_counter()
    gen.append_tokens(np.arange(3, 3 + prompt, dtype=np.int32))
    t2 = time.perf_counter()
    steps = 0
    while not gen.is_done():
        gen.generate_next_token()
        gen.get_next_tokens()
        steps += 1
    t3 = time.perf_counter()
    print("RESULT " + json.dumps({"load_s": load, "prompt_ms": (t2 - t1) * 1e3, "decode_ms": (t3 - t2) * 1e3 / steps,
                                  "steps": steps}), flush=True)


def main(argv: list[str] | None = None) -> None:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        return
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(here, "results"))
    ap.add_argument("--workdir", default=os.path.join(here, ".genai_work"))
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=32)
    args = ap.parse_args(argv)
    folder = build(args.workdir)
    rows = []
    for name, module in RUNTIMES.items():
        r = child_result(__file__, module, folder, str(args.prompt), str(args.new), timeout=3600)
        rows.append({"runtime": name, **r})
        print(name, r, flush=True)
    m = machine()
    lines = ["# LLM generation on the CPU: crossml.genai vs onnxruntime-genai", "",
             f"{m['platform']}, {m['cpu_count']} CPUs; torch {m['torch']}. {MODEL}-shaped random-weight model, builder "
             f"`-p int4 -e cpu` (MatMulNBits, accuracy_level 4); batch 1, greedy, prompt {args.prompt} tokens, "
             f"{args.new} new tokens; each runtime in its own process.", "",
             "| runtime | Model() s | prompt ms | decode ms/token |", "| --- | ---: | ---: | ---: |"]
    lines += [f"| {r['runtime']} | {r['load_s']:.2f} | {r['prompt_ms']:.0f} | {r['decode_ms']:.1f} |" for r in rows]
    lines += ["", "Produced by benchmarks/cpu_genai.py."]
    write("cpu_genai", {"machine": m, "prompt": args.prompt, "new": args.new, "rows": rows}, "\n".join(lines) + "\n",
          out=args.out)


if __name__ == "__main__":
    main()
