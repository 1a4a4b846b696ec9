"""String ops and TfIdfVectorizer: shapes, broadcasting, locales, splitting rules, weighting."""

import numpy as np
import pytest

from tests.reference.oneop import op_function


def s(*values, shape=None):
    a = np.array(list(values), dtype=object)
    return a.reshape(shape) if shape is not None else a


# StringConcat ----------------------------------------------------------------------------
def test_concat_broadcasts_and_keeps_object_dtype():
    z = op_function("StringConcat")(s("a", "b", shape=(2, 1)), s("x", "y", "z"))
    assert z.shape == (2, 3) and z.dtype == object
    assert z.tolist() == [["ax", "ay", "az"], ["bx", "by", "bz"]]


def test_concat_of_scalars_is_a_0d_array():
    z = op_function("StringConcat")(np.array("ü", dtype=object), np.array("", dtype=object))
    assert isinstance(z, np.ndarray) and z.shape == () and z[()] == "ü"


def test_concat_of_empty_tensors():
    z = op_function("StringConcat")(s(shape=(0,)), s("q"))
    assert z.shape == (0,)


# StringNormalizer ------------------------------------------------------------------------
def test_normalizer_drops_stopwords_case_insensitively_and_lowercases():
    y = op_function("StringNormalizer")(
        s("Monday", "is", "MONDAY", "fun"), stopwords=["monday"], case_change_action="LOWER"
    )
    assert y.tolist() == ["is", "fun"]


def test_normalizer_case_sensitive_keeps_other_cases():
    y = op_function("StringNormalizer")(
        s("Monday", "monday", shape=(1, 2)), stopwords=["monday"], is_case_sensitive=1
    )
    assert y.shape == (1, 1) and y.tolist() == [["Monday"]]


def test_normalizer_all_dropped_gives_one_empty_string():
    assert op_function("StringNormalizer")(s("a", "A"), stopwords=["a"]).tolist() == [""]
    y = op_function("StringNormalizer")(s("a", shape=(1, 1)), stopwords=["a"])
    assert y.shape == (1, 1) and y[0, 0] == ""


@pytest.mark.parametrize(
    "locale, upper, lower",
    [
        ("en_US.UTF-8", "ISTANBUL", "istanbul"),
        ("", "ISTANBUL", "istanbul"),
        ("tr_TR", "İSTANBUL", "ıstanbul"),  # Turkish dotted capital İ, dotless small ı
        ("xx_NOT_A_LOCALE", "ISTANBUL", "istanbul"),
    ],
)
def test_normalizer_case_change_with_locales(locale, upper, lower):
    up = op_function("StringNormalizer")(s("istanbul"), case_change_action="UPPER", locale=locale)
    low = op_function("StringNormalizer")(s("ISTANBUL"), case_change_action="LOWER", locale=locale)
    assert up.tolist() == [upper] and low.tolist() == [lower]


def test_normalizer_rejects_other_ranks_and_actions():
    with pytest.raises(ValueError, match=r"\[C\] or \[1, C\]"):
        op_function("StringNormalizer")(s("a", "b", shape=(2, 1)))
    with pytest.raises(ValueError, match="case_change_action"):
        op_function("StringNormalizer")(s("a"), case_change_action="TITLE")


# StringSplit -----------------------------------------------------------------------------
def test_split_on_delimiter_keeps_empty_pieces_and_pads():
    y, n = op_function("StringSplit")(s("a,,b", "", "c", "d,", shape=(2, 2)), delimiter=",")
    assert y.shape == (2, 2, 3) and n.dtype == np.int64
    assert n.tolist() == [[3, 1], [1, 2]]
    assert y[0, 0].tolist() == ["a", "", "b"]
    assert y[0, 1].tolist() == ["", "", ""]
    assert y[1, 1].tolist() == ["d", "", ""]


