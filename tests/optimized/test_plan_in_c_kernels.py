"""Step-table entries for the kernels that small convolutional and decoder models spend their
runs in: Conv, FusedConv and the fused ConvHardSwish (our conv2d, or the oneDNN primitive
_onednn_conv planned), GlobalAveragePool, Softmax, the fused Rotary and GroupedAttention(Masked) of optimized/passes.  Each
compiled run must give the Python plan's bits, stay within the agreement policy's bound of the
reference op, and be compiled again when the input shapes change."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from optimized import kernels
from optimized.cpu import C_STEPS, KERNELS, ONEDNN_CONV_RULES, conv_class
from optimized.passes.fuse_bias_activation import CONV_HARD_SWISH, fuse_bias_activation
from optimized.passes.gqa_fusion import (
    GROUPED_ATTENTION,
    GROUPED_ATTENTION_MASKED,
    grouped_attention_function,
)
from optimized.passes.rotary_fusion import ROTARY, ROTARY_INTERLEAVED, rotary_function
from optimized.passes.silu_mlp_fusion import FUSED_DOMAIN
from optimized.plan import PY, C, Plan
from reference.agreement import check_node
from reference.evaluator import ReferenceEvaluator

F, I64 = TensorProto.FLOAT, TensorProto.INT64
lib = kernels.lib  # the step kinds (PLAN_*)
MS = "com.microsoft"


def model_of(nodes, inputs, outputs, initializers=(), functions=(), opset=18):
    graph = helper.make_graph(nodes, "t", inputs, outputs,
                              initializer=[numpy_helper.from_array(v, n) for n, v in initializers])
    return helper.make_model(graph, functions=list(functions), opset_imports=[
        helper.make_opsetid("", opset), helper.make_opsetid(MS, 1),
        helper.make_opsetid(FUSED_DOMAIN, 1)])


def tensor(name, shape, elem=F):
    return helper.make_tensor_value_info(name, elem, shape)


def program(plan, feeds):
    return plan._programs.get(tuple((n, v.shape, v.dtype) for n, v in feeds.items()))


def run_both(model, feeds):
    """The step-table plan's outputs on its third run (recorded, compiled, then run in C), the
    Python plan's outputs, and the compiled program."""
    in_c, in_python = Plan(model, KERNELS, c_steps=C_STEPS), Plan(model, KERNELS)
    for _ in range(3):
        got = in_c.run(dict(feeds))
    return got, in_python.run(dict(feeds)), program(in_c, feeds), in_c


