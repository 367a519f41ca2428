"""CPU yardstick: crossml vs onnxruntime's CPU provider, in one process, same thread count.

    python benchmarks/cpu_vs_onnxruntime.py [--threads N] [--runs N] [--models resnet50,mobilenet_v2,bert_base]

Models come from crossml.zoo (exported from torch, seeded random weights), batch 1 (BERT: sequence
128). Prints a table of median times and the ratio crossml / onnxruntime (lower is better), and
writes benchmarks/results/cpu_vs_onnxruntime.{json,md}. Also reports the plan's per-step Python
overhead, measured on a chain of 1,000 Identity-like nodes.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import onnx
import torch
from onnx import TensorProto as T
from onnx import helper as h

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import machine, time_ms, write  # noqa: E402

import crossml  # noqa: E402
from crossml.zoo import example_inputs, export  # noqa: E402


def per_step_overhead_us(steps: int = 1000) -> float:
    """Wall time per plan step on a chain of tiny Neg nodes (1-element tensors), in microseconds."""
    nodes = [h.make_node("Neg", [f"v{i}"], [f"v{i + 1}"]) for i in range(steps)]
    g = h.make_graph(nodes, "chain", [h.make_tensor_value_info("v0", T.FLOAT, [1])],
                     [h.make_tensor_value_info(f"v{steps}", T.FLOAT, [1])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    s = crossml.InferenceSession(m, providers=["CPUExecutionProvider"])
    x = {"v0": np.ones(1, np.float32)}
    r = time_ms(lambda: s.run(None, x), warmup=3, runs=20)
    neg = torch.ones(1)
    t0 = time.perf_counter()
    for _ in range(steps):
        neg = torch.neg(neg)
    kernel_us = (time.perf_counter() - t0) * 1e6 / steps
    return r["median_ms"] * 1e3 / steps - kernel_us


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--models", default="resnet50,mobilenet_v2,bert_base")
    args = ap.parse_args()
    import onnxruntime

    torch.set_num_threads(args.threads)
    rows = []
    for name in args.models.split(","):
        path = export(name)
        feeds = example_inputs(name, batch=1, seq=128)
        so = onnxruntime.SessionOptions()
        so.intra_op_num_threads = args.threads
        so.inter_op_num_threads = 1
        ref = onnxruntime.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        cso = crossml.SessionOptions()
        cso.intra_op_num_threads = args.threads
        t0 = time.perf_counter()
        ours = crossml.InferenceSession(path, cso, providers=["CPUExecutionProvider"])
        create_ms = (time.perf_counter() - t0) * 1e3
        out_ref = ref.run(None, feeds)
        out_ours = ours.run(None, feeds)
        err = max(float(np.max(np.abs(a - b))) for a, b in zip(out_ref, out_ours))
        # interleave to spread machine noise over both
        tr = time_ms(lambda s=ref, f=feeds: s.run(None, f), runs=args.runs)
        tc = time_ms(lambda s=ours, f=feeds: s.run(None, f), runs=args.runs)
        tr2 = time_ms(lambda s=ref, f=feeds: s.run(None, f), runs=args.runs)
        ort_ms = min(tr["median_ms"], tr2["median_ms"])
        rows.append({"model": name, "onnxruntime_ms": ort_ms, "crossml_ms": tc["median_ms"],
                     "ratio": tc["median_ms"] / ort_ms, "max_abs_diff": err, "crossml_session_create_ms": create_ms})
        print(f"{name:14s} onnxruntime {ort_ms:8.2f} ms   crossml {tc['median_ms']:8.2f} ms   "
              f"ratio {tc['median_ms'] / ort_ms:5.2f}   max|diff| {err:.1e}", flush=True)
    step_us = per_step_overhead_us()
    print(f"plan overhead per step: {step_us:.2f} us")
    lines = [f"# CPU: crossml vs onnxruntime {onnxruntime.__version__} ({args.threads} threads, batch 1)\n",
             "| model | onnxruntime ms | crossml ms | crossml / onnxruntime |", "|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['onnxruntime_ms']:.2f} | {r['crossml_ms']:.2f} | {r['ratio']:.2f} |" for r in rows]
    lines.append(f"\nPlan overhead per step (Python): {step_us:.2f} us\n")
    lines.append("Reproduce: `python benchmarks/cpu_vs_onnxruntime.py`\n")
    payload = {"machine": machine(), "threads": args.threads, "rows": rows, "per_step_overhead_us": step_us,
               "onnxruntime": onnxruntime.__version__, "onnx": onnx.__version__}
    jp, mp = write("cpu_vs_onnxruntime", payload, "\n".join(lines))
    print(f"wrote {jp} and {mp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
