"""The bound policy of reference.agreement: hand-worked bounds per op family, the edges of the
number line (float16 range limits, subnormals, NaN, Inf), and the law that any summation order
passes while a missing term fails."""
import functools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import helper

from reference.agreement import (
    check_node,
    judge,
    narrow_like,
    smallest_subnormal,
    unit_roundoff,
)
from reference.registry import lookup

U32 = 2.0**-24
U16 = 2.0**-11


def node(op, n_in=2, n_out=1, domain="", **attrs):
    return helper.make_node(op, [f"x{i}" for i in range(n_in)], [f"y{i}" for i in range(n_out)],
                            name=f"{op.lower()}_node", domain=domain, **attrs)


def reference(op, opset=17, domain="", **attrs):
    fn = lookup(domain, op, opset).fn

    def run(*inputs):
        out = fn(*inputs, **attrs)
        return list(out) if isinstance(out, tuple) else [out]

    return run


def judged(op, inputs, actual, opset=17, domain="", n_out=1, **attrs):
    n = node(op, len(inputs), n_out, domain, **attrs)
    return check_node(n, opset, inputs, actual, reference(op, opset, domain, **attrs))


def test_unit_roundoffs():
    assert unit_roundoff(np.float32) == U32 and unit_roundoff(np.float16) == U16
    assert unit_roundoff(np.float64) == 2.0**-53
    import ml_dtypes

    assert unit_roundoff(ml_dtypes.bfloat16) == 2.0**-8
    assert unit_roundoff(ml_dtypes.float8_e4m3fn) == 2.0**-4
    assert smallest_subnormal(np.float32) == 2.0**-149


