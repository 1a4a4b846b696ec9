"""ai.onnx.ml: traditional machine-learning operators (linear models, SVMs, tree ensembles, encoders)."""

from __future__ import annotations

import numpy as np

from ..registry import op

ML = "ai.onnx.ml"
STR = np.dtype(object)


# helpers ------------------------------------------------------------------------------------
def _erf(x):
    """erf in float64: Taylor series for |x| < 2, the continued fraction of erfc beyond."""
    x = np.asarray(x, dtype=np.float64)
    ax = np.abs(x)
    small = np.minimum(ax, 2.0)
    term = small.copy()
    total = small.copy()
    x2 = small * small
    for n in range(1, 50):
        term = term * -x2 / n
        total = total + term / (2 * n + 1)
    series = 2.0 / np.sqrt(np.pi) * total
    big = np.maximum(ax, 2.0)
    frac = big.copy()
    for n in range(60, 0, -1):
        frac = big + (n / 2.0) / frac
    erfc = np.exp(-big * big) / (np.sqrt(np.pi) * frac)
    return np.sign(x) * np.where(ax < 2.0, series, 1.0 - erfc)


def _erfinv(y):
    """Inverse of erf: Winitzki's closed form, refined by Newton steps on _erf."""
    y = np.asarray(y, dtype=np.float64)
    a = 0.147
    with np.errstate(divide="ignore", invalid="ignore"):
        ln = np.log1p(-y * y)
        t = 2.0 / (np.pi * a) + ln / 2.0
        x = np.sign(y) * np.sqrt(np.sqrt(t * t - ln / a) - t)
        for _ in range(3):
            step = (_erf(x) - y) / (2.0 / np.sqrt(np.pi) * np.exp(-x * x))
            x = np.where(np.isfinite(step), x - step, x)
    return x


def post_transform_scores(scores: np.ndarray, transform: str) -> np.ndarray:
    """The post_transform of linear/SVM/tree models, over the last axis (float64 in, out)."""
    if transform == "NONE":
        return scores
    if transform == "LOGISTIC":
        return 1.0 / (1.0 + np.exp(-scores))
    if transform == "SOFTMAX":
        e = np.exp(scores - scores.max(axis=-1, keepdims=True, initial=-np.inf))
        return e / e.sum(axis=-1, keepdims=True)
    if transform == "SOFTMAX_ZERO":
        # zeros stand for "no score" and stay zero
        nonzero = scores != 0
        e = np.where(
            nonzero, np.exp(scores - scores.max(axis=-1, keepdims=True, initial=-np.inf)), 0.0
        )
        s = e.sum(axis=-1, keepdims=True)
        return np.divide(e, s, out=np.zeros_like(e), where=s != 0)
    if transform == "PROBIT":
        return np.sqrt(2.0) * _erfinv(2.0 * scores - 1.0)
    raise ValueError(
        f"post_transform {transform!r} is not one of NONE, SOFTMAX, LOGISTIC, SOFTMAX_ZERO, PROBIT"
    )


_TRANSFORMS = ["NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT"]


