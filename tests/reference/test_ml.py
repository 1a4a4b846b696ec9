"""ai.onnx.ml ops: hand-checked unit tests, and scikit-learn models (via skl2onnx) compared
with scikit-learn's predictions and with onnxruntime."""

import numpy as np
import pytest
from onnx import TensorProto, helper

from reference import ReferenceEvaluator
from tests.reference.oneop import one_node_model, run_node

ML = "ai.onnx.ml"


def ml_model(op_type, inputs, n_out=1, opset=3, input_types=None, **attrs):
    """A one-node ai.onnx.ml model; `opset` is the ai.onnx.ml version."""
    return one_node_model(op_type, inputs, n_out=n_out, opset=17, domain=ML, domain_opset=opset,
                          input_types=input_types, ir_version=9, **attrs)


def run(op_type, *inputs, opset=3, **kw):
    return run_node(op_type, *inputs, opset=17, domain=ML, domain_opset=opset, **kw)


def run_ort(op_type, *inputs, n_out=1, opset=3, input_types=None, **attrs):
    ort = pytest.importorskip("onnxruntime")
    m, feeds = ml_model(op_type, inputs, n_out, opset, input_types, **attrs)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    out = sess.run(None, feeds)
    return out[0] if n_out == 1 else out


# small ops -------------------------------------------------------------------------------------
def test_array_feature_extractor_last_axis():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    y = run("ArrayFeatureExtractor", x, np.array([3, 0], np.int64))
    np.testing.assert_array_equal(y, x[..., [3, 0]])
    s = np.array(["a", "b", "c"], dtype=object)
    y = run("ArrayFeatureExtractor", s, np.array([2], np.int64))
    assert y.shape == (1, 1) and y[0, 0] == "c"


def test_binarizer_keeps_dtype():
    x = np.array([[-1.0, 0.0, 0.5, 2.0]], np.float64)
    y = run("Binarizer", x, threshold=0.4)
    assert y.dtype == np.float64
    np.testing.assert_array_equal(y, [[0, 0, 1, 1]])


def test_scaler_normalizer():
    x = np.array([[1.0, 2.0, -3.0], [0.0, 0.0, 0.0]], np.float64)
    y = run("Scaler", x, offset=[1.0], scale=[2.0, 1.0, 0.5])
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, [[0, 1, -2], [-2, -1, -0.5]])
    np.testing.assert_allclose(
        run("Normalizer", x, norm="L1"), [[1 / 6, 2 / 6, -3 / 6], [0, 0, 0]], rtol=1e-6
    )
    n = np.sqrt(14)
    np.testing.assert_allclose(
        run("Normalizer", x, norm="L2"), [[1 / n, 2 / n, -3 / n], [0, 0, 0]], rtol=1e-6
    )
    np.testing.assert_allclose(run("Normalizer", x, norm="MAX"), [[0.5, 1, -1.5], [0, 0, 0]])
    for norm in ("MAX", "L1", "L2"):
        np.testing.assert_allclose(
            run("Normalizer", x, norm=norm), run_ort("Normalizer", x, norm=norm), rtol=1e-6
        )


def test_imputer_nan_and_int():
    x = np.array([[np.nan, 1.0], [2.0, np.nan]], np.float32)
    y = run("Imputer", x, imputed_value_floats=[7.0, 8.0], replaced_value_float=float("nan"))
    np.testing.assert_array_equal(y, [[7, 1], [2, 8]])
    xi = np.array([[0, 5], [-1, 0]], np.int64)
    y = run("Imputer", xi, imputed_value_int64s=[9], replaced_value_int64=0)
    np.testing.assert_array_equal(y, [[9, 5], [-1, 9]])
    assert y.dtype == np.int64


def test_feature_vectorizer_pads_and_truncates():
    a = np.array([[1, 2], [3, 4]], np.int64)
    b = np.array([[5.0, 6.0, 7.0], [8.0, 9.0, 10.0]], np.float64)
    y = run("FeatureVectorizer", a, b, inputdimensions=[3, 2])
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, [[1, 2, 0, 5, 6], [3, 4, 0, 8, 9]])


