"""ai.onnx.ml and training ops against onnxruntime (CPU) on models the ONNX node tests lack:
Normalizer, Scaler, Imputer, OneHotEncoder, FeatureVectorizer, LabelEncoder opsets 1/2,
CategoryMapper, ZipMap, linear models and the legacy tree ensembles (regression, multi-class,
binary, post transforms)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import crossml

RNG = np.random.default_rng(5)
ML = "ai.onnx.ml"
NP_TO_TP = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
            np.dtype(np.int64): TensorProto.INT64, np.dtype(np.int32): TensorProto.INT32,
            np.dtype(object): TensorProto.STRING}


def ml_model(op_type: str, inputs: dict[str, np.ndarray], outputs: list[tuple[str, int | None]],
             ml_opset: int = 3, **attrs) -> bytes:
    node = helper.make_node(op_type, list(inputs), [n for n, _ in outputs], domain=ML, **attrs)
    ins = [helper.make_tensor_value_info(n, NP_TO_TP[v.dtype], None) for n, v in inputs.items()]
    outs = []
    for n, et in outputs:
        if et == "seqmap_str":
            tp = helper.make_sequence_type_proto(helper.make_map_type_proto(
                TensorProto.STRING, helper.make_tensor_type_proto(TensorProto.FLOAT, None)))
            vt = helper.make_value_info(n, tp)
            outs.append(vt)
        else:
            outs.append(helper.make_tensor_value_info(n, et, None))
    graph = helper.make_graph([node], "g", ins, outs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(ML, ml_opset)])
    model.ir_version = 8
    return model.SerializeToString()


def run_both(blob: bytes, feed: dict[str, np.ndarray]) -> tuple[list, list]:
    want = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, feed)
    got = crossml.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, feed)
    return want, got


def assert_same(want: list, got: list, rtol: float = 1e-5, atol: float = 1e-5) -> None:
    assert len(want) == len(got)
    for w, g in zip(want, got):
        if isinstance(w, list):
            assert len(w) == len(g)
            for dw, dg in zip(w, g):
                assert dw.keys() == dg.keys()
                np.testing.assert_allclose(list(dg.values()), list(dw.values()), rtol=rtol, atol=atol)
            continue
        assert g.dtype == w.dtype, (g.dtype, w.dtype)
        assert g.shape == w.shape, (g.shape, w.shape)
        if w.dtype == object:
            assert g.tolist() == w.tolist()
        else:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def check(op_type: str, inputs: dict[str, np.ndarray], outputs: list[tuple[str, int]], ml_opset: int = 3,
          **attrs) -> None:
    want, got = run_both(ml_model(op_type, inputs, outputs, ml_opset, **attrs), inputs)
    assert_same(want, got)


X = RNG.standard_normal((6, 4)).astype(np.float32)


@pytest.mark.parametrize("norm", ["MAX", "L1", "L2"])
def test_normalizer(norm):
    check("Normalizer", {"x": X}, [("y", TensorProto.FLOAT)], norm=norm)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_scaler(dtype):
    check("Scaler", {"x": (X * 4).astype(dtype)}, [("y", TensorProto.FLOAT)],
          offset=[0.5, -1.0, 2.0, 0.0], scale=[2.0, 0.5, 1.0, 3.0])


def test_imputer_float_nan_and_int():
    x = X.copy()
    x[1, 2] = np.nan
    x[4, 0] = np.nan
    check("Imputer", {"x": x}, [("y", TensorProto.FLOAT)], imputed_value_floats=[1.0, 2.0, 3.0, 4.0],
          replaced_value_float=float("nan"))
    xi = RNG.integers(0, 3, (5, 4)).astype(np.int64)
    check("Imputer", {"x": xi}, [("y", TensorProto.INT64)], imputed_value_int64s=[9], replaced_value_int64=1)


def test_one_hot_encoder():
    xi = RNG.integers(0, 5, (3, 4)).astype(np.int64)
    check("OneHotEncoder", {"x": xi}, [("y", TensorProto.FLOAT)], cats_int64s=[0, 1, 2, 3, 4, 7])
    xs = np.array(["a", "b", "z", "c"], dtype=object)
    check("OneHotEncoder", {"x": xs}, [("y", TensorProto.FLOAT)], cats_strings=["a", "b", "c"])


def test_feature_vectorizer():
    a, b = X[:, :3].copy(), X[:, :1].copy()
    check("FeatureVectorizer", {"a": a, "b": b}, [("y", TensorProto.FLOAT)], inputdimensions=[2, 3])


def test_binarizer_and_array_feature_extractor():
    check("Binarizer", {"x": X}, [("y", TensorProto.FLOAT)], threshold=0.2)
    check("ArrayFeatureExtractor", {"x": X, "i": np.array([3, 0, 3], dtype=np.int64)}, [("y", TensorProto.FLOAT)])


def test_label_encoder_opset2_floats_to_strings():
    x = np.array([1.5, 2.0, 7.0, -1.0], dtype=np.float32)
    check("LabelEncoder", {"x": x}, [("y", TensorProto.STRING)], ml_opset=2,
          keys_floats=[1.5, 2.0, -1.0], values_strings=["a", "b", "c"], default_string="?")
    xi = np.array([[3, 1], [2, 9]], dtype=np.int64)
    check("LabelEncoder", {"x": xi}, [("y", TensorProto.FLOAT)], ml_opset=2,
          keys_int64s=[1, 2, 3], values_floats=[0.5, 1.5, 2.5])


def test_label_encoder_opset1():
    xs = np.array(["b", "a", "q"], dtype=object)
    check("LabelEncoder", {"x": xs}, [("y", TensorProto.INT64)], ml_opset=1, classes_strings=["a", "b"],
          default_int64=-7)


def test_category_mapper():
    xs = np.array([["b", "a"], ["q", "a"]], dtype=object)
    check("CategoryMapper", {"x": xs}, [("y", TensorProto.INT64)], cats_strings=["a", "b"], cats_int64s=[5, 6])
    xi = np.array([5, 6, 1], dtype=np.int64)
    check("CategoryMapper", {"x": xi}, [("y", TensorProto.STRING)], cats_strings=["a", "b"], cats_int64s=[5, 6],
          default_string="none")


def test_zipmap():
    p = RNG.random((3, 2)).astype(np.float32)
    check("ZipMap", {"x": p}, [("y", "seqmap_str")], classlabels_strings=["no", "yes"])


def test_linear_regressor():
    check("LinearRegressor", {"x": X}, [("y", TensorProto.FLOAT)], coefficients=list(RNG.standard_normal(8)),
          intercepts=[0.5, -0.5], targets=2)


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"])
@pytest.mark.parametrize("rows", [1, 3])
def test_linear_classifier(post, rows):
    labels = [0, 1] if rows == 1 else [4, 5, 6]
    check("LinearClassifier", {"x": X}, [("label", TensorProto.INT64), ("scores", TensorProto.FLOAT)],
          coefficients=list(RNG.standard_normal(4 * rows)), intercepts=list(RNG.standard_normal(rows)),
          classlabels_ints=labels, post_transform=post)


# --------------------------------------------------------------------------------------------
# tree ensembles (legacy attributes): two depth-2 trees over 4 features


def _trees(leaf_targets: list[list[tuple[int, float]]]) -> dict:
    """Two trees, each: node0 (f0 <= s) -> node1 (f1 < s) -> leaves 3, 4 ; else leaf 2."""
    nodes = dict(nodes_treeids=[], nodes_nodeids=[], nodes_featureids=[], nodes_values=[], nodes_modes=[],
                 nodes_truenodeids=[], nodes_falsenodeids=[])
    for t, (f0, f1, s0, s1) in enumerate([(0, 1, 0.1, -0.3), (2, 3, -0.2, 0.4)]):
        for nid, feat, val, mode, tr, fa in [(0, f0, s0, "BRANCH_LEQ", 1, 2), (1, f1, s1, "BRANCH_LT", 3, 4),
                                             (2, 0, 0.0, "LEAF", 0, 0), (3, 0, 0.0, "LEAF", 0, 0),
                                             (4, 0, 0.0, "LEAF", 0, 0)]:
            nodes["nodes_treeids"].append(t)
            nodes["nodes_nodeids"].append(nid)
            nodes["nodes_featureids"].append(feat)
            nodes["nodes_values"].append(val)
            nodes["nodes_modes"].append(mode)
            nodes["nodes_truenodeids"].append(tr)
            nodes["nodes_falsenodeids"].append(fa)
    tree_ids, node_ids, ids, weights = [], [], [], []
    k = 0
    for t in range(2):
        for leaf in (2, 3, 4):
            for target, w in leaf_targets[k % len(leaf_targets)]:
                tree_ids.append(t)
                node_ids.append(leaf)
                ids.append(target)
                weights.append(w)
            k += 1
    return nodes, tree_ids, node_ids, ids, weights


@pytest.mark.parametrize("agg", ["SUM", "AVERAGE", "MIN", "MAX"])
def test_tree_ensemble_regressor(agg):
    nodes, tt, tn, ti, tw = _trees([[(0, 1.5), (1, -2.0)], [(0, 0.25)], [(1, 3.0)]])
    check("TreeEnsembleRegressor", {"x": X}, [("y", TensorProto.FLOAT)], n_targets=2, target_treeids=tt,
          target_nodeids=tn, target_ids=ti, target_weights=tw, aggregate_function=agg, base_values=[0.5, 1.0],
          **nodes)


@pytest.mark.parametrize("post", ["NONE", "SOFTMAX", "LOGISTIC"])
def test_tree_ensemble_classifier_multiclass(post):
    nodes, tt, tn, ti, tw = _trees([[(0, 0.7), (2, 0.3)], [(1, 1.0)], [(2, 0.6), (0, 0.4)]])
    check("TreeEnsembleClassifier", {"x": X}, [("label", TensorProto.INT64), ("probabilities", TensorProto.FLOAT)],
          class_treeids=tt, class_nodeids=tn, class_ids=ti, class_weights=tw, classlabels_int64s=[10, 20, 30],
          post_transform=post, **nodes)


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC"])
def test_tree_ensemble_classifier_binary_one_class(post):
    nodes, tt, tn, ti, tw = _trees([[(0, 0.8)], [(0, -1.2)], [(0, 0.3)]])
    check("TreeEnsembleClassifier", {"x": X}, [("label", TensorProto.STRING), ("probabilities", TensorProto.FLOAT)],
          class_treeids=tt, class_nodeids=tn, class_ids=ti, class_weights=tw, classlabels_strings=["neg", "pos"],
          post_transform=post, base_values=[0.1], **nodes)


def test_tree_ensemble_classifier_binary_two_classes():
    nodes, tt, tn, ti, tw = _trees([[(0, 0.8), (1, 0.2)], [(1, 1.0)], [(0, 0.3), (1, 0.7)]])
    check("TreeEnsembleClassifier", {"x": X}, [("label", TensorProto.INT64), ("probabilities", TensorProto.FLOAT)],
          class_treeids=tt, class_nodeids=tn, class_ids=ti, class_weights=tw, classlabels_int64s=[0, 1], **nodes)


def test_tree_ensemble_nan_tracks_true():
    nodes, tt, tn, ti, tw = _trees([[(0, 1.0)], [(0, 2.0)], [(0, 3.0)]])
    nodes["nodes_missing_value_tracks_true"] = [1, 0, 0, 0, 0] * 2
    x = X.copy()
    x[::2, 0] = np.nan
    x[1::2, 2] = np.nan
    check("TreeEnsembleRegressor", {"x": x}, [("y", TensorProto.FLOAT)], n_targets=1, target_treeids=tt,
          target_nodeids=tn, target_ids=ti, target_weights=tw, **nodes)
