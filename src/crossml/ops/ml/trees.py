"""ai.onnx.ml tree ensembles: TreeEnsemble (opset 5), TreeEnsembleRegressor and TreeEnsembleClassifier
(opsets 1 and 3). Evaluation is vectorized torch on the input's device (see ``_forest``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from crossml.ops.ml._forest import MODE_NAMES, Forest, aggregate, leaf_indices, post_transform
from crossml.ops.registry import ML_DOMAIN, OpContext, op

_AGG_CODES = {0: "AVERAGE", 1: "SUM", 2: "MIN", 3: "MAX"}


def _np(v: Any, dtype: Any) -> np.ndarray:
    if v is None:
        return np.zeros(0, dtype=dtype)
    if isinstance(v, torch.Tensor):
        return v.reshape(-1).cpu().numpy().astype(dtype)
    return np.asarray(v, dtype=dtype).reshape(-1)


def _input(x: torch.Tensor) -> torch.Tensor:
    if x.dim() == 1:
        x = x.reshape(1, -1)
    if x.dim() != 2:
        raise ValueError(f"tree ensembles expect input of shape [N, F], got {tuple(x.shape)}")
    return x if x.dtype in (torch.float32, torch.float64, torch.float16) else x.to(torch.float32)


# --------------------------------------------------------------------------------------------
# opset 5


@op("TreeEnsemble", since=5, domain=ML_DOMAIN)
def tree_ensemble(x: torch.Tensor, *, aggregate_function: int = 1, leaf_targetids: list[int],
                  leaf_weights: torch.Tensor, membership_values: torch.Tensor | None = None, n_targets: int,
                  nodes_falseleafs: list[int], nodes_falsenodeids: list[int], nodes_featureids: list[int],
                  nodes_hitrates: torch.Tensor | None = None, nodes_missing_value_tracks_true: list[int] | None = None,
                  nodes_modes: torch.Tensor, nodes_splits: torch.Tensor, nodes_trueleafs: list[int],
                  nodes_truenodeids: list[int], post_transform: int = 0, tree_roots: list[int]) -> torch.Tensor:
    n = len(nodes_featureids)
    modes = _np(nodes_modes, np.int64)
    lengths = {len(nodes_falseleafs), len(nodes_falsenodeids), len(nodes_trueleafs), len(nodes_truenodeids), len(modes)}
    if lengths != {n}:
        raise ValueError("the nodes_* attributes of TreeEnsemble must all have one entry per node")
    leaf_t, leaf_w = _np(leaf_targetids, np.int64), _np(leaf_weights, np.float64)
    if len(leaf_t) != len(leaf_w) or (len(leaf_t) and not 0 <= leaf_t.min() <= leaf_t.max() < n_targets):
        raise ValueError(f"leaf_targetids must match leaf_weights and lie in [0, {n_targets})")
    weight = np.zeros((len(leaf_t), n_targets))
    weight[np.arange(len(leaf_t)), leaf_t] = leaf_w
    has = np.zeros_like(weight, dtype=bool)
    has[np.arange(len(leaf_t)), leaf_t] = True
    members = None
    if (modes == MODE_NAMES["BRANCH_MEMBER"]).any():
        members = _membership_sets(modes, _np(membership_values, np.float64))
    forest = Forest(
        feature=_np(nodes_featureids, np.int64), split=_np(nodes_splits, np.float64), mode=modes,
        true_next=_np(nodes_truenodeids, np.int64), true_leaf=_np(nodes_trueleafs, bool),
        false_next=_np(nodes_falsenodeids, np.int64), false_leaf=_np(nodes_falseleafs, bool),
        missing_true=_np(nodes_missing_value_tracks_true, bool) if nodes_missing_value_tracks_true else np.zeros(n, bool),
        roots=_np(tree_roots, np.int64), leaf_weight=weight, leaf_has=has, members=members)
    if aggregate_function not in _AGG_CODES:
        raise ValueError(f"aggregate_function must be 0 (AVERAGE), 1 (SUM), 2 (MIN) or 3 (MAX), got {aggregate_function}")
    xin = _input(x)
    acc = xin.dtype if xin.dtype == torch.float64 else torch.float32
    scores, _ = aggregate(forest, leaf_indices(forest, xin), _AGG_CODES[aggregate_function], acc)
    return post_transform_(scores, post_transform).to(x.dtype if x.is_floating_point() else torch.float32)


post_transform_ = post_transform


def _membership_sets(modes: np.ndarray, values: np.ndarray) -> np.ndarray:
    """membership_values lists one NaN-terminated set per BRANCH_MEMBER node, in node order."""
    sets: list[list[float]] = [[]]
    for v in values:
        if np.isnan(v):
            sets.append([])
        else:
            sets[-1].append(float(v))
    if sets and not sets[-1]:
        sets.pop()
    member_nodes = np.nonzero(modes == MODE_NAMES["BRANCH_MEMBER"])[0]
    if len(sets) != len(member_nodes):
        raise ValueError(f"membership_values holds {len(sets)} sets for {len(member_nodes)} BRANCH_MEMBER nodes")
    width = max((len(s) for s in sets), default=1) or 1
    table = np.full((len(modes), width), np.nan)
    for node, s in zip(member_nodes, sets):
        table[node, :len(s)] = s
    return table


# --------------------------------------------------------------------------------------------
# opsets 1 and 3


def _legacy_forest(nodes_treeids: list[int], nodes_nodeids: list[int], nodes_featureids: list[int],
                   values: np.ndarray, nodes_modes: list[str], nodes_truenodeids: list[int],
                   nodes_falsenodeids: list[int], missing: list[int] | None, t_tree: list[int], t_node: list[int],
                   t_ids: list[int], t_weights: np.ndarray, n_targets: int) -> Forest:
    """(tree id, node id) addressed nodes with LEAF entries -> a Forest."""
    count = len(nodes_nodeids)
    if {len(nodes_treeids), len(nodes_featureids), len(values), len(nodes_modes), len(nodes_truenodeids),
            len(nodes_falsenodeids)} != {count}:
        raise ValueError("the nodes_* attributes must all have one entry per node")
    key = {(t, nid): i for i, (t, nid) in enumerate(zip(nodes_treeids, nodes_nodeids))}
    is_leaf = [m == "LEAF" for m in nodes_modes]
    for m in nodes_modes:
        if m != "LEAF" and m not in MODE_NAMES:
            raise ValueError(f"unknown node mode {m!r}")
    leaf_of = {i: k for k, i in enumerate(i for i in range(count) if is_leaf[i])}
    branch = [i for i in range(count) if not is_leaf[i]]
    node_of = {i: k for k, i in enumerate(branch)}
    weight = np.zeros((len(leaf_of) + count, n_targets))
    has = np.zeros(weight.shape, dtype=bool)
    for t, nid, tid, w in zip(t_tree, t_node, t_ids, t_weights):
        i = key.get((t, nid))
        if i is None or not is_leaf[i]:
            raise ValueError(f"a weight refers to tree {t} node {nid}, which is not a leaf")
        if not 0 <= tid < n_targets:
            raise ValueError(f"target/class id {tid} is out of range [0, {n_targets})")
        weight[leaf_of[i], tid] += w
        has[leaf_of[i], tid] = True
    true_next, true_leaf, false_next, false_leaf = [], [], [], []
    for i in branch:
        for child_id, nxt, lf in ((nodes_truenodeids[i], true_next, true_leaf),
                                  (nodes_falsenodeids[i], false_next, false_leaf)):
            c = key.get((nodes_treeids[i], child_id))
            if c is None:
                raise ValueError(f"tree {nodes_treeids[i]} node {nodes_nodeids[i]} points to missing node {child_id}")
            nxt.append(leaf_of[c] if is_leaf[c] else node_of[c])
            lf.append(is_leaf[c])
    feature = [nodes_featureids[i] for i in branch]
    split = [values[i] for i in branch]
    mode = [MODE_NAMES[nodes_modes[i]] for i in branch]
    miss = [bool(missing[i]) if missing else False for i in branch]
    # roots: the node of each tree that no node points to; a one-leaf tree gets a dummy branch
    children = {(nodes_treeids[i], c) for i in branch for c in (nodes_truenodeids[i], nodes_falsenodeids[i])}
    roots = []
    for tree in dict.fromkeys(nodes_treeids):
        root = next(i for i in range(count) if nodes_treeids[i] == tree and (tree, nodes_nodeids[i]) not in children)
        if is_leaf[root]:
            feature.append(0)
            split.append(0.0)
            mode.append(MODE_NAMES["BRANCH_LEQ"])
            miss.append(False)
            true_next.append(leaf_of[root])
            false_next.append(leaf_of[root])
            true_leaf.append(True)
            false_leaf.append(True)
            roots.append(len(feature) - 1)
        else:
            roots.append(node_of[root])
    return Forest(feature=np.asarray(feature, np.int64), split=np.asarray(split, np.float64),
                  mode=np.asarray(mode, np.int64), true_next=np.asarray(true_next, np.int64),
                  true_leaf=np.asarray(true_leaf, bool), false_next=np.asarray(false_next, np.int64),
                  false_leaf=np.asarray(false_leaf, bool), missing_true=np.asarray(miss, bool),
                  roots=np.asarray(roots, np.int64), leaf_weight=weight[:len(leaf_of)], leaf_has=has[:len(leaf_of)])


def _thresholds(x: torch.Tensor, nodes_values: list[float] | None, as_tensor: Any) -> np.ndarray:
    if as_tensor is not None:
        return _np(as_tensor, np.float64)
    # float attributes: compare in float32 like onnxruntime unless the input is double
    return _np(nodes_values, np.float32).astype(np.float64)


def _legacy_input(x: torch.Tensor, as_tensor: Any) -> torch.Tensor:
    xin = _input(x)
    if xin.dtype == torch.float16:
        xin = xin.to(torch.float32)
    if as_tensor is not None and as_tensor.dtype == torch.float64:
        xin = xin.to(torch.float64)
    return xin


@op("TreeEnsembleRegressor", since=1, domain=ML_DOMAIN)
def tree_ensemble_regressor(
        x: torch.Tensor, *, aggregate_function: str = "SUM", base_values: list[float] | None = None,
        base_values_as_tensor: torch.Tensor | None = None, n_targets: int = 1, nodes_falsenodeids: list[int],
        nodes_featureids: list[int], nodes_hitrates: list[float] | None = None,
        nodes_hitrates_as_tensor: torch.Tensor | None = None, nodes_missing_value_tracks_true: list[int] | None = None,
        nodes_modes: list[str], nodes_nodeids: list[int], nodes_treeids: list[int], nodes_truenodeids: list[int],
        nodes_values: list[float] | None = None, nodes_values_as_tensor: torch.Tensor | None = None,
        post_transform: str = "NONE", target_ids: list[int], target_nodeids: list[int], target_treeids: list[int],
        target_weights: list[float] | None = None, target_weights_as_tensor: torch.Tensor | None = None) -> torch.Tensor:
    xin = _legacy_input(x, nodes_values_as_tensor)
    weights = _np(target_weights_as_tensor if target_weights_as_tensor is not None else target_weights, np.float64)
    forest = _legacy_forest(nodes_treeids, nodes_nodeids, nodes_featureids,
                            _thresholds(xin, nodes_values, nodes_values_as_tensor), nodes_modes, nodes_truenodeids,
                            nodes_falsenodeids, nodes_missing_value_tracks_true, target_treeids, target_nodeids,
                            target_ids, weights, n_targets)
    scores, has = aggregate(forest, leaf_indices(forest, xin), aggregate_function, torch.float64)
    base = _np(base_values_as_tensor if base_values_as_tensor is not None else base_values, np.float64)
    if len(base):
        if len(base) != n_targets:
            raise ValueError(f"base_values has {len(base)} entries; expected n_targets={n_targets}")
        scores = scores + torch.from_numpy(base).to(scores.device)
    scores = torch.where(has, scores, torch.zeros_like(scores))  # onnxruntime: a target no leaf scored is 0
    return post_transform_(scores, post_transform).to(torch.float32)


@op("TreeEnsembleClassifier", since=1, domain=ML_DOMAIN, ctx=True)
def tree_ensemble_classifier(
        x: torch.Tensor, *, base_values: list[float] | None = None, base_values_as_tensor: torch.Tensor | None = None,
        class_ids: list[int], class_nodeids: list[int], class_treeids: list[int], class_weights: list[float] | None = None,
        class_weights_as_tensor: torch.Tensor | None = None, classlabels_int64s: list[int] | None = None,
        classlabels_strings: list[str] | None = None, nodes_falsenodeids: list[int], nodes_featureids: list[int],
        nodes_hitrates: list[float] | None = None, nodes_hitrates_as_tensor: torch.Tensor | None = None,
        nodes_missing_value_tracks_true: list[int] | None = None, nodes_modes: list[str], nodes_nodeids: list[int],
        nodes_treeids: list[int], nodes_truenodeids: list[int], nodes_values: list[float] | None = None,
        nodes_values_as_tensor: torch.Tensor | None = None, post_transform: str = "NONE",
        ctx: OpContext) -> tuple[Any, torch.Tensor]:
    from crossml.ops.ml._classify import finalize_classifier

    labels: list[Any] = list(classlabels_int64s or classlabels_strings or [])
    if not labels:
        raise ValueError("TreeEnsembleClassifier needs classlabels_int64s or classlabels_strings")
    xin = _legacy_input(x, nodes_values_as_tensor)
    weights = _np(class_weights_as_tensor if class_weights_as_tensor is not None else class_weights, np.float64)
    forest = _legacy_forest(nodes_treeids, nodes_nodeids, nodes_featureids,
                            _thresholds(xin, nodes_values, nodes_values_as_tensor), nodes_modes, nodes_truenodeids,
                            nodes_falsenodeids, nodes_missing_value_tracks_true, class_treeids, class_nodeids,
                            class_ids, weights, len(labels))
    scores, has = aggregate(forest, leaf_indices(forest, xin), "SUM", torch.float64)
    base = _np(base_values_as_tensor if base_values_as_tensor is not None else base_values, np.float64)
    return finalize_classifier(scores, has, base, labels, sorted(set(class_ids)), bool((weights >= 0).all()),
                               post_transform, ctx)