# dot products -----------------------------------------------------------------------------------
def test_a_long_dot_product_with_cancellation_by_hand():
    # sum of 1000 terms +-1: exact 0, sum |a_k b_k| = 1000, so the bound is
    # gamma(1000) * 1000 = 1000 u / (1 - 1000 u) * 1000 ~ 0.0596: a float32 kernel may be that far
    # off after the cancellation, whatever its order; plus the floor of two subnormals.
    k = 1000
    a = np.ones((1, k), np.float32)
    b = np.tile(np.array([1.0, -1.0], np.float32), k // 2).reshape(k, 1)
    allowed = k * U32 / (1 - k * U32) * k + 2 * 2.0**-149
    ok = judged("MatMul", [a, b], [np.array([[0.05]], np.float32)])
    assert ok.ok
    assert ok.outputs[0].allowed == pytest.approx(allowed, rel=1e-12)
    assert ok.outputs[0].used == pytest.approx(float(np.float32(0.05)) / allowed, rel=1e-9)
    assert ok.outputs[0].describe().startswith("y0: 84% of the allowed error; worst at [0, 0]")
    bad = judged("MatMul", [a, b], [np.array([[0.07]], np.float32)])
    assert not bad.ok and bad.used == pytest.approx(0.07 / allowed, rel=1e-6)


def test_gemm_bound_counts_alpha_beta_and_the_bias():
    a = np.array([[1.0, 2.0]], np.float32)
    b = np.array([[3.0], [-4.0]], np.float32)
    c = np.array([[10.0]], np.float32)
    # alpha=2, beta=0.5: 2 * (3 - 8) + 5 = -5; magnitudes 2 * (3 + 8) + 5 = 27; K + 2 = 4 roundings
    exact = -5.0
    allowed = 4 * U32 / (1 - 4 * U32) * 27 + U32 * 5 + 2 * 2.0**-149
    off = np.float32(exact) + np.float32(6e-6)  # 6e-6 < allowed ~ 6.4e-6 + 3e-7
    j = judged("Gemm", [a, b, c], [np.array([[off]], np.float32)], alpha=2.0, beta=0.5)
    assert j.ok and j.outputs[0].allowed == pytest.approx(allowed, rel=1e-9)
    far = judged("Gemm", [a, b, c], [np.array([[exact + 1e-5]], np.float32)], alpha=2.0, beta=0.5)
    assert not far.ok


def test_conv_bound_is_conv_of_magnitudes():
    # one output: 2x2 window of x times w, K = 1 * 2 * 2 = 4, plus bias: gamma(6)
    x = np.array([[[[1.0, -2.0], [3.0, -4.0]]]], np.float32)
    w = np.array([[[[1.0, 1.0], [1.0, 1.0]]]], np.float32)
    bias = np.array([0.5], np.float32)
    exact = -2.0 + 0.5
    magnitude = 10.0 + 0.5
    allowed = 6 * U32 / (1 - 6 * U32) * magnitude + U32 * 1.5 + 2 * 2.0**-149
    j = judged("Conv", [x, w, bias], [np.array([[[[exact + 3e-6]]]], np.float32)])
    assert j.outputs[0].allowed == pytest.approx(allowed, rel=1e-6)
    assert j.ok
    assert not judged("Conv", [x, w, bias], [np.array([[[[exact + 1e-5]]]], np.float32)]).ok


# elementwise and the number line's edges --------------------------------------------------------
def test_add_allows_half_an_ulp_and_no_more():
    a, b = np.array([1.0], np.float32), np.array([2.0**-25], np.float32)
    # exact 1 + 2^-25 lies a quarter ulp above 1: 1.0 is the correctly rounded result
    assert judged("Add", [a, b], [np.array([1.0], np.float32)]).ok
    assert not judged("Add", [a, b], [np.nextafter(np.float32(1), np.float32(0), dtype=np.float32)
                                      .reshape(1)]).ok


def test_float16_near_its_range_limits():
    a, b = np.array([60000.0], np.float16), np.array([5000.0], np.float16)
    # exact 65000; float16 spacing there is 32: 64992 is correctly rounded (error 8)
    j = judged("Add", [a, b], [np.array([64992.0], np.float16)])
    assert j.ok and j.outputs[0].policy == "equal"
    assert not judged("Add", [a, b], [np.array([64960.0], np.float16)]).ok  # 40 off: > u |y|
    # 65504 + 32 = 65536 rounds to inf in float16: a kernel that saturates at 65504 is wrong
    big = [np.array([65504.0], np.float16), np.array([32.0], np.float16)]
    assert judged("Add", big, [np.array([np.inf], np.float16)]).ok
    sat = judged("Add", big, [np.array([65504.0], np.float16)])
    assert not sat.ok and "where the reference op gives inf" in sat.message()


def test_a_float16_kernel_is_compared_in_float16():
    reference32 = np.array([1.0001], np.float32)
    assert narrow_like(reference32, np.zeros(1, np.float16)).dtype == np.float16
    assert narrow_like(reference32, np.zeros(1, np.float32)) is reference32
    # a float16 MatMul accumulates in float32 and rounds once: u16 |y| plus gamma(K) of float32
    a = np.full((1, 64), 0.1, np.float16)
    b = np.full((64, 1), 0.3, np.float16)
    exact = (a.astype(np.float64) @ b.astype(np.float64)).item()
    rounded = np.array([[exact]], np.float16)
    assert judged("MatMul", [a, b], [rounded]).ok
    two_ulps = np.nextafter(np.nextafter(rounded, np.float16(9)), np.float16(9))
    assert not judged("MatMul", [a, b], [two_ulps]).ok


def test_subnormal_results_must_not_be_flushed():
    a, b = np.array([1e-20], np.float32), np.array([1e-20], np.float32)
    exact = 1e-20 * 1e-20  # not exactly: the float32 inputs' product, computed in float64
    exact = float(np.float64(a[0]) * np.float64(b[0]))
    assert exact < np.finfo(np.float32).tiny  # a subnormal float32 result
    rounded = np.array([exact], np.float32)
    assert judged("Mul", [a, b], [rounded]).ok  # within half a subnormal step
    flushed = judged("Mul", [a, b], [np.zeros(1, np.float32)])
    assert not flushed.ok and flushed.outputs[0].error == pytest.approx(exact)


def test_nan_and_inf_must_match_the_reference_op():
    x = np.array([[1.0, np.inf, 2.0], [1.0, 2.0, 3.0]], np.float32)
    expected = reference("Softmax", 13, axis=-1)(x)[0]
    assert np.isnan(expected[0]).any()
    assert judged("Softmax", [x], [expected.copy()], opset=13, axis=-1).ok  # NaN == NaN
    zeros = expected.copy()
    zeros[0] = 0.0
    j = judged("Softmax", [x], [zeros], opset=13, axis=-1)
    assert not j.ok and "nan" in j.message()
    inf_minus_inf = [np.array([np.inf], np.float32), np.array([np.inf], np.float32)]
    assert judged("Sub", inf_minus_inf, [np.array([np.nan], np.float32)]).ok
    assert not judged("Sub", inf_minus_inf, [np.array([0.0], np.float32)]).ok


def test_tanh_allows_a_few_u_absolute_where_its_formula_cancels():
    x = np.array([0.25], np.float32)
    t = math.tanh(0.25)
    # max(|y|, min(1, 64 |x|)) = 1: four u absolute, plus the output rounding
    allowed = 4 * U32 * 1.0 + U32 * t + 2 * 2.0**-149
    j = judged("Tanh", [x], [np.array([t + 1e-7], np.float32)])
    assert j.ok and j.outputs[0].allowed == pytest.approx(allowed, rel=1e-9)
    assert not judged("Tanh", [x], [np.array([t + 4e-7], np.float32)]).ok


def test_exact_ops_allow_no_difference_at_all():
    data = np.arange(12, dtype=np.float32).reshape(4, 3)
    idx = np.array([2, 0], np.int64)
    right = reference("Gather", 13)(data, idx)[0]
    assert judged("Gather", [data, idx], [right.copy()], opset=13).ok
    one_ulp = right.copy()
    one_ulp[1, 2] = np.nextafter(one_ulp[1, 2], np.float32(100))
    j = judged("Gather", [data, idx], [one_ulp], opset=13)
    assert not j.ok and j.outputs[0].policy == "exact" and j.outputs[0].index == (1, 2)


# row-wise ops and reductions --------------------------------------------------------------------
def test_softmax_bound_by_hand():
    x = np.array([[0.0, 1.0]], np.float32)
    e = np.exp([-1.0, 0.0])
    p = e / e.sum()
    # p_i (u (|x_i - m| + sum_j p_j |x_j - m|) + (2*4 + 2) u + gamma(2)) + u p_i
    weighted = p[0] * 1.0
    rel = [U32 * (d + weighted) + 10 * U32 + 2 * U32 / (1 - 2 * U32) for d in (1.0, 0.0)]
    allowed = p * rel + U32 * p + 2 * 2.0**-149
    got = (p + allowed * 0.9).astype(np.float32)[None]
    j = judged("Softmax", [x], [got], opset=13, axis=-1)
    assert j.ok
    assert judged("Softmax", [x], [(p * (1 + 1e-5)).astype(np.float32)[None]], opset=13,
                  axis=-1).ok is False


def test_layer_norm_compares_only_the_declared_output():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5, 16)).astype(np.float32)
    scale, bias = np.ones(16, np.float32), np.zeros(16, np.float32)
    ref = reference("LayerNormalization", 17, axis=-1, epsilon=1e-5)
    assert len(ref(x, scale, bias)) == 3  # the reference gives Mean and InvStdDev too
    n = node("LayerNormalization", 3, 1, axis=-1, epsilon=1e-5)
    y = ref(x, scale, bias)[0]
    assert check_node(n, 17, [x, scale, bias], [y], ref).ok
    off = y.copy()
    off[2, 4, 7] *= np.float32(1 + 1e-4)
    j = check_node(n, 17, [x, scale, bias], [off], ref)
    assert not j.ok and j.worst.index == (2, 4, 7)
    # an omitted optional output in the middle is skipped by name, not by count
    skip = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y", "", "inv"], axis=-1)
    outs = ref(x, scale, bias)
    assert [o.name for o in check_node(skip, 17, [x, scale, bias], outs, ref).outputs] == ["y", "inv"]