def _as_2d(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim == 0:
        return x.reshape(1, 1)
    if x.ndim == 1:
        return x.reshape(1, -1)
    return x.reshape(x.shape[0], -1)


def _labels(classlabels_ints, classlabels_strings, what="classlabels"):
    if classlabels_strings:
        return np.array(classlabels_strings, dtype=object)
    if classlabels_ints is not None and len(classlabels_ints):
        return np.array(classlabels_ints, dtype=np.int64)
    raise ValueError(f"one of {what}_ints/{what}_strings (or int64s) must be set")


def _binary_columns(score: np.ndarray, transform: str, complement: bool) -> np.ndarray:
    """Columns [negative, positive] of a binary model that scores the positive class only.

    LOGISTIC and PROBIT turn the score into a probability p: [1 - p, p]. Otherwise the raw
    score s gives [1 - s, s] (complement) or [-s, s] (a signed margin); a softmax over a
    single score is meaningless, so SOFTMAX and SOFTMAX_ZERO leave it raw (as onnxruntime).
    """
    if transform in ("LOGISTIC", "PROBIT"):
        p = post_transform_scores(score, transform)
        return np.stack([1.0 - p, p], axis=1)
    if transform not in _TRANSFORMS:
        post_transform_scores(score, transform)  # raises the error naming the transform
    return np.stack([1.0 - score if complement else -score, score], axis=1)


def _floats(values):
    """A float attribute's values as the model stores them (float32), widened to float64."""
    return np.asarray(values if values is not None else [], dtype=np.float32).astype(np.float64)


def _final_scores(scores: np.ndarray, transform: str) -> np.ndarray:
    """Scores after the post_transform, as the float32 output of the linear/SVM/tree models."""
    return post_transform_scores(scores, transform).astype(np.float32)


# simple transforms ---------------------------------------------------------------------------
@op("ArrayFeatureExtractor", 1, ML)
def array_feature_extractor(x, indices):
    indices = np.asarray(indices, dtype=np.int64).reshape(-1)
    if x.ndim == 0:
        raise ValueError("ArrayFeatureExtractor: X must have rank >= 1")
    if len(indices) and (indices.min() < 0 or indices.max() >= x.shape[-1]):
        raise ValueError(
            f"ArrayFeatureExtractor: indices {indices.tolist()} out of range "
            f"for last dimension {x.shape[-1]}"
        )
    z = x[..., indices]
    return z.reshape(1, -1) if x.ndim == 1 else z


@op("Binarizer", 1, ML)
def binarizer(x, threshold=0.0):
    return (x > x.dtype.type(threshold)).astype(x.dtype)


@op("Scaler", 1, ML)
def scaler(x, offset=None, scale=None):
    offset = np.asarray(offset if offset else [0.0], dtype=np.float32)
    scale = np.asarray(scale if scale else [1.0], dtype=np.float32)
    return ((x.astype(np.float32) - offset) * scale).astype(np.float32)


@op("Normalizer", 1, ML)
def normalizer(x, norm="MAX"):
    x2 = _as_2d(x).astype(np.float64) if x.ndim < 2 else x.astype(np.float64)
    if norm == "MAX":
        div = x2.max(axis=-1, keepdims=True)
    elif norm == "L1":
        div = np.abs(x2).sum(axis=-1, keepdims=True)
    elif norm == "L2":
        div = np.sqrt((x2 * x2).sum(axis=-1, keepdims=True))
    else:
        raise ValueError(f"Normalizer: norm {norm!r} is not one of MAX, L1, L2")
    y = np.divide(x2, div, out=x2.copy(), where=div != 0)
    return y.reshape(x.shape).astype(np.float32)


@op("Imputer", 1, ML)
def imputer(
    x,
    imputed_value_floats=None,
    imputed_value_int64s=None,
    replaced_value_float=0.0,
    replaced_value_int64=0,
):
    if x.dtype.kind == "f":
        if not imputed_value_floats:
            raise ValueError("Imputer: imputed_value_floats must be set for a float input")
        values = np.asarray(imputed_value_floats, dtype=x.dtype)
        hit = (
            np.isnan(x)
            if np.isnan(replaced_value_float)
            else x == x.dtype.type(replaced_value_float)
        )
    else:
        if not imputed_value_int64s:
            raise ValueError("Imputer: imputed_value_int64s must be set for an integer input")
        values = np.asarray(imputed_value_int64s, dtype=x.dtype)
        hit = x == replaced_value_int64
    if values.size not in (1, x.shape[-1] if x.ndim else 1):
        raise ValueError(f"Imputer: {values.size} imputed values for {x.shape[-1]} features")
    return np.where(hit, np.broadcast_to(values, x.shape), x)


@op("FeatureVectorizer", 1, ML)
def feature_vectorizer(*inputs, inputdimensions=None):
    dims = list(inputdimensions or [])
    if len(dims) != len(inputs):
        raise ValueError(
            f"FeatureVectorizer: inputdimensions has {len(dims)} entries for {len(inputs)} inputs"
        )
    parts = []
    for x, d in zip(inputs, dims):
        x = _as_2d(x).astype(np.float32)
        if x.shape[1] < d:  # short inputs are padded with zeros, long ones truncated
            x = np.pad(x, ((0, 0), (0, d - x.shape[1])))
        parts.append(x[:, :d])
    return np.concatenate(parts, axis=1)


# encoders ----------------------------------------------------------------------------------
def _map_values(x: np.ndarray, keys: np.ndarray, values: np.ndarray, default) -> np.ndarray:
    """Elementwise lookup key -> value (last duplicate key wins; NaN keys match NaN)."""
    out_dtype = values.dtype
    flat = x.reshape(-1)
    if flat.size == 0:
        return np.empty(x.shape, dtype=out_dtype)
    uniq, inverse = np.unique(flat, return_inverse=True)
    table = {}
    nan_value = None
    for k, v in zip(keys.tolist(), values.tolist()):
        if isinstance(k, float) and np.isnan(k):
            nan_value = v
        else:
            table[k] = v
    mapped = []
    for u in uniq.tolist():
        if isinstance(u, float) and np.isnan(u):
            mapped.append(default if nan_value is None else nan_value)
        else:
            mapped.append(table.get(u, default))
    return np.array(mapped, dtype=out_dtype)[inverse.reshape(-1)].reshape(x.shape)


@op("LabelEncoder", 1, ML)
def label_encoder_v1(x, classes_strings=None, default_int64=-1, default_string="_Unused"):
    classes = list(classes_strings or [])
    if x.dtype == STR or x.dtype.kind in "US":
        first = {}
        for i, c in enumerate(classes):
            first.setdefault(c, i)
        return _map_values(
            x.astype(object),
            np.array(list(first), dtype=object),
            np.array(list(first.values()), dtype=np.int64),
            default_int64,
        )
    return _map_values(
        x.astype(np.int64),
        np.arange(len(classes), dtype=np.int64),
        np.array(classes, dtype=object),
        default_string,
    )


_LE_DEFAULTS = {"i": -1, "u": -1, "f": -0.0, "O": "_Unused"}


@op("LabelEncoder", 2, ML)
def label_encoder(
    x,
    keys_strings=None,
    keys_int64s=None,
    keys_floats=None,
    keys_tensor=None,
    values_strings=None,
    values_int64s=None,
    values_floats=None,
    values_tensor=None,
    default_string="_Unused",
    default_int64=-1,
    default_float=-0.0,
    default_tensor=None,
):
    keys = [k for k in (keys_tensor, keys_strings, keys_int64s, keys_floats) if k is not None]
    values = [
        v for v in (values_tensor, values_strings, values_int64s, values_floats) if v is not None
    ]
    if len(keys) != 1 or len(values) != 1:
        raise ValueError("LabelEncoder: exactly one keys_* and one values_* attribute must be set")
    if keys_tensor is not None:
        keys = keys_tensor.reshape(-1)
    elif keys_strings is not None:
        keys = np.array(keys_strings, dtype=object)
    elif keys_int64s is not None:
        keys = np.array(keys_int64s, dtype=np.int64)
    else:
        keys = np.array(keys_floats, dtype=np.float32)
    if values_tensor is not None:
        values = values_tensor.reshape(-1)
        default = (
            default_tensor.reshape(-1)[0]
            if default_tensor is not None
            else _LE_DEFAULTS[values.dtype.kind]
        )
    elif values_strings is not None:
        values, default = np.array(values_strings, dtype=object), default_string
    elif values_int64s is not None:
        values, default = np.array(values_int64s, dtype=np.int64), default_int64
    else:
        values, default = np.array(values_floats, dtype=np.float32), default_float
    if len(keys) != len(values):
        raise ValueError(f"LabelEncoder: {len(keys)} keys but {len(values)} values")
    if keys.dtype == STR:
        x = x.astype(object)
    default = default.item() if isinstance(default, np.generic) else default
    return _map_values(x, keys.astype(x.dtype) if keys.dtype != STR else keys, values, default)


@op("CategoryMapper", 1, ML)
def category_mapper(
    x, cats_int64s=None, cats_strings=None, default_int64=-1, default_string="_Unused"
):
    ints = np.array(cats_int64s or [], dtype=np.int64)
    strs = np.array(cats_strings or [], dtype=object)
    if len(ints) != len(strs):
        raise ValueError("CategoryMapper: cats_int64s and cats_strings must have the same length")
    if x.dtype == STR or x.dtype.kind in "US":
        return _map_values(x.astype(object), strs, ints, default_int64)
    return _map_values(x.astype(np.int64), ints, strs, default_string)


@op("OneHotEncoder", 1, ML)
def one_hot_encoder(x, cats_int64s=None, cats_strings=None, zeros=1):
    if cats_strings:
        cats = np.array(cats_strings, dtype=object)
        x = x.astype(object)
    elif cats_int64s:
        cats = np.array(cats_int64s, dtype=np.int64)
        x = x.astype(np.int64)
    else:
        raise ValueError("OneHotEncoder: one of cats_int64s/cats_strings must be set")
    y = (x[..., None] == cats).astype(np.float32)
    if not zeros and x.size and not y.any(axis=-1).all():
        raise ValueError("OneHotEncoder: an input value is not among the categories and zeros=0")
    return y


def _map_value_dtype(x: dict, ctx):
    """Element dtype of a map's values: the declared type where the graph states it."""
    from ..dtypes import np_dtype

    name = ctx.node.input[0] if ctx is not None else None
    graph = getattr(ctx.evaluator, "graph", None) if ctx is not None else None
    if graph is not None:
        for info in list(graph.input) + list(graph.value_info):
            tp = info.type
            if info.name == name and tp.WhichOneof("value") == "map_type":
                return np_dtype(tp.map_type.value_type.tensor_type.elem_type)
    values = list(x.values())
    sample = values[0] if values else 0.0
    if isinstance(sample, (np.ndarray, np.generic)):
        return sample.dtype if sample.dtype.kind not in "US" else STR
    return (
        STR
        if isinstance(sample, str)
        else np.dtype(np.int64 if isinstance(sample, int) else np.float32)
    )


@op("DictVectorizer", 1, ML)
def dict_vectorizer(x, int64_vocabulary=None, string_vocabulary=None, *, ctx=None):
    vocab = list(string_vocabulary) if string_vocabulary else list(int64_vocabulary or [])
    if not vocab:
        raise ValueError("DictVectorizer: one of int64_vocabulary/string_vocabulary must be set")
    dtype = _map_value_dtype(x, ctx)
    y = np.full(len(vocab), "" if dtype == STR else 0, dtype=dtype)
    index = {k: i for i, k in enumerate(vocab)}
    for k, v in x.items():
        k = k.item() if isinstance(k, np.generic) else k
        if k in index:
            y[index[k]] = v.item() if isinstance(v, np.ndarray) else v
    return y.reshape(1, -1)


@op("CastMap", 1, ML)
def cast_map(x, cast_to="TO_FLOAT", map_form="DENSE", max_map=1):
    kinds = {"TO_FLOAT": np.float32, "TO_INT64": np.int64, "TO_STRING": STR}
    if cast_to not in kinds:
        raise ValueError(f"CastMap: cast_to {cast_to!r} is not one of {list(kinds)}")
    dtype = kinds[cast_to]
    items = sorted((int(k), v.item() if isinstance(v, np.ndarray) else v) for k, v in x.items())

    def conv(v):
        if dtype is STR:
            return v if isinstance(v, str) else str(v)
        return dtype(float(v)) if dtype is np.float32 else dtype(int(float(v)))

    if map_form == "DENSE":
        y = np.array([conv(v) for _, v in items], dtype=dtype)
    elif map_form == "SPARSE":
        if items and (items[0][0] < 0 or items[-1][0] >= max_map):
            raise ValueError(f"CastMap: a key falls outside [0, max_map={max_map})")
        y = np.full(max_map, "0" if dtype is STR else 0, dtype=dtype)
        for k, v in items:
            y[k] = conv(v)
    else:
        raise ValueError(f"CastMap: map_form {map_form!r} is not DENSE or SPARSE")
    return y.reshape(1, -1)


@op("ZipMap", 1, ML)
def zip_map(x, classlabels_int64s=None, classlabels_strings=None):
    labels = list(classlabels_strings) if classlabels_strings else list(classlabels_int64s or [])
    x = _as_2d(x)
    if x.shape[1] != len(labels):
        raise ValueError(f"ZipMap: input has {x.shape[1]} columns for {len(labels)} labels")
    return [dict(zip(labels, row)) for row in x.tolist()]


# linear models -----------------------------------------------------------------------------
@op("LinearRegressor", 1, ML)
def linear_regressor(x, coefficients=None, intercepts=None, targets=1, post_transform="NONE"):
    x = _as_2d(x).astype(np.float64)
    coef = _floats(coefficients).reshape(targets, -1)
    y = x @ coef.T
    if intercepts:
        y = y + np.asarray(intercepts, dtype=np.float32)
    return _final_scores(y, post_transform)


@op("LinearClassifier", 1, ML)
def linear_classifier(
    x,
    coefficients=None,
    intercepts=None,
    classlabels_ints=None,
    classlabels_strings=None,
    multi_class=0,
    post_transform="NONE",
):
    labels = _labels(classlabels_ints, classlabels_strings)
    x = _as_2d(x).astype(np.float64)
    coef = _floats(coefficients).reshape(-1, x.shape[1])
    scores = x @ coef.T
    if intercepts:
        scores = scores + np.asarray(intercepts, dtype=np.float32)
    if coef.shape[0] == 1 and len(labels) == 2:
        # binary model with one weight row: the row scores the second class
        s = scores[:, 0]
        label = np.where(s > 0, labels[1], labels[0])
        return label, _binary_columns(s, post_transform, True).astype(np.float32)
    label = labels[np.argmax(scores, axis=1)] if scores.shape[1] else labels[:0]
    return label, _final_scores(scores, post_transform)


# SVMs ------------------------------------------------------------------------------------------
def _kernel(x, sv, kernel_type, kernel_params):
    gamma, coef0, degree = (list(kernel_params or []) + [0.0, 0.0, 0.0])[:3]
    if kernel_type == "LINEAR":
        return x @ sv.T
    if kernel_type == "POLY":
        return (gamma * (x @ sv.T) + coef0) ** int(degree)
    if kernel_type == "RBF":
        d2 = (x * x).sum(1)[:, None] + (sv * sv).sum(1)[None, :] - 2 * x @ sv.T
        return np.exp(-gamma * np.maximum(d2, 0.0))
    if kernel_type == "SIGMOID":
        return np.tanh(gamma * (x @ sv.T) + coef0)
    raise ValueError(f"kernel_type {kernel_type!r} is not one of LINEAR, POLY, RBF, SIGMOID")


@op("SVMRegressor", 1, ML)
def svm_regressor(
    x,
    coefficients=None,
    kernel_params=None,
    kernel_type="LINEAR",
    n_supports=0,
    one_class=0,
    post_transform="NONE",
    rho=None,
    support_vectors=None,
):
    x = _as_2d(x).astype(np.float64)
    coef = _floats(coefficients)
    rho0 = float(np.float32(rho[0])) if rho else 0.0
    if n_supports > 0:
        sv = _floats(support_vectors).reshape(n_supports, -1)
        score = _kernel(x, sv, kernel_type, kernel_params) @ coef + rho0
    else:  # a linear model: the coefficients are the weights
        score = x @ coef.reshape(-1) + rho0
    if one_class:
        score = np.where(score > 0, 1.0, -1.0)
    return _final_scores(score[:, None], post_transform)


def _multiclass_probability(r: np.ndarray) -> np.ndarray:
    """Pairwise coupling of libsvm (Wu, Lin & Weng, method 2); r[n, i, j] = P(i | i or j)."""
    n, k, _ = r.shape
    q = np.where(np.eye(k, dtype=bool), 0.0, -r * np.swapaxes(r, 1, 2))
    q[:, np.arange(k), np.arange(k)] = (r**2 * ~np.eye(k, dtype=bool)).sum(1)
    p = np.full((n, k), 1.0 / k)
    active = np.ones(n, dtype=bool)  # each sample stops at its own convergence, as in libsvm
    for _ in range(max(100, k)):
        qp = np.einsum("nij,nj->ni", q, p)
        pqp = (p * qp).sum(1)
        active &= np.abs(qp - pqp[:, None]).max(1) >= 0.005 / k
        if not active.any():
            break
        for t in range(k):
            diff = np.where(active, (-qp[:, t] + pqp) / q[:, t, t], 0.0)
            p[:, t] += diff
            pqp = (pqp + diff * (diff * q[:, t, t] + 2 * qp[:, t])) / (1 + diff) ** 2
            qp = (qp + diff[:, None] * q[:, :, t]) / (1 + diff)[:, None]
            p /= (1 + diff)[:, None]
    return p


@op("SVMClassifier", 1, ML)
def svm_classifier(
    x,
    classlabels_ints=None,
    classlabels_strings=None,
    coefficients=None,
    kernel_params=None,
    kernel_type="LINEAR",
    post_transform="NONE",
    prob_a=None,
    prob_b=None,
    rho=None,
    support_vectors=None,
    vectors_per_class=None,
):
    labels = _labels(classlabels_ints, classlabels_strings)
    k = len(labels)
    x = _as_2d(x).astype(np.float64)
    coef = _floats(coefficients)
    rho = _floats(rho or [0.0] * k)
    if not vectors_per_class:  # linear SVM: one weight row per class
        w = coef.reshape(-1, x.shape[1])
        scores = x @ w.T + rho[0]  # one bias for every class (as onnxruntime)
        if w.shape[0] == 1 and k == 2:
            s = scores[:, 0]
            return (
                np.where(s > 0, labels[1], labels[0]),
                _binary_columns(s, post_transform, False).astype(np.float32),
            )
        return labels[np.argmax(scores, 1)], _final_scores(scores, post_transform)
    counts = np.asarray(vectors_per_class, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)])
    sv = _floats(support_vectors).reshape(starts[-1], -1)
    kern = _kernel(x, sv, kernel_type, kernel_params)
    coef = coef.reshape(k - 1, starts[-1])
    n = x.shape[0]
    decisions, votes = [], np.zeros((n, k), dtype=np.int64)
    pair = 0
    for i in range(k):
        for j in range(i + 1, k):
            si, sj = slice(starts[i], starts[i + 1]), slice(starts[j], starts[j + 1])
            d = kern[:, si] @ coef[j - 1, si] + kern[:, sj] @ coef[i, sj] + rho[pair]
            decisions.append(d)
            votes[:, i] += d > 0
            votes[:, j] += d <= 0
            pair += 1
    dec = np.stack(decisions, axis=1)
    if prob_a:
        a = _floats(prob_a)
        b = _floats(prob_b)
        pp = 1.0 / (1.0 + np.exp(dec * a + b))
        pp = np.clip(pp, 1e-7, 1 - 1e-7)
        r = np.zeros((n, k, k))
        iu = np.triu_indices(k, 1)
        r[:, iu[0], iu[1]] = pp
        r[:, iu[1], iu[0]] = 1 - pp
        prob = _multiclass_probability(r)
        # the label still comes from the pairwise votes, as in libsvm's predict
        return labels[np.argmax(votes, 1)], _final_scores(prob, post_transform)
    if k == 2:  # one decision value, positive for the first class
        d = dec[:, 0]
        label = np.where(d > 0, labels[0], labels[1])
        return label, _binary_columns(d, post_transform, False).astype(np.float32)
    # ties in votes go to the class with the lowest index
    return labels[np.argmax(votes, 1)], _final_scores(dec, post_transform)


