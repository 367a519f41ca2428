"""The Engine API (og.Engine) serving several requests at once: aggregate generated tokens per second.

For each of the GenAI benchmark's models (``genai_bench.py``'s builder folders, built under --workdir on first use)
and each request count N in --requests, N requests are admitted together (prompts of --prompt distinct tokens, turns
of exactly --new tokens: min and max generated tokens both --new), and the engine is run until it has nothing
pending (each request's session limited to its prompt and turn, plus one); the table has the wall time from the first admission to the last event and the generated tokens per second
over all requests (median of --repeats, after one unmeasured round). Runtimes: ``crossml`` (crossml.genai.Engine:
three or more requests that start together decode in batched steps on shared buffers, crossml.genai.engine) and ``ortgenai`` (onnxruntime-genai's Engine on its CUDA build, where it imports);
``generator`` is the N = 1 reference: one crossml Generator's turn of the same length, its tokens read one by one;
``crossml-alone`` is crossml without batching (every request on its own generator: BATCH_ROWS = 1).
With ``--cpu`` the model is ``cpu_genai.py``'s Qwen2.5-0.5B-shaped int4 CPU folder and the results go to
OUT/genai_engine_cpu.{json,md}; ``--session`` sets each request's session length (default: its prompt and turn,
plus one), ``--rounds`` alternates the runtimes that many times (a noisy host).

    python benchmarks/genai_engine.py [--models qwen2.5-0.5b] [--precisions fp16,int4] [--requests 1,4,8]
        [--runtimes crossml,generator,ortgenai]

Writes OUT/genai_engine.{json,md}.
"""

from __future__ import annotations

import functools
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _common import genai_config, genai_models, genai_parser, machine, write  # noqa: E402


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def engine_round(og, model, n: int, prompt: int, new: int, session: int = 0) -> float:
    """Seconds to serve ``n`` requests of ``new`` tokens each, admitted together (sessions of ``session`` tokens,
    0: the prompt and turn, plus one)."""
    e = og.Engine(model)
    buf = e.create_event_buffer(64)
    reqs = []
    _sync()
    t = time.perf_counter()
    session_tokens = session
    session = og.RequestOptions()
    session.set_max_session_tokens(session_tokens or prompt + new + 1)
    for i in range(n):
        r = e.create_request(options=session)
        opts = og.TurnOptions(r)
        opts.set_max_generated_tokens(new)
        opts.set_min_generated_tokens(new)
        r.begin_turn(((np.arange(prompt) * (i + 7)) % 1000 + 3).astype(np.int32), opts)
        reqs.append(r)
    tokens = 0
    while e.has_pending_requests():
        for ev in e.run(buf):
            tokens += bool(ev.flags & og.EngineEventFlags.TOKEN)
    _sync()
    seconds = time.perf_counter() - t
    if tokens != n * new:
        raise RuntimeError(f"expected {n * new} tokens, got {tokens}")
    for r in reqs:
        r.close()
    return seconds


def generator_round(og, model, prompt: int, new: int) -> float:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=prompt + new + 1, min_length=prompt + new)
    _sync()
    t = time.perf_counter()
    gen = og.Generator(model, params)
    gen.append_tokens(((np.arange(prompt) * 7) % 1000 + 3).astype(np.int32))
    for _ in range(new):
        gen.generate_next_token()
        gen.get_next_tokens()
    _sync()
    return time.perf_counter() - t


def _batching(runtime: str):
    """A context where crossml batches requests, or (``crossml-alone``) does not."""
    import contextlib

    from crossml.genai import engine

    @contextlib.contextmanager
    def ctx():
        rows, engine.BATCH_ROWS = engine.BATCH_ROWS, 1 if runtime == "crossml-alone" else engine.BATCH_ROWS
        try:
            yield
        finally:
            engine.BATCH_ROWS = rows
    return ctx()


def main(argv: list[str] | None = None) -> None:
    ap = genai_parser(__doc__, models="qwen2.5-0.5b")
    ap.add_argument("--requests", default="1,4,8")
    ap.add_argument("--runtimes", default="crossml,generator")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cpu", action="store_true", help="cpu_genai.py's int4 CPU model")
    ap.add_argument("--session", type=int, default=0, help="each request's session length (0: prompt + new + 1)")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args(argv)
    counts = [int(x) for x in args.requests.split(",")]
    if args.cpu:
        import cpu_genai

        folders = {(cpu_genai.MODEL, "int4"): cpu_genai.build(args.workdir)}
    else:
        folders = genai_models(args)
    rows = []
    for (name, prec), folder in folders.items():
        models = {}
        for rnd in range(args.rounds):
            for runtime in args.runtimes.split(","):
                og, config = genai_config(folder, "ortgenai" if runtime.startswith("ortgenai") else "crossml")
                if runtime not in models:
                    models[runtime] = og.Model(config)
                model = models[runtime]
                for n in ([1] if runtime == "generator" else counts):
                    if runtime == "generator":
                        once = functools.partial(generator_round, og, model, args.prompt, args.new)
                    else:
                        once = functools.partial(engine_round, og, model, n, args.prompt, args.new, args.session)
                    with _batching(runtime):
                        once()
                        s = statistics.median(once() for _ in range(args.repeats))
                    row = {"model": name, "precision": prec, "runtime": runtime, "requests": n, "round": rnd,
                           "seconds": round(s, 4), "tokens_per_s": round(n * args.new / s, 1)}
                    print(row, flush=True)
                    rows.append(row)
        del models
    where = "CPU: " + str(os.cpu_count()) + " cores" if args.cpu else f"GPU: {machine()['gpu']}"
    lines = ["# The Engine API serving several requests (aggregate generated tokens per second)", "",
             f"{where}. Requests admitted together, prompts of {args.prompt} tokens, turns of exactly "
             f"{args.new} generated tokens, sessions of {args.session or 'prompt + turn + 1'} tokens; wall time from "
             f"the first admission to the last event, median of {args.repeats}. `generator`: one crossml Generator's "
             "turn of the same length (N = 1); `crossml-alone`: no batching.", "",
             "| model | precision | runtime | round | requests | s | generated tok/s |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['model']} | {r['precision']} | {r['runtime']} | {r['round']} | {r['requests']} | "
              f"{r['seconds']:.3f} | {r['tokens_per_s']:,.1f} |" for r in rows]
    lines += ["", "Produced by benchmarks/genai_engine.py" + (" --cpu." if args.cpu else ".")]
    write("genai_engine_cpu" if args.cpu else "genai_engine", {"machine": machine(), "args": vars(args),
                                                                "rows": rows}, "\n".join(lines) + "\n", out=args.out)


if __name__ == "__main__":
    main()
