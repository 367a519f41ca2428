"""Control flow: If, Loop and Scan. Subgraph attributes arrive as callables ``g(*inputs) -> outputs``.

Host syncs: If reads its condition once; Loop reads its trip count once and the body's condition
once per iteration (skipped while the body passes its condition through unchanged); Scan never syncs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from crossml import dtypes
from crossml.ops._util import ints, norm_axis, scalar
from crossml.ops.registry import OpContext, op

Graph = Callable[..., list[Any]]

#: iteration numbers are made on the device this many at a time (one arange, no host copy each step)
_ITER_CHUNK = 1024


def _truth(cond: Any) -> bool:
    if cond is None:
        raise ValueError("the condition is an empty value; expected a bool tensor with one element")
    if isinstance(cond, torch.Tensor):
        if cond.numel() != 1:
            raise ValueError(f"the condition must have exactly one element, got shape {tuple(cond.shape)}")
        return bool(cond.reshape(()).item())
    return bool(scalar(cond))


def _stack(values: list[torch.Tensor], axis: int, ctx: OpContext, index: int) -> torch.Tensor:
    """Per-iteration values joined along a new ``axis``; an empty tensor when there were none."""
    if not values:
        et = ctx.output_types[index] if index < len(ctx.output_types) else None
        dt = dtypes.ONNX_TO_TORCH.get(et) if et else torch.float32
        return torch.empty((0,), dtype=dt or torch.float32, device=ctx.device)
    return torch.stack(values, dim=norm_axis(axis, values[0].dim() + 1))


# --------------------------------------------------------------------------------------------
# If


@op("If", since=1, host_inputs=(0,))
def if_(cond: Any, *, then_branch: Graph, else_branch: Graph) -> tuple[Any, ...]:
    branch = then_branch if _truth(cond) else else_branch
    return tuple(branch())


# --------------------------------------------------------------------------------------------
# Loop


class _IterNumbers:
    """0, 1, 2... as int64 scalars on ``device``, made in chunks so no step copies from the host."""

    def __init__(self, device: Any, limit: int | None) -> None:
        self.device = device
        self.limit = limit
        self.chunk: torch.Tensor | None = None
        self.start = 0

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.chunk is None or not self.start <= i < self.start + self.chunk.numel():
            n = _ITER_CHUNK if self.limit is None else max(1, min(_ITER_CHUNK, self.limit - i))
            self.start = i
            self.chunk = torch.arange(i, i + n, dtype=torch.int64, device=self.device)
        return self.chunk[i - self.start]


@op("Loop", since=1, host_inputs=(0,), ctx=True)
def loop(m: Any, cond: Any, *v_initial: Any, body: Graph, ctx: OpContext) -> tuple[Any, ...]:
    trip = None if m is None else int(scalar(m))
    n_carried = len(v_initial)
    n_scan = ctx.num_outputs - n_carried
    if n_scan < 0:
        raise ValueError(f"Loop has {n_carried} loop-carried inputs but only {ctx.num_outputs} outputs")
    device = ctx.device if ctx.device is not None else torch.device("cpu")
    carried = list(v_initial)
    scans: list[list[torch.Tensor]] = [[] for _ in range(n_scan)]
    if cond is None:
        cond_value = torch.ones((), dtype=torch.bool, device=device)
        keep_going = True
    else:
        cond_value = cond
        keep_going = _truth(cond)
    iters = _IterNumbers(device, trip)
    i = 0
    while keep_going and (trip is None or i < trip):
        outs = body(iters[i], cond_value, *carried)
        if len(outs) != 1 + ctx.num_outputs:
            raise ValueError(f"the Loop body returned {len(outs)} values; expected 1 condition + "
                             f"{n_carried} loop-carried + {n_scan} scan outputs")
        carried = list(outs[1:1 + n_carried])
        for k in range(n_scan):
            scans[k].append(outs[1 + n_carried + k])
        # onnxruntime honours the body's condition even without a condition input; a body that passes
        # its condition through unchanged (the same tensor) costs no host read
        if outs[0] is not cond_value:
            cond_value = outs[0]
            keep_going = _truth(cond_value)
        i += 1
    results = carried + [_stack(s, 0, ctx, n_carried + k) for k, s in enumerate(scans)]
    return tuple(results)


# --------------------------------------------------------------------------------------------
# Scan


def _per_input(values: Sequence[int] | None, count: int, name: str) -> list[int]:
    if not values:
        return [0] * count
    if len(values) != count:
        raise ValueError(f"attribute {name} has {len(values)} entries; expected {count}")
    return list(values)


def _scan_loop(body: Graph, states: list[Any], scan_inputs: list[torch.Tensor], axes: list[int],
               directions: list[int], length: int) -> tuple[list[Any], list[list[torch.Tensor]]]:
    """Run ``body`` over ``length`` slices; returns the final states and per-step scan outputs."""
    n_states = len(states)
    scan_out: list[list[torch.Tensor]] | None = None
    for t in range(length):
        slices = [x.select(a, length - 1 - t if d else t) for x, a, d in zip(scan_inputs, axes, directions)]
        outs = body(*states, *slices)
        states = list(outs[:n_states])
        if scan_out is None:
            scan_out = [[] for _ in range(len(outs) - n_states)]
        for k, v in enumerate(outs[n_states:]):
            scan_out[k].append(v)
    return states, scan_out or []


@op("Scan", since=9, ctx=True)
def scan(*inputs: Any, body: Graph, num_scan_inputs: int, scan_input_axes: list[int] | None = None,
         scan_input_directions: list[int] | None = None, scan_output_axes: list[int] | None = None,
         scan_output_directions: list[int] | None = None, ctx: OpContext) -> tuple[Any, ...]:
    n_states = len(inputs) - num_scan_inputs
    if n_states < 0:
        raise ValueError(f"Scan has {len(inputs)} inputs but num_scan_inputs={num_scan_inputs}")
    states, scan_inputs = list(inputs[:n_states]), list(inputs[n_states:])
    in_axes = [norm_axis(a, x.dim()) for a, x in
               zip(_per_input(scan_input_axes, num_scan_inputs, "scan_input_axes"), scan_inputs)]
    in_dirs = _per_input(scan_input_directions, num_scan_inputs, "scan_input_directions")
    lengths = {int(x.shape[a]) for x, a in zip(scan_inputs, in_axes)}
    if len(lengths) != 1:
        raise ValueError(f"Scan inputs have different lengths along their scan axes: {sorted(lengths)}")
    length = lengths.pop()
    n_scan_out = ctx.num_outputs - n_states
    out_axes = _per_input(scan_output_axes, n_scan_out, "scan_output_axes")
    out_dirs = _per_input(scan_output_directions, n_scan_out, "scan_output_directions")
    states, scan_out = _scan_loop(body, states, scan_inputs, in_axes, in_dirs, length)
    if not scan_out:
        scan_out = [[] for _ in range(n_scan_out)]
    results = list(states)
    for k, vals in enumerate(scan_out):
        if out_dirs[k]:
            vals = vals[::-1]
        results.append(_stack(vals, out_axes[k], ctx, n_states + k))
    return tuple(results)


@op("Scan", since=8, host_inputs=(0,), ctx=True)
def scan8(sequence_lens: Any, *inputs: Any, body: Graph, num_scan_inputs: int,
          directions: list[int] | None = None, ctx: OpContext) -> tuple[Any, ...]:
    """Opset 8: every input has a batch axis 0; scan inputs are scanned along axis 1."""
    n_states = len(inputs) - num_scan_inputs
    if n_states < 0:
        raise ValueError(f"Scan has {len(inputs)} inputs but num_scan_inputs={num_scan_inputs}")
    states, scan_inputs = list(inputs[:n_states]), list(inputs[n_states:])
    dirs = _per_input(directions, num_scan_inputs, "directions")
    batch = int(scan_inputs[0].shape[0])
    max_len = int(scan_inputs[0].shape[1])
    lens = ints(sequence_lens) if sequence_lens is not None else [max_len] * batch
    if len(lens) != batch or any(not 0 <= n <= max_len for n in lens):
        raise ValueError(f"sequence_lens {lens} does not fit batch size {batch} and sequence length {max_len}")
    n_scan_out = ctx.num_outputs - n_states
    final_states: list[list[Any]] = [[] for _ in range(n_states)]
    scan_out: list[list[torch.Tensor]] = [[] for _ in range(n_scan_out)]
    for b in range(batch):
        per_states = [s[b] for s in states]
        # a shorter sequence is the first lens[b] steps (reversed inputs start from its own end)
        per_inputs = [x[b].narrow(0, 0, lens[b]) for x in scan_inputs]
        st, outs = _scan_loop(body, per_states, per_inputs, [0] * num_scan_inputs, dirs, lens[b])
        for k, v in enumerate(st):
            final_states[k].append(v)
        for k in range(n_scan_out):
            vals = outs[k] if outs else []
            scan_out[k].append(_padded(vals, max_len, ctx, n_states + k))
    results: list[Any] = [torch.stack(v) for v in final_states]
    results += [torch.stack(v) for v in scan_out]
    return tuple(results)


def _padded(vals: list[torch.Tensor], length: int, ctx: OpContext, index: int) -> torch.Tensor:
    y = _stack(vals, 0, ctx, index)
    if y.shape[0] == length:
        return y
    if not vals:
        raise ValueError("Scan-8 cannot size the scan output of an empty sequence")
    pad = torch.zeros((length - y.shape[0], *y.shape[1:]), dtype=y.dtype, device=y.device)
    return torch.cat([y, pad])
