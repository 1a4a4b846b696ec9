"""ai.onnx.preview.training: optimizers against the spec's pseudo code worked by hand, and the
Gradient operator against finite differences."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from reference import ReferenceEvaluator
from tests.reference.oneop import run_node

TRAINING = "ai.onnx.preview.training"


def run_optimizer(op_type, inputs, n_out, **attrs):
    return run_node(op_type, *inputs, n_out=n_out, as_list=True, opset=17, domain=TRAINING,
                    **attrs)


R = np.array(0.5, np.float32)


def test_adagrad_hand_values():
    x, g, h = np.array([1.0], np.float32), np.array([2.0], np.float32), np.array([5.0], np.float32)
    # r = 0.5 / (1 + 2 * 0.5) = 0.25 ; g_reg = 0.1 * 1 + 2 = 2.1 ; h_new = 5 + 4.41 = 9.41
    x_new, h_new = run_optimizer(
        "Adagrad",
        [R, np.array(2, np.int64), x, g, h],
        2,
        decay_factor=0.5,
        norm_coefficient=0.1,
        epsilon=0.0,
    )
    assert x_new.dtype == np.float32
    np.testing.assert_allclose(h_new, [9.41], rtol=1e-6)
    np.testing.assert_allclose(x_new, [1.0 - 0.25 * 2.1 / np.sqrt(9.41)], rtol=1e-6)


def test_adagrad_two_tensors_keep_their_order():
    x1, x2 = np.array([1.0], np.float64), np.array([[1.0, 2.0]], np.float64)
    g1, g2 = np.array([1.0]), np.array([[0.0, 1.0]])
    h1, h2 = np.array([0.0]), np.array([[0.0, 0.0]])
    out = run_optimizer(
        "Adagrad", [R, np.array(0, np.int64), x1, x2, g1, g2, h1, h2], 4, epsilon=1e-9
    )
    assert [o.shape for o in out] == [(1,), (1, 2), (1,), (1, 2)]
    assert out[0].dtype == np.float64
    np.testing.assert_allclose(out[0], [0.5])
    np.testing.assert_allclose(out[1], [[1.0, 1.5]])  # a zero gradient leaves x unchanged
    np.testing.assert_allclose(out[3], [[0.0, 1.0]])


def test_adam_bias_correction_and_post_norm():
    x, g = np.array([1.0], np.float32), np.array([0.5], np.float32)
    v, h = np.array([0.1], np.float32), np.array([0.2], np.float32)
    alpha, beta = 0.9, 0.99
    x_new, v_new, h_new = run_optimizer(
        "Adam",
        [R, np.array(3, np.int64), x, g, v, h],
        3,
        alpha=alpha,
        beta=beta,
        epsilon=1e-3,
        norm_coefficient=0.0,
        norm_coefficient_post=0.1,
    )
    v_want = alpha * 0.1 + (1 - alpha) * 0.5
    h_want = beta * 0.2 + (1 - beta) * 0.25
    rate = 0.5 * np.sqrt(1 - beta**3) / (1 - alpha**3)
    x_want = (1 - 0.1) * (1.0 - rate * v_want / (np.sqrt(h_want) + 1e-3))
    np.testing.assert_allclose(v_new, [v_want], rtol=1e-6)
    np.testing.assert_allclose(h_new, [h_want], rtol=1e-6)
    np.testing.assert_allclose(x_new, [x_want], rtol=1e-6)


def test_adam_first_step_uses_plain_rate():
    x, g = np.array([1.0], np.float32), np.array([1.0], np.float32)
    z = np.array([0.0], np.float32)
    x_new, _, _ = run_optimizer(
        "Adam", [R, np.array(0, np.int64), x, g, z, z], 3, alpha=0.5, beta=0.5, epsilon=0.0
    )
    # v = 0.5, h = 0.5 -> x = 1 - 0.5 * 0.5 / sqrt(0.5)
    np.testing.assert_allclose(x_new, [1 - 0.25 / np.sqrt(0.5)], rtol=1e-6)


@pytest.mark.parametrize("mode", ["standard", "nesterov"])
@pytest.mark.parametrize("t", [0, 4])
def test_momentum(mode, t):
    x, g, v = np.array([2.0], np.float32), np.array([1.0], np.float32), np.array([3.0], np.float32)
    x_new, v_new = run_optimizer(
        "Momentum",
        [R, np.array(t, np.int64), x, g, v],
        2,
        alpha=0.9,
        beta=0.1,
        mode=mode,
        norm_coefficient=0.5,
    )
    g_reg = 0.5 * 2 + 1  # 2
    beta = 0.1 if t > 0 else 1.0
    v_want = 0.9 * 3 + beta * g_reg
    step = v_want if mode == "standard" else g_reg + 0.9 * v_want
    np.testing.assert_allclose(v_new, [v_want], rtol=1e-6)
    np.testing.assert_allclose(x_new, [2.0 - 0.5 * step], rtol=1e-6)


def test_momentum_rejects_unknown_mode():
    one = np.array([1.0], np.float32)
    with pytest.raises(Exception, match="mode"):
        run_optimizer(
            "Momentum",
            [R, np.array(0, np.int64), one, one, one],
            2,
            alpha=0.9,
            beta=0.1,
            mode="heavy",
            norm_coefficient=0.0,
        )


# Gradient --------------------------------------------------------------------------------------
def gradient_model(nodes, inputs, y, xs, zs=(), inits=()):
    grads = [f"d_{x}" for x in xs]
    extra = {"zs": list(zs)} if zs else {}
    node = helper.make_node(
        "Gradient", list(xs) + list(zs), grads, domain=TRAINING, xs=list(xs), y=y, **extra
    )
    graph = helper.make_graph(
        nodes + [node],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.DOUBLE, s) for n, s in inputs],
        [helper.make_empty_tensor_value_info(o) for o in [y] + grads],
        initializer=list(inits),
    )
    m = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(TRAINING, 1)]
    )
    return ReferenceEvaluator(m, check=False)


def numeric_grad(f, values, i, eps=1e-6):
    base = [v.copy() for v in values]
    g = np.zeros_like(values[i])
    for idx in np.ndindex(values[i].shape):
        plus = [v.copy() for v in base]
        minus = [v.copy() for v in base]
        plus[i][idx] += eps
        minus[i][idx] -= eps
        g[idx] = (f(*plus).sum() - f(*minus).sum()) / (2 * eps)
    return g


def test_gradient_scalar_add_mul():
    ev = gradient_model(
        [helper.make_node("Add", ["a", "b"], ["c"]), helper.make_node("Mul", ["c", "a"], ["d"])],
        [("a", []), ("b", [])],
        "d",
        ["a", "b"],
    )
    d, da, db = ev.run(None, {"a": np.array(3.0), "b": np.array(-2.0)})
    # d = a * (a + b): dd/da = 2a + b, dd/db = a
    assert float(d) == 3.0 and float(da) == 4.0 and float(db) == 3.0
    assert da.shape == () and da.dtype == np.float64


def test_gradient_broadcast_matmul_chain():
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Add", ["h", "b"], ["hb"]),
        helper.make_node("Sigmoid", ["hb"], ["s"]),
        helper.make_node("Tanh", ["s"], ["t"]),
        helper.make_node("Div", ["t", "x2"], ["y"]),
        helper.make_node("Sub", ["x2", "s"], ["unused"]),
    ]
    # x2 is a zs input: it must be fed, but no gradient is asked for it
    ev = gradient_model(
        nodes,
        [("x", [2, 3]), ("w", [3, 4]), ("b", [4]), ("x2", [1, 4])],
        "y",
        ["x", "w", "b"],
        zs=["x2"],
    )
    rng = np.random.default_rng(0)
    vals = [rng.standard_normal(s) for s in [(2, 3), (3, 4), (4,)]] + [rng.uniform(1, 2, (1, 4))]
    _y, dx, dw, db = ev.run(None, dict(zip(["x", "w", "b", "x2"], vals)))

    def f(x, w, b, x2):
        return np.tanh(1 / (1 + np.exp(-(x @ w + b)))) / x2

    for i, got in enumerate([dx, dw, db]):
        assert got.shape == vals[i].shape
        np.testing.assert_allclose(got, numeric_grad(f, vals, i), rtol=1e-5, atol=1e-8)


def test_gradient_with_respect_to_an_unrelated_input_is_zero():
    ev = gradient_model(
        [helper.make_node("Relu", ["a"], ["y"])], [("a", [3]), ("b", [2])], "y", ["a", "b"]
    )
    _, da, db = ev.run(None, {"a": np.array([-1.0, 2.0, 3.0]), "b": np.array([1.0, 1.0])})
    np.testing.assert_array_equal(da, [0, 1, 1])
    np.testing.assert_array_equal(db, [0, 0])


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.floats(0.5, 3.0), min_size=3, max_size=3),
    st.lists(st.floats(-2.0, 2.0), min_size=3, max_size=3),
)
def test_gradient_product_rule_property(a, b):
    # y = log(a) * exp(b) + sqrt(a): the gradient satisfies the product rule elementwise
    nodes = [
        helper.make_node("Log", ["a"], ["la"]),
        helper.make_node("Exp", ["b"], ["eb"]),
        helper.make_node("Mul", ["la", "eb"], ["p"]),
        helper.make_node("Sqrt", ["a"], ["sa"]),
        helper.make_node("Add", ["p", "sa"], ["y"]),
    ]
    ev = gradient_model(nodes, [("a", [3]), ("b", [3])], "y", ["a", "b"])
    a, b = np.array(a), np.array(b)
    _, da, db = ev.run(None, {"a": a, "b": b})
    np.testing.assert_allclose(da, np.exp(b) / a + 0.5 / np.sqrt(a), rtol=1e-10)
    np.testing.assert_allclose(db, np.log(a) * np.exp(b), rtol=1e-10, atol=1e-12)
