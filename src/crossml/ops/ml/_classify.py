"""Scores -> (labels, probabilities) for the ai.onnx.ml classifiers, following onnxruntime's rules
(including its binary case: two labels but weights for a single class)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from crossml.ops.ml._forest import post_transform
from crossml.ops.registry import OpContext


def labels_output(choice: torch.Tensor, labels: list[Any], ctx: OpContext) -> Any:
    """Label per sample from a class-index tensor: int64 tensor, or a string array on the CPU."""
    if isinstance(labels[0], str):
        table = np.empty(len(labels), dtype=object)
        table[:] = labels
        return table[choice.cpu().numpy()]
    lab = torch.tensor(labels, dtype=torch.int64, device=choice.device)
    return lab[choice]


def finalize_classifier(scores: torch.Tensor, has: torch.Tensor, base: np.ndarray, labels: list[Any],
                        class_ids: list[int], all_positive: bool, post: str,
                        ctx: OpContext) -> tuple[Any, torch.Tensor]:
    """scores/has: [N, n_labels] summed weights and whether any weight reached each class."""
    n_labels = len(labels)
    dev = scores.device
    if n_labels == 2 and len(class_ids) == 1:  # binary case: one score for the positive class
        s = scores[:, class_ids[0]]
        if len(base) >= 1:
            s = s + float(base[-1] if len(base) == 2 else base[0])
        positive = s > 0.5 if all_positive else s > 0
        label = labels_output(positive.to(torch.int64), labels, ctx)
        if post == "PROBIT":
            probs = post_transform(s.unsqueeze(1), "PROBIT")
        elif post == "LOGISTIC":
            probs = torch.stack([torch.sigmoid(-s), torch.sigmoid(s)], dim=1)
        elif all_positive:
            probs = torch.stack([1 - s, s], dim=1)
        else:
            probs = torch.stack([-s, s], dim=1)
            if post != "NONE":
                probs = post_transform(probs, post)
        return label, probs.to(torch.float32)
    if n_labels == 2:
        return _two_classes(scores, has, base, labels, post, ctx)
    if len(base):
        if len(base) != n_labels:
            raise ValueError(f"base_values has {len(base)} entries; expected one per class ({n_labels})")
        scores = scores + torch.from_numpy(base).to(dev)
        has = torch.ones_like(has)
    masked = torch.where(has, scores, torch.full_like(scores, -math.inf))
    label = labels_output(masked.argmax(dim=1), labels, ctx)
    return label, post_transform(scores, post).to(torch.float32)


def _two_classes(scores: torch.Tensor, has: torch.Tensor, base: np.ndarray, labels: list[Any], post: str,
                 ctx: OpContext) -> tuple[Any, torch.Tensor]:
    """Weights for both classes: the label is positive when class 1 scored above 0 (onnxruntime)."""
    s0, s1 = scores[:, 0], scores[:, 1]
    if len(base) == 2:
        p1 = torch.where(has[:, 1], float(base[1]) + s0, s1 + float(base[1]))
        s0 = torch.where(has[:, 1], -p1, s0 + float(base[0]))
        s1 = p1
    elif len(base) == 1:
        s0 = s0 + float(base[0])
    pos = torch.where(has[:, 1], s1, torch.where(has[:, 0], s0, torch.zeros_like(s0)))
    label = labels_output((pos > 0).to(torch.int64), labels, ctx)
    return label, post_transform(torch.stack([s0, s1], dim=1), post).to(torch.float32)
