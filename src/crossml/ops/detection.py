"""Detection post-processing: NonMaxSuppression."""

from __future__ import annotations

import torch

from crossml.ops._util import scalar
from crossml.ops.registry import op


def _corners(boxes: torch.Tensor, center_point_box: int) -> torch.Tensor:
    """[..., 4] boxes -> (y1, x1, y2, x2) with y1 <= y2 and x1 <= x2."""
    if center_point_box:
        xc, yc, w, h = boxes.unbind(-1)
        return torch.stack([yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2], -1)
    a, b, c, d = boxes.unbind(-1)
    return torch.stack([torch.minimum(a, c), torch.minimum(b, d), torch.maximum(a, c), torch.maximum(b, d)], -1)


def _iou(boxes: torch.Tensor) -> torch.Tensor:
    """Pairwise IoU of (y1, x1, y2, x2) boxes [N, 4] -> [N, N]."""
    y1, x1, y2, x2 = boxes.unbind(-1)
    area = (y2 - y1) * (x2 - x1)
    iy = (torch.minimum(y2[:, None], y2[None]) - torch.maximum(y1[:, None], y1[None])).clamp(min=0)
    ix = (torch.minimum(x2[:, None], x2[None]) - torch.maximum(x1[:, None], x1[None])).clamp(min=0)
    inter = iy * ix
    union = area[:, None] + area[None] - inter
    return torch.where(union > 0, inter / union, torch.zeros_like(inter))


@op("NonMaxSuppression", since=10, host_inputs=(2, 3, 4), dynamic=True)
def non_max_suppression(boxes: torch.Tensor, scores: torch.Tensor, max_output_boxes_per_class=None,
                        iou_threshold=None, score_threshold=None, *, center_point_box: int = 0) -> torch.Tensor:
    """Greedy per-class suppression, as onnxruntime: keep score > score_threshold, drop IoU > iou_threshold.

    Output rows are (batch, class, box), by batch, class, then descending score (ties: lower box index).
    """
    if boxes.dim() != 3 or boxes.shape[-1] != 4:
        raise ValueError(f"boxes must be [batch, boxes, 4], got {tuple(boxes.shape)}")
    if scores.dim() != 3 or scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
        raise ValueError(f"scores must be [batch, classes, boxes] = [{boxes.shape[0]}, C, {boxes.shape[1]}], "
                         f"got {tuple(scores.shape)}")
    limit = int(scalar(max_output_boxes_per_class)) if max_output_boxes_per_class is not None else 0
    iou_t = float(scalar(iou_threshold)) if iou_threshold is not None else 0.0
    score_t = float(scalar(score_threshold)) if score_threshold is not None else None
    rows: list[tuple[int, int, int]] = []
    if limit > 0 and boxes.shape[1] > 0:
        corners = _corners(boxes.float(), center_point_box).cpu()
        sc = scores.float().cpu()
        for b in range(boxes.shape[0]):
            iou = _iou(corners[b])
            for c in range(scores.shape[1]):
                s = sc[b, c]
                order = torch.sort(s, descending=True, stable=True).indices.tolist()
                keep: list[int] = []
                for i in order:
                    if score_t is not None and not s[i] > score_t:
                        break
                    if all(iou[i, j] <= iou_t for j in keep):
                        keep.append(i)
                        if len(keep) == limit:
                            break
                rows.extend((b, c, i) for i in keep)
    out = torch.tensor(rows, dtype=torch.int64).reshape(-1, 3)
    return out.to(boxes.device)
