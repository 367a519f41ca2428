"""Where the host time of a state-carrying model's prompt runs goes on a GPU: eager turns, and a piece width's warm,
recording and replayed runs (``crossml.genai.model.state_pieces``).

One process per model (the second of two: on-disk caches warm), one generator: a 512-token first prompt, eager turns
of 100 and 57 tokens (pieces off), then turns that are one piece each (``STATE_PIECE_AFTER`` 0: widths 128 and 16,
three times: warm, record, replay). Each turn is timed until the host holds its next token; inside it, timers around
the session's per-shape work (``InferenceSession._specialized_types``: shape inference; ``build_plan``), the plan
walks (``execute``), each op type's calls within the walks (host time, no device sync) and Triton's launch path
(``JITFunction.run``).

    PYTHONPATH=src python benchmarks/state_pieces.py --models lfm2-350m,qwen3.5-0.8b --precisions fp16

Writes OUT/state_pieces.json and OUT/state_pieces.md.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
EAGER_TURNS = (100, 57, 100, 57)
PIECES = (128, 16)
TOP_OPS = 4


def session(folder: str) -> dict[str, Any]:
    """The phases of one process (see the module docstring): per phase ms and the host time breakdown."""
    import numpy as np
    import torch
    import triton.runtime.jit as tj

    import crossml.genai as og
    import crossml.genai.model as genai_model
    import crossml.runtime.session as sess
    from crossml.graph import execute as ex

    spent: dict[str, float] = collections.defaultdict(float)
    calls: collections.Counter[str] = collections.Counter()
    ops: dict[str, float] = collections.defaultdict(float)

    def timed(owner: Any, name: str, key: str) -> None:
        orig = getattr(owner, name)

        def wrap(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return orig(*a, **k)
            finally:
                spent[key] += (time.perf_counter() - t) * 1e3
                calls[key] += 1

        setattr(owner, name, wrap)

    def walk(plan: Any, vals: list[Any], profiler: Any = None) -> list[Any]:  # execute, timing each step's call
        for step in plan.steps:
            args = [vals[i] if i >= 0 else None for i in step.inputs]
            kw = step.attrs if step.subgraphs is None else ex._bind_subgraphs(step, vals, None)
            t = time.perf_counter()
            out = step.fn(*args, **kw)
            ops[step.op_type] += (time.perf_counter() - t) * 1e3
            ex._store(step, out, vals)
        return [vals[i] for i in plan.output_slots]

    sess.execute = walk
    timed(sess, "execute", "walks")
    timed(sess.InferenceSession, "_specialized_types", "shape inference")
    timed(sess, "build_plan", "plan building")
    timed(tj.JITFunction, "run", "triton launches")

    torch.zeros(1, device="cuda")
    model = og.Model(folder)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=2048)
    gen = og.Generator(model, params)
    phases: list[dict[str, Any]] = []

    def turn(n: int, label: str) -> None:
        spent.clear()
        calls.clear()
        ops.clear()
        torch.cuda.synchronize()
        t = time.perf_counter()
        gen.append_tokens(np.arange(3, 3 + n))
        gen.generate_next_token()
        gen.get_next_tokens()
        ms = (time.perf_counter() - t) * 1e3
        top = sorted(ops.items(), key=lambda kv: -kv[1])[:TOP_OPS]
        phases.append({"phase": label, "tokens": n, "ms": ms, "parts": dict(spent), "calls": dict(calls),
                       "top_ops": top})
        for _ in range(2):
            gen.generate_next_token()
            gen.get_next_tokens()

    genai_model.STATE_PIECE_MAX = 0  # the first prompt at its own width, eager turns
    turn(512, "first prompt")
    for n in EAGER_TURNS:
        turn(n, "eager turn")
    genai_model.STATE_PIECE_MAX, genai_model.STATE_PIECE_AFTER = 512, 0
    for kind in ("warm", "record", "replay"):
        for n in PIECES:
            turn(n, f"piece, {kind}")
    return {"phases": phases}


def markdown(payload: dict[str, Any]) -> str:
    m = payload["machine"]
    lines = ["# A state-carrying model's prompt runs: where the host time goes", "",
             f"GPU: {m.get('gpu')}; torch {m.get('torch')}. One generator a model (max_length 2048), the second of two "
             "processes; ms until the host holds the turn's next token, and inside it host ms: shape inference and "
             "plan building for a new width, the plan walks, Triton's launch path (calls), and the op types with the "
             f"most host time in the walks (ms). Eager turns with pieces off; piece turns of one piece each "
             f"(widths {', '.join(map(str, PIECES))}).", "",
             "| model | precision | phase | tokens | ms | shape inference | plan building | walks | Triton launches "
             "| top op types |", "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for r in payload["rows"]:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['precision']} | error: {r['error'][:160]} | | | | | | | |")
            continue
        for p in r["phases"]:
            parts, calls = p["parts"], p["calls"]

            def part(key: str, parts: dict = parts) -> str:
                return f"{parts[key]:.1f}" if key in parts else "-"

            launches = f"{parts['triton launches']:.1f} ({calls['triton launches']})" if "triton launches" in parts \
                else "-"
            top = ", ".join(f"{k} {v:.1f}" for k, v in p["top_ops"])
            lines.append(f"| {r['model']} | {r['precision']} | {p['phase']} | {p['tokens']} | {p['ms']:.1f} | "
                         f"{part('shape inference')} | {part('plan building')} | {part('walks')} | {launches} | "
                         f"{top} |")
    lines += ["", "Produced by benchmarks/state_pieces.py.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        print("RESULT " + json.dumps(session(sys.argv[2])), flush=True)
        return
    sys.path.insert(0, HERE)
    import _common as common

    ap = common.genai_parser(__doc__, models="lfm2-350m,qwen3.5-0.8b")
    args = ap.parse_args(argv)
    rows: list[dict[str, Any]] = []
    for (name, prec), folder in common.genai_models(args).items():
        row: dict[str, Any] = {"model": name, "precision": prec}
        try:
            common.child_result(__file__, folder)  # warms the on-disk caches
            row.update(common.child_result(__file__, folder))
        except Exception as exc:  # noqa: BLE001 - one row's failure is reported in the table
            row["error"] = f"{type(exc).__name__}: {exc}"
        rows.append(row)
    payload = {"machine": common.machine(), "rows": rows}
    common.write("state_pieces", payload, markdown(payload), args.out)


if __name__ == "__main__":
    main()