# tree ensembles ------------------------------------------------------------------------------
_MODES = [
    "BRANCH_LEQ",
    "BRANCH_LT",
    "BRANCH_GTE",
    "BRANCH_GT",
    "BRANCH_EQ",
    "BRANCH_NEQ",
    "BRANCH_MEMBER",
    "LEAF",
]
LEAF = 7


class _Forest:
    """Flat arrays describing all trees; leaves have mode LEAF.

    feature, threshold, mode, true_next, false_next, missing_true: per node.
    roots: node index of each tree root.  members: padded set values of BRANCH_MEMBER nodes.
    """

    def __init__(
        self, feature, threshold, mode, true_next, false_next, missing_true, roots, members=None
    ):
        self.feature = np.asarray(feature, dtype=np.int64)
        self.threshold = np.asarray(threshold, dtype=np.float64)
        self.mode = np.asarray(mode, dtype=np.int64)
        self.true_next = np.asarray(true_next, dtype=np.int64)
        self.false_next = np.asarray(false_next, dtype=np.int64)
        self.missing_true = np.asarray(missing_true, dtype=bool)
        self.roots = np.asarray(roots, dtype=np.int64)
        self.members = members  # (n_nodes, width) padded with NaN, or None

    def leaves(self, x: np.ndarray) -> np.ndarray:
        """Leaf node index reached by each (sample, tree): shape [N, n_trees]."""
        n = x.shape[0]
        node = np.broadcast_to(self.roots, (n, len(self.roots))).copy()
        rows = np.arange(n)[:, None]
        for _ in range(len(self.mode) + 1):
            mode = self.mode[node]
            active = mode != LEAF
            if not active.any():
                return node
            v = x[rows, np.where(active, self.feature[node], 0)]
            t = self.threshold[node]
            cond = np.select(
                [mode == 0, mode == 1, mode == 2, mode == 3, mode == 4, mode == 5],
                [v <= t, v < t, v >= t, v > t, v == t, v != t],
                False,
            )
            if self.members is not None:
                is_member = (self.members[node] == v[..., None]).any(-1)
                cond = np.where(mode == 6, is_member, cond)
            cond |= np.isnan(v) & self.missing_true[node]
            node = np.where(
                active, np.where(cond, self.true_next[node], self.false_next[node]), node
            )
        raise ValueError("tree ensemble: a tree has a cycle")