def test_one_hot_encoder():
    x = np.array([[1, 3], [2, 7]], np.int64)
    y = run("OneHotEncoder", x, cats_int64s=[1, 2, 3])
    assert y.shape == (2, 2, 3) and y.dtype == np.float32
    np.testing.assert_array_equal(y[1, 1], [0, 0, 0])
    np.testing.assert_array_equal(y[0, 1], [0, 0, 1])
    with pytest.raises(Exception, match="zeros"):
        run("OneHotEncoder", x, cats_int64s=[1, 2, 3], zeros=0)
    s = np.array(["b", "z"], dtype=object)
    np.testing.assert_array_equal(
        run("OneHotEncoder", s, cats_strings=["a", "b"]), [[0, 1], [0, 0]]
    )


def test_label_encoder_versions():
    s = np.array([["a", "q"], ["c", "a"]], dtype=object)
    y = run("LabelEncoder", s, opset=1, classes_strings=["a", "b", "c"], default_int64=-5)
    np.testing.assert_array_equal(y, [[0, -5], [2, 0]])
    i = np.array([2, 0, 9], np.int64)
    y = run("LabelEncoder", i, opset=1, classes_strings=["a", "b", "c"], default_string="?")
    assert y.tolist() == ["c", "a", "?"]
    f = np.array([1.5, np.nan, 2.0], np.float32)
    y = run("LabelEncoder", f, opset=2, keys_floats=[1.5, float("nan")], values_int64s=[3, 4])
    np.testing.assert_array_equal(y, [3, 4, -1])
    # repeated key: the last one wins
    y = run(
        "LabelEncoder",
        np.array(["a"], dtype=object),
        opset=2,
        keys_strings=["a", "a"],
        values_floats=[1.0, 2.0],
    )
    assert y.dtype == np.float32 and y.tolist() == [2.0]
    y = run(
        "LabelEncoder",
        np.array([[1, 2]], np.int64),
        opset=4,
        keys_tensor=helper.make_tensor("k", TensorProto.INT64, [2], [1, 5]),
        values_tensor=helper.make_tensor("v", TensorProto.DOUBLE, [2], [0.5, 1.5]),
    )
    assert y.dtype == np.float64 and y.tolist() == [[0.5, -0.0]]


def test_category_mapper_both_ways():
    s = np.array(["x", "y", "zz"], dtype=object)
    y = run("CategoryMapper", s, cats_strings=["x", "y"], cats_int64s=[10, 20], default_int64=-9)
    np.testing.assert_array_equal(y, [10, 20, -9])
    y = run(
        "CategoryMapper",
        np.array([[20, 5]], np.int64),
        cats_strings=["x", "y"],
        cats_int64s=[10, 20],
        default_string="none",
    )
    assert y.tolist() == [["y", "none"]]


def test_dict_vectorizer_and_cast_map_match_onnxruntime():
    mtype = helper.make_map_type_proto(
        TensorProto.STRING, helper.make_tensor_type_proto(TensorProto.FLOAT, None)
    )
    x = {"a": 4.0, "c": 8.0}
    ours = run("DictVectorizer", x, input_types=[mtype], string_vocabulary=["a", "c", "b", "z"])
    np.testing.assert_array_equal(ours.reshape(-1), [4, 8, 0, 0])
    theirs = run_ort(
        "DictVectorizer", x, input_types=[mtype], string_vocabulary=["a", "c", "b", "z"]
    )
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    itype = helper.make_map_type_proto(
        TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, None)
    )
    x = {3: 1.5, 1: 2.5}
    for form in ("DENSE", "SPARSE"):
        for cast_to in ("TO_FLOAT", "TO_INT64", "TO_STRING"):
            kw = {"input_types": [itype], "map_form": form, "cast_to": cast_to, "max_map": 5}
            ours, theirs = run("CastMap", x, **kw), run_ort("CastMap", x, **kw)
            assert ours.shape == theirs.shape and ours.dtype.kind == theirs.dtype.kind
            if cast_to == "TO_STRING":  # onnxruntime pads with "0.f", the spec names no pad value
                keep = [v != "0.f" for v in theirs.reshape(-1)]
                assert [float(v) for v, k in zip(ours.reshape(-1), keep) if k] == [
                    float(v) for v, k in zip(theirs.reshape(-1), keep) if k
                ]
            else:
                np.testing.assert_array_equal(ours, theirs)


