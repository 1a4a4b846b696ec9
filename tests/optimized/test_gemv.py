"""csrc/gemv.c (kernels.gemv) and the MatMul/Gemm kernels of optimized/cpu.py that send up to
GEMV_ROWS_UP_TO rows of A to it: judged against the reference op with the bound policy
(reference/agreement.py), over shapes whose N and K are not multiples of the kernel's blocks
(8 lanes, 4 rows of B per pass, 1024-column blocks), both layouts of B, C broadcasts and
activations; bitwise equal at 1 and 2 threads (N split, or K in parts fixed by the shape);
views as inputs."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper

from optimized import cpu, kernels
from reference import agreement
from reference.registry import lookup

MS = "com.microsoft"
OPSET = {"": 23, MS: 1}


def rand(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def judge(domain, op_type, inputs, actual, **attrs):
    names = [f"in{i}" if v is not None else "" for i, v in enumerate(inputs)]
    node = helper.make_node(op_type, names, ["y"], domain=domain, **attrs)
    fn = lookup(domain, op_type, OPSET[domain]).fn
    present = list(inputs)
    while present and present[-1] is None:
        present.pop()
    judgement = agreement.check_node(node, OPSET[domain], present, [actual],
                                     lambda *xs: [fn(*xs, **attrs)])
    assert judgement.ok, judgement.message()


SIZES = st.integers(1, 67)  # spans the 8-lane and 4-row blocks and their tails


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.sampled_from([(), (1,), (2,), (3,), (2, 2), (4, 1)]), m=st.integers(1, 4),
       k=SIZES, n=st.integers(1, 1100), seed=st.integers(0, 2**16))
def test_matmul_rows_up_to_four_match_the_reference(batch, m, k, n, seed):
    rows = int(np.prod(batch)) * m
    a, b = rand(seed, *batch, m, k), rand(seed + 1, k, n)
    y = cpu.KERNELS[("", "MatMul")](a, b)
    judge("", "MatMul", [a, b], y)
    if rows <= cpu.GEMV_ROWS_UP_TO:  # the GEMV kernel ran: the same bits as calling it
        np.testing.assert_array_equal(y.reshape(rows, n), kernels.gemv(a.reshape(rows, k), b))


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 4), k=SIZES, n=SIZES, seed=st.integers(0, 2**16),
       alpha=st.sampled_from([1.0, 0.5, -2.0]))
def test_fused_matmul_trans_b_reads_b_as_rows(m, k, n, seed, alpha):
    a, b = rand(seed, 2, m, k) if m <= 2 else rand(seed, m, k), rand(seed + 1, n, k)
    y = cpu.KERNELS[(MS, "FusedMatMul")](a, b, alpha=alpha, transB=1)
    judge(MS, "FusedMatMul", [a, b], y, alpha=alpha, transB=1)


C_SHAPES = ["none", "scalar", "row", "column", "full"]


def c_of(kind, m, n, seed):
    return {"none": None, "scalar": rand(seed, 1), "row": rand(seed, n), "column": rand(seed, m, 1),
            "full": rand(seed, m, n)}[kind]


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 4), k=SIZES, n=SIZES, seed=st.integers(0, 2**16),
       trans_a=st.booleans(), trans_b=st.booleans(), c_kind=st.sampled_from(C_SHAPES),
       alpha=st.sampled_from([1.0, 0.25]), beta=st.sampled_from([1.0, -3.0]))
def test_gemm_matches_the_reference(m, k, n, seed, trans_a, trans_b, c_kind, alpha, beta):
    a = rand(seed, k, m) if trans_a else rand(seed, m, k)
    b = rand(seed + 1, n, k) if trans_b else rand(seed + 1, k, n)
    c = c_of(c_kind, m, n, seed + 2)
    attrs = {"alpha": alpha, "beta": beta, "transA": int(trans_a), "transB": int(trans_b)}
    y = cpu.KERNELS[("", "Gemm")](a, b, c, **attrs)
    judge("", "Gemm", [a, b, c], y, **attrs)


@pytest.mark.parametrize("activation,params", [("Relu", {}), ("LeakyRelu", {"activation_alpha": 0.1}),
                                               ("Tanh", {})])
def test_fused_gemm_epilogue(activation, params):
    a, b, c = rand(0, 3, 37), rand(1, 29, 37), rand(2, 29)
    y = cpu.KERNELS[(MS, "FusedGemm")](a, b, c, transB=1, activation=activation, **params)
    np.testing.assert_array_equal(y, kernels.gemv(a, b, c, trans_b=True, activation=activation,
                                                  activation_params=list(params.values())))
    plain = kernels.gemm(a, b, c, trans_b=True)
    expected = {"Relu": np.maximum(plain, 0), "Tanh": np.tanh(plain),
                "LeakyRelu": np.where(plain < 0, 0.1 * plain, plain)}[activation]
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


# 2 threads need n * k * 4 >= 2 * 128 KiB; n odd and past a 1024-column block
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_two_threads_give_the_same_bits_as_one(threads, trans_b, m):
    k, n = 131, 2053
    a, b = rand(0, m, k), rand(1, n, k) if trans_b else rand(1, k, n)
    c = rand(2, n)
    threads(1)
    one = kernels.gemv(a, b, c, beta=0.5, trans_b=trans_b, activation="Relu")
    threads(2)
    two = kernels.gemv(a, b, c, beta=0.5, trans_b=trans_b, activation="Relu")
    np.testing.assert_array_equal(one, two)
    judge("", "Gemm", [a, b, c], kernels.gemv(a, b, c, trans_b=trans_b), transB=int(trans_b))


# a weight with short rows (m * n * parts within gemv.c's 16384-float part buffer) is cut by
# rows into 2 to 16 parts of 64 rows or more: k past one part and not a multiple of it, n a k/v
# projection's 128 and an odd width
@pytest.mark.parametrize("k, n", [(512, 128), (700, 37), (1408, 512), (257, 2048)])
@pytest.mark.parametrize("m", [1, 2, 4])
def test_short_rows_cut_by_rows_give_the_same_bits_at_any_thread_count(threads, k, n, m):
    a, b, c = rand(0, m, k), rand(1, k, n), rand(2, n)
    threads(1)
    one = kernels.gemv(a, b, c, beta=0.5)
    threads(2)
    two = kernels.gemv(a, b, c, beta=0.5)
    np.testing.assert_array_equal(one, two)
    judge("", "Gemm", [a, b, c], kernels.gemv(a, b, c), transB=0)
    judge("", "Gemm", [a, b], kernels.gemv(a, b, allow_simd=False), transB=0)


# each example sets the thread count it needs; the fixture restores it once, at the end
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(m=st.integers(1, 4), k=st.integers(128, 2200), n=st.integers(1, 4200),
       c_shape=st.sampled_from(["none", "row", "column", "full"]), seed=st.integers(0, 2**16))
def test_b_cut_by_rows_near_the_part_buffer_matches_the_reference(threads, m, k, n, c_shape, seed):
    """B stored k x n with k of two 64-row parts or more, and m * n from a few floats to past
    the 16384 of csrc/gemv.c's part buffer (GEMV_PART_FLOATS), where the number of parts falls
    to 2 and then to none: the reference's result, with C and an activation after the parts are
    added, and the same bits at 1 and 2 threads."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    c = {"none": None, "row": rng.standard_normal(n, dtype=np.float32),
         "column": rng.standard_normal((m, 1), dtype=np.float32),
         "full": rng.standard_normal((m, n), dtype=np.float32)}[c_shape]
    threads(1)
    one = kernels.gemv(a, b, c, alpha=0.75, beta=-0.5)
    relu = kernels.gemv(a, b, c, alpha=0.75, beta=-0.5, activation="Relu")
    threads(2)
    np.testing.assert_array_equal(kernels.gemv(a, b, c, alpha=0.75, beta=-0.5), one)
    np.testing.assert_array_equal(relu, np.where(one < 0, np.float32(0), one))
    judge("", "Gemm", [a, b, c], one, alpha=0.75, beta=-0.5)


