"""Timing helpers shared by the benchmarks: medians over repeated runs, result files."""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

RESULTS = os.path.join(os.path.dirname(__file__), "results")


def time_ms(fn: Callable[[], Any], warmup: int = 3, runs: int = 20, sync: Callable[[], None] | None = None) -> dict:
    """Median / min wall time of ``fn`` in milliseconds (``sync`` waits for a device, if any)."""
    for _ in range(warmup):
        fn()
    if sync:
        sync()
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        ts.append((time.perf_counter() - t0) * 1e3)
    return {"median_ms": statistics.median(ts), "min_ms": min(ts), "runs": runs}


def machine() -> dict:
    import torch

    return {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "cpu_count": os.cpu_count(), "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def write(name: str, payload: dict, markdown: str, out: str = RESULTS) -> tuple[str, str]:
    """OUT/NAME.json (the payload) and OUT/NAME.md; returns their paths."""
    os.makedirs(out, exist_ok=True)
    jp = os.path.join(out, f"{name}.json")
    mp = os.path.join(out, f"{name}.md")
    with open(jp, "w") as f:
        json.dump(payload, f, indent=2)
    with open(mp, "w") as f:
        f.write(markdown)
    return jp, mp


#: environment variable carrying ``--set`` settings (JSON) from a benchmark to its child processes
SETTINGS_ENV = "CROSSML_BENCH_SET"


def parse_settings(items: list[str]) -> dict[str, Any]:
    """``--set`` items ``MODULE.ATTRIBUTE=VALUE`` (VALUE a Python literal) -> {"MODULE.ATTRIBUTE": value}: module
    constants to override for an A/B run, e.g. ``crossml.ops.matmul.GEMV_MAX_M=4`` for the routing before a change."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or "." not in name.strip("."):
            raise ValueError(f"--set {item!r}: expected MODULE.ATTRIBUTE=VALUE, e.g. crossml.ops.matmul.GEMV_MAX_M=4")
        try:
            out[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError) as exc:
            raise ValueError(f"--set {item!r}: VALUE must be a Python literal (a number, string, bool or None)") from exc
    return out


def apply_settings(settings: dict[str, Any]) -> None:
    """Set each module attribute of ``parse_settings``' result. A module or attribute that does not exist is an error,
    so a misspelt name cannot leave the default in place unnoticed."""
    import importlib

    for name, value in settings.items():
        module, _, attr = name.rpartition(".")
        mod = importlib.import_module(module)
        if not hasattr(mod, attr):
            raise AttributeError(f"--set {name}: module {module} has no attribute {attr!r}")
        setattr(mod, attr, value)


#: where child processes keep Python's bytecode caches (``child_result``)
PYCACHE = os.path.join(tempfile.gettempdir(), "crossml-bench-pycache")


def child_result(script: str, *args: str, timeout: float = 600) -> dict:
    """Run ``python script --child args...`` in a fresh process and return the JSON of the ``RESULT `` line it
    prints; RuntimeError with the tail of its output where it printed none.

    The child writes and reads Python's bytecode caches (under PYCACHE), as an installed package has them (pip
    compiles them at install), whatever PYTHONDONTWRITEBYTECODE says: the GPU machines set it, so every process
    compiled each module of crossml and Triton from source, 100-150 ms of a fresh process's first prompt and
    200-300 ms of its ``Model()`` on an H200 (Qwen2.5-0.5B fp16, processes with and without the caches alternated)."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = PYCACHE
    proc = subprocess.run([sys.executable, script, "--child", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"exit {proc.returncode}: {(proc.stderr or proc.stdout)[-400:]}")


def in_graph_us(calls: list[Callable[[], object]], replays: int = 20) -> float:
    """Mean µs of one call among ``calls``, captured back to back in one CUDA graph (each called once before the
    capture, the graph replayed ``replays`` times after one unmeasured replay)."""
    import torch

    for fn in calls:
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in calls:
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / replays / len(calls) * 1e3


def results_parser(doc: str) -> argparse.ArgumentParser:
    """A benchmark's argument parser (described by the first line of its docstring ``doc``) with --out, the folder
    its result files go to (default benchmarks/results)."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--out", default=RESULTS)
    return ap


def genai_parser(doc: str, models: str = "qwen2.5-0.5b,llama-3.2-1b") -> argparse.ArgumentParser:
    """The arguments of the benchmarks that run the GenAI benchmark's models: --out, --workdir (where the builder
    folders are made on first use), --models and --precisions (comma lists)."""
    here = os.path.dirname(os.path.abspath(__file__))
    ap = results_parser(doc)
    ap.add_argument("--workdir", default=os.path.join(here, ".genai_work"))
    ap.add_argument("--models", default=models)
    ap.add_argument("--precisions", default="fp16,int4")
    return ap


def genai_models(args: argparse.Namespace) -> dict[tuple[str, str], str]:
    """(model, precision) -> builder folder for ``genai_parser``'s arguments, building what is missing."""
    import genai_bench

    return genai_bench.build_all(args.workdir, [n for n in args.models.split(",") if n],
                                 [p for p in args.precisions.split(",") if p], print)


def genai_config(folder: str, runtime: str) -> tuple[Any, Any]:
    """(module, Config of ``folder``) for a GenAI benchmark runtime: crossml.genai ("crossml"), or onnxruntime_genai's
    CUDA build with its CUDA graph ("ortgenai-graph") or without ("ortgenai")."""
    if runtime == "crossml":
        import crossml.genai as og

        return og, og.Config(folder)
    import genai_bench

    og = genai_bench._import_ortgenai()
    config = og.Config(folder)
    config.clear_providers()
    config.append_provider("cuda")
    config.set_provider_option("cuda", "enable_cuda_graph", "1" if runtime == "ortgenai-graph" else "0")
    return og, config


def chat_generator(og: Any, model: Any) -> Any:
    """A generator of module ``og`` on ``model`` for chat-turn benchmarks: max_length 4096, a 512-token prompt and
    4 generated tokens, so turns append to a started sequence."""
    import numpy as np

    params = og.GeneratorParams(model)
    params.set_search_options(max_length=4096)
    gen = og.Generator(model, params)
    gen.append_tokens(np.arange(3, 515, dtype=np.int32))
    for _ in range(4):
        gen.generate_next_token()
    return gen
