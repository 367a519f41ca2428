"""Speculative decoding (n-gram, ``set_speculative_options``): decode tokens per second against standard decoding.

For each of the GenAI benchmark's models (``genai_bench.py``'s builder folders, random weights, built under --workdir
on first use): a prompt of --prompt distinct tokens, then exactly --new greedy tokens (min_length holds off the end
of sequence), timed from after the prompt to the host holding the last token, median of --repeats after one
unmeasured run. Runtimes:

- ``standard``: a crossml Generator without speculation (steps run ahead on the GPU);
- ``ngram``: crossml with ``ngram_size=3, max_draft_tokens=4``. A random-weight model rarely repeats itself, so
  lookups mostly miss or are rejected: this row is the cost of speculation where it does not help;
- ``oracle-K``: crossml's rounds of K drafts with a proposer that knows the continuation (every draft is accepted):
  what a proposer that is always right gives, the bound for text that repeats (code edits, summaries). The
  continuation is the one the rounds commit (found by untimed runs: it can differ from standard decoding's after a
  near-tie of two logits, see ``same``);
- ``half-K``: the same with every draft from the middle of each proposal on wrong (about half accepted);
- ``draft-K``: a draft model (``crossml.genai.speculative.make_folder``): the fp16 target with the int4 build of the
  same weights as its draft, K drafts a round (run on the fp16 rows where the int4 folder is built too);
- ``ortgenai-ngram`` / ``ortgenai``: onnxruntime-genai's CUDA build with and without the same n-gram options (no
  CUDA graph: its n-gram decoding runs verification widths a graph cannot), where it imports.

Every crossml row's tokens are compared with ``standard``'s (``same`` in the table: the tokens up to the first
difference, out of --new; a difference needs a near-tie of two logits, the verifying runs sum in another order).

    python benchmarks/genai_speculative.py [--models qwen2.5-0.5b] [--precisions fp16,int4] [--ks 4,8]
        [--runtimes standard,ngram,oracle,half,draft,ortgenai-ngram,ortgenai] [--folder F]

Writes OUT/genai_speculative.{json,md} (``--name``). On the CPU: ``--folder`` with cpu_genai.py's int4 folder, e.g.
``--folder benchmarks/.genai_work/qwen2.5-0.5b_int4_cpu --new 64 --prompt 32 --repeats 2 --runtimes
standard,ngram,oracle,half --name genai_speculative_cpu``.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _common import decode_arguments, genai_models, genai_parser, machine, write  # noqa: E402


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


class Oracle:
    """Drafts the known continuation; with ``wrong_from``, every draft from that index of a proposal on is wrong."""

    def __init__(self, gen, truth: list[int], base: int, wrong_from: int | None = None) -> None:
        import weakref

        # weakly: a generator kept alive by a cycle would keep its lent decode buffers (and their recordings) from
        # the next generator
        self.gen, self.truth, self.base, self.wrong_from = weakref.proxy(gen), truth, base, wrong_from

    def __call__(self, k: int) -> list[int]:
        done = self.gen._len - self.base
        out = list(self.truth[done:done + k])
        if self.wrong_from is not None:
            out = [t if i < self.wrong_from else (t + 1) % 1000 for i, t in enumerate(out)]
        return out


def decode(og, model, prompt: np.ndarray, new: int, spec: dict | None = None, truth: list[int] | None = None,
           wrong_from: int | None = None) -> tuple[float, list[int], dict]:
    """(seconds for ``new`` tokens after the prompt, the tokens, speculative stats)."""
    params = og.GeneratorParams(model)
    n = len(prompt)
    params.set_search_options(max_length=n + new, min_length=n + new)
    if spec:
        params.set_speculative_options(**spec)
    gen = og.Generator(model, params)
    if truth is not None:
        gen._spec.propose = Oracle(gen, truth, n, wrong_from)
    gen.append_tokens(prompt)
    gen.get_next_tokens()
    _sync()
    t = time.perf_counter()
    tokens = []
    for _ in range(new):
        gen.generate_next_token()
        tokens.append(int(gen.get_next_tokens()[0]))
    _sync()
    seconds = time.perf_counter() - t
    return seconds, tokens, gen.get_speculative_stats()


def main(argv: list[str] | None = None) -> None:
    ap = genai_parser(__doc__, models="qwen2.5-0.5b")
    ap.add_argument("--runtimes", default="standard,ngram,oracle,half,draft,ortgenai-ngram,ortgenai")
    ap.add_argument("--ks", default="4,8")
    decode_arguments(ap, "genai_speculative")
    ap.add_argument("--folder", default="", help="one builder folder instead of --models (a CPU run)")
    args = ap.parse_args(argv)
    ks = [int(k) for k in args.ks.split(",")]
    folders = ({(os.path.basename(os.path.normpath(args.folder)), "-"): args.folder} if args.folder
               else genai_models(args))
    runtimes = args.runtimes.split(",")
    prompt = ((np.arange(args.prompt) * 7) % 1000 + 3).astype(np.int32)
    ngram = dict(ngram_size=3, max_draft_tokens=4)
    rows = []
    for (name, prec), folder in folders.items():
        import crossml.genai as og

        model = og.Model(folder)
        decode(og, model, prompt, args.new)
        _, truth, _ = decode(og, model, prompt, args.new)
        cases: list[tuple[str, dict | None, list[int] | None, int | None]] = []
        for runtime in runtimes:
            if runtime == "standard":
                cases.append(("standard", None, None, None))
            elif runtime == "ngram":
                cases.append(("ngram", ngram, None, None))
            elif runtime in ("oracle", "half"):
                for k in ks:
                    cases.append((f"{runtime}-{k}", dict(ngram_size=2, max_draft_tokens=k), truth,
                                  None if runtime == "oracle" else k // 2))
        if "draft" in runtimes and prec == "fp16" and (name, "int4") in folders:
            import tempfile

            from crossml.genai import speculative

            paired = speculative.make_folder(os.path.join(tempfile.mkdtemp(), "draft"), folder, folders[(name, "int4")])
            with_draft = og.Model(paired)
            for k in ks:
                spec = dict(max_draft_tokens=k)
                decode(og, with_draft, prompt, args.new, spec)
                runs = [decode(og, with_draft, prompt, args.new, spec) for _ in range(args.repeats)]
                s = statistics.median(r[0] for r in runs)
                tokens, stats = runs[-1][1], runs[-1][2]
                same = next((i for i, (a, b) in enumerate(zip(tokens, truth)) if a != b), len(truth))
                rows.append({"model": name, "precision": prec, "runtime": f"draft-{k}", "seconds": round(s, 5),
                             "tokens_per_s": round(args.new / s, 1), "same": same, "rounds": stats["rounds"],
                             "accepted": stats["draft_tokens_accepted"], "fallback": stats["standard_fallback_steps"]})
                print(rows[-1], flush=True)
            del with_draft
        for label, spec, oracle, wrong in cases:
            if oracle is not None:
                # the continuation the rounds themselves commit: a verifying run sums in another order than a
                # decode step, so at a near-tie of two logits its choice can differ from standard decoding's;
                # drafts of the standard continuation would then all be wrong from there on. Untimed runs until
                # the rounds commit exactly the drafted continuation.
                for _ in range(6):
                    _, tokens, _ = decode(og, model, prompt, args.new, spec, oracle, wrong)
                    if tokens == oracle:
                        break
                    oracle = tokens
            decode(og, model, prompt, args.new, spec, oracle, wrong)
            runs = [decode(og, model, prompt, args.new, spec, oracle, wrong) for _ in range(args.repeats)]
            s = statistics.median(r[0] for r in runs)
            tokens, stats = runs[-1][1], runs[-1][2]
            same = next((i for i, (a, b) in enumerate(zip(tokens, truth)) if a != b), len(truth))
            rows.append({"model": name, "precision": prec, "runtime": label, "seconds": round(s, 5),
                         "tokens_per_s": round(args.new / s, 1), "same": same,
                         "rounds": stats["rounds"], "accepted": stats["draft_tokens_accepted"],
                         "fallback": stats["standard_fallback_steps"]})
            print(rows[-1], flush=True)
        del model
        for runtime in runtimes:
            if not runtime.startswith("ortgenai"):
                continue
            try:
                import genai_bench

                ort = genai_bench._import_ortgenai()
                config = ort.Config(folder)
                config.clear_providers()
                config.append_provider("cuda")
                peer = ort.Model(config)
            except Exception as exc:  # noqa: BLE001 - the peer is optional: say why it is missing
                print(f"{runtime}: not run ({type(exc).__name__}: {exc})", flush=True)
                continue
            spec = ngram if runtime == "ortgenai-ngram" else None
            decode(ort, peer, prompt, args.new, spec)
            runs = [decode(ort, peer, prompt, args.new, spec) for _ in range(args.repeats)]
            s = statistics.median(r[0] for r in runs)
            stats = runs[-1][2]
            rows.append({"model": name, "precision": prec, "runtime": runtime, "seconds": round(s, 5),
                         "tokens_per_s": round(args.new / s, 1), "same": None, "rounds": stats["rounds"],
                         "accepted": stats["draft_tokens_accepted"], "fallback": stats["standard_fallback_steps"]})
            print(rows[-1], flush=True)
            del peer
    base = {(r["model"], r["precision"]): r["tokens_per_s"] for r in rows if r["runtime"] == "standard"}
    lines = ["# Speculative decoding (n-gram) against standard decoding", "",
             (f"GPU: {machine()['gpu']}" if machine()["gpu"] else f"CPU: {os.cpu_count()} cores") + ". Batch 1, a {args.prompt}-token prompt, then {args.new} greedy tokens timed "
             f"(median of {args.repeats}); random-weight builder models. `oracle-K`: rounds of K drafts that are all "
             "right (a proposer that knows the continuation); `half-K`: drafts wrong from the middle of each "
             "proposal on; `ngram`: ngram_size 3, 4 drafts; `same`: tokens equal to `standard`'s up to the first "
             "difference; ratio: against crossml `standard`.", "",
             "| model | precision | runtime | decode tok/s | ratio | same | rounds | drafts accepted | standard steps |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        ratio = r["tokens_per_s"] / base[(r["model"], r["precision"])] if (r["model"], r["precision"]) in base else 0
        same = "" if r["same"] is None else f"{r['same']}/{args.new}"
        lines.append(f"| {r['model']} | {r['precision']} | {r['runtime']} | {r['tokens_per_s']:,.1f} | "
                     f"{ratio:.2f}x | {same} | {r['rounds']} | {r['accepted']} | {r['fallback']} |")
    lines += ["", "Produced by benchmarks/genai_speculative.py."]
    write(args.name, {"machine": machine(), "args": vars(args), "rows": rows}, "\n".join(lines) + "\n",
          out=args.out)


if __name__ == "__main__":
    main()
