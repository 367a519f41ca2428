"""Every ONNX node test of the installed onnx package, through crossml.InferenceSession.

Known failures are listed, with a reason each, in failures_cpu.txt (failures_gpu.txt on the GPU
provider) and run as strict xfails: a listed case that starts passing fails the suite until it is
removed from the list, so the pass count below can only go up.
"""

from __future__ import annotations

import os

import pytest

from tests.conformance.node_cases import node_cases, run_case
from tests.conformance.report import GPU_PROVIDERS, failures_path

#: onnxruntime 1.31.1 passes 1,398 of the 1,884 cases (onnx 1.23) on its CPU provider.
MIN_CPU_PASSES = 1850

CASES = sorted(node_cases())


def _listed(gpu: bool) -> dict[str, str]:
    path = failures_path(gpu)
    if not os.path.exists(path):
        return {}
    out = {}
    with open(path) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            name, _, reason = line.rstrip("\n").partition("\t")
            out[name] = reason
    return out


CPU_FAILS = _listed(gpu=False)


@pytest.mark.parametrize("name", CASES)
def test_node_cpu(name: str) -> None:
    if name in CPU_FAILS:
        pytest.xfail(CPU_FAILS[name])  # replaced by a strict check below
    run_case(name)


#: cases whose expected outputs are draws of numpy's random generator: no runtime reproduces them,
#: but a draw can match by chance, so their passing says nothing and is not checked.
RANDOM_OUTPUTS = ("test_bernoulli", "test_training_dropout")


def test_listed_failures_still_fail() -> None:
    """A case on the failures list that now passes must be taken off the list."""
    now_passing = []
    for name in sorted(CPU_FAILS):
        if name.startswith(RANDOM_OUTPUTS):
            continue
        if name not in node_cases():
            now_passing.append(f"{name} (no longer an onnx test)")
            continue
        try:
            run_case(name)
        except Exception:  # noqa: BLE001 - expected: it is listed as failing
            continue
        now_passing.append(name)
    assert not now_passing, f"remove from failures_cpu.txt, these pass now: {now_passing}"


def test_minimum_pass_count() -> None:
    passes = len(CASES) - len([n for n in CPU_FAILS if n in node_cases()])
    assert passes >= MIN_CPU_PASSES, f"{passes} node tests pass on the CPU, the floor is {MIN_CPU_PASSES}"


GPU_FAILS = _listed(gpu=True)


@pytest.mark.gpu
@pytest.mark.parametrize("name", CASES)
def test_node_gpu(name: str) -> None:
    from crossml.runtime.providers import gpu_available

    if not gpu_available():
        pytest.skip("no GPU: torch sees no accelerator on this machine")
    if name in GPU_FAILS:
        pytest.xfail(GPU_FAILS[name])
    run_case(name, GPU_PROVIDERS)
