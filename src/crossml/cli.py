"""The ``crossml`` command.

    crossml demo [--model resnet50|mobilenet_v2|bert_base|bert_tiny] [--batch N] [--runs N] [--provider cpu|gpu]
    crossml run model.onnx [--provider cpu|gpu] [--runs N]     # random inputs, prints outputs and timing
    crossml providers                                          # what this machine offers
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import numpy as np


def _providers(choice: str) -> list[str]:
    import crossml

    if choice == "cpu":
        return ["CPUExecutionProvider"]
    if choice == "gpu":
        return ["GPUExecutionProvider", "CPUExecutionProvider"]
    return crossml.get_available_providers()[:1] + ["CPUExecutionProvider"]


def _time_runs(sess: Any, feeds: dict[str, np.ndarray], runs: int) -> tuple[list[Any], list[float]]:
    outs = sess.run(None, feeds)  # warm-up
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        outs = sess.run(None, feeds)
        times.append((time.perf_counter() - t0) * 1e3)
    return outs, times


def _random_feeds(sess: Any, batch: int) -> dict[str, np.ndarray]:
    from crossml import dtypes

    rng = np.random.default_rng(0)
    feeds = {}
    for a in sess.get_inputs():
        shape = [d if isinstance(d, int) else batch for d in (a.shape or [])]
        et = a._tp.tensor_type.elem_type
        dt = dtypes.np_dtype(et)
        feeds[a.name] = (rng.integers(0, 10, shape).astype(dt) if dt.kind in "iub"
                         else rng.standard_normal(shape).astype(dt))
    return feeds


def cmd_demo(args: argparse.Namespace) -> int:
    import crossml
    from crossml.zoo import MODELS, example_inputs, export

    print(f"crossml {crossml.__version__}: building the zoo model '{args.model}' (seeded random weights)...")
    t0 = time.perf_counter()
    path = export(args.model)
    t1 = time.perf_counter()
    sess = crossml.InferenceSession(path, providers=_providers(args.provider))
    t2 = time.perf_counter()
    feeds = example_inputs(args.model, batch=args.batch, seq=args.seq)
    outs, times = _time_runs(sess, feeds, args.runs)
    print(f"model:    {path} (ready in {t1 - t0:.1f} s)")
    print(f"provider: {sess.get_providers()[0]} on {sess.device}")
    print(f"session:  created in {(t2 - t1) * 1e3:.0f} ms")
    if MODELS[args.model][1] == "image":
        logits = outs[0]
        probs = np.exp(logits - logits.max(1, keepdims=True))
        probs /= probs.sum(1, keepdims=True)
        top = np.argsort(-probs[0])[:5]
        print("top-5 (class: probability): " + ", ".join(f"{c}: {probs[0, c]:.4f}" for c in top))
    else:
        print(f"last_hidden_state {outs[0].shape}, pooler_output[0, :5] = {np.round(outs[1][0, :5], 4)}")
    print(f"latency:  median {statistics.median(times):.2f} ms, min {min(times):.2f} ms over {args.runs} runs "
          f"(batch {args.batch})")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    import crossml

    sess = crossml.InferenceSession(args.model, providers=_providers(args.provider))
    feeds = _random_feeds(sess, args.batch)
    outs, times = _time_runs(sess, feeds, args.runs)
    for o, v in zip(sess.get_outputs(), outs):
        arr = np.asarray(v)
        print(f"{o.name}: {arr.dtype} {arr.shape}")
    print(f"latency: median {statistics.median(times):.2f} ms over {args.runs} runs on {sess.device}")
    return 0


def cmd_providers(_: argparse.Namespace) -> int:
    import crossml
    from crossml.device.adapter import adapters

    print("available providers:", ", ".join(crossml.get_available_providers()))
    for a in adapters():
        print(f"  adapter {a.index}: {a.name} (vendor 0x{a.vendor_id:04X}, {a.memory_bytes / 2**30:.1f} GiB, "
              f"{a.compute_units} compute units)")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="crossml", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="run a built-in model on the best device, print results and timing")
    d.add_argument("--model", default="resnet50", choices=["resnet50", "mobilenet_v2", "bert_base", "bert_tiny"])
    d.add_argument("--batch", type=int, default=1)
    d.add_argument("--seq", type=int, default=128)
    d.add_argument("--runs", type=int, default=20)
    d.add_argument("--provider", default="auto", choices=["auto", "cpu", "gpu"])
    d.set_defaults(fn=cmd_demo)
    r = sub.add_parser("run", help="run an ONNX file on random inputs")
    r.add_argument("model")
    r.add_argument("--batch", type=int, default=1)
    r.add_argument("--runs", type=int, default=10)
    r.add_argument("--provider", default="auto", choices=["auto", "cpu", "gpu"])
    r.set_defaults(fn=cmd_run)
    p = sub.add_parser("providers", help="list providers and adapters")
    p.set_defaults(fn=cmd_providers)
    args = ap.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