def test_reductions_by_hand():
    x = np.array([[1e8, 1.0, -1e8, 1.0]], np.float32)
    # ReduceSum: gamma(3) * sum |x| = 3u/(1-3u) * (2e8 + 2): the exact 2 may come out as 0
    j = judged("ReduceSum", [x, np.array([1], np.int64)], [np.array([[0.0]], np.float32)],
               opset=13, keepdims=1)
    assert j.ok and j.outputs[0].allowed == pytest.approx(
        3 * U32 / (1 - 3 * U32) * (2e8 + 2) + U32 * 2 + 2 * 2.0**-149, rel=1e-9)
    mean = judged("ReduceMean", [x], [np.array([[0.5 + 20.0]], np.float32)], opset=17, axes=[1])
    assert not mean.ok  # 20 > gamma(4) * mean |x| = 4u * 5e7 ~ 12
    prod = judged("ReduceMax", [x], [np.array([[1e8]], np.float32)], opset=17, axes=[1])
    assert prod.ok


def test_average_pool_bound_by_hand():
    x = np.array([[[[1.0, -3.0], [2.0, 4.0]]]], np.float32)
    # one 2x2 window: gamma(4) * mean |x| = 4u/(1-4u) * 2.5; the mean is 1
    allowed = 4 * U32 / (1 - 4 * U32) * 2.5 + U32 + 2 * 2.0**-149
    j = judged("AveragePool", [x], [np.array([[[[1.0 + 5e-7]]]], np.float32)],
               kernel_shape=[2, 2])
    assert j.ok and j.outputs[0].allowed == pytest.approx(allowed, rel=1e-9)
    assert not judged("AveragePool", [x], [np.array([[[[1.0 + 1e-6]]]], np.float32)],
                      kernel_shape=[2, 2]).ok