def _aggregate(forest, x, leaf_targets, n_targets, aggregate):
    """Scores [N, n_targets] from the leaves reached; leaf_targets: (leaf, target, weight) arrays."""
    leaf_idx, target_idx, weight = leaf_targets
    n_nodes = len(forest.mode)
    w = np.zeros((n_nodes, n_targets))
    hit = np.zeros((n_nodes, n_targets), dtype=bool)
    np.add.at(w, (leaf_idx, target_idx), weight)
    hit[leaf_idx, target_idx] = True
    reached = forest.leaves(x)  # [N, T]
    vals, hits = w[reached], hit[reached]  # [N, T, targets]
    if aggregate == "SUM":
        return vals.sum(1)
    if aggregate == "AVERAGE":
        return vals.sum(1) / max(len(forest.roots), 1)
    if aggregate == "MIN":
        r = np.where(hits, vals, np.inf).min(1)
    elif aggregate == "MAX":
        r = np.where(hits, vals, -np.inf).max(1)
    else:
        raise ValueError(f"aggregate_function {aggregate!r} is not one of SUM, AVERAGE, MIN, MAX")
    return np.where(hits.any(1), r, 0.0)


def _attr(plain, as_tensor):
    if as_tensor is not None:
        return np.asarray(as_tensor, dtype=np.float64).reshape(-1)
    return _floats(plain)


