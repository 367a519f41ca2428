"""com.crossml GatherRows: one position per batch row, the row selection graph pass ``output_rows`` puts in front of an
LLM's lm_head so a prompt computes logits only where the generator reads them.

    GatherRows(X [B, S, ...], rows int64 [B]) -> [B, 1, ...], Y[b, 0] = X[b, rows[b]]

Negative positions count from the end (-1: the last). ``rows`` with no elements (shape [0], the pass's default) hands
X on as it is, with no kernel (the session's plans for runs that do not feed ``rows`` leave the node out altogether:
``PlanOptions.pass_through``). Positions outside [-S, S) raise on
the CPU; on a GPU they give zeros (as onnxruntime's CUDA Gather does), checking them would need a host sync. On a
Triton device the op is one launch (``crossml.kernels.gather.gather_rows``).
"""

from __future__ import annotations

import torch

from crossml.kernels import TRITON_DEVICES, load
from crossml.ops.registry import op


@op("GatherRows", domain="com.crossml")
def gather_rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    if rows.numel() == 0:
        return x
    if x.dim() < 2:
        raise ValueError(f"GatherRows: X must be [batch, positions, ...], got shape {tuple(x.shape)}")
    batch, positions = x.shape[0], x.shape[1]
    if rows.shape != (batch,):
        raise ValueError(f"GatherRows: rows must hold one position per batch row, shape ({batch},), got "
                         f"{tuple(rows.shape)} for X of shape {tuple(x.shape)}")
    if x.device.type in TRITON_DEVICES and rows.device == x.device:
        kernel = load("gather")  # one launch (crossml.kernels.gather.gather_rows)
        y = kernel.gather_rows(x, rows) if kernel is not None else None
        if y is not None:
            return y
    rows = rows.to(device=x.device, dtype=torch.long)
    idx = torch.where(rows < 0, rows + positions, rows)
    if x.device.type == "cpu":
        bad = (idx < 0) | (idx >= positions)
        if bool(bad.any()):
            b = int(torch.nonzero(bad)[0, 0])
            raise ValueError(f"GatherRows: position {int(rows[b])} of batch row {b} is outside [-{positions}, "
                             f"{positions}) for X of shape {tuple(x.shape)}")
        ok = None
    else:
        ok = (idx >= 0) & (idx < positions)
        idx = idx.clamp(0, positions - 1)
    y = x.gather(1, idx.view(batch, 1, *([1] * (x.dim() - 2))).expand(batch, 1, *x.shape[2:]))
    if ok is not None:
        y = y.masked_fill(~ok.view(batch, 1, *([1] * (x.dim() - 2))), 0)
    return y
