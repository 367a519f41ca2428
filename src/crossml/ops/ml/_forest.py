"""Tree ensembles compiled to flat node arrays and evaluated for every (sample, tree) at once.

A forest is walked level by level with torch gathers (no host sync: the depth is known when the
forest is compiled). Shared by TreeEnsemble (opset 5) and TreeEnsembleRegressor/Classifier.
Also the post transforms every ai.onnx.ml scorer shares.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

# node modes (TreeEnsemble opset 5 numbering)
LEQ, LT, GTE, GT, EQ, NEQ, MEMBER = range(7)
MODE_NAMES = {"BRANCH_LEQ": LEQ, "BRANCH_LT": LT, "BRANCH_GTE": GTE, "BRANCH_GT": GT, "BRANCH_EQ": EQ,
              "BRANCH_NEQ": NEQ, "BRANCH_MEMBER": MEMBER}
POST_NAMES = {"NONE": 0, "SOFTMAX": 1, "LOGISTIC": 2, "SOFTMAX_ZERO": 3, "PROBIT": 4}


@dataclass
class Forest:
    """Branch nodes (global indices), leaves with a dense [n_leaves, n_targets] weight table."""

    feature: np.ndarray  # int64 [n_nodes]
    split: np.ndarray  # float64 [n_nodes]
    mode: np.ndarray  # int64 [n_nodes]
    true_next: np.ndarray  # int64: node index, or leaf index where true_leaf
    true_leaf: np.ndarray  # bool
    false_next: np.ndarray
    false_leaf: np.ndarray
    missing_true: np.ndarray  # bool
    roots: np.ndarray  # int64 [n_trees], node indices
    leaf_weight: np.ndarray  # float64 [n_leaves, n_targets]
    leaf_has: np.ndarray  # bool [n_leaves, n_targets]: the leaf carries a weight for the target
    members: np.ndarray | None = None  # float64 [n_nodes, max_set] NaN-padded sets (BRANCH_MEMBER)

    def depth(self) -> int:
        """Largest number of branch nodes on a root-to-leaf path (validates the structure)."""
        level = np.unique(self.roots)
        n = len(self.feature)
        for d in range(1, n + 2):
            nxt = np.concatenate([self.true_next[level][~self.true_leaf[level]],
                                  self.false_next[level][~self.false_leaf[level]]])
            if nxt.size == 0:
                return d
            if nxt.min() < 0 or nxt.max() >= n:
                raise ValueError("a tree node points to a node index out of range")
            level = np.unique(nxt)
        raise ValueError("the tree ensemble has a cycle")


def leaf_indices(forest: Forest, x: torch.Tensor) -> torch.Tensor:
    """[N, n_trees] index of the leaf each sample reaches in each tree; compares in x's dtype."""
    dev, dt = x.device, x.dtype
    n_leaves = forest.leaf_weight.shape[0]
    for arr, is_leaf in ((forest.true_next, forest.true_leaf), (forest.false_next, forest.false_leaf)):
        if is_leaf.any() and (arr[is_leaf].min() < 0 or arr[is_leaf].max() >= n_leaves):
            raise ValueError("a tree node points to a leaf index out of range")
    if len(forest.feature) and forest.feature.max() >= x.shape[1]:
        raise ValueError(f"the trees read feature {int(forest.feature.max())} but the input has {x.shape[1]} features")

    def t(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(device=dev, dtype=dtype)

    feature, split, mode = t(forest.feature, torch.int64), t(forest.split, dt), t(forest.mode, torch.int64)
    tn, tl = t(forest.true_next, torch.int64), t(forest.true_leaf, torch.bool)
    fn, fl = t(forest.false_next, torch.int64), t(forest.false_leaf, torch.bool)
    miss = t(forest.missing_true, torch.bool)
    members = t(forest.members, dt) if forest.members is not None else None
    n = x.shape[0]
    idx = t(forest.roots, torch.int64).unsqueeze(0).expand(n, -1).contiguous()
    done = torch.zeros_like(idx, dtype=torch.bool)
    leaf = torch.zeros_like(idx)
    for _ in range(forest.depth()):
        xv = x.gather(1, feature[idx])
        th, md = split[idx], mode[idx]
        cond = torch.where(md == LEQ, xv <= th, torch.where(md == LT, xv < th, torch.where(
            md == GTE, xv >= th, torch.where(md == GT, xv > th, torch.where(md == EQ, xv == th, xv != th)))))
        if members is not None:
            is_member = (xv.unsqueeze(-1) == members[idx]).any(-1)
            cond = torch.where(md == MEMBER, is_member, cond)
        cond = cond | (xv.isnan() & miss[idx])
        nxt = torch.where(cond, tn[idx], fn[idx])
        to_leaf = torch.where(cond, tl[idx], fl[idx]) & ~done
        leaf = torch.where(to_leaf, nxt, leaf)
        idx = torch.where(done | to_leaf, idx, nxt)
        done = done | to_leaf
    return leaf


def aggregate(forest: Forest, leaf: torch.Tensor, how: str, acc: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-target scores [N, n_targets] (SUM, AVERAGE, MIN, MAX) and whether any tree scored each."""
    dev = leaf.device
    w = torch.from_numpy(forest.leaf_weight).to(device=dev, dtype=acc)[leaf]  # [N, T, targets]
    has = torch.from_numpy(forest.leaf_has).to(dev)[leaf]
    any_has = has.any(1)
    if how in ("SUM", "AVERAGE"):
        s = w.sum(1)
        if how == "AVERAGE":
            s = s / max(len(forest.roots), 1)
    elif how == "MIN":
        s = torch.where(has, w, torch.full_like(w, math.inf)).amin(1)
        s = torch.where(any_has, s, torch.zeros_like(s))
    elif how == "MAX":
        s = torch.where(has, w, torch.full_like(w, -math.inf)).amax(1)
        s = torch.where(any_has, s, torch.zeros_like(s))
    else:
        raise ValueError(f"aggregate_function must be SUM, AVERAGE, MIN or MAX, got {how!r}")
    return s, any_has


def probit(x: torch.Tensor) -> torch.Tensor:
    return math.sqrt(2.0) * torch.special.erfinv(2 * x - 1)


def post_transform(scores: torch.Tensor, how: int | str) -> torch.Tensor:
    """NONE, SOFTMAX, LOGISTIC, SOFTMAX_ZERO, PROBIT over the last axis."""
    code = POST_NAMES.get(how, -1) if isinstance(how, str) else how
    if code == 0:
        return scores
    if code == 1:
        return torch.softmax(scores, dim=-1)
    if code == 2:
        return torch.sigmoid(scores)
    if code == 3:
        m = scores.amax(dim=-1, keepdim=True)
        e = torch.where(scores == 0, torch.zeros_like(scores), torch.exp(scores - m))
        return e / e.sum(dim=-1, keepdim=True)
    if code == 4:
        return probit(scores)
    raise ValueError(f"post_transform must be one of {', '.join(POST_NAMES)}, got {how!r}")
