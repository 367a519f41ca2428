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


def child_result(script: str, *args: str, timeout: float = 600, env: dict[str, str] | None = None) -> dict:
    """Run ``python script --child args...`` in a fresh process and return the JSON of the ``RESULT `` line it
    prints; RuntimeError with the tail of its output where it printed none.

    The child writes and reads Python's bytecode caches (under PYCACHE), as an installed package has them (pip
    compiles them at install), whatever PYTHONDONTWRITEBYTECODE says: the GPU machines set it, so every process
    compiled each module of crossml and Triton from source, 100-150 ms of a fresh process's first prompt and
    200-300 ms of its ``Model()`` on an H200 (Qwen2.5-0.5B fp16, processes with and without the caches alternated).
    ``env``: environment variables set for the child alone."""
    import subprocess
    import sys

    child_env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    child_env["PYTHONPYCACHEPREFIX"] = PYCACHE
    child_env.update(env or {})
    proc = subprocess.run([sys.executable, script, "--child", *args], capture_output=True, text=True,
                          timeout=timeout, env=child_env)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"exit {proc.returncode}: {(proc.stderr or proc.stdout)[-400:]}")


def add_child_settings(ap: argparse.ArgumentParser, name: str) -> None:
    """``--set MODULE.ATTRIBUTE=VALUE`` (repeatable: module constants for crossml's child processes, read there by
    ``child_settings``) and ``--name`` (the result files' name, default ``name``)."""
    ap.add_argument("--set", action="append", default=[], metavar="MODULE.ATTRIBUTE=VALUE",
                    help="a module constant for crossml's child processes (repeatable)")
    ap.add_argument("--name", default=name, help="result files OUT/NAME.json and OUT/NAME.md")


def export_settings(args: argparse.Namespace) -> dict[str, Any]:
    """``add_child_settings``' --set values, parsed and handed to the child processes (SETTINGS_ENV)."""
    settings = parse_settings(args.set)
    os.environ[SETTINGS_ENV] = json.dumps(settings)
    return settings


def child_settings(runtime: str) -> None:
    """In a child process: apply the --set values to crossml's runs (not to the peers')."""
    if runtime == "crossml":
        apply_settings(json.loads(os.environ.get(SETTINGS_ENV, "{}")))


def runtime_models(ap: argparse.ArgumentParser, args: argparse.Namespace,
                   known: tuple[str, ...]) -> tuple[dict[tuple[str, str], str], list[str], str]:
    """For a GenAI benchmark with a --runtimes list (of ``known``): (model, precision) -> builder folder (built where
    missing, ``genai_parser``'s arguments), the runtimes asked for, and onnxruntime-genai's version or why it is
    unavailable. An unknown model or runtime is the parser's error."""
    import genai_bench as gb

    names = [n for n in args.models.split(",") if n]
    runtimes = [r for r in args.runtimes.split(",") if r]
    unknown = [n for n in names if n not in gb.SHAPES] + [r for r in runtimes if r not in known]
    if unknown:
        ap.error(f"unknown model/runtime {unknown}; models: {list(gb.SHAPES)}, runtimes: {list(known)}")
    os.makedirs(args.workdir, exist_ok=True)
    folders = gb.build_all(args.workdir, names, [p for p in args.precisions.split(",") if p], print)
    try:
        ort_version = gb._import_ortgenai().__version__
    except Exception as exc:  # noqa: BLE001 - reported, not fatal
        ort_version = f"unavailable ({type(exc).__name__})"
    return folders, runtimes, ort_version


def child_model(runtime: str, folder: str) -> tuple[Any, Any, float]:
    """In a GenAI benchmark's child process: CUDA started, the --set values applied (``child_settings``), and the
    runtime's model of ``folder`` loaded; returns (module, model, load seconds)."""
    import torch

    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    child_settings(runtime)
    og, config = genai_config(folder, runtime)
    t0 = time.perf_counter()
    model = og.Model(config)
    return og, model, time.perf_counter() - t0


def first_token_ms(gen: Any, tokens: int) -> float:
    """ms from appending ``tokens`` ids (3, 4, ...) to ``gen`` to the host holding the next token."""
    import numpy as np
    import torch

    ids = np.arange(3, 3 + tokens, dtype=np.int32)
    torch.cuda.synchronize()
    t = time.perf_counter()
    gen.append_tokens(ids)
    gen.generate_next_token()
    gen.get_next_tokens()
    return (time.perf_counter() - t) * 1e3


def warm_process_rows(script: str, folders: dict[tuple[str, str], str], runtimes: list[str],
                      *args: str) -> list[dict[str, Any]]:
    """One row per (model, precision) folder and runtime: ``script``'s child result (``child_result``) for
    ``runtime folder args...``, from the second of two processes (the first warms the on-disk caches); a failure
    is the row's "error"."""
    rows: list[dict[str, Any]] = []
    for (name, prec), folder in folders.items():
        for rt in runtimes:
            row: dict[str, Any] = {"model": name, "precision": prec, "runtime": rt}
            try:
                child_result(script, rt, folder, *args)  # warms the on-disk caches
                row.update(child_result(script, rt, folder, *args))
            except Exception as exc:  # noqa: BLE001 - one row's failure is reported in the table
                row["error"] = f"{type(exc).__name__}: {exc}"
            print(json.dumps({k: v for k, v in row.items() if not isinstance(v, list)}), flush=True)
            rows.append(row)
    return rows


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


def decode_arguments(ap: argparse.ArgumentParser, name: str) -> None:
    """--prompt, --new, --repeats and --name of the benchmarks that time the tokens after a prompt."""
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--name", default=name, help="the results' file name")


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