def test_zipmap_sequence_of_maps():
    x = np.array([[0.25, 0.75], [1.0, 0.0]], np.float32)
    z = run("ZipMap", x, classlabels_strings=["no", "yes"])
    assert isinstance(z, list) and len(z) == 2
    assert z[0]["yes"] == pytest.approx(0.75) and z[1]["no"] == pytest.approx(1.0)
    z = run("ZipMap", x, classlabels_int64s=[3, 7])
    assert set(z[0]) == {3, 7}


# linear models and SVMs -------------------------------------------------------------------------
@pytest.mark.parametrize("transform", ["NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT"])
def test_linear_regressor_post_transforms(transform):
    x = np.array([[0.1, 0.2], [0.3, -0.1]], np.float32)
    kw = {
        "coefficients": [0.5, 0.25, 0.0, 0.0, -1.0, 0.5],
        "intercepts": [0.1, 0.0, 0.2],
        "targets": 3,
        "post_transform": transform,
    }
    ours = run("LinearRegressor", x, **kw)
    raw = x.astype(np.float64) @ np.array([[0.5, 0.25], [0, 0], [-1, 0.5]]).T + [0.1, 0.0, 0.2]
    if transform == "NONE":
        np.testing.assert_allclose(ours, raw, rtol=1e-6)
    if transform == "SOFTMAX_ZERO":  # the all-zero target stays zero
        assert (ours[:, 1] == 0).all()
        np.testing.assert_allclose(ours.sum(1), 1, rtol=1e-6)
    if transform == "PROBIT":  # inverse normal CDF
        p = np.clip(raw, 1e-6, 1 - 1e-6)
        ok = (raw > 0) & (raw < 1)
        z = ours[ok].astype(np.float64)
        from reference.ops.ml import _erf

        np.testing.assert_allclose(0.5 * (1 + _erf(z / np.sqrt(2))), p[ok], rtol=1e-5)
    if transform != "PROBIT":  # onnxruntime approximates probit coarsely
        np.testing.assert_allclose(ours, run_ort("LinearRegressor", x, **kw), rtol=1e-5, atol=1e-6)


X_BIN = np.array([[0.5, -1.0], [2.0, 1.0], [-1.0, 0.2], [0.0, 0.0]], np.float32)


