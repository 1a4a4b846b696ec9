"""csrc/gemm_packed.c (kernels.PackedWeights, kernels.gemm_packed) and the MatMul/Gemm kernels
of optimized/cpu.py that send a constant B with GEMV_ROWS_UP_TO < M <= PACKED_GEMM_ROWS_UP_TO
to it: judged against the reference op with the bound policy (reference/agreement.py), over
M, K, N that are not multiples of the 6-row tile, the 16-column panel or the 1024-row K block,
both layouts of B, C broadcasts, alpha/beta and activations; bitwise equal at 1 and 2 threads
(threads split panels only); the plan's step table, and a new plan when M changes."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from optimized import cpu, kernels
from reference import agreement
from reference.registry import lookup

from .conftest import ISA_LEVELS

OPSET = 23


def rand(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def constant(x):
    """x as an initializer is seen by the kernels: read-only and C-contiguous."""
    x = np.ascontiguousarray(x)
    x.flags.writeable = False
    return x


def judge(op_type, inputs, actual, **attrs):
    names = [f"in{i}" for i in range(len(inputs))]
    node = helper.make_node(op_type, names, ["y"], **attrs)
    fn = lookup("", op_type, OPSET).fn
    judgement = agreement.check_node(node, OPSET, list(inputs), [actual],
                                     lambda *xs: [fn(*xs, **attrs)])
    assert judgement.ok, judgement.message()


def test_panels_hold_sixteen_columns_row_after_row_padded_with_zeros():
    b = np.arange(3 * 18, dtype=np.float32).reshape(3, 18)  # k 3, n 18: two panels
    packed = kernels.PackedWeights(b)
    panels = packed.data.reshape(2, 3, 16)
    np.testing.assert_array_equal(panels[0], b[:, :16])
    np.testing.assert_array_equal(panels[1, :, :2], b[:, 16:])
    np.testing.assert_array_equal(panels[1, :, 2:], 0)
    np.testing.assert_array_equal(kernels.PackedWeights(np.ascontiguousarray(b.T),
                                                        trans_b=True).data, packed.data)


C_FORMS = ["none", "scalar", "row", "column", "full"]


def addend(form, m, n, seed):
    shape = {"scalar": (1,), "row": (n,), "column": (m, 1), "full": (m, n)}.get(form)
    return None if shape is None else rand(seed, *shape)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=st.integers(1, 40), k=st.integers(1, 70), n=st.integers(1, 50),
       trans_b=st.booleans(), c_form=st.sampled_from(C_FORMS),
       alpha=st.sampled_from([1.0, 0.5, -2.0]), beta=st.sampled_from([1.0, 0.0, 3.0]),
       simd=st.booleans(), seed=st.integers(0, 2**16))
def test_gemm_packed_matches_the_reference_gemm(m, k, n, trans_b, c_form, alpha, beta, simd,
                                                seed):
    a, b = rand(seed, m, k), rand(seed + 1, n, k) if trans_b else rand(seed + 1, k, n)
    c = addend(c_form, m, n, seed + 2)
    y = kernels.gemm_packed(a, kernels.PackedWeights(b, trans_b=trans_b), c, alpha=alpha,
                            beta=beta, allow_simd=simd)
    inputs = [a, b] if c is None else [a, b, c]
    judge("Gemm", inputs, y, alpha=alpha, beta=beta, transB=int(trans_b))


@pytest.mark.parametrize("m,k,n", [(37, 1030, 33), (7, 2049, 17), (128, 768, 64)])
def test_k_past_one_block_matches_the_reference(m, k, n):
    a, b = rand(0, m, k), rand(1, k, n)
    judge("MatMul", [a, b], kernels.gemm_packed(a, kernels.PackedWeights(b)))


@pytest.mark.parametrize("activation,params", [("Relu", ()), ("LeakyRelu", (0.1,)),
                                               ("Tanh", ())])
def test_activation_runs_after_the_sum(activation, params):
    a, b, c = rand(0, 9, 20), rand(1, 20, 35), rand(2, 35)
    y = kernels.gemm_packed(a, kernels.PackedWeights(b), c, activation=activation,
                            activation_params=params)
    plain = kernels.gemm_packed(a, kernels.PackedWeights(b), c)
    np.testing.assert_array_equal(y, kernels.activation(plain, activation, params))


def test_empty_k_gives_beta_c():
    a, b, c = np.zeros((6, 0), np.float32), np.zeros((0, 5), np.float32), rand(0, 5)
    y = kernels.gemm_packed(a, kernels.PackedWeights(b), c, beta=2.0)
    np.testing.assert_array_equal(y, np.tile(2 * c, (6, 1)))


# 2 threads need m * n * k >= 2 * 2^18; n spans an odd count of panels
@pytest.mark.parametrize("trans_b", [False, True])
def test_two_threads_give_the_same_bits_as_one(threads, trans_b):
    m, k, n = 37, 1100, 275
    a, b, c = rand(0, m, k), rand(1, n, k) if trans_b else rand(1, k, n), rand(2, n)
    packed = kernels.PackedWeights(b, trans_b=trans_b)
    threads(1)
    one = kernels.gemm_packed(a, packed, c, beta=0.5, activation="Relu")
    threads(2)
    two = kernels.gemm_packed(a, packed, c, beta=0.5, activation="Relu")
    np.testing.assert_array_equal(one, two)


def test_bad_input_is_refused_with_its_name():
    packed = kernels.PackedWeights(rand(0, 3, 2))
    with pytest.raises(ValueError, match="inner dimensions"):
        kernels.gemm_packed(rand(1, 5, 4), packed)
    with pytest.raises(ValueError, match="does not broadcast"):
        kernels.gemm_packed(rand(1, 5, 3), packed, rand(2, 3))
    with pytest.raises(ValueError, match="B"):
        kernels.PackedWeights(rand(0, 2, 3, 4))


# --- the dispatch in optimized/cpu.py ---------------------------------------------------------

@pytest.mark.parametrize("batch,m", [((), 5), ((2,), 37), ((3, 1), 7)])
def test_matmul_with_a_constant_b_runs_the_packed_kernel(batch, m):
    a, b = rand(0, *batch, m, 45), constant(rand(1, 45, 29))
    rows = int(np.prod(batch)) * m
    assert cpu.packed_rows(a.shape, b, False) == rows
    y = cpu.KERNELS[("", "MatMul")](a, b)
    np.testing.assert_array_equal(
        y.reshape(rows, 29), kernels.gemm_packed(a.reshape(rows, 45), cpu.packed_weights(b, False)))
    judge("MatMul", [a, b], y)


def test_gemm_with_a_constant_transposed_b_and_bias_runs_the_packed_kernel():
    a, b, c = rand(0, 11, 40), constant(rand(1, 21, 40)), rand(2, 21)
    y = cpu.KERNELS[("", "Gemm")](a, b, c, alpha=0.5, beta=2.0, transB=1)
    np.testing.assert_array_equal(y, kernels.gemm_packed(a, cpu.packed_weights(b, True), c,
                                                         alpha=0.5, beta=2.0))
    judge("Gemm", [a, b, c], y, alpha=0.5, beta=2.0, transB=1)


def test_a_b_that_may_change_or_too_many_rows_go_to_the_blas():
    b = constant(rand(1, 16, 9))
    assert cpu.packed_rows((8, 16), np.array(b), False) == 8  # the rule itself takes any 2-D B
    assert cpu.packed_rows((cpu.GEMV_ROWS_UP_TO, 16), b, False) == 0  # GEMV's
    assert cpu.packed_rows((cpu.PACKED_GEMM_ROWS_UP_TO + 1, 16), b, False) == 0
    assert cpu.packed_rows((16, 8), b, True) == 0  # A transposed
    assert cpu.packed_rows((8, 16), rand(2, 3, 16, 9), False) == 0  # batched B
    a = rand(0, 8, 16)
    writeable = np.array(b)  # a writeable B is not packed: it may change between calls
    y = cpu.KERNELS[("", "MatMul")](a, writeable)
    np.testing.assert_array_equal(y, kernels.matmul(a, writeable))


def test_weights_are_packed_once_per_orientation_and_dropped_with_them():
    b = constant(rand(0, 20, 20))
    first = cpu.packed_weights(b, False)
    assert cpu.packed_weights(b, False) is first
    assert cpu.packed_weights(b, True) is not first
    key = id(b)
    del b
    assert key not in cpu._PACKED_WEIGHTS


# --- the plan's step table (csrc/plan.c PLAN_GEMM_PACKED) ------------------------------------

def encoder_model(k, n):
    """x (batch, seq, k) @ w1 (k, n) -> Reshape -> Gemm with w2 (n', n) transB, bias, alpha;
    Relu as its own node."""
    w1, w2, bias = rand(1, k, n), rand(2, n + 3, n), rand(3, n + 3)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Reshape", ["h", "shape"], ["h2"]),
             helper.make_node("Gemm", ["h2", "w2", "bias"], ["g"], transB=1, alpha=0.5),
             helper.make_node("Relu", ["g"], ["y"])]
    inits = [numpy_helper.from_array(v, name) for name, v in
             (("w1", w1), ("w2", w2), ("bias", bias), ("shape", np.array([-1, n], np.int64)))]
    graph = helper.make_graph(
        nodes, "encoder",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def test_step_table_runs_packed_steps_and_plans_again_for_a_new_m(threads):
    from optimized.cpu import C_STEPS, KERNELS
    from optimized.plan import Plan

    threads(2)
    model = encoder_model(37, 53)
    plan = Plan(model, KERNELS, c_steps=C_STEPS)
    for seq in (9, 23):  # a new M: a new signature with its own steps, the same packed weights
        feeds = {"x": rand(seq, 2, seq, 37)}
        for _ in range(3):  # records, compiles, runs the table
            got = plan.run(dict(feeds))
        w1, w2, bias = (numpy_helper.to_array(t) for t in model.graph.initializer[:3])
        expected = np.maximum(0.5 * (feeds["x"].reshape(-1, 37).astype(np.float64) @ w1 @ w2.T)
                              + bias, 0)
        np.testing.assert_allclose(got[0], expected, rtol=1e-4, atol=1e-4)
    assert len(plan._programs) == 2
    for program in plan._programs.values():
        kinds = [int(s.kind) for s in program.table.steps[0:program.table.count]]
        assert kinds.count(int(kernels.lib.PLAN_GEMM_PACKED)) == 2, kinds


def test_views_are_read_as_their_values():
    """A sliced A and a broadcast C beside a constant B: the packed kernel reads their values."""
    big_a = np.full((14, 50), np.nan, np.float32)
    big_a[::2, 1:] = rand(0, 7, 49)
    a = big_a[::2, 1:]
    b = constant(rand(1, 49, 23))
    c = np.broadcast_to(rand(2, 1, 23), (7, 23))
    y = cpu.KERNELS[("", "Gemm")](a, b, c)
    copies = [np.ascontiguousarray(x) for x in (a, b, c)]
    np.testing.assert_array_equal(y, kernels.gemm_packed(copies[0], cpu.packed_weights(b, False),
                                                         copies[2]))
    judge("Gemm", copies, y)
    batched = big_a[::2, 1:].reshape(1, 7, 49)
    np.testing.assert_array_equal(cpu.KERNELS[("", "MatMul")](batched, b)[0],
                                  kernels.gemm_packed(copies[0], cpu.packed_weights(b, False)))


# every vector-instruction level the CPU runs (kernels.limit_isa) ---------------------------------
@pytest.mark.parametrize("level", ISA_LEVELS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=st.integers(1, 40), k=st.integers(1, 70), n=st.integers(1, 75),
       trans_b=st.booleans(), c_form=st.sampled_from(C_FORMS),
       alpha=st.sampled_from([1.0, 0.5]), beta=st.sampled_from([1.0, 3.0]),
       seed=st.integers(0, 2**16))
def test_each_isa_matches_the_reference_gemm(level, m, k, n, trans_b, c_form, alpha, beta, seed):
    """Each level's tile (AVX-512: up to 12 rows by two panels, a masked store for the last
    panel's tail; AVX2: 6 rows by one panel) over m, n that are no multiple of either."""
    a, b = rand(seed, m, k), rand(seed + 1, n, k) if trans_b else rand(seed + 1, k, n)
    c = addend(c_form, m, n, seed + 2)
    packed = kernels.PackedWeights(b, trans_b=trans_b)
    with kernels.isa_limit(level):
        y = kernels.gemm_packed(a, packed, c, alpha=alpha, beta=beta)
    inputs = [a, b] if c is None else [a, b, c]
    judge("Gemm", inputs, y, alpha=alpha, beta=beta, transB=int(trans_b))


@pytest.mark.parametrize("level", ISA_LEVELS)
@pytest.mark.parametrize("m,k,n", [(37, 1100, 275), (128, 1030, 47), (13, 2049, 33)])
def test_each_isa_two_threads_give_the_same_bits_as_one(threads, level, m, k, n):
    """Threads split the panels (an odd count: one thread's last panel runs alone on AVX-512),
    k past one 1024-row block: each output is summed in one order whatever the threads."""
    a, b, c = rand(0, m, k), rand(1, k, n), rand(2, n)
    packed = kernels.PackedWeights(b)

    def run():
        threads(1)
        one = kernels.gemm_packed(a, packed, c, beta=0.5, activation="Relu")
        threads(2)
        return one, kernels.gemm_packed(a, packed, c, beta=0.5, activation="Relu")

    with kernels.isa_limit(level):
        one, two = run()
    np.testing.assert_array_equal(one, two)
    judge("Gemm", [a, b, c], kernels.gemm_packed(a, packed, c, beta=0.5), beta=0.5)


@pytest.mark.parametrize("level", ISA_LEVELS)
def test_each_isa_hand_checked(level):
    """a = ones (14 x 3), B's column j = (j, 1, -1): every row of y is 0, 1, ..., 32 plus c."""
    n = 33
    b = np.stack([np.arange(n), np.ones(n), -np.ones(n)]).astype(np.float32)
    c = np.full(n, 0.25, np.float32)
    with kernels.isa_limit(level):
        y = kernels.gemm_packed(np.ones((14, 3), np.float32), kernels.PackedWeights(b), c)
    np.testing.assert_array_equal(y, np.tile(np.arange(n) + 0.25, (14, 1)).astype(np.float32))