def _legacy_forest(
    nodes_treeids,
    nodes_nodeids,
    nodes_featureids,
    nodes_modes,
    values,
    nodes_truenodeids,
    nodes_falsenodeids,
    nodes_missing_value_tracks_true,
):
    """Forest from the v1/v3 encoding, where children are (tree id, node id) pairs."""
    trees = np.asarray(nodes_treeids, dtype=np.int64)
    ids = np.asarray(nodes_nodeids, dtype=np.int64)
    position = {(t, i): p for p, (t, i) in enumerate(zip(trees.tolist(), ids.tolist()))}
    modes = [_MODES.index(m) if m in _MODES else -1 for m in nodes_modes]
    if -1 in modes:
        raise ValueError(f"nodes_modes: unknown mode among {sorted(set(nodes_modes))}")
    if 6 in modes:
        raise ValueError("nodes_modes: BRANCH_MEMBER is only defined for TreeEnsemble")

    def child(ids_attr):
        out = []
        for t, c, m in zip(trees.tolist(), ids_attr, modes):
            if m == LEAF:
                out.append(0)
            elif (t, c) not in position:
                raise ValueError(f"tree {t}: child node id {c} does not exist")
            else:
                out.append(position[(t, c)])
        return out

    missing = list(nodes_missing_value_tracks_true or []) or [0] * len(modes)
    order = list(dict.fromkeys(trees.tolist()))
    roots = [
        min((p for p, t in enumerate(trees.tolist()) if t == tree), key=lambda p: ids[p])
        for tree in order
    ]
    forest = _Forest(
        nodes_featureids,
        values,
        modes,
        child(nodes_truenodeids),
        child(nodes_falsenodeids),
        missing,
        roots,
    )
    return forest, position