def assert_identical(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert g.tobytes() == w.tobytes()  # bit for bit, signed zeros and NaN payloads too


def step_kinds(compiled):
    return [compiled.table.steps[i].kind for i in range(compiled.table.count)]


def assert_within_bound(plan, feeds, got):
    """A one-node graph's compiled output judged against its reference op."""
    step = plan.steps[0]
    values = [feeds[plan.names[s]] if plan.names[s] in feeds else plan.template[s]
              for s in step.inputs if s >= 0]
    judgement = check_node(step.node, 18, values, got, step.reference)
    assert judgement.ok, judgement.message()


# --- convolution --------------------------------------------------------------------------
RNG = np.random.default_rng(21)
CONVS = {  # name: (x shape, w shape, attributes), N != C != H != W
    "pointwise": ((2, 12, 7, 5), (10, 12, 1, 1), {}),
    "depthwise": ((1, 12, 9, 6), (12, 1, 3, 3), {"group": 12, "pads": [1, 1, 1, 1],
                                                 "strides": [2, 1]}),
    "spatial": ((2, 16, 7, 9), (8, 16, 3, 3), {"pads": [1, 0, 1, 2], "dilations": [1, 2]}),
    "stem": ((1, 3, 11, 13), (6, 3, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    "grouped": ((2, 12, 6, 5), (9, 4, 3, 1), {"group": 3, "pads": [1, 0, 1, 0]}),
}


def conv_model(x_shape, w_shape, attrs, fused=False, residual=False):
    w = RNG.standard_normal(w_shape).astype(np.float32)
    b = RNG.standard_normal(w_shape[0]).astype(np.float32)
    inputs = ["x", "w", "b"] + (["z"] if residual else [])
    if fused:
        node = helper.make_node("FusedConv", inputs, ["y"], domain=MS, activation="LeakyRelu",
                                activation_params=[0.125], **attrs)
    else:
        node = helper.make_node("Conv", inputs[:3], ["y"], **attrs)
    feeds = [tensor("x", ["N", x_shape[1], "H", "W"])] + ([tensor("z", None)] if residual else [])
    return model_of([node], feeds, [tensor("y", None)], [("w", w), ("b", b)])


def conv_kind(name):
    _x_shape, w_shape, attrs = CONVS[name]
    rule = ONEDNN_CONV_RULES.get(conv_class(np.zeros(w_shape), attrs.get("group", 1)))
    uses_onednn = rule == "onednn" and kernels.onednn_unavailable() is None
    return lib.PLAN_ONEDNN_CONV if uses_onednn else lib.PLAN_CONV


@pytest.mark.parametrize("name", sorted(CONVS))
@pytest.mark.parametrize("fused", [False, True])
def test_convolutions_run_in_the_step_table(name, fused):
    x_shape, w_shape, attrs = CONVS[name]
    model = conv_model(x_shape, w_shape, attrs, fused=fused)
    feeds = {"x": RNG.standard_normal(x_shape).astype(np.float32)}
    got, want, compiled, plan = run_both(model, feeds)
    assert_identical(got, want)
    assert [op[0] for op in compiled.ops] == [C]
    assert step_kinds(compiled) == [conv_kind(name)]
    if not fused:
        assert_within_bound(plan, feeds, got)


@pytest.mark.parametrize("name", ["pointwise", "spatial"])
def test_a_fused_convolution_with_a_residual(name):
    x_shape, w_shape, attrs = CONVS[name]
    model = conv_model(x_shape, w_shape, attrs, fused=True, residual=True)
    x = RNG.standard_normal(x_shape).astype(np.float32)
    y_shape = KERNELS[("", "Conv")](x, np.zeros(w_shape, np.float32), **attrs).shape
    feeds = {"x": x, "z": RNG.standard_normal(y_shape).astype(np.float32)}
    got, want, compiled, _ = run_both(model, feeds)
    assert_identical(got, want)
    assert step_kinds(compiled) == [conv_kind(name)]


def conv_then_hard_swish(x_shape, w_shape, attrs):
    w = RNG.standard_normal(w_shape).astype(np.float32)
    b = RNG.standard_normal(w_shape[0]).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs),
             helper.make_node("HardSwish", ["c"], ["y"])]
    return model_of(nodes, [tensor("x", ["N", x_shape[1], "H", "W"])], [tensor("y", None)],
                    [("w", w), ("b", b)])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", sorted(CONVS))
def test_conv_hard_swish_is_one_step_with_the_two_nodes_bits(name, threads):
    x_shape, w_shape, attrs = CONVS[name]
    unfused = conv_then_hard_swish(x_shape, w_shape, attrs)
    fused = fuse_bias_activation(unfused)
    assert [n.op_type for n in fused.graph.node] == [CONV_HARD_SWISH]
    feeds = {"x": (RNG.standard_normal(x_shape) * 3).astype(np.float32)}
    before = kernels.get_num_threads()
    try:
        kernels.set_num_threads(threads)
        got, want, compiled, _ = run_both(fused, feeds)
        apart, _, apart_compiled, _ = run_both(unfused, feeds)
    finally:
        kernels.set_num_threads(before)
    assert_identical(got, want)
    assert_identical(got, apart)  # the activation on the convolution's output, as HardSwish
    assert [op[0] for op in compiled.ops] == [C]
    assert step_kinds(compiled) == step_kinds(apart_compiled)[:1]
    assert step_kinds(apart_compiled)[1:] == [lib.PLAN_ACTIVATION]
    # float32 convolution sums against the reference's, through a slope of at most 1.5
    np.testing.assert_allclose(got[0], reference_outputs(unfused, feeds)[0], rtol=1e-4, atol=1e-4)


def test_convolutions_are_planned_again_for_each_input_shape():
    x_shape, w_shape, attrs = CONVS["spatial"]
    model = conv_model(x_shape, w_shape, attrs)
    in_c, in_python = Plan(model, KERNELS, c_steps=C_STEPS), Plan(model, KERNELS)
    shapes = [(2, 16, 7, 9), (1, 16, 10, 4), (3, 16, 5, 11)]
    for shape in shapes + shapes[:1]:
        feeds = {"x": RNG.standard_normal(shape).astype(np.float32)}
        for _ in range(3):
            got = in_c.run(dict(feeds))
        assert_identical(got, in_python.run(dict(feeds)))
        assert [op[0] for op in program(in_c, feeds).ops] == [C]
    assert len(in_c._programs) == 3


@pytest.mark.parametrize(("group", "bias"), [(1, None), (1, "tied"), (1, "distinct"),
                                           (2, "tied")])
def test_equal_filters_give_equal_channels(group, bias):
    # _conv copies the channels of equal filters from the first of each, as the reference
    # does (where the bias of the copies is equal too): the step table copies them after it
    distinct = RNG.standard_normal((3, 10 // group, 3, 3)).astype(np.float32)
    w = distinct[[0, 1, 0, 2, 1, 1]]
    b = {None: None, "tied": np.array([1, 2, 1, 3, 2, 2], np.float32),
         "distinct": np.arange(6, dtype=np.float32)}[bias]
    inits = [("w", w)] + ([("b", b)] if b is not None else [])
    node = helper.make_node("Conv", ["x", "w"] + (["b"] if b is not None else []), ["y"],
                            pads=[1, 0, 1, 2], group=group)
    model = model_of([node], [tensor("x", [2, 10, 6, 7])], [tensor("y", None)], inits)
    feeds = {"x": RNG.standard_normal((2, 10, 6, 7)).astype(np.float32)}
    got, want, compiled, plan = run_both(model, feeds)
    assert_identical(got, want)
    assert [op[0] for op in compiled.ops] == [C]
    tied = bias != "distinct"
    assert (lib.PLAN_TIED_CHANNELS in step_kinds(compiled)) == tied
    if tied and group == 1:
        np.testing.assert_array_equal(got[0][:, 2], got[0][:, 0])
        np.testing.assert_array_equal(got[0][:, 5], got[0][:, 1])
    assert_within_bound(plan, feeds, got)


def test_global_average_pool():
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["y"])]
    model = model_of(nodes, [tensor("x", ["N", 6, "H", "W"])], [tensor("y", None)])
    for shape in [(2, 6, 5, 7), (3, 6, 1, 4)]:
        feeds = {"x": RNG.standard_normal(shape).astype(np.float32)}
        got, want, compiled, plan = run_both(model, feeds)
        assert_identical(got, want)
        assert got[0].shape == shape[:2] + (1, 1)
        assert step_kinds(compiled) == [lib.PLAN_REDUCE_LAST]
        assert_within_bound(plan, feeds, got)


@pytest.mark.parametrize(("opset", "shape", "axis"), [
    (9, (3, 10, 1, 1), 1),     # squeezenet's: the old form's default axis 1, trailing ones
    (11, (2, 7, 1), -2),
    (13, (2, 5, 1, 1), 1),     # the one-axis form over the same data
    (13, (4, 3, 6), -1),
])
def test_softmax_with_only_ones_after_its_axis_runs_in_the_step_table(opset, shape, axis):
    nodes = [helper.make_node("Softmax", ["x"], ["y"], axis=axis)]
    model = model_of(nodes, [tensor("x", list(shape))], [tensor("y", None)], opset=opset)
    feeds = {"x": (RNG.standard_normal(shape) * 4).astype(np.float32)}
    got, want, compiled, _ = run_both(model, feeds)
    assert_identical(got, want)
    assert step_kinds(compiled) == [lib.PLAN_SOFTMAX]
    np.testing.assert_allclose(got[0], reference_outputs(model, feeds)[0], rtol=1e-5, atol=1e-7)
    assert got[0].sum(axis=axis) == pytest.approx(1, rel=1e-5)


@pytest.mark.parametrize("opset", [11, 13])
def test_softmax_over_an_axis_with_more_after_it_stays_in_python(opset):
    # opset 11 normalizes over axes 1 and 2 together, opset 13 over axis 1 alone
    nodes = [helper.make_node("Softmax", ["x"], ["y"], axis=1)]
    model = model_of(nodes, [tensor("x", [2, 3, 4])], [tensor("y", None)], opset=opset)
    feeds = {"x": RNG.standard_normal((2, 3, 4)).astype(np.float32)}
    got, _, compiled, _ = run_both(model, feeds)
    assert [op[0] for op in compiled.ops] == [PY]
    np.testing.assert_allclose(got[0], reference_outputs(model, feeds)[0], rtol=1e-6)


# --- decoder kernels ----------------------------------------------------------------------
def reference_outputs(model, feeds):
    return ReferenceEvaluator(model).run(None, feeds)


@pytest.mark.parametrize("op_type", [ROTARY, ROTARY_INTERLEAVED])
def test_rotary_runs_in_the_step_table(op_type):
    nodes = [helper.make_node(op_type, ["x", "cos", "sin"], ["y"], domain=FUSED_DOMAIN)]
    model = model_of(nodes, [tensor("x", [2, 3, "S", 8]), tensor("cos", ["S", 8]),
                             tensor("sin", ["S", 8])], [tensor("y", None)],
                     functions=[rotary_function(op_type, 18)])
    for seq in (5, 1):
        angles = RNG.standard_normal((seq, 8)).astype(np.float32)
        feeds = {"x": RNG.standard_normal((2, 3, seq, 8)).astype(np.float32),
                 "cos": np.cos(angles), "sin": np.sin(angles)}
        got, want, compiled, _ = run_both(model, feeds)
        assert_identical(got, want)
        assert step_kinds(compiled) == [lib.PLAN_ROTARY]
        # x*cos - y*sin in float32, rounded in another order than the reference function body
        np.testing.assert_allclose(got[0], reference_outputs(model, feeds)[0], rtol=1e-6,
                                   atol=1e-6)


@pytest.mark.parametrize("masked", [False, True])
def test_grouped_attention_runs_in_the_step_table(masked):
    op_type = GROUPED_ATTENTION_MASKED if masked else GROUPED_ATTENTION
    names = ["q", "k", "v", "kv_heads"] + (["mask"] if masked else [])
    batch, heads, kv, head = 2, 6, 3, 4
    node = helper.make_node(op_type, names, ["y"], domain=FUSED_DOMAIN, scale=0.375)
    inputs = [tensor("q", [batch, heads, "S", head]), tensor("k", [batch, kv, "T", head]),
              tensor("v", [batch, kv, "T", head + 1])]
    if masked:
        inputs.append(tensor("mask", [batch, 1, "S", "T"]))
    table = (np.arange(heads) // (heads // kv)).astype(np.int64)
    model = model_of([node], inputs, [tensor("y", None)], [("kv_heads", table)],
                     functions=[grouped_attention_function(op_type, 18)])
    for seq, total in ((3, 7), (1, 8)):
        feeds = {"q": RNG.standard_normal((batch, heads, seq, head)).astype(np.float32),
                 "k": RNG.standard_normal((batch, kv, total, head)).astype(np.float32),
                 "v": RNG.standard_normal((batch, kv, total, head + 1)).astype(np.float32)}
        if masked:
            causal = np.arange(total)[None, :] <= np.arange(seq)[:, None] + total - seq
            feeds["mask"] = np.broadcast_to(np.where(causal, 0, -np.inf),
                                            (batch, 1, seq, total)).astype(np.float32)
        got, want, compiled, _ = run_both(model, feeds)
        assert_identical(got, want)
        assert got[0].shape == (batch, seq, heads, head + 1)
        assert step_kinds(compiled) == [lib.PLAN_GQA]
        # softmax and the weighted sum in float32, summed in another order than NumPy's
        np.testing.assert_allclose(got[0], reference_outputs(model, feeds)[0], rtol=1e-5,
                                   atol=1e-6)


# --- masks: Cast, And/Or/Xor, Where -------------------------------------------------------
def test_an_attention_mask_built_from_a_padding_mask():
    # as the Llama export builds it: padding (int64) cast to bool, and-ed with a causal
    # table, then Where(keep, 0, -inf) into an additive float mask
    causal = np.tril(np.ones((4, 6), bool), k=2)[None, None]
    nodes = [helper.make_node("Cast", ["padding"], ["keep"], to=TensorProto.BOOL),
             helper.make_node("Unsqueeze", ["keep", "axes"], ["keep4"]),
             helper.make_node("And", ["causal", "keep4"], ["both"]),
             helper.make_node("Where", ["both", "zero", "fill"], ["mask"]),
             helper.make_node("Cast", ["mask"], ["wide"], to=TensorProto.DOUBLE),
             helper.make_node("Xor", ["both", "keep4"], ["x"]),
             helper.make_node("Or", ["x", "causal"], ["o"])]
    model = model_of(nodes, [tensor("padding", ["B", 6], I64)],
                     [tensor("mask", None), tensor("wide", None), tensor("o", None)],
                     [("causal", causal), ("axes", np.array([1, 2], np.int64)),
                      ("zero", np.zeros((), np.float32)),
                      ("fill", np.array(-np.inf, np.float32))])
    for batch in (3, 1):
        feeds = {"padding": RNG.integers(-1, 2, (batch, 6)).astype(np.int64)}
        got, want, compiled, _ = run_both(model, feeds)
        assert_identical(got, want)
        assert_identical(got, reference_outputs(model, feeds))
        assert got[0].shape == (batch, 1, 4, 6)
        assert [op[0] for op in compiled.ops] == [C]
        assert lib.PLAN_CAST in step_kinds(compiled) and lib.PLAN_SELECT in step_kinds(compiled)


@pytest.mark.parametrize(("source", "target"), [
    (np.int64, np.float32), (np.float64, np.float32), (np.float32, np.bool_),
    (np.int32, np.int64), (np.bool_, np.float64)])
def test_cast_runs_in_the_step_table(source, target):
    values = np.array([[0, -0.0, 1.5, -7, 3e38, np.nan], [2**53 + 1, -1, 0.25, 1e-45, 8, 9]])
    if np.dtype(source).kind in "iub":
        values = np.nan_to_num(values, posinf=0, neginf=0).clip(-2**31, 2**31 - 1)
    x = values.astype(source)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(target))
    nodes = [helper.make_node("Cast", ["x"], ["y"], to=elem)]
    model = model_of(nodes, [tensor("x", [2, 6], helper.np_dtype_to_tensor_dtype(x.dtype))],
                     [tensor("y", None, elem)])
    got, want, compiled, _ = run_both(model, {"x": x})
    assert_identical(got, want)
    assert_identical(got, reference_outputs(model, {"x": x}))
    assert step_kinds(compiled) == [lib.PLAN_CAST]


def test_float_to_int_cast_stays_in_python():
    nodes = [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.INT64)]
    model = model_of(nodes, [tensor("x", [2, 3])], [tensor("y", None, I64)])
    feeds = {"x": np.array([[1.5, -2.5, 7], [0, 3, -1]], np.float32)}
    got, want, compiled, _ = run_both(model, feeds)
    assert_identical(got, want)
    assert [op[0] for op in compiled.ops] == [PY]