@pytest.mark.parametrize("transform", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"])
def test_linear_classifier_binary_one_row(transform):
    # one weight row for two labels: the row scores the second label
    kw = {
        "coefficients": [1.0, -0.5],
        "intercepts": [0.1],
        "classlabels_ints": [0, 1],
        "post_transform": transform,
    }
    label, scores = run("LinearClassifier", X_BIN, n_out=2, **kw)
    s = X_BIN.astype(np.float64) @ [1.0, -0.5] + 0.1  # [1.1, 1.6, -1.0, 0.1]
    np.testing.assert_array_equal(label, (s > 0).astype(np.int64))
    p = 1 / (1 + np.exp(-s)) if transform == "LOGISTIC" else s
    np.testing.assert_allclose(scores, np.stack([1 - p, p], 1), rtol=1e-6)
    label_o, scores_o = run_ort("LinearClassifier", X_BIN, n_out=2, **kw)
    np.testing.assert_array_equal(label, label_o)
    np.testing.assert_allclose(scores, scores_o, rtol=1e-5)


_BIN_TREE = {
    "nodes_treeids": [0, 0, 0],
    "nodes_nodeids": [0, 1, 2],
    "nodes_featureids": [0, 0, 0],
    "nodes_modes": ["BRANCH_LEQ", "LEAF", "LEAF"],
    "nodes_values": [0.3, 0, 0],
    "nodes_truenodeids": [1, 0, 0],
    "nodes_falsenodeids": [2, 0, 0],
    "classlabels_int64s": [0, 1],
    "class_treeids": [0, 0],
    "class_nodeids": [1, 2],
}


@pytest.mark.parametrize("cid", [0, 1])
@pytest.mark.parametrize("weights", [[0.2, 0.9], [-0.7, 1.2]])
@pytest.mark.parametrize("transform", ["NONE", "LOGISTIC"])
def test_tree_classifier_binary_single_class_scores(cid, weights, transform):
    kw = dict(_BIN_TREE, class_ids=[cid, cid], class_weights=weights, post_transform=transform)
    label, scores = run("TreeEnsembleClassifier", X_BIN, n_out=2, **kw)
    s = np.where(X_BIN[:, 0] <= 0.3, weights[0], weights[1])
    threshold = 0.5 if min(weights) >= 0 else 0.0
    np.testing.assert_array_equal(label, (s > threshold).astype(np.int64))
    assert scores.shape == (4, 2) and scores.dtype == np.float32
    label_o, scores_o = run_ort("TreeEnsembleClassifier", X_BIN, n_out=2, **kw)
    np.testing.assert_array_equal(label, label_o)
    np.testing.assert_allclose(scores, scores_o, rtol=1e-5, atol=1e-7)


_SVM_LINEAR = {
    "coefficients": [0.5, -0.25, 0.1, 0.3, -0.2, 0.7],
    "rho": [0.1, 0.2, 0.3],
    "classlabels_ints": [4, 5, 6],
    "kernel_type": "LINEAR",
    "kernel_params": [0.0, 0.0, 1.0],
}
_SVM_RBF_BINARY = {
    "coefficients": [0.5, -0.25, 0.1, -0.3],
    "rho": [0.1],
    "classlabels_ints": [4, 5],
    "kernel_type": "RBF",
    "kernel_params": [0.3, 0.0, 1.0],
    "vectors_per_class": [2, 2],
    "support_vectors": [1, 0, 0, 1, 1, 1, 0.5, -1],
}


@pytest.mark.parametrize("transform", ["NONE", "LOGISTIC"])
@pytest.mark.parametrize("attrs", [_SVM_LINEAR, _SVM_RBF_BINARY], ids=["linear3", "rbf2"])
def test_svm_classifier_small_models(attrs, transform):
    x = np.array([[1.0, 2.0], [0.0, -1.0], [0.3, 0.1]], np.float32)
    label, scores = run("SVMClassifier", x, n_out=2, post_transform=transform, **attrs)
    if attrs is _SVM_LINEAR and transform == "NONE":
        # one weight row per class; onnxruntime adds rho[0] to every class
        np.testing.assert_allclose(
            scores, x @ np.array([[0.5, -0.25], [0.1, 0.3], [-0.2, 0.7]]).T + 0.1, rtol=1e-6
        )
    label_o, scores_o = run_ort("SVMClassifier", x, n_out=2, post_transform=transform, **attrs)
    np.testing.assert_array_equal(label, label_o)
    np.testing.assert_allclose(scores, scores_o, rtol=1e-5, atol=1e-6)


def test_svm_regressor_one_class():
    x = np.array([[1.0, 2.0], [0.0, -1.0], [0.9, 0.1]], np.float32)
    kw = {
        "coefficients": [0.5, -0.25],
        "support_vectors": [1.0, 0.0, 0.0, 1.0],
        "n_supports": 2,
        "rho": [-0.1],
        "kernel_type": "RBF",
        "kernel_params": [0.5, 0.0, 0.0],
        "one_class": 1,
    }
    y = run("SVMRegressor", x, **kw)
    k = np.exp(-0.5 * ((x[:, None, :] - np.array([[1, 0], [0, 1]])) ** 2).sum(-1))
    np.testing.assert_array_equal(y[:, 0], np.where(k @ [0.5, -0.25] - 0.1 > 0, 1, -1))
    np.testing.assert_array_equal(y, run_ort("SVMRegressor", x, **kw))


# tree ensembles -----------------------------------------------------------------------------
def _regressor_attrs(**extra):
    # tree 0: x0 <= 0.5 ? (x1 < 2 ? leaf 3 : leaf 4) : leaf 2 ; tree 1: x1 == 3 ? leaf 1 : leaf 2
    attrs = {
        "nodes_treeids": [0, 0, 0, 0, 0, 1, 1, 1],
        "nodes_nodeids": [0, 1, 2, 3, 4, 0, 1, 2],
        "nodes_featureids": [0, 1, 0, 0, 0, 1, 0, 0],
        "nodes_modes": [
            "BRANCH_LEQ",
            "BRANCH_LT",
            "LEAF",
            "LEAF",
            "LEAF",
            "BRANCH_EQ",
            "LEAF",
            "LEAF",
        ],
        "nodes_values": [0.5, 2.0, 0, 0, 0, 3.0, 0, 0],
        "nodes_truenodeids": [1, 3, 0, 0, 0, 1, 0, 0],
        "nodes_falsenodeids": [2, 4, 0, 0, 0, 2, 0, 0],
        "nodes_missing_value_tracks_true": [1, 0, 0, 0, 0, 0, 0, 0],
        "target_treeids": [0, 0, 0, 0, 1, 1, 1],
        "target_nodeids": [2, 3, 4, 4, 1, 2, 1],
        "target_ids": [0, 0, 0, 1, 0, 1, 1],
        "target_weights": [1.0, 10.0, 100.0, 5.0, 0.5, 2.0, 0.25],
        "n_targets": 2,
    }
    attrs.update(extra)
    return attrs


X_TREE = np.array([[0.0, 1.0], [0.0, 3.0], [1.0, 3.0], [np.nan, 1.0], [0.0, np.nan]], np.float32)


def test_tree_regressor_hand_values_and_missing():
    y = run("TreeEnsembleRegressor", X_TREE, **_regressor_attrs())
    # row 3: x0 NaN tracks true -> x1 < 2 -> leaf 3 ; row 4: x1 NaN < 2 is false -> leaf 4
    want = [[10, 2], [100.5, 5.25], [1.5, 0.25], [10, 2], [100, 7]]
    np.testing.assert_allclose(y, want)


@pytest.mark.parametrize("agg", ["SUM", "AVERAGE", "MIN", "MAX"])
@pytest.mark.parametrize("transform", ["NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO"])
def test_tree_regressor_aggregates_match_onnxruntime(agg, transform):
    attrs = _regressor_attrs(
        aggregate_function=agg, post_transform=transform, base_values=[0.5, -0.5]
    )
    ours = run("TreeEnsembleRegressor", X_TREE, **attrs)
    np.testing.assert_allclose(
        ours, run_ort("TreeEnsembleRegressor", X_TREE, **attrs), rtol=1e-5, atol=1e-6
    )


def test_tree_regressor_aggregates_by_hand():
    raw = {
        "AVERAGE": [[5, 1], [50.25, 2.625], [0.75, 0.125], [5, 1], [50, 3.5]],
        "MIN": [[10, 2], [0.5, 0.25], [0.5, 0.25], [10, 2], [100, 2]],
        "MAX": [[10, 2], [100, 5], [1, 0.25], [10, 2], [100, 5]],
    }
    for agg, want in raw.items():
        np.testing.assert_allclose(
            run("TreeEnsembleRegressor", X_TREE, **_regressor_attrs(aggregate_function=agg)), want
        )


def test_tree_ensemble_v5_two_trees():
    # the trees of _regressor_attrs in the v5 encoding, with one target per leaf:
    # leaves 0..3 vote for target 0 (1, 10, 100, 0.5), leaf 4 for target 1 (2)
    attrs = {
        "n_targets": 2,
        "aggregate_function": 1,
        "post_transform": 0,
        "tree_roots": [0, 2],
        "nodes_modes": helper.make_tensor("m", TensorProto.UINT8, [3], [0, 1, 4]),
        "nodes_featureids": [0, 1, 1],
        "nodes_splits": helper.make_tensor("s", TensorProto.FLOAT, [3], [0.5, 2.0, 3.0]),
        "nodes_truenodeids": [1, 1, 3],
        "nodes_trueleafs": [0, 1, 1],
        "nodes_falsenodeids": [0, 2, 4],
        "nodes_falseleafs": [1, 1, 1],
        "nodes_missing_value_tracks_true": [1, 0, 0],
        "leaf_targetids": [0, 0, 0, 0, 1],
        "leaf_weights": helper.make_tensor("w", TensorProto.FLOAT, [5], [1, 10, 100, 0.5, 2]),
    }
    y = run("TreeEnsemble", X_TREE, opset=5, **attrs)
    assert y.dtype == np.float32 and y.shape == (5, 2)
    np.testing.assert_allclose(y, [[10, 2], [100.5, 0], [1.5, 0], [10, 2], [100, 2]])
    np.testing.assert_allclose(y, run_ort("TreeEnsemble", X_TREE, opset=5, **attrs))
    # onnxruntime reads post_transform 1 as LOGISTIC and 2 as SOFTMAX, the spec says the
    # opposite (1 = SOFTMAX, 2 = LOGISTIC): compare 3 with onnxruntime, 1 and 2 by hand
    raw = y.astype(np.float64)
    attrs["post_transform"] = 1
    e = np.exp(raw - raw.max(1, keepdims=True))
    np.testing.assert_allclose(
        run("TreeEnsemble", X_TREE, opset=5, **attrs),
        e / e.sum(1, keepdims=True),
        rtol=1e-5,
        atol=1e-7,
    )
    attrs["post_transform"] = 2
    np.testing.assert_allclose(
        run("TreeEnsemble", X_TREE, opset=5, **attrs), 1 / (1 + np.exp(-raw)), rtol=1e-5
    )
    attrs["post_transform"] = 3
    np.testing.assert_allclose(
        run("TreeEnsemble", X_TREE, opset=5, **attrs),
        run_ort("TreeEnsemble", X_TREE, opset=5, **attrs),
        rtol=1e-5,
        atol=1e-7,
    )


def test_tree_ensemble_v5_member_and_min_max():
    base = {
        "n_targets": 1,
        "post_transform": 0,
        "tree_roots": [0, 1],
        "nodes_modes": helper.make_tensor("m", TensorProto.UINT8, [2], [6, 3]),
        "nodes_featureids": [0, 0],
        "nodes_splits": helper.make_tensor("s", TensorProto.DOUBLE, [2], [0.0, 1.0]),
        "membership_values": helper.make_tensor("mv", TensorProto.DOUBLE, [3], [1.0, 4.0, np.nan]),
        "nodes_truenodeids": [0, 2],
        "nodes_trueleafs": [1, 1],
        "nodes_falsenodeids": [1, 3],
        "nodes_falseleafs": [1, 1],
        "nodes_missing_value_tracks_true": [1, 0],
        "leaf_targetids": [0, 0, 0, 0],
        "leaf_weights": helper.make_tensor("w", TensorProto.DOUBLE, [4], [1.0, 2.0, 30.0, 40.0]),
    }
    x = np.array([[4.0], [2.0], [np.nan], [0.5]], np.float64)
    # tree 0: x in {1, 4} (NaN -> true) ? 1 : 2 ; tree 1: x > 1 ? 30 : 40
    leaves = np.array([[1, 30], [2, 30], [1, 40], [2, 40]], np.float64)
    for agg, fn in [
        (0, lambda a: a.mean(1)),
        (1, lambda a: a.sum(1)),
        (2, lambda a: a.min(1)),
        (3, lambda a: a.max(1)),
    ]:
        y = run("TreeEnsemble", x, opset=5, aggregate_function=agg, **base)
        assert y.dtype == np.float64
        np.testing.assert_allclose(y[:, 0], fn(leaves))
        np.testing.assert_allclose(
            y, run_ort("TreeEnsemble", x, opset=5, aggregate_function=agg, **base)
        )


def test_tree_probit_transform():
    attrs = _regressor_attrs(
        post_transform="PROBIT", target_weights=[0.1, 0.2, 0.3, 0.4, 0.05, 0.6, 0.7]
    )
    y = run("TreeEnsembleRegressor", X_TREE[:1], **attrs)
    # row 0 reaches leaf 3 (0.2 for target 0) and tree 1's leaf 2 (0.6 for target 1)
    # probit(0.2) = -0.8416212, probit(0.6) = 0.2533471
    np.testing.assert_allclose(y, [[-0.8416212, 0.2533471]], rtol=1e-5)


# scikit-learn models -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def data():
    sk = pytest.importorskip("sklearn.datasets")
    x, y = sk.load_iris(return_X_y=True)
    return x.astype(np.float32), y


def _convert(est, x, **options):
    skl2onnx = pytest.importorskip("skl2onnx")
    from skl2onnx.common.data_types import FloatTensorType

    return skl2onnx.convert_sklearn(
        est,
        initial_types=[("X", FloatTensorType([None, x.shape[1]]))],
        target_opset={"": 17, "ai.onnx.ml": 3},
        options={id(est): options} if options else None,
    )


def _both(onx, x):
    ort = pytest.importorskip("onnxruntime")
    ours = ReferenceEvaluator(onx).run(None, {"X": x})
    theirs = ort.InferenceSession(onx.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"X": x}
    )
    return ours, theirs