@pytest.mark.parametrize("trans_b", [False, True])
def test_portable_code_agrees(trans_b):
    a = rand(0, 3, 45)
    b = rand(1, 53, 45) if trans_b else rand(1, 45, 53)
    judge("", "Gemm", [a, b], kernels.gemv(a, b, trans_b=trans_b, allow_simd=False),
          transB=int(trans_b))


def test_empty_k_gives_beta_c():
    a, b, c = np.zeros((2, 0), np.float32), np.zeros((0, 5), np.float32), rand(0, 5)
    np.testing.assert_array_equal(kernels.gemv(a, b, c, beta=2.0), np.tile(2 * c, (2, 1)))


def test_views_are_read_as_their_values():
    """A sliced A, a transposed B (a (n, k) array seen as (k, n)) and a broadcast C."""
    big_a = np.full((8, 50), np.nan, np.float32)
    big_a[::2, 1:] = rand(0, 4, 49)
    a = big_a[::2, 1:]
    b = np.ascontiguousarray(rand(1, 49, 23).T).T
    c = np.broadcast_to(rand(2, 1, 23), (4, 23))
    y = cpu.KERNELS[("", "Gemm")](a, b, c)
    copies = [np.ascontiguousarray(x) for x in (a, b, c)]
    np.testing.assert_array_equal(y, cpu.KERNELS[("", "Gemm")](*copies))
    judge("", "Gemm", copies, y)