# --- what a compiled run keeps ------------------------------------------------------------
def test_a_compiled_run_keeps_no_feed_or_output_alive():
    import gc
    import weakref

    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Neg", ["r"], ["n"]),  # a Python step between C steps
             helper.make_node("Sigmoid", ["n"], ["y"])]
    model = model_of(nodes, [tensor("x", [3, 5])], [tensor("y", None)])
    plan = Plan(model, KERNELS, c_steps=C_STEPS)
    for _ in range(2):
        plan.run({"x": RNG.standard_normal((3, 5)).astype(np.float32)})
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    (y,) = plan.run({"x": x})
    compiled = program(plan, {"x": x})
    assert [op[0] for op in compiled.ops] == [C, PY, C]
    watched = [weakref.ref(x), weakref.ref(y)]
    del x, y
    gc.collect()
    assert [ref() for ref in watched] == [None, None]


@pytest.fixture
def two_threads():
    before = kernels.get_num_threads()
    kernels.set_num_threads(2)
    yield
    kernels.set_num_threads(before)


@pytest.mark.parametrize("name", sorted(CONVS))
def test_convolutions_at_two_threads(name, two_threads):
    # the oneDNN primitive is planned per thread count: the table keeps the one recorded
    x_shape, w_shape, attrs = CONVS[name]
    model = conv_model(x_shape, w_shape, attrs, fused=True)
    feeds = {"x": RNG.standard_normal(x_shape).astype(np.float32)}
    got, want, compiled, _ = run_both(model, feeds)
    assert_identical(got, want)
    assert step_kinds(compiled) == [conv_kind(name)]