def _legacy_targets(position, treeids, nodeids, target_ids, weights):
    leaves = []
    for t, i in zip(treeids, nodeids):
        if (t, i) not in position:
            raise ValueError(f"a weight refers to node ({t}, {i}), which does not exist")
        leaves.append(position[(t, i)])
    return (
        np.asarray(leaves, dtype=np.int64),
        np.asarray(target_ids, dtype=np.int64),
        np.asarray(weights, dtype=np.float64),
    )


@op("TreeEnsembleRegressor", 1, ML)
def tree_ensemble_regressor(
    x,
    aggregate_function="SUM",
    base_values=None,
    base_values_as_tensor=None,
    n_targets=None,
    nodes_falsenodeids=None,
    nodes_featureids=None,
    nodes_hitrates=None,
    nodes_hitrates_as_tensor=None,
    nodes_missing_value_tracks_true=None,
    nodes_modes=None,
    nodes_nodeids=None,
    nodes_treeids=None,
    nodes_truenodeids=None,
    nodes_values=None,
    nodes_values_as_tensor=None,
    post_transform="NONE",
    target_ids=None,
    target_nodeids=None,
    target_treeids=None,
    target_weights=None,
    target_weights_as_tensor=None,
):
    x = _as_2d(x).astype(np.float64)
    forest, position = _legacy_forest(
        nodes_treeids,
        nodes_nodeids,
        nodes_featureids,
        nodes_modes,
        _attr(nodes_values, nodes_values_as_tensor),
        nodes_truenodeids,
        nodes_falsenodeids,
        nodes_missing_value_tracks_true,
    )
    targets = _legacy_targets(
        position,
        target_treeids,
        target_nodeids,
        target_ids,
        _attr(target_weights, target_weights_as_tensor),
    )
    n_targets = n_targets or (int(targets[1].max()) + 1 if len(targets[1]) else 1)
    scores = _aggregate(forest, x, targets, n_targets, aggregate_function)
    base = _attr(base_values, base_values_as_tensor)
    if base.size:
        scores = scores + base
    return _final_scores(scores, post_transform)