def test_an_op_without_a_bound_is_judged_by_the_corpus_policy():
    x = np.array([1.0, 2.0], np.float32)
    j = judged("Softplus", [x], [np.log1p(np.exp(x)).astype(np.float32) * np.float32(1 + 1e-5)])
    assert j.ok and "no error bound is written for Softplus" in j.outputs[0].detail
    assert not judged("Softplus", [x], [np.log1p(np.exp(x)).astype(np.float32) * 1.01]).ok


def test_judge_takes_a_given_truth():
    x = np.array([[0.5, 0.25]], np.float32)
    truth = [np.array([[0.5 + 0.25]], np.float64)]
    n = node("ReduceSum", 1, keepdims=1)
    assert judge(n, 11, [x], [np.array([[0.75]], np.float32)], truth).ok
    assert not judge(n, 11, [x], [np.array([[0.76]], np.float32)], truth).ok


def test_multi_head_attention_bound():
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 5, 8)).astype(np.float32) for _ in range(3))
    ref = reference("MultiHeadAttention", 1, "com.microsoft", num_heads=2)
    y = ref(q, k, v)[0]
    n = node("MultiHeadAttention", 3, 1, "com.microsoft", num_heads=2)
    assert check_node(n, 1, [q, k, v], [y], ref).ok
    off = y.copy()
    off[1, 2, 3] *= np.float32(1 + 1e-4)
    assert not check_node(n, 1, [q, k, v], [off], ref).ok


# the law ----------------------------------------------------------------------------------------
terms = hnp.arrays(np.float32, st.integers(2, 200),
                   elements=st.floats(-1e4, 1e4, allow_nan=False, width=32))


def float32_sum(values) -> np.float32:
    return functools.reduce(lambda s, v: np.float32(s + v), values, np.float32(0))


SUM = node("ReduceSum", 1, keepdims=0)


def sum_judgement(x, total):
    return check_node(SUM, 11, [x], [np.array(total, np.float32)], reference("ReduceSum", 11,
                                                                             keepdims=0))


@settings(max_examples=80, deadline=None)
@given(terms, st.randoms(use_true_random=False), st.sampled_from(["recursive", "pairwise",
                                                                  "blocked"]))
def test_a_float32_sum_in_any_order_passes(x, rnd, order):
    values = list(x)
    rnd.shuffle(values)
    if order == "recursive":
        total = float32_sum(values)
    elif order == "pairwise":
        while len(values) > 1:
            values = [np.float32(values[i] + values[i + 1]) if i + 1 < len(values) else values[i]
                      for i in range(0, len(values), 2)]
        total = values[0]
    else:  # four accumulators, as a SIMD kernel keeps, then combined
        total = float32_sum([float32_sum(values[i::4]) for i in range(4)])
    assert sum_judgement(x, total).ok


@settings(max_examples=80, deadline=None)
@given(terms, st.integers(0, 10_000))
def test_a_sum_missing_one_term_fails_once_the_term_exceeds_the_bound(x, pick):
    j = pick % x.size
    exact = float(np.sum(x.astype(np.float64)))
    allowed = sum_judgement(x, np.float32(exact)).outputs[0]
    without = np.float32(exact - float(x[j]))
    bound = (x.size - 1) * U32 / (1 - (x.size - 1) * U32) * float(np.sum(np.abs(x.astype(np.float64))))
    rounding = U32 * abs(exact) + U32 * abs(exact - float(x[j]))
    verdict = sum_judgement(x, without)
    if abs(float(x[j])) > bound + U32 * abs(exact) + rounding + 3 * 2.0**-149:
        assert not verdict.ok
    if abs(float(x[j])) < bound - rounding:
        assert verdict.ok
    assert allowed.ok


