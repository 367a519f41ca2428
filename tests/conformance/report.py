"""Run every ONNX node test and write the failures list.

    python -m tests.conformance.report                 # CPU provider, rewrite failures_cpu.txt
    python -m tests.conformance.report --gpu           # GPU provider, rewrite failures_gpu.txt
    python -m tests.conformance.report -k conv --show  # a subset, print reasons, write nothing
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

from tests.conformance.node_cases import node_cases, run_case

HERE = os.path.dirname(__file__)
#: the node tests' tolerances are fp32 tolerances: check the GPU provider with strict fp32 math
#: (use_tf32=0); TF32 stays the provider's default for users, as in onnxruntime's CUDA provider.
GPU_PROVIDERS = [("GPUExecutionProvider", {"use_tf32": "0"}), "CPUExecutionProvider"]


def failures_path(gpu: bool) -> str:
    return os.path.join(HERE, "failures_gpu.txt" if gpu else "failures_cpu.txt")


def one_line(exc: BaseException) -> str:
    msg = f"{type(exc).__name__}: {exc}".replace("\n", " ").replace("\t", " ")
    msg = msg.replace("[ONNXRuntimeError] : ", "")
    return msg[:200]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu", action="store_true", help="run on the GPU provider")
    ap.add_argument("-k", default="", help="only cases whose name contains this")
    ap.add_argument("--show", action="store_true", help="print each failure's reason; do not write the file")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    providers = GPU_PROVIDERS if args.gpu else ["CPUExecutionProvider"]
    names = sorted(n for n in node_cases() if args.k in n)
    failed: dict[str, str] = {}
    t0 = time.time()
    for n in names:
        try:
            run_case(n, providers)
        except Exception as exc:  # noqa: BLE001 - the reason goes into the report
            failed[n] = one_line(exc)
            if args.show:
                print(f"FAIL {n}: {failed[n]}")
    passed = len(names) - len(failed)
    print(f"{passed} passed, {len(failed)} failed ({time.time() - t0:.0f}s)")
    if not args.show and not args.k:
        with open(failures_path(args.gpu), "w") as f:
            f.write(f"# ONNX node tests crossml fails on the {'GPU' if args.gpu else 'CPU'} provider, one per line:\n")
            f.write("# name<TAB>reason. Regenerate with: python -m tests.conformance.report"
                    f"{' --gpu' if args.gpu else ''}\n")
            for n in sorted(failed):
                f.write(f"{n}\t{failed[n]}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