@op("TreeEnsembleClassifier", 1, ML)
def tree_ensemble_classifier(
    x,
    base_values=None,
    base_values_as_tensor=None,
    class_ids=None,
    class_nodeids=None,
    class_treeids=None,
    class_weights=None,
    class_weights_as_tensor=None,
    classlabels_int64s=None,
    classlabels_strings=None,
    nodes_falsenodeids=None,
    nodes_featureids=None,
    nodes_hitrates=None,
    nodes_hitrates_as_tensor=None,
    nodes_missing_value_tracks_true=None,
    nodes_modes=None,
    nodes_nodeids=None,
    nodes_treeids=None,
    nodes_truenodeids=None,
    nodes_values=None,
    nodes_values_as_tensor=None,
    post_transform="NONE",
):
    labels = _labels(classlabels_int64s, classlabels_strings, "classlabels")
    x = _as_2d(x).astype(np.float64)
    forest, position = _legacy_forest(
        nodes_treeids,
        nodes_nodeids,
        nodes_featureids,
        nodes_modes,
        _attr(nodes_values, nodes_values_as_tensor),
        nodes_truenodeids,
        nodes_falsenodeids,
        nodes_missing_value_tracks_true,
    )
    weights = _attr(class_weights, class_weights_as_tensor)
    targets = _legacy_targets(position, class_treeids, class_nodeids, class_ids, weights)
    scores = _aggregate(forest, x, targets, len(labels), "SUM")
    base = _attr(base_values, base_values_as_tensor)
    used = set(np.asarray(class_ids, dtype=np.int64).tolist())
    if len(labels) == 2 and len(used) == 1:
        # binary model whose leaves score one class only; the threshold on the raw score is
        # 0.5 for probability-like (all non-negative) weights, else 0
        cls = next(iter(used))
        s = scores[:, cls] + (base[cls] if base.size > cls else 0.0)
        positive = bool((weights >= 0).all())
        label = np.where(s > (0.5 if positive else 0.0), labels[1], labels[0])
        if cls == 0:  # the score is read as the positive class's (as onnxruntime does)
            return label, _binary_columns(s, post_transform, positive).astype(np.float32)
        both = np.stack([np.zeros_like(s), s], axis=1)
        return label, _final_scores(both, post_transform)
    if base.size:
        scores = scores + base
    label = labels[np.argmax(scores, axis=1)]
    return label, _final_scores(scores, post_transform)