# layering ---------------------------------------------------------------------------------------
def test_reference_and_optimized_import_nothing_from_conformance():
    import ast
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2]
    offenders = []
    for package in ("reference", "optimized"):
        for path in (root / package).rglob("*.py"):
            for stmt in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in stmt.names] if isinstance(stmt, ast.Import)
                         else [stmt.module or ""] if isinstance(stmt, ast.ImportFrom)
                         and not stmt.level else [])
                offenders += [f"{path.relative_to(root)}: {n}" for n in names
                              if n.split(".")[0] == "conformance"]
    assert offenders == []


def test_softmax_over_masked_positions_has_a_finite_bound():
    # a causal mask: -inf where a query may not look; those positions are exactly 0
    x = np.array([[0.7, -np.inf, -np.inf], [0.6, 0.7, -np.inf]], np.float32)
    y = reference("Softmax", 13, axis=-1)(x)[0]
    off = y.copy()
    off[1, 0] = np.nextafter(off[1, 0], np.float32(1))  # one ulp: within the bound
    j = judged("Softmax", [x], [off], opset=13, axis=-1)
    assert j.ok and np.isfinite(j.outputs[0].allowed) and j.outputs[0].index == (1, 0)
    off[1, 0] *= np.float32(1 + 1e-4)
    assert not judged("Softmax", [x], [off], opset=13, axis=-1).ok


def gam(n):
    return n * U32 / (1 - n * U32)


PHI_M3 = 0.5 * math.erfc(3 / math.sqrt(2))  # Phi(-3)
# op, inputs, attrs, opset, domain, exact value, allowed error before the output's rounding
HAND_WORKED = [
    ("Div", [1.0, 3.0], {}, 13, "", 1 / 3, U32 / 3),
    ("Sigmoid", [0.0], {}, 13, "", 0.5, 4 * U32 * 0.5),
    ("Gelu", [-3.0], {}, 20, "", -3 * PHI_M3, 6 * U32 * (3 * PHI_M3 + 1.5)),
    ("LeakyRelu", [-2.0], {"alpha": 0.1}, 13, "", -2.0 * np.float32(0.1), 0.0),
    ("Sum", [1.0, 2.0, -3.0], {}, 13, "", 0.0, gam(2) * 6),
    ("Mean", [1.0, 2.0, -3.0], {}, 13, "", 0.0, gam(3) * 2),
    ("FusedMatMul", [[[1.0, 2.0]], [[3.0], [-4.0]]], {"alpha": 2.0}, 1, "com.microsoft", -10.0,
     gam(3) * 22),
    ("GlobalAveragePool", [[[[[1.0, -3.0], [2.0, 4.0]]]]], {}, 13, "", 1.0, gam(4) * 2.5),
    ("ReduceSumSquare", [[[1.0, 2.0]]], {"axes": [1]}, 13, "", 5.0, gam(2) * 5),
    ("ReduceL2", [[[3.0, 4.0]]], {"axes": [1]}, 13, "", 5.0, (0.5 * gam(2) + U32) * 5),
    ("ReduceProd", [[[2.0, 3.0, 4.0]]], {"axes": [1]}, 13, "", 24.0, gam(2) * 24),
    ("ReduceLogSum", [[[1.0, 3.0]]], {"axes": [1]}, 13, "", math.log(4), gam(1) + 4 * U32 * math.log(4)),
    ("ReduceLogSumExp", [[[0.0, 0.0]]], {"axes": [1]}, 13, "", math.log(2),
     6 * U32 + gam(2) + 4 * U32 * math.log(2) + U32 * math.log(2)),
]


@pytest.mark.parametrize("op, inputs, attrs, opset, domain, exact, allowed", HAND_WORKED,
                         ids=[c[0] for c in HAND_WORKED])
def test_each_bound_by_hand(op, inputs, attrs, opset, domain, exact, allowed):
    arrays = [np.array(v, np.float32) for v in inputs]
    n = node(op, len(arrays), 1, domain, **attrs)
    shape = reference(op, opset, domain, **attrs)(*arrays)[0].shape
    truth = np.full(shape, exact, np.float64)
    one_ulp = np.asarray(np.nextafter(truth.astype(np.float32), np.float32(np.inf)))  # not equal
    verdict = judge(n, opset, arrays, [one_ulp], [truth]).outputs[0]
    output_rounding = U32 * abs(exact) + 2 * 2.0**-149
    assert verdict.allowed == pytest.approx(allowed + output_rounding, rel=1e-9, abs=1e-45)
