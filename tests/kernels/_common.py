"""Shared by the kernel tests: where the kernels run, tolerances per dtype, random inputs.

A kernel test module sets TRITON_INTERPRET=1 when torch sees no GPU, before triton is imported
(this module imports it): Triton's interpreter then runs the kernels on CPU tensors. With a GPU
the variable stays unset, so the ``gpu`` tests run the compiled kernels (the CPU cases skip).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

pytest.importorskip("triton")

from crossml.kernels._launch import INTERPRET  # noqa: E402

#: cpu: the interpreter (needs TRITON_INTERPRET=1 before triton's first import); cuda: compiled kernels
DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRET, reason="Triton is not interpreting (TRITON_INTERPRET "
                                                                       "unset when triton was first imported)")),
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(INTERPRET, reason="Triton is interpreting")]),
]

#: (rtol, atol) against an fp64 reference of the same (rounded) inputs
TOL = {
    torch.float64: (1e-9, 1e-9),
    torch.float32: (1e-5, 1e-4),
    torch.float16: (5e-3, 1e-2),
    torch.bfloat16: (3e-2, 8e-2),
}
#: fp32 with TF32 tensor-core products (10-bit mantissa inputs)
TF32_TOL = (5e-3, 5e-2)


def rand(*shape: int, dtype: torch.dtype = torch.float32, device: str = "cpu", seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype).to(device)


def assert_close(y: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, tol: tuple[float, float] | None = None) -> float:
    """Compare with the fp64 reference; return the max abs error (for reports)."""
    rtol, atol = tol or TOL[dtype]
    assert y.dtype == dtype
    got = y.detach().double().cpu()
    assert got.shape == ref.shape
    torch.testing.assert_close(got, ref, rtol=rtol, atol=atol)
    return float((got - ref).abs().max()) if got.numel() else 0.0


def record_calls(monkeypatch: pytest.MonkeyPatch, module: Any, *names: str) -> list[str]:
    """Wrap the functions ``names`` of ``module`` so that each call still runs and appends its name to the list
    returned (the tests that an op routes its inputs to a kernel read it)."""
    calls: list[str] = []
    for name in names:
        real = getattr(module, name)

        def spy(*args: Any, _real: Callable[..., Any] = real, _name: str = name, **kwargs: Any) -> Any:
            calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)
    return calls


def run_own_kernels(run: Callable[[], Any], own: str, vendor: tuple[str, ...]) -> Any:
    """``run()`` on the GPU, traced after one untraced call (autotuning): at least one launched kernel is named
    with ``own`` and none of the others with a ``vendor`` library marker (lower case). Returns the traced result."""
    from torch.profiler import ProfilerActivity, profile

    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out = run()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
    assert any(own in n for n in names), names
    others = [n for n in names if own not in n and any(s in n.lower() for s in vendor)]
    assert not others, others
    return out
