"""LLM generation on the CPU: crossml.genai vs onnxruntime-genai on a builder int4 CPU model.

The GenAI benchmark's Qwen2.5-0.5B-shaped random-weight model (``genai_bench.make_hf``; ``--model lfm2-350m``: an
LFM2-350M-shaped one, 10 short-convolution and 6 attention layers) converted by onnxruntime-genai's
model builder for the CPU (``-p int4 -e cpu``: MatMulNBits with accuracy_level 4), built under --workdir on first
use. Each runtime in its own process: ``Model()``, a --prompt-token prompt, then --new greedy tokens (EOS held off
with min_length), the host reading each token; ms for the prompt (until its logits), for the first two
``generate_next_token`` calls (the first decode step and its one-time work: crossml lays out each 4-bit weight for its
decode kernel there) and per decode token after them.

    python benchmarks/cpu_genai.py [--workdir W] [--prompt 128] [--new 64] [--repeats 3] [--runtimes R1,R2]
                                   [--max-length N] [--tag T] [--out DIR] [--model NAME]

``--max-length``: the generator's max_length (default prompt + new; 0 keeps genai_config.json's, 32768 for this
model, as a user who sets none gets). Writes OUT/cpu_genai[_T].{json,md}. Needs onnxruntime-genai (the builder, and
the peer).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from _common import child_result, machine, write  # noqa: E402

#: the default model shape (``--model``: any of genai_bench.SHAPES)
MODEL = "qwen2.5-0.5b"
#: runtime name -> module the child imports; "crossml-torch-int4" runs crossml with numba hidden, so its 4-bit decode
#: products take torch's packed int4 kernel (what runs where numba is not installed); "crossml-allrows" computes the
#: prompt's logits at every position (crossml.genai.model.SELECT_LOGITS off)
RUNTIMES = {"crossml": "crossml.genai", "crossml-torch-int4": "crossml.genai:no-numba",
            "crossml-allrows": "crossml.genai:all-rows", "onnxruntime-genai": "onnxruntime_genai"}


def build(work: str, model: str = MODEL) -> str:
    """The builder's int4 CPU folder of the benchmark model under ``work`` (made on first use)."""
    import genai_bench

    hf, dst = os.path.join(work, f"hf_{model}"), os.path.join(work, f"{model}_int4_cpu")
    if not os.path.isfile(os.path.join(dst, "genai_config.json")):
        genai_bench.make_hf(model, hf)
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
        subprocess.run([sys.executable, "-m", "crossml.genai.builder", "-i", hf, "-o", dst, "-p", "int4",
                        "-e", "cpu", "-c", os.path.join(work, f"cache_{model}_int4_cpu")], env=env, check=True,
                       capture_output=True)
    return dst


def child(module: str, folder: str, prompt: int, new: int, max_length: int) -> None:
    """One runtime's timings, printed as the RESULT line ``child_result`` reads."""
    import numpy as np

    module, _, flag = module.partition(":")
    if flag == "no-numba":
        sys.modules["numba"] = None  # import numba raises ImportError: crossml.kernels.cpu_nbits does not load
    og = __import__(module, fromlist=["Model"])
    if flag == "all-rows":
        import crossml.genai.model as genai_model

        genai_model.SELECT_LOGITS = False
    t0 = time.perf_counter()
    model = og.Model(folder)
    load = time.perf_counter() - t0
    params = og.GeneratorParams(model)
    if max_length:
        params.set_search_options(max_length=max_length, min_length=prompt + new)
    else:
        params.set_search_options(min_length=prompt + new)
    gen = og.Generator(model, params)
    t1 = time.perf_counter()
    gen.append_tokens(np.arange(3, 3 + prompt, dtype=np.int32))
    t2 = time.perf_counter()
    times = []
    while not gen.is_done() and len(times) < new:
        t = time.perf_counter()
        gen.generate_next_token()
        gen.get_next_tokens()
        times.append(time.perf_counter() - t)
    # the first two steps: the first samples the prompt's logits, the second is the first decode step, where one-time
    # work lands (crossml lays out each 4-bit weight for its decode kernel there)
    print("RESULT " + json.dumps({"load_s": load, "prompt_ms": (t2 - t1) * 1e3, "first_steps_ms": sum(times[:2]) * 1e3,
                                  "decode_ms": sum(times[2:]) * 1e3 / len(times[2:]), "steps": len(times)}),
          flush=True)


def main(argv: list[str] | None = None) -> None:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
        return
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(here, "results"))
    ap.add_argument("--workdir", default=os.path.join(here, ".genai_work"))
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--runtimes", default=",".join(RUNTIMES), help=f"comma-separated, of {', '.join(RUNTIMES)}")
    ap.add_argument("--max-length", type=int, default=None,
                    help="the generator's max_length (default prompt + new; 0: genai_config.json's)")
    ap.add_argument("--tag", default="", help="results file suffix: cpu_genai_TAG.{json,md}")
    ap.add_argument("--model", default=MODEL, help="the model shape (genai_bench.SHAPES)")
    args = ap.parse_args(argv)
    max_length = args.prompt + args.new if args.max_length is None else args.max_length
    folder = build(args.workdir, args.model)
    names = args.runtimes.split(",")
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for rep in range(args.repeats):  # the runtimes alternate, so drift on a shared host falls on each alike
        for name in names:
            r = child_result(__file__, RUNTIMES[name], folder, str(args.prompt), str(args.new), str(max_length),
                             timeout=3600)
            runs[name].append(r)
            print(rep, name, r, flush=True)
    keys = ("load_s", "prompt_ms", "first_steps_ms", "decode_ms")
    rows = [{"runtime": name, **{k: statistics.median(r[k] for r in runs[name]) for k in keys},
             "runs": runs[name]} for name in names]
    m = machine()
    lines = ["# LLM generation on the CPU: crossml.genai vs onnxruntime-genai", "",
             f"{m['platform']}, {m['cpu_count']} CPUs; torch {m['torch']}. {args.model}-shaped random-weight model, builder "
             f"`-p int4 -e cpu` (MatMulNBits, accuracy_level 4); batch 1, greedy, prompt {args.prompt} tokens, "
             f"{args.new} new tokens, max_length {max_length or 'of genai_config.json (32768)'}; each runtime in its "
             f"own process, the runtimes alternated {args.repeats} times "
             "(medians; each run's decode ms/token in the last column).", "",
             "| runtime | Model() s | prompt ms | first two steps ms | decode ms/token (the steps after them) | runs |",
             "| --- | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        each = ", ".join(f"{x['decode_ms']:.1f}" for x in r["runs"])
        lines.append(f"| {r['runtime']} | {r['load_s']:.2f} | {r['prompt_ms']:.0f} | {r['first_steps_ms']:.0f} | "
                     f"{r['decode_ms']:.1f} | {each} |")
    lines += ["", "Produced by benchmarks/cpu_genai.py."]
    write("cpu_genai" + (f"_{args.tag}" if args.tag else ""),
          {"machine": m, "prompt": args.prompt, "new": args.new, "max_length": max_length, "repeats": args.repeats,
           "rows": rows}, "\n".join(lines) + "\n", out=args.out)


if __name__ == "__main__":
    main()