def test_bad_input_is_refused_with_its_name():
    with pytest.raises(ValueError, match="1 to 4 rows"):
        kernels.gemv(rand(0, 5, 3), rand(1, 3, 2))
    with pytest.raises(ValueError, match="inner dimensions"):
        kernels.gemv(rand(0, 2, 3), rand(1, 4, 2))
    with pytest.raises(ValueError, match="does not broadcast"):
        kernels.gemv(rand(0, 2, 3), rand(1, 3, 2), rand(2, 3))


def test_more_rows_go_to_the_blas():
    a, b = rand(0, cpu.GEMV_ROWS_UP_TO + 1, 16), rand(1, 16, 9)
    assert cpu.gemv_rows(a.shape, b.ndim, False) == 0
    judge("", "MatMul", [a, b], cpu.KERNELS[("", "MatMul")](a, b))


# --- the plan's step table (csrc/plan.c PLAN_GEMV) ----------------------------------------

def decode_model(rows, k, n):
    """x (rows, 1, k) @ w1 (k, n) -> Gemm with w2 (n', n) transB, bias and Relu (FusedGemm's
    epilogue is not in opset 21: Relu as its own node)."""
    from onnx import TensorProto, numpy_helper

    w1, w2, bias = rand(1, k, n), rand(2, n + 3, n), rand(3, n + 3)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Reshape", ["h", "shape"], ["h2"]),
             helper.make_node("Gemm", ["h2", "w2", "bias"], ["g"], transB=1, alpha=0.5),
             helper.make_node("Relu", ["g"], ["y"])]
    inits = [numpy_helper.from_array(v, name) for name, v in
             (("w1", w1), ("w2", w2), ("bias", bias), ("shape", np.array([rows, n], np.int64)))]
    graph = helper.make_graph(nodes, "decode",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, 1, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize("rows", [1, 3])
def test_step_table_runs_gemv_steps_with_the_python_plans_bits(rows, threads):
    from optimized.cpu import C_STEPS, KERNELS
    from optimized.plan import Plan

    threads(2)
    model = decode_model(rows, 37, 301)
    feeds = {"x": rand(4, rows, 1, 37)}
    in_c, in_python = Plan(model, KERNELS, c_steps=C_STEPS), Plan(model, KERNELS)
    for _ in range(3):  # records, compiles, runs the table
        got = in_c.run(dict(feeds))
    program, = in_c._programs.values()
    kinds = [int(s.kind) for s in program.table.steps[0:program.table.count]]
    assert kinds.count(int(kernels.lib.PLAN_GEMV)) == 2, kinds
    np.testing.assert_array_equal(got[0], in_python.run(dict(feeds))[0])
