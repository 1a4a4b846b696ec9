"""Elementwise chains fused at plan time (optimized/chains.py, csrc chain_f32): same values as
the reference, every broadcast form the kernel claims, and a fallback for the rest."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from optimized import chains
from optimized.cpu import KERNELS
from optimized.plan import Plan
from reference import ReferenceEvaluator

F = TensorProto.FLOAT
SHAPE = (2, 3, 4, 5)
# side operand shapes over SHAPE: full, scalar, last-axis row, per-channel, per-(batch, channel)
SIDES = [SHAPE, (), (5,), (3, 1, 1), (2, 3, 1, 1), (1,)]
UNARY = [("Relu", {}), ("Sigmoid", {}), ("Tanh", {}), ("LeakyRelu", {"alpha": 0.3}),
         ("Gelu", {}), ("Gelu", {"approximate": "tanh"})]


def chain_model(members, dtype=F, rank=4):
    """members: ("Add"/"Sub"/"Mul"/"Div", side shape, value on the left?) or (unary, attrs)."""
    nodes, inits, value = [], [], "x"
    rng = np.random.default_rng(len(members))
    for i, member in enumerate(members):
        out = f"v{i}" if i < len(members) - 1 else "y"
        if member[0] in chains.BINARY_OPS:
            op_type, side_shape, value_left = member
            side = (rng.uniform(0.5, 2.0, side_shape)).astype(np.float32)
            inits.append(numpy_helper.from_array(side, f"s{i}"))
            inputs = [value, f"s{i}"] if value_left else [f"s{i}", value]
            nodes.append(helper.make_node(op_type, inputs, [out], name=f"n{i}"))
        else:
            nodes.append(helper.make_node(member[0], [value], [out], name=f"n{i}", **member[1]))
        value = out
    dims = [f"d{i}" for i in range(rank)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", dtype, dims)],
                              [helper.make_tensor_value_info("y", dtype, dims)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])


def run_fused(model, x):
    plan = Plan(model, KERNELS, fuse_chains=True)
    return plan, plan.run({"x": x})[0]


# a side divided by the value is left to the hand-checked test below: dividing by a value that
# an earlier member drove near 0 makes the law ill-conditioned, not the kernel wrong
members = st.one_of(
    st.tuples(st.sampled_from(sorted(chains.BINARY_OPS)), st.sampled_from(SIDES), st.booleans())
    .map(lambda m: (m[0], m[1], True) if m[0] == "Div" else m),
    st.sampled_from(UNARY))


@settings(max_examples=40, deadline=None)
@given(chain=st.lists(members, min_size=2, max_size=7), seed=st.integers(0, 1000))
def test_fused_chain_matches_reference(chain, seed):
    model = chain_model(chain)
    # magnitudes in [0.5, 2] like the sides, so no Div blows a value out to Gelu's far tail,
    # where the reference's 1 + erf(x) rounds to 0 long before the true value underflows
    rng = np.random.default_rng(seed)
    x = (rng.uniform(0.5, 2.0, SHAPE) * rng.choice([-1, 1], SHAPE)).astype(np.float32)
    plan, got = run_fused(model, x)
    assert [s.node.op_type for s in plan.steps] == ["ElementwiseChain"]
    expected = ReferenceEvaluator(model).run(None, {"x": x})[0]
    # float32 rounding (and the kernels' few-ulp exp/tanh) grows through a chain that
    # subtracts near-equal values and divides: measure the error against the result's scale
    scale = max(1.0, float(np.abs(expected).max()))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * scale)


def test_hand_checked_chain_with_value_on_the_right_and_channel_broadcast():
    model = chain_model([("Sub", (3, 1, 1), False), ("Div", (), False), ("Relu", {})])
    plan = Plan(model, KERNELS, fuse_chains=True)
    x = np.ones(SHAPE, np.float32)
    side = numpy_helper.to_array(model.graph.initializer[0])[:, 0, 0]
    scale = numpy_helper.to_array(model.graph.initializer[1])
    got = plan.run({"x": x})[0]
    # Relu(scale / (side_c - 1)) per channel c
    for c in range(3):
        np.testing.assert_allclose(got[:, c], np.maximum(scale / (side[c] - 1), 0), rtol=1e-6)


def test_a_side_that_grows_the_value_runs_node_by_node():
    # x [1, 5] + s [4, 5] has the shape of s, and then Relu: the first member starts from s;
    # x [2, 1, 1, 1] * s [3, 1, 1] grows both ways: the kernel cannot take it, the nodes can
    model = chain_model([("Mul", (3, 1, 1), True), ("Relu", {})])
    x = np.random.default_rng(0).standard_normal((2, 1, 1, 1)).astype(np.float32)
    _, got = run_fused(model, x)
    np.testing.assert_allclose(got, ReferenceEvaluator(model).run(None, {"x": x})[0], rtol=1e-6)
    model = chain_model([("Add", (4, 5), True), ("Relu", {})], rank=2)
    x = np.random.default_rng(1).standard_normal((1, 5)).astype(np.float32)
    _, got = run_fused(model, x)
    np.testing.assert_allclose(got, ReferenceEvaluator(model).run(None, {"x": x})[0], rtol=1e-6)


def test_other_dtypes_and_nan_inf_and_empty():
    model = chain_model([("Add", (), True), ("Sigmoid", {}), ("Mul", (5,), False)],
                        dtype=TensorProto.DOUBLE, rank=2)
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.array(1.0), "s0"))
    model.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.arange(5.0), "s2"))
    x = np.linspace(-3, 3, 20).reshape(4, 5)
    _, got = run_fused(model, x)  # float64: the chain runs its nodes one by one
    np.testing.assert_allclose(got, ReferenceEvaluator(model).run(None, {"x": x})[0])
    model = chain_model([("Add", (), True), ("Relu", {}), ("Tanh", {})], rank=1)
    x = np.array([np.nan, np.inf, -np.inf, -1.0, 0.5], np.float32)
    _, got = run_fused(model, x)
    np.testing.assert_array_equal(got, ReferenceEvaluator(model).run(None, {"x": x})[0])
    _, got = run_fused(model, np.zeros(0, np.float32))
    assert got.shape == (0,)


def test_values_read_elsewhere_or_graph_outputs_end_a_chain():
    model = chain_model([("Add", (), True), ("Relu", {}), ("Sigmoid", {})], rank=1)
    model.graph.output.append(helper.make_tensor_value_info("v0", F, ["n"]))  # v0 is an output
    plan = Plan(model, KERNELS, fuse_chains=True)
    assert [s.node.op_type for s in plan.steps] == ["Add", "ElementwiseChain"]
    x = np.ones(3, np.float32)
    y, v0 = plan.run({"x": x})
    expected_y, expected_v0 = ReferenceEvaluator(model).run(None, {"x": x})
    np.testing.assert_allclose(v0, expected_v0)
    np.testing.assert_allclose(y, expected_y)


def test_iter_results_and_check_mode_see_every_intermediate():
    model = chain_model([("Add", (), True), ("Relu", {}), ("Sigmoid", {})], rank=1)
    plan = Plan(model, KERNELS, fuse_chains=True)
    seen = []
    plan.run({"x": np.ones(3, np.float32)}, observer=lambda r: seen.append(r.name))
    assert seen == ["v0", "v1", "y"]


@pytest.mark.parametrize("threads", [1, 2])
def test_large_chain_splits_across_threads(threads):
    from optimized import kernels

    before = kernels.get_num_threads()
    kernels.set_num_threads(threads)
    try:
        model = chain_model([("Mul", (64,), True), ("Add", (), True), ("Gelu", {})], rank=2)
        x = np.random.default_rng(2).standard_normal((300, 64)).astype(np.float32)
        _, got = run_fused(model, x)
        np.testing.assert_allclose(got, ReferenceEvaluator(model).run(None, {"x": x})[0],
                                   rtol=1e-5, atol=1e-6)
    finally:
        kernels.set_num_threads(before)


def test_two_chains_meeting_at_one_node_keep_every_node():
    # (x - 1) / (sqrt(x*x) + 0.5): both operands of the Div end a possible chain; the Div can
    # join only one of them, and no node may be lost (MeanVarianceNormalization's expansion)
    c = {n: numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("one", 1.0),
                                                                            ("half", 0.5))}
    nodes = [helper.make_node("Sub", ["x", "one"], ["centered"]),
             helper.make_node("Mul", ["x", "x"], ["square"]),
             helper.make_node("Sqrt", ["square"], ["root"]),
             helper.make_node("Add", ["root", "half"], ["denominator"]),
             helper.make_node("Div", ["centered", "denominator"], ["y"])]
    graph = helper.make_graph(nodes, "meet", [helper.make_tensor_value_info("x", F, ["n"])],
                              [helper.make_tensor_value_info("y", F, ["n"])], list(c.values()))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    plan = Plan(model, KERNELS, fuse_chains=True)
    fused = [s for s in plan.steps if s.node.op_type == "ElementwiseChain"]
    assert len(fused) == 1
    x = np.array([-2.0, 0.0, 1.0, 3.0], np.float32)
    np.testing.assert_allclose(plan.run({"x": x})[0], (x - 1) / (np.abs(x) + 0.5), rtol=1e-6)


def test_a_chain_replans_when_the_input_shape_changes():
    model = chain_model([("Mul", (5,), True), ("Add", (), True), ("Sigmoid", {})], rank=2)
    plan = Plan(model, KERNELS, fuse_chains=True)
    reference = ReferenceEvaluator(model)
    rng = np.random.default_rng(3)
    for shape in [(2, 5), (7, 5), (2, 5), (1, 5), (0, 5)]:  # cached geometry must not leak
        x = rng.standard_normal(shape).astype(np.float32)
        got = plan.run({"x": x})[0]
        assert got.shape == shape
        np.testing.assert_allclose(got, reference.run(None, {"x": x})[0], rtol=1e-6)