def test_split_on_whitespace_groups_runs_and_strips():
    y, n = op_function("StringSplit")(s("  a \t b  ", "   "))
    assert n.tolist() == [2, 0]
    assert y.tolist() == [["a", "b"], ["", ""]]


def test_split_maxsplit_keeps_the_rest():
    y, n = op_function("StringSplit")(s("a-b-c-d", "x"), delimiter="-", maxsplit=2)
    assert y.tolist() == [["a", "b", "c-d"], ["x", "", ""]] and n.tolist() == [3, 1]
    y, n = op_function("StringSplit")(s(" a  b  c "), maxsplit=1)
    assert y.tolist() == [["a", "b  c"]]


def test_split_of_an_empty_tensor():
    y, n = op_function("StringSplit")(s(shape=(0, 2)), delimiter=" ")
    assert y.shape == (0, 2, 0) and n.shape == (0, 2)


# RegexFullMatch --------------------------------------------------------------------------
def test_regex_must_match_the_whole_string():
    y = op_function("RegexFullMatch")(s("abc", "abcd", "xabc", "", shape=(2, 2)), pattern="a.c|")
    assert y.dtype == np.bool_ and y.tolist() == [[True, False], [False, True]]
    with pytest.raises(ValueError, match="not a valid regex"):
        op_function("RegexFullMatch")(s("a"), pattern="(")


# TfIdfVectorizer -------------------------------------------------------------------------
def tfidf(x, **kw):
    args = {"min_gram_length": 1, "max_gram_length": 2, "max_skip_count": 0}
    args.update(kw)
    return op_function("TfIdfVectorizer")(x, **args)


# pool: 1-grams [7], [8]; 2-grams [7, 8], [8, 8] -> output coordinates 3, 0, 1, 2
POOL = {"pool_int64s": [7, 8, 7, 8, 8, 8], "ngram_counts": [0, 2], "ngram_indexes": [3, 0, 1, 2]}


def test_tf_counts_unigrams_and_bigrams():
    y = tfidf(np.array([7, 8, 8, 7, 8], np.int32), mode="TF", **POOL)
    # 7 twice, 8 three times, (7,8) twice, (8,8) once
    assert y.dtype == np.float32 and y.tolist() == [3, 2, 1, 2]


def test_skips_count_every_gap_up_to_max_skip():
    # bigrams with skip 0: (7,8) (8,9) (9,8); skip 1: (7,9) (8,8) -> (7,8)=1, (8,8)=1
    y = tfidf(
        np.array([[7, 8, 9, 8]], np.int64), mode="TF", min_gram_length=2, max_skip_count=1, **POOL
    )
    assert y.shape == (1, 4) and y.tolist() == [[0, 1, 1, 0]]


def test_idf_and_tfidf_weights_apply_per_pool_entry():
    x = np.array([[7, 8, 8, 7, 8], [9, 9, 9, 9, 9]], np.int64)
    w = [0.5, 2.0, 3.0, 4.0]  # for [7], [8], [7,8], [8,8]
    idf = tfidf(x, mode="IDF", weights=w, **POOL)
    assert idf.tolist() == [[2.0, 3.0, 4.0, 0.5], [0, 0, 0, 0]]
    tf_idf = tfidf(x, mode="TFIDF", weights=w, **POOL)
    assert tf_idf.tolist() == [[6.0, 6.0, 4.0, 1.0], [0, 0, 0, 0]]


def test_string_pool_ignores_unknown_words():
    x = s("the", "cat", "sat", "the", "cat")
    y = tfidf(
        x,
        mode="TF",
        pool_strings=["cat", "the", "the", "cat"],
        ngram_counts=[0, 2],
        ngram_indexes=[0, 1, 2],
    )
    assert y.tolist() == [2, 2, 2]


def test_short_rows_produce_no_long_grams():
    y = tfidf(np.array([7], np.int64), mode="TF", max_skip_count=3, **POOL)
    assert y.tolist() == [0, 0, 0, 1]
