"""Strings and text features: StringConcat, StringNormalizer, StringSplit, RegexFullMatch,
TfIdfVectorizer.

Strings are object arrays of str.  Per-string work goes through Python's str methods
(np.vectorize / list comprehensions): there is no vectorised NumPy string kernel for these.
"""
from __future__ import annotations

import re

import numpy as np

from ..registry import op


def _text(value) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _strings(x) -> np.ndarray:
    """An object array of str with x's shape."""
    x = np.asarray(x)
    out = np.empty(x.shape, dtype=object)
    out.reshape(-1)[:] = [_text(v) for v in x.reshape(-1)]
    return out


@op("StringConcat", 20)
def string_concat(X, Y):
    return np.asarray(np.add(_strings(X), _strings(Y)), dtype=object)


def _lower(s: str, turkic: bool) -> str:
    return s.replace("I", "ı").replace("İ", "i").lower() if turkic else s.lower()


def _upper(s: str, turkic: bool) -> str:
    return s.replace("i", "İ").upper() if turkic else s.upper()


@op("StringNormalizer", 10)
def string_normalizer(X, *, case_change_action="NONE", is_case_sensitive=0, locale="",
                      stopwords=None):
    # Case mapping is Unicode's default (what en_US gives); the one locale-specific mapping
    # in common use, the Turkic dotted/dotless i, is honoured for tr/az locales.
    if case_change_action not in ("NONE", "LOWER", "UPPER"):
        raise ValueError(f"case_change_action must be NONE, LOWER or UPPER, "
                         f"got {case_change_action!r}")
    x = _strings(X)
    if not (x.ndim == 1 or (x.ndim == 2 and x.shape[0] == 1)):
        raise ValueError(f"StringNormalizer takes a [C] or [1, C] tensor, "
                         f"got shape {list(x.shape)}")
    turkic = (locale or "").lower()[:2] in ("tr", "az")
    words = list(x.reshape(-1))
    if stopwords:
        if is_case_sensitive:
            stop = set(stopwords)
            words = [w for w in words if w not in stop]
        else:
            stop = {_lower(s, turkic) for s in stopwords}
            words = [w for w in words if _lower(w, turkic) not in stop]
    if case_change_action == "LOWER":
        words = [_lower(w, turkic) for w in words]
    elif case_change_action == "UPPER":
        words = [_upper(w, turkic) for w in words]
    if not words:
        words = [""]
    out = np.empty(len(words), dtype=object)
    out[:] = words
    return out if x.ndim == 1 else out.reshape(1, -1)


@op("StringSplit", 20)
def string_split(X, *, delimiter=None, maxsplit=None):
    x = _strings(X)
    sep = delimiter or None  # unset or "" splits on runs of whitespace
    limit = -1 if maxsplit is None else int(maxsplit)
    parts = [_text(s).split(sep, limit) for s in x.reshape(-1)]
    if sep is None and limit >= 0:
        parts = [p[:-1] + [p[-1].strip()] if p else p for p in parts]
    counts = np.array([len(p) for p in parts], dtype=np.int64).reshape(x.shape)
    width = int(counts.max()) if counts.size else 0
    y = np.full((len(parts), width), "", dtype=object)
    for i, p in enumerate(parts):
        y[i, : len(p)] = p
    return y.reshape(x.shape + (width,)), counts


@op("RegexFullMatch", 20)
def regex_full_match(X, *, pattern=""):
    try:
        regex = re.compile(pattern)
    except re.error as e:
        raise ValueError(f"RegexFullMatch 'pattern' {pattern!r} is not a valid regex: {e}") from e
    x = _strings(X)
    flat = [regex.fullmatch(s) is not None for s in x.reshape(-1)]
    return np.array(flat, dtype=bool).reshape(x.shape)


def _row_ids(rows: np.ndarray, pool: np.ndarray) -> np.ndarray:
    """For each row of `rows` (Q, n), the index of the equal row of `pool` (P, n), or -1."""
    both = np.concatenate([pool, rows])
    _, inverse = np.unique(both, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    lookup = np.full(inverse.max() + 1 if inverse.size else 0, -1, dtype=np.int64)
    lookup[inverse[: len(pool)]] = np.arange(len(pool))
    return lookup[inverse[len(pool) :]]


@op("TfIdfVectorizer", 9)
def tfidf_vectorizer(X, *, mode, min_gram_length, max_gram_length, max_skip_count,
                     ngram_counts, ngram_indexes, pool_int64s=None, pool_strings=None,
                     weights=None):
    if (pool_int64s is None) == (pool_strings is None):
        raise ValueError("TfIdfVectorizer needs exactly one of pool_int64s and pool_strings")
    if mode not in ("TF", "IDF", "TFIDF"):
        raise ValueError(f"TfIdfVectorizer 'mode' must be TF, IDF or TFIDF, got {mode!r}")
    if not 1 <= min_gram_length <= max_gram_length:
        raise ValueError(f"need 1 <= min_gram_length <= max_gram_length, "
                         f"got {min_gram_length} and {max_gram_length}")
    x = np.asarray(X)
    if x.ndim not in (1, 2):
        raise ValueError(f"TfIdfVectorizer takes a [C] or [N, C] tensor, got shape {list(x.shape)}")
    rows = x.reshape(1, -1) if x.ndim == 1 else x
    if pool_strings is not None:
        # Code strings as integers: pool strings by position, unknown input strings as -1.
        vocab = {s: i for i, s in enumerate(pool_strings)}
        pool = np.array([vocab[s] for s in pool_strings], dtype=np.int64)
        rows = np.array([vocab.get(_text(s), -1) for s in rows.reshape(-1)],
                        dtype=np.int64).reshape(rows.shape)
    else:
        pool = np.asarray(pool_int64s, dtype=np.int64)
        rows = rows.astype(np.int64)
    ngram_indexes = np.asarray(ngram_indexes, dtype=np.int64)
    size = int(ngram_indexes.max()) + 1 if ngram_indexes.size else 0
    counts = np.zeros((rows.shape[0], size), dtype=np.float64)
    starts = list(ngram_counts) + [len(pool)]
    first_id = 0  # id of the first n-gram of the current length in pool order
    n_rows, width = rows.shape
    for n in range(1, len(ngram_counts) + 1):
        grams = pool[starts[n - 1] : starts[n]].reshape(-1, n)
        if min_gram_length <= n <= max_gram_length and len(grams):
            for skip in range(max_skip_count + 1 if n > 1 else 1):
                span = (n - 1) * (skip + 1) + 1
                if span > width:
                    break
                idx = np.arange(width - span + 1)[:, None] + np.arange(n) * (skip + 1)
                cand = rows[:, idx]  # (N, starts, n)
                ids = _row_ids(cand.reshape(-1, n), grams).reshape(n_rows, -1)
                r, c = np.nonzero(ids >= 0)
                np.add.at(counts, (r, ngram_indexes[first_id + ids[r, c]]), 1)
        first_id += len(grams)
    w = np.ones(len(ngram_indexes)) if weights is None else np.asarray(weights, dtype=np.float64)
    per_coord = np.ones(size)
    per_coord[ngram_indexes] = w
    if mode == "IDF":
        counts = np.minimum(counts, 1) * per_coord
    elif mode == "TFIDF":
        counts = counts * per_coord
    out = counts.astype(np.float32)
    return out.reshape(-1) if x.ndim == 1 else out
