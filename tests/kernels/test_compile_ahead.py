"""crossml.kernels.CompileAhead: Triton launches compile side by side and run nothing, so a later real run finds
its kernels (and their host launchers) ready."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytest.importorskip("triton")

from crossml.kernels import CompileAhead  # noqa: E402
from crossml.kernels._launch import INTERPRET  # noqa: E402


def test_inactive_off_triton_devices() -> None:
    """The CPU (and the interpreter, for any device) get a plain block: it says so, and what runs in it runs."""
    x = torch.ones(3)
    ahead = CompileAhead(torch.device("cpu"))
    with ahead.collect():
        y = x + 1
    ahead.wait()
    assert ahead.active is False and y.tolist() == [2.0, 2.0, 2.0]
    if INTERPRET:
        assert CompileAhead(torch.device("cuda")).active is False


def test_launch_key_is_at_least_as_fine_as_tritons() -> None:
    """Launches of the same kind share a key; a tensor's dtype, device or 16-byte alignment, a scalar's value or
    type, or a keyword argument that differs gives another key (Triton's specialization looks at no more than
    these); an argument that cannot be keyed gives None (the launch is handed over as it is)."""
    from crossml.kernels import _launch_key

    def fn() -> None:
        pass

    x, y = torch.zeros(64), torch.zeros(64)
    key = _launch_key(fn, (x, 100, 0.5), {"B": 128, "num_warps": 4})
    assert key == _launch_key(fn, (y, 100, 0.5), {"num_warps": 4, "B": 128})
    assert key != _launch_key(fn, (x[1:], 100, 0.5), {"B": 128, "num_warps": 4})  # 4 bytes off alignment
    assert key != _launch_key(fn, (x.half(), 100, 0.5), {"B": 128, "num_warps": 4})
    assert key != _launch_key(fn, (x, 101, 0.5), {"B": 128, "num_warps": 4})
    assert _launch_key(fn, (1,), {}) != _launch_key(fn, (True,), {})  # equal in Python, not to Triton
    assert key != _launch_key(fn, (x, 100, 0.5), {"B": 256, "num_warps": 4})
    assert key != _launch_key(lambda: None, (x, 100, 0.5), {"B": 128, "num_warps": 4})
    assert _launch_key(fn, ((x, 3), 1), {}) == _launch_key(fn, ((y, 3), 1), {})
    assert _launch_key(fn, (x, {"a": 1}), {}) is None


_GPU_SCRIPT = textwrap.dedent('''
    import torch, triton, triton.language as tl
    import triton.compiler as tc
    import triton.runtime.build as build
    from crossml.kernels import CompileAhead

    @triton.jit
    def add_one(X, Y, N, B: tl.constexpr):
        o = tl.arange(0, B)
        tl.store(Y + o, tl.load(X + o, mask=o < N) + 1.0, mask=o < N)

    @triton.jit
    def double(X, Y, N, B: tl.constexpr):  # integers from integers: runs even inside collect()
        o = tl.arange(0, B)
        tl.store(Y + o, tl.load(X + o, mask=o < N) * 2, mask=o < N)

    @triton.autotune(configs=[triton.Config({"B": 128}), triton.Config({"B": 256})], key=["N"])
    @triton.jit
    def tuned(X, Y, N, B: tl.constexpr):
        o = tl.arange(0, B)
        tl.store(Y + o, tl.load(X + o, mask=o < N) * 3.0, mask=o < N)

    x = torch.arange(100, dtype=torch.float32, device="cuda")
    xi = torch.arange(100, dtype=torch.int32, device="cuda")
    y, yt, yi = torch.full_like(x, -1.0), torch.full_like(x, -1.0), torch.full_like(xi, -1)
    ahead = CompileAhead(x.device)
    assert ahead.active
    from triton.runtime import jit
    packed, real_pack = [], jit.JITFunction._pack_args
    jit.JITFunction._pack_args = lambda *a, **k: packed.append(1) or real_pack(*a, **k)
    with ahead.collect():
        add_one[(1,)](x, y, 100, B=128)
        add_one[(1,)](torch.zeros_like(x), y, 100, B=128)  # the same kind of launch: handed over once
        double[(1,)](xi, yi, 100, B=128)
        tuned[(1,)](x, yt, 100)
    jit.JITFunction._pack_args = real_pack
    assert len(packed) == 2, packed  # add_one once, double once (it runs)
    ahead.wait()
    torch.cuda.synchronize()
    assert (y == -1).all() and (yt == -1).all(), "a float kernel ran inside collect()"
    assert (yi == 2 * xi).all(), "the all-integer kernel did not run"

    compiles, builds = [], []
    real_compile, real_build = tc.compile, build._build
    tc.compile = lambda *a, **k: compiles.append(1) or real_compile(*a, **k)
    build._build = lambda *a, **k: builds.append(1) or real_build(*a, **k)
    add_one[(1,)](x, y, 100, B=128)
    torch.cuda.synchronize()
    assert (y == x + 1).all()
    assert not compiles, "the kernel compiled again after wait()"
    assert not builds, "its host launcher was built at the launch, not ahead"
    tc.compile, build._build = real_compile, real_build
    tuned[(1,)](x, yt, 100)  # autotuned for real now
    torch.cuda.synchronize()
    assert (yt == 3 * x).all()
    print("ok")
''')


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or INTERPRET, reason="needs a CUDA GPU and compiled kernels")
def test_compiles_ahead_and_runs_nothing_but_integer_kernels(tmp_path) -> None:
    """In a fresh process with an empty Triton cache: inside, a float kernel compiles but does not run (its repeat
    with arguments of the same kind is not prepared again), an all-integer kernel runs, an autotuned kernel is left
    alone; after, the float kernel launches without compiling
    or building its launcher, and the autotuned one tunes and runs."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "triton"), PYTHONPATH=os.path.abspath("src"))
    script = tmp_path / "compile_ahead_check.py"  # triton.jit reads its functions' source from a file
    script.write_text(_GPU_SCRIPT)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
