"""Multi-token prediction (og.MtpGenerator, crossml.genai.mtp): decode tokens per second against standard decoding.

A Qwen3.5-0.8B-shaped checkpoint (genai_bench.py's ``qwen3.5-0.8b``: 18 Gated DeltaNet and 6 attention layers,
random weights) with an MTP head (``mtp.*`` weights, tests/genai/_build.py's ``add_mtp_head``), exported by the
builder at fp16 for the GPU. Random weights give a head that never agrees with the model, so the agreement is made:
every layer's output projections are scaled by --residual (the model's next token is then mostly a function of the
current one) and the head passes the embedding of the token it is given through to the model's final norm and lm_head.
The weights read per token are those of the real shape; the acceptance is the construction's (reported in the table),
not a trained head's.

Runtimes: ``standard`` (crossml's Generator, steps run ahead) and ``mtp-K`` (MtpGenerator, K drafts a round). A
prompt of --prompt tokens, then --new greedy tokens timed from after the prompt until the host holds the last one,
median of --repeats after one unmeasured run; each MTP row's tokens are compared with standard's (``same``: tokens up
to the first difference).

    python benchmarks/genai_mtp.py [--ks 1,2,4] [--residual 0.01] [--new 256] [--cpu]

Writes OUT/genai_mtp.{json,md} (``--name``). Needs a CUDA GPU (or ``--cpu``: the int4 CPU build on the CPU) and
onnxruntime-genai's model builder (the folder is built under --workdir on first use).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _common import decode_arguments, genai_parser, machine, write  # noqa: E402

NAME = "qwen3.5-0.8b"


def build(work: str, residual: float, ep: str = "cuda", precision: str = "fp16") -> str:
    """The builder folder of the MTP checkpoint for ``ep`` at ``precision`` (made on first use)."""
    import genai_bench
    import torch
    import transformers
    from safetensors.torch import load_file, save_file
    from tests.genai._build import add_mtp_head

    tag = f"{NAME}-mtp-r{residual:g}"
    dst = os.path.join(work, f"{tag}_{precision}_{ep}")
    if os.path.isfile(os.path.join(dst, "genai_config.json")):
        return dst
    hf = os.path.join(work, f"hf_{tag}")
    if not os.path.isfile(os.path.join(hf, "config.json")):
        genai_bench.make_hf(NAME, hf)
        path = os.path.join(hf, "model.safetensors")
        tensors = load_file(path)
        for name, t in tensors.items():
            if name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight")):
                tensors[name] = (t.float() * residual).to(t.dtype)
        save_file(tensors, path, metadata={"format": "pt"})
        add_mtp_head(hf, transformers.AutoConfig.from_pretrained(hf).text_config)
        torch.cuda.empty_cache()
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    cmd = [sys.executable, "-m", "crossml.genai.builder", "-i", hf, "-o", dst, "-p", precision, "-e", ep, "-c",
           os.path.join(work, f"cache_{tag}")]
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    return dst


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def decode(og, model, head, prompt: np.ndarray, new: int, k: int) -> tuple[float, list[int], dict]:
    """(seconds for ``new`` tokens after the prompt, the tokens, MTP stats); ``k`` 0: standard decoding."""
    params = og.GeneratorParams(model)
    n = len(prompt)
    params.set_search_options(max_length=n + new, min_length=n + new, do_sample=False)
    if k:
        params.set_speculative_options(max_draft_tokens=k)
        gen = og.MtpGenerator(model, head, params)
    else:
        gen = og.Generator(model, params)
    gen.append_tokens(prompt)
    _sync()
    t = time.perf_counter()
    for _ in range(new):
        gen.generate_next_token()
        if not k:
            gen.get_next_tokens()
    tokens = (gen.get_sequence() if k else gen.get_sequence(0)).tolist()[n:]
    seconds = time.perf_counter() - t
    return seconds, tokens, gen.get_stats() if k else {}


def main(argv: list[str] | None = None) -> None:
    ap = genai_parser(__doc__, models=NAME)
    ap.add_argument("--ks", default="1,2,4")
    ap.add_argument("--residual", type=float, default=0.01)
    decode_arguments(ap, "genai_mtp")
    ap.add_argument("--cpu", action="store_true", help="an int4 CPU build, run on the CPU (--precisions is ignored)")
    args = ap.parse_args(argv)
    import crossml.genai as og
    from crossml.genai import mtp

    folder = build(args.workdir, args.residual, *(("cpu", "int4") if args.cpu else ("cuda", "fp16")))
    model, head = og.Model(folder), og.Model(mtp.head_folder(folder))
    prompt = ((np.arange(args.prompt) * 7) % 1000 + 3).astype(np.int32)
    rows, truth = [], None
    for k in [0] + [int(k) for k in args.ks.split(",")]:
        decode(og, model, head, prompt, args.new, k)
        runs = [decode(og, model, head, prompt, args.new, k) for _ in range(args.repeats)]
        s = statistics.median(r[0] for r in runs)
        tokens, stats = runs[-1][1], runs[-1][2]
        truth = truth or tokens
        row = {"runtime": f"mtp-{k}" if k else "standard", "seconds": round(s, 5),
               "tokens_per_s": round(args.new / s, 1),
               "same": next((i for i, (a, b) in enumerate(zip(tokens, truth)) if a != b), len(truth))}
        if k:
            row.update(rounds=stats["rounds"], accepts=stats["accepts"], trials=stats["trials"],
                       forwards=stats["forwards"], replays=stats["target_reconciliation_forward_passes"])
        rows.append(row)
        print(row, flush=True)
    base = rows[0]["tokens_per_s"]
    lines = ["# Multi-token prediction (og.MtpGenerator) against standard decoding", "",
             (f"CPU: {os.cpu_count()} cores" if args.cpu else f"GPU: {machine()['gpu']}") +
             f". {NAME}-shaped {'int4 CPU' if args.cpu else 'fp16'} builder model with an MTP head, random weights "
             "with the "
             f"layers' output projections scaled by {args.residual:g} so that the head agrees with the model (the "
             f"acceptance is the construction's). Batch 1, a {args.prompt}-token prompt, then {args.new} greedy "
             f"tokens timed (median of {args.repeats}). ratio: against `standard`; same: tokens equal to "
             "`standard`'s up to the first difference; forwards: the model's verifying runs and replays.", "",
             "| runtime | decode tok/s | ratio | same | rounds | accepts / trials | forwards | replays |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        extra = (f"{r['rounds']} | {r['accepts']} / {r['trials']} | {r['forwards']} | {r['replays']}"
                 if "rounds" in r else " |  |  | ")
        lines.append(f"| {r['runtime']} | {r['tokens_per_s']:,} | {r['tokens_per_s'] / base:.2f}x | {r['same']} | "
                     f"{extra} |")
    lines += ["", "Produced by benchmarks/genai_mtp.py."]
    print("\n".join(lines))
    write(args.name, {"machine": machine(), "args": vars(args), "rows": rows}, "\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
