"""ai.onnx.ml linear models: LinearRegressor and LinearClassifier (a matmul on the input's device)."""

from __future__ import annotations

from typing import Any

import torch

from crossml.ops.ml._classify import labels_output
from crossml.ops.ml._forest import post_transform as apply_post
from crossml.ops.registry import ML_DOMAIN, OpContext, op


def _linear(x: torch.Tensor, coefficients: list[float], intercepts: list[float] | None, rows: int) -> torch.Tensor:
    x = x.reshape(1, -1) if x.dim() == 1 else x
    if x.dim() != 2:
        raise ValueError(f"linear models expect input of shape [N, C], got {tuple(x.shape)}")
    x = x.to(torch.float32)
    c = int(x.shape[1])
    if len(coefficients) != rows * c:
        raise ValueError(f"{len(coefficients)} coefficients do not fit {rows} row(s) of {c} features")
    w = torch.tensor(coefficients, dtype=torch.float32, device=x.device).reshape(rows, c)
    y = x @ w.T
    if intercepts:
        if len(intercepts) != rows:
            raise ValueError(f"{len(intercepts)} intercepts; expected {rows}")
        y = y + torch.tensor(intercepts, dtype=torch.float32, device=x.device)
    return y


@op("LinearRegressor", since=1, domain=ML_DOMAIN)
def linear_regressor(x: torch.Tensor, *, coefficients: list[float] | None = None, intercepts: list[float] | None = None,
                     post_transform: str = "NONE", targets: int = 1) -> torch.Tensor:
    return apply_post(_linear(x, coefficients or [], intercepts, targets), post_transform)


@op("LinearClassifier", since=1, domain=ML_DOMAIN, ctx=True)
def linear_classifier(x: torch.Tensor, *, coefficients: list[float], classlabels_ints: list[int] | None = None,
                      classlabels_strings: list[str] | None = None, intercepts: list[float] | None = None,
                      multi_class: int = 0, post_transform: str = "NONE",
                      ctx: OpContext) -> tuple[Any, torch.Tensor]:
    labels: list[Any] = list(classlabels_ints or classlabels_strings or [])
    if not labels:
        raise ValueError("LinearClassifier needs classlabels_ints or classlabels_strings")
    feats = int(x.shape[-1]) if x.dim() else 1
    rows = len(coefficients) // max(feats, 1)
    scores = _linear(x, coefficients, intercepts, rows)
    if rows == 1:  # binary: one score for the positive class
        s = scores[:, 0]
        choice = (s > 0).to(torch.int64)
        if len(labels) != 2:
            raise ValueError(f"a single row of coefficients needs 2 class labels, got {len(labels)}")
        # onnxruntime's binary rule: [1 - s, s] (softmax included); LOGISTIC gives [sigmoid(-s), sigmoid(s)]
        if post_transform == "LOGISTIC":
            probs = torch.stack([torch.sigmoid(-s), torch.sigmoid(s)], dim=1)
        elif post_transform == "PROBIT":
            probs = apply_post(s.unsqueeze(1), post_transform)
        else:
            probs = torch.stack([1 - s, s], dim=1)
        return labels_output(choice, labels, ctx), probs
    if rows != len(labels):
        raise ValueError(f"{rows} rows of coefficients for {len(labels)} class labels")
    return labels_output(scores.argmax(dim=1), labels, ctx), apply_post(scores, post_transform)