def _check_classifier(est, x, y, rtol=1e-4, atol=1e-5, **options):
    est.fit(x, y)
    onx = _convert(est, x, **{"zipmap": False, **options})
    (lab, prob), (lab_o, prob_o) = _both(onx, x)
    np.testing.assert_array_equal(lab, lab_o)
    np.testing.assert_allclose(prob, prob_o, rtol=rtol, atol=atol)
    return lab, prob


@pytest.mark.parametrize("binary", [False, True])
def test_sklearn_logistic_regression(data, binary):
    from sklearn.linear_model import LogisticRegression

    x, y = data
    if binary:
        y = (y == 2).astype(np.int64)
    est = LogisticRegression(max_iter=500)
    lab, prob = _check_classifier(est, x, y)
    np.testing.assert_array_equal(lab, est.predict(x))
    np.testing.assert_allclose(prob, est.predict_proba(x), rtol=1e-4, atol=1e-5)


def test_sklearn_linear_regression(data):
    from sklearn.linear_model import LinearRegression

    x, y = data
    est = LinearRegression().fit(x, x[:, 0] * 2 + y)
    (pred,), (pred_o,) = _both(_convert(est, x), x)
    np.testing.assert_allclose(pred[:, 0], est.predict(x), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(pred, pred_o, rtol=1e-5)


@pytest.mark.parametrize("kind", ["tree", "forest", "gbm"])
def test_sklearn_tree_classifiers(data, kind):
    from sklearn.ensemble import GradientBoostingClassifier, RandomForestClassifier
    from sklearn.tree import DecisionTreeClassifier

    x, y = data
    est = {
        "tree": DecisionTreeClassifier(max_depth=4, random_state=0),
        "forest": RandomForestClassifier(n_estimators=5, max_depth=3, random_state=0),
        "gbm": GradientBoostingClassifier(n_estimators=5, max_depth=2, random_state=0),
    }[kind]
    lab, prob = _check_classifier(est, x, y)
    np.testing.assert_array_equal(lab, est.predict(x))
    np.testing.assert_allclose(prob, est.predict_proba(x), rtol=1e-4, atol=1e-5)


def test_sklearn_binary_gbm_two_columns(data):
    from sklearn.ensemble import GradientBoostingClassifier

    x, y = data
    y = (y == 1).astype(np.int64)
    est = GradientBoostingClassifier(n_estimators=5, max_depth=2, random_state=0)
    _lab, prob = _check_classifier(est, x, y)
    assert prob.shape == (len(x), 2)
    np.testing.assert_allclose(prob, est.predict_proba(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["tree", "forest"])
def test_sklearn_tree_regressors(data, kind):
    from sklearn.ensemble import RandomForestRegressor
    from sklearn.tree import DecisionTreeRegressor

    x, y = data
    est = {
        "tree": DecisionTreeRegressor(max_depth=4, random_state=0),
        "forest": RandomForestRegressor(n_estimators=5, max_depth=3, random_state=0),
    }[kind]
    est.fit(x, y.astype(np.float32))
    (pred,), (pred_o,) = _both(_convert(est, x), x)
    np.testing.assert_allclose(pred[:, 0], est.predict(x), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(pred, pred_o, rtol=1e-5)


@pytest.mark.parametrize("probability", [False, True])
@pytest.mark.parametrize("kernel", ["rbf", "linear", "poly"])
def test_sklearn_svc(data, probability, kernel):
    from sklearn.svm import SVC

    x, y = data
    est = SVC(probability=probability, kernel=kernel, random_state=0, degree=2)
    lab, _ = _check_classifier(est, x, y, rtol=1e-3, atol=1e-4)
    agree = (lab == est.predict(x)).mean()
    assert agree > 0.97


def test_sklearn_svc_binary(data):
    from sklearn.svm import SVC

    x, y = data
    y = (y == 2).astype(np.int64)
    est = SVC(kernel="rbf")
    lab, _ = _check_classifier(est, x, y, rtol=1e-3, atol=1e-4)
    np.testing.assert_array_equal(lab, est.predict(x))


@pytest.mark.parametrize("kernel", ["rbf", "linear", "sigmoid"])
def test_sklearn_svr(data, kernel):
    from sklearn.svm import SVR

    x, y = data
    est = SVR(kernel=kernel, gamma=0.1).fit(x, y.astype(np.float32))
    (pred,), (pred_o,) = _both(_convert(est, x), x)
    np.testing.assert_allclose(pred[:, 0], est.predict(x), rtol=1e-5, atol=1e-5)
    # onnxruntime sums the kernel terms in float32 (errors near 1e-3 for the linear kernel)
    np.testing.assert_allclose(pred, pred_o, rtol=1e-3, atol=2e-3)


def test_sklearn_scaler_onehot_pipeline():
    pytest.importorskip("sklearn")
    skl2onnx = pytest.importorskip("skl2onnx")
    from skl2onnx.common.data_types import FloatTensorType, Int64TensorType
    from sklearn.compose import ColumnTransformer
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    rng = np.random.default_rng(0)
    num = rng.standard_normal((20, 2)).astype(np.float32)
    cat = rng.integers(0, 4, (20, 1)).astype(np.int64)
    ct = ColumnTransformer(
        [
            ("s", StandardScaler(), [0, 1]),
            ("o", OneHotEncoder(sparse_output=False, handle_unknown="ignore"), [2]),
        ]
    )
    ct.fit(np.hstack([num, cat]))
    onx = skl2onnx.convert_sklearn(
        ct,
        initial_types=[("num", FloatTensorType([None, 2])), ("cat", Int64TensorType([None, 1]))],
        target_opset={"": 17, "ai.onnx.ml": 3},
    )
    ct2 = ColumnTransformer(
        [
            ("s", StandardScaler(), [0, 1]),
            ("o", OneHotEncoder(sparse_output=False, handle_unknown="ignore"), [2]),
        ]
    ).fit(np.hstack([num, cat]))
    ours = ReferenceEvaluator(onx).run(None, {"num": num, "cat": cat})[0]
    np.testing.assert_allclose(ours, ct2.transform(np.hstack([num, cat])), rtol=1e-5, atol=1e-6)


def test_sklearn_classifier_with_zipmap(data):
    from sklearn.linear_model import LogisticRegression

    x, y = data
    est = LogisticRegression(max_iter=500).fit(x, y)
    onx = _convert(est, x)
    (lab, maps), (lab_o, maps_o) = _both(onx, x[:5])
    assert isinstance(maps, list) and len(maps) == 5
    np.testing.assert_array_equal(lab, lab_o)
    for m, mo in zip(maps, maps_o):
        assert set(m) == set(mo)
        for k in m:
            assert float(np.asarray(m[k])) == pytest.approx(mo[k], rel=1e-4, abs=1e-6)