@op("TreeEnsemble", 5, ML)
def tree_ensemble(
    x,
    aggregate_function=1,
    leaf_targetids=None,
    leaf_weights=None,
    membership_values=None,
    n_targets=None,
    nodes_falseleafs=None,
    nodes_falsenodeids=None,
    nodes_featureids=None,
    nodes_hitrates=None,
    nodes_missing_value_tracks_true=None,
    nodes_modes=None,
    nodes_splits=None,
    nodes_trueleafs=None,
    nodes_truenodeids=None,
    post_transform=0,
    tree_roots=None,
):
    dtype = x.dtype
    x = _as_2d(x).astype(np.float64)
    n_nodes = len(nodes_featureids)
    n_leaves = len(leaf_targetids)
    modes = np.asarray(nodes_modes, dtype=np.int64).reshape(-1)
    if modes.size and (modes.min() < 0 or modes.max() > 6):
        raise ValueError("nodes_modes: values must be in [0, 6]")

    def child(ids, is_leaf):  # leaves are appended after the interior nodes: leaf i is n_nodes + i
        return np.where(np.asarray(is_leaf, bool), n_nodes, 0) + np.asarray(ids)

    members = None
    if (modes == 6).any():
        if membership_values is None:
            raise ValueError("membership_values must be set when a node uses BRANCH_MEMBER")
        mv = np.asarray(membership_values).reshape(-1).astype(dtype).astype(np.float64)
        cuts = np.flatnonzero(np.isnan(mv))
        sets = np.split(mv, cuts)
        sets = [s[~np.isnan(s)] for s in sets][: int((modes == 6).sum())]
        width = max([len(s) for s in sets] + [1])
        members = np.full((n_nodes + n_leaves, width), np.nan)
        for node, s in zip(np.flatnonzero(modes == 6), sets):
            members[node, : len(s)] = s
    missing = list(nodes_missing_value_tracks_true or []) or [0] * n_nodes
    splits = np.asarray(nodes_splits).reshape(-1).astype(np.float64)
    forest = _Forest(
        np.concatenate([nodes_featureids, np.zeros(n_leaves)]),
        np.concatenate([splits, np.zeros(n_leaves)]),
        np.concatenate([modes, np.full(n_leaves, LEAF)]),
        np.concatenate([child(nodes_truenodeids, nodes_trueleafs), np.zeros(n_leaves)]),
        np.concatenate([child(nodes_falsenodeids, nodes_falseleafs), np.zeros(n_leaves)]),
        np.concatenate([missing, np.zeros(n_leaves)]),
        tree_roots,
        members,
    )
    weights = np.asarray(leaf_weights).reshape(-1).astype(np.float64)
    targets = (np.arange(n_leaves) + n_nodes, np.asarray(leaf_targetids, dtype=np.int64), weights)
    n_targets = n_targets or (int(max(leaf_targetids)) + 1 if n_leaves else 1)
    aggregates = ["AVERAGE", "SUM", "MIN", "MAX"]
    scores = _aggregate(forest, x, targets, n_targets, aggregates[aggregate_function])
    return post_transform_scores(scores, _TRANSFORMS[post_transform]).astype(dtype)
