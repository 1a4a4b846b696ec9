"""Non-contiguous views (slices, transposes, stride-0 broadcasts, negative strides) into every
fast kernel of optimized/cpu.py and into fused elementwise chains (issue 12: a chain once read
its view operands through pointers into copies that were already freed, and gave wrong answers
that changed from run to run).

Each case is judged twice: bit for bit against the same kernel given C-contiguous copies of the
same values (a kernel must not care how its input is laid out), and against the reference op.
Views are built over arrays padded with NaN, so a read outside the view shows.  Arrays are a
few KiB: numpy keeps freed blocks under 1 KiB in a cache of its own, where ASan
(csrc/asan_check.sh) could not see a read after free.
"""
import ast
import gc
import pathlib

import numpy as np
import pytest
from onnx import TensorProto, helper

from optimized import InferenceSession, SessionOptions, chains, kernels
from optimized.cpu import KERNELS
from optimized.passes.fuse_bias_activation import conv_hard_swish_function
from optimized.passes.gate_up_halves import silu_mul_halves_function
from optimized.passes.gqa_fusion import causal_padding_mask_function, grouped_attention_function
from optimized.passes.rotary_fusion import rotary_function
from optimized.passes.silu_mlp_fusion import fuse_silu_mlp
from optimized.passes.weight_packing import packed_matmul_function
from optimized.plan import Plan
from reference import ReferenceEvaluator
from tests.models.exporter_style import (
    MobileVitConfig,
    Phi3MlpConfig,
    build_mobilevit_block,
    build_phi3_mlp,
    random_feeds,
)

MS = "com.microsoft"
F = TensorProto.FLOAT
VIEWS = ["sliced", "transposed", "broadcast", "negative"]


def as_view(values: np.ndarray, kind: str) -> np.ndarray:
    """A non-contiguous view of `kind` holding `values`; for "broadcast", the first entry along
    the last axis longer than 1, repeated with stride 0 over that axis.  `values` must hold
    more than one element."""
    values = np.asarray(values)
    fill = np.nan if values.dtype.kind == "f" else 0xA5  # what a read outside the view finds
    if kind == "sliced":  # every other row of axis 0, and an offset on the other axes
        big = np.full((2 * values.shape[0],) + tuple(s + 1 for s in values.shape[1:]), fill,
                      values.dtype)
        index = (slice(None, None, 2),) + (slice(1, None),) * (values.ndim - 1)
        big[index] = values
        view = big[index]
    elif kind == "transposed":
        view = np.ascontiguousarray(values.transpose()).transpose()
        if view.flags.c_contiguous:  # one axis longer than 1: a row of a transposed matrix
            pairs = np.ascontiguousarray(np.stack([values.ravel(), np.full(values.size, fill,
                                                                           values.dtype)], 1))
            view = pairs.T[0].reshape(values.shape)
    elif kind == "broadcast":
        axis = max(a for a, n in enumerate(values.shape) if n > 1)
        view = np.broadcast_to(values[(slice(None),) * axis + (slice(0, 1),)], values.shape)
    elif kind == "negative":
        view = np.flip(np.ascontiguousarray(np.flip(values)))
    else:
        raise ValueError(kind)
    assert not view.flags.c_contiguous, (kind, values.shape)
    return view


def rand(seed, *shape, low=None):
    """Standard-normal float32; with `low`, magnitudes in [low, 2] with random signs."""
    rng = np.random.default_rng(seed)
    if low is None:
        return rng.standard_normal(shape).astype(np.float32)
    return (rng.uniform(low, 2.0, shape) * rng.choice([-1, 1], shape)).astype(np.float32)


# every kernel in cpu.KERNELS: its inputs (None for an omitted optional input) and attributes;
# images and matrices are non-square so an axis mix-up shows
X4, XR = (2, 3, 9, 11), (4, 6, 10)
NBITS_K, NBITS_N, NBITS_BLOCK = 40, 7, 16  # 3 blocks per column, the last one partial


def codes(seed, *shape):
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


CASES = {
    ("", "Add"): ([rand(0, *X4), rand(1, *X4)], {}),
    ("", "Sub"): ([rand(0, *X4), rand(1, 3, 1, 11)], {}),
    ("", "Mul"): ([rand(0, *X4), rand(1, *X4)], {}),
    ("", "Div"): ([rand(0, *X4), rand(1, *X4, low=0.5)], {}),
    ("", "Relu"): ([rand(0, *X4)], {}),
    ("", "Sigmoid"): ([rand(0, *X4)], {}),
    ("", "Tanh"): ([rand(0, *X4)], {}),
    ("", "LeakyRelu"): ([rand(0, *X4)], {"alpha": 0.2}),
    ("", "HardSigmoid"): ([rand(0, *X4)], {"alpha": 0.3, "beta": 0.4}),
    ("", "HardSwish"): ([rand(0, *X4)], {}),
    ("", "Gelu"): ([rand(0, *X4)], {"approximate": "tanh"}),
    (MS, "FastGelu"): ([rand(0, *XR), rand(1, 10)], {}),
    (MS, "Gelu"): ([rand(0, *X4)], {}),
    (MS, "MultiHeadAttention"): ([rand(0, 2, 5, 12), rand(1, 2, 7, 12), rand(2, 2, 7, 12), None,
                                  None, rand(3, 2, 3, 5, 7)], {"num_heads": 3}),
    ("", "Gemm"): ([rand(0, 6, 9), rand(1, 7, 9), rand(2, 7)],
                   {"alpha": 0.5, "beta": 2.0, "transB": 1}),
    (MS, "FusedGemm"): ([rand(0, 9, 6), rand(1, 9, 7), rand(2, 6, 7)],
                        {"transA": 1, "activation": "Relu"}),
    ("", "MatMul"): ([rand(0, 2, 6, 9), rand(1, 9, 7)], {}),
    (MS, "FusedMatMul"): ([rand(0, 2, 6, 9), rand(1, 2, 7, 9)], {"alpha": 0.5, "transB": 1}),
    ("", "Conv"): ([rand(0, 2, 4, 9, 11), rand(1, 6, 2, 3, 3), rand(2, 6)],
                   {"pads": [1, 1, 1, 1], "strides": [1, 2], "group": 2}),
    (MS, "FusedConv"): ([rand(0, 2, 4, 9, 11), rand(1, 5, 4, 3, 2), rand(2, 5),
                         rand(3, 2, 5, 9, 10)], {"activation": "Relu", "pads": [1, 0, 1, 0]}),
    ("", "MaxPool"): ([rand(0, *X4)], {"kernel_shape": [3, 2], "strides": [2, 1],
                                       "pads": [1, 0, 1, 1]}),
    ("", "AveragePool"): ([rand(0, *X4)], {"kernel_shape": [2, 3], "strides": [1, 2],
                                           "pads": [1, 1, 0, 1], "count_include_pad": 1}),
    ("", "GlobalAveragePool"): ([rand(0, *X4)], {}),
    ("", "Softmax"): ([rand(0, *XR)], {"axis": -1}),
    ("", "LayerNormalization"): ([rand(0, *XR), rand(1, 10), rand(2, 10)], {"epsilon": 1e-3}),
    ("", "RMSNormalization"): ([rand(0, *XR), rand(1, 10)], {"epsilon": 1e-3}),
    ("", "SimplifiedLayerNormalization"): ([rand(0, *XR), rand(1, 10)], {"epsilon": 1e-3}),
    (MS, "SimplifiedLayerNormalization"): ([rand(0, *XR), rand(1, 10)], {"epsilon": 1e-3}),
    (MS, "SkipSimplifiedLayerNormalization"): ([rand(0, *XR), rand(1, *XR), rand(2, 10),
                                                rand(3, 10)], {"epsilon": 1e-3}),
    ("onnx_parity.fused", "SiluMul"): ([rand(0, *XR), rand(1, *XR)], {}),
    ("onnx_parity.fused", "SiluMulHalves"): ([rand(0, 2, 3, 14)], {}),
    # 4-bit weights: B (N, blocks, block_size / 2) bytes, scales and packed zero points per block
    (MS, "MatMulNBits"): ([rand(0, 2, 5, NBITS_K), codes(1, NBITS_N, 3, NBITS_BLOCK // 2),
                          rand(2, NBITS_N * 3), codes(3, NBITS_N * 2), None, rand(4, NBITS_N)],
                         {"K": NBITS_K, "N": NBITS_N, "bits": 4, "block_size": NBITS_BLOCK}),
}
# decoder attention: heads (B, N, S, H) = (2, 4, 5, 8), a K/V cache of 7 over 2 KV heads
FUSED = "onnx_parity.fused"
COS_SIN = [rand(5, 1, 1, 5, 8), rand(6, 1, 1, 5, 8)]
HEAD_TABLE = np.array([0, 0, 1, 1], np.int64)
CASES.update({
    (FUSED, "Rotary"): ([rand(0, 2, 4, 5, 8)] + COS_SIN, {}),
    (FUSED, "RotaryInterleaved"): ([rand(0, 2, 4, 5, 8)] + COS_SIN, {}),
    (FUSED, "GroupedAttention"): ([rand(0, 2, 4, 5, 8), rand(1, 2, 2, 7, 8), rand(2, 2, 2, 7, 8),
                                   HEAD_TABLE], {"scale": 0.35}),
    (FUSED, "GroupedAttentionMasked"): ([rand(0, 2, 4, 5, 8), rand(1, 2, 2, 7, 8),
                                         rand(2, 2, 2, 7, 8), HEAD_TABLE, rand(3, 2, 1, 5, 7)],
                                        {"scale": 0.35}),
    # (B, S, N*H) with caches (positions, H/2) read at position_ids (B, S)
    (FUSED, "PackedMatMul"): ([rand(0, 2, 3, 12), rand(1, 2, 12, 16)], {}),
    (FUSED, "CausalPaddingMask"): ([np.array([[1, 1, 0, 1, 1], [0, 1, 1, 1, 1]], np.int64),
                                    np.array(2, np.int64), np.array(5, np.int64)],
                                   {"fill": -3.0e38}),
    (FUSED, "ConvHardSwish"): ([rand(0, 2, 4, 9, 11), rand(1, 5, 4, 3, 2), rand(2, 5)],
                               {"pads": [1, 0, 1, 0], "strides": [2, 1]}),
    (MS, "RotaryEmbedding"): ([rand(0, 2, 5, 32), np.array([[0, 1, 2, 3, 4], [3, 4, 5, 6, 7]]),
                               rand(1, 9, 4), rand(2, 9, 4)], {"num_heads": 4}),
    # a decode step of 2 tokens after 5 cached ones: seqlens_k = total - 1
    (MS, "GroupQueryAttention"): ([rand(0, 2, 2, 32), rand(1, 2, 2, 16), rand(2, 2, 2, 16),
                                   rand(3, 2, 2, 5, 8), rand(4, 2, 2, 5, 8),
                                   np.array([6, 6], np.int32), np.array(7, np.int32)],
                                  {"num_heads": 4, "kv_num_heads": 2}),
})
# products accumulate in another order than the reference's
TOLERANCE = {"Gemm": 1e-5, "MatMul": 1e-5, "Conv": 1e-5, "ConvHardSwish": 1e-5,
             "MatMulNBits": 1e-5,
             "GroupedAttention": 1e-5, "GroupedAttentionMasked": 1e-5,
             "GroupQueryAttention": 1e-5}


# fused ops of optimized/passes, model-local functions: the reference runs their bodies
BODIES = {
    ("onnx_parity.fused", "SiluMul"): lambda gate, up: [
        helper.make_node("Sigmoid", [gate], ["s"]), helper.make_node("Mul", [gate, "s"], ["a"]),
        helper.make_node("Mul", ["a", up], ["y"])],
}


# fused ops whose passes write their model-local function: the reference runs that body
FUNCTIONS = {
    (FUSED, "ConvHardSwish"): lambda: conv_hard_swish_function(23),
    (FUSED, "Rotary"): lambda: rotary_function("Rotary", 23),
    (FUSED, "RotaryInterleaved"): lambda: rotary_function("RotaryInterleaved", 23),
    (FUSED, "GroupedAttention"): lambda: grouped_attention_function("GroupedAttention", 23),
    (FUSED, "GroupedAttentionMasked"): lambda: grouped_attention_function(
        "GroupedAttentionMasked", 23),
    (FUSED, "PackedMatMul"): lambda: packed_matmul_function(23),
    (FUSED, "CausalPaddingMask"): lambda: causal_padding_mask_function(23),
    (FUSED, "SiluMulHalves"): lambda: silu_mul_halves_function(23),
}


def reference(key, inputs, attrs):
    domain, op_type = key
    names = [f"in{i}" if v is not None else "" for i, v in enumerate(inputs)]
    nodes = (BODIES[key](*names) if key in BODIES
             else [helper.make_node(op_type, names, ["y"], domain=domain, **attrs)])
    graph = helper.make_graph(
        nodes, "t",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for n, v in zip(names, inputs) if v is not None],
        [helper.make_empty_tensor_value_info("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23),
                                                    helper.make_opsetid(MS, 1),
                                                    helper.make_opsetid(FUSED, 1)])
    if key in FUNCTIONS:
        model.functions.append(FUNCTIONS[key]())
    feeds = {n: np.ascontiguousarray(v) for n, v in zip(names, inputs) if v is not None}
    return ReferenceEvaluator(model, check=False).run(None, feeds)[0]


def fast(key, inputs, attrs):
    result = KERNELS[key](*inputs, **attrs)
    assert result is not NotImplemented, f"{key} fell back to the reference op on views"
    return result[0] if isinstance(result, (tuple, list)) else result  # the first output


def test_every_fast_kernel_has_a_view_case():
    assert set(KERNELS) - set(CASES) == set()


@pytest.mark.parametrize("kind", VIEWS)
@pytest.mark.parametrize("key", sorted(set(CASES) & set(KERNELS)),
                         ids=lambda k: f"{k[0] or 'ai.onnx'}.{k[1]}")
def test_fast_kernel_on_views(key, kind):
    inputs, attrs = CASES[key]
    # a one-element array (a scalar such as total_sequence_length) has no non-contiguous view
    views = [v if v is None or v.size == 1 else as_view(v, kind) for v in inputs]
    copies = [None if v is None else np.ascontiguousarray(v) for v in views]
    got = fast(key, views, attrs)
    np.testing.assert_array_equal(got, fast(key, copies, attrs))
    tol = TOLERANCE.get(key[1].removeprefix("Fused"), 2e-6)
    np.testing.assert_allclose(got, reference(key, copies, attrs), rtol=tol, atol=tol)
    for view, copy in zip(views, copies):  # inputs are read, never written
        if view is not None:
            np.testing.assert_array_equal(view, copy)


# the GEMV path of the same kernels (csrc/gemv.c): up to cpu.GEMV_ROWS_UP_TO rows of A
GEMV_CASES = {
    ("", "Gemm"): ([rand(0, 3, 9), rand(1, 7, 9), rand(2, 7)],
                   {"alpha": 0.5, "beta": 2.0, "transB": 1}),
    (MS, "FusedGemm"): ([rand(0, 9, 1), rand(1, 9, 7), rand(2, 7)],
                        {"transA": 1, "activation": "Relu"}),
    ("", "MatMul"): ([rand(0, 2, 2, 9), rand(1, 9, 7)], {}),
    (MS, "FusedMatMul"): ([rand(0, 3, 9), rand(1, 7, 9)], {"alpha": 0.5, "transB": 1}),
}


@pytest.mark.parametrize("kind", VIEWS)
@pytest.mark.parametrize("key", sorted(GEMV_CASES), ids=lambda k: f"{k[0] or 'ai.onnx'}.{k[1]}")
def test_gemv_path_on_views(key, kind):
    from optimized.cpu import gemv_rows

    inputs, attrs = GEMV_CASES[key]
    assert gemv_rows(inputs[0].shape, inputs[1].ndim, attrs.get("transA", 0)) > 0
    views = [as_view(v, kind) for v in inputs]
    copies = [np.ascontiguousarray(v) for v in views]
    got = fast(key, views, attrs)
    np.testing.assert_array_equal(got, fast(key, copies, attrs))
    np.testing.assert_allclose(got, reference(key, copies, attrs), rtol=1e-5, atol=1e-5)
    for view, copy in zip(views, copies):
        np.testing.assert_array_equal(view, copy)


# --- fused chains --------------------------------------------------------------------------

SHAPE = (2, 3, 8, 10)
# (op, side shape or None for a unary member, value on the left); every side is a graph input,
# so the chain gets exactly the arrays fed to the plan
CHAIN = [("Mul", SHAPE, True), ("Sigmoid", None, True), ("Sub", (3, 1, 1), False),
         ("Add", (10,), True), ("Div", SHAPE, True), ("Tanh", None, True), ("Mul", SHAPE, False)]


def chain_model(members):
    nodes, inputs, value = [], [helper.make_tensor_value_info("x", F, SHAPE)], "x"
    for i, (op_type, side_shape, value_left) in enumerate(members):
        out = f"v{i}" if i < len(members) - 1 else "y"
        if side_shape is None:
            nodes.append(helper.make_node(op_type, [value], [out]))
        else:
            inputs.append(helper.make_tensor_value_info(f"s{i}", F, side_shape))
            pair = [value, f"s{i}"] if value_left else [f"s{i}", value]
            nodes.append(helper.make_node(op_type, pair, [out]))
        value = out
    graph = helper.make_graph(nodes, "chain", inputs, [helper.make_tensor_value_info("y", F, SHAPE)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])


def chain_feeds(members, seed):
    feeds = {"x": rand(seed, *SHAPE, low=0.5)}
    for i, (_, side_shape, _) in enumerate(members):
        if side_shape is not None:
            feeds[f"s{i}"] = rand(seed + i + 1, *side_shape, low=0.5)
    return feeds


def viewed(feeds, kind, where):
    """The feeds with the chain's first value ("first"), its sides ("sides") or all as views;
    a side of one element has no non-contiguous view and stays as it is."""
    chosen = {"first": ["x"], "sides": [n for n in feeds if n != "x"], "all": list(feeds)}[where]
    return {n: as_view(v, kind) if n in chosen and v.size > 1 else v for n, v in feeds.items()}


@pytest.mark.parametrize("where", ["first", "sides", "all"])
@pytest.mark.parametrize("kind", VIEWS)
def test_fused_chain_on_views(kind, where):
    model = chain_model(CHAIN)
    plan = Plan(model, KERNELS, fuse_chains=True)
    assert [s.node.op_type for s in plan.steps] == ["ElementwiseChain"]
    unfused = Plan(model, KERNELS, fuse_chains=False)
    for seed in (0, 1):  # a second run must not reuse anything of the first
        feeds = viewed(chain_feeds(CHAIN, seed), kind, where)
        copies = {n: np.ascontiguousarray(v) for n, v in feeds.items()}
        got = plan.run(feeds)[0]
        # the fused kernel's exp/tanh and its evaluation order differ from the node-by-node
        # kernels by a few ulps, amplified by the Div
        np.testing.assert_allclose(got, unfused.run(copies)[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got, ReferenceEvaluator(model).run(None, copies)[0],
                                   rtol=1e-5, atol=1e-6)
        for name, value in feeds.items():
            np.testing.assert_array_equal(value, copies[name])


@pytest.mark.parametrize("kind", VIEWS)
def test_fused_chain_called_directly_with_views(kind):
    # FusedChain itself, not through a plan: first value and sides as views
    model = chain_model(CHAIN)
    step, = Plan(model, KERNELS, fuse_chains=True).steps
    feeds = chain_feeds(CHAIN, 3)
    names = ["x"] + [f"s{i}" for i, m in enumerate(CHAIN) if m[1] is not None]
    views = [as_view(feeds[n], kind) if feeds[n].size > 1 else feeds[n] for n in names]
    copies = [np.ascontiguousarray(v) for v in views]
    expected = step.run.one_by_one(*copies)[0]
    np.testing.assert_allclose(step.run(*views)[0], expected, rtol=1e-5, atol=1e-6)


def test_fused_chain_keeps_read_only_sides_across_runs():
    # sides that come back as the same read-only arrays (initializers) keep their pointer table
    # between runs; a view among them is copied each run and never cached
    model = chain_model(CHAIN)
    plan = Plan(model, KERNELS, fuse_chains=True)
    unfused = Plan(model, KERNELS, fuse_chains=False)
    sides = {n: v for n, v in chain_feeds(CHAIN, 4).items() if n != "x"}
    for v in sides.values():
        v.flags.writeable = False
    sides["s6"] = as_view(sides["s6"], "transposed")
    for seed in range(3):
        feeds = {"x": rand(10 + seed, *SHAPE, low=0.5), **sides}
        np.testing.assert_allclose(plan.run(feeds)[0], unfused.run(feeds)[0], rtol=1e-5,
                                   atol=1e-6)


# --- exporter-style models -----------------------------------------------------------------

MODELS = {
    "phi3_mlp_split": lambda: build_phi3_mlp(Phi3MlpConfig(chunk="split")),
    "phi3_mlp_slice": lambda: build_phi3_mlp(Phi3MlpConfig(chunk="slice")),
    "mobilevit_block": lambda: build_mobilevit_block(MobileVitConfig()),
}


@pytest.mark.parametrize("level", [0, 1, 2, 99])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_exporter_style_model_matches_reference(name, level):
    model = MODELS[name]()
    options = SessionOptions()
    options.graph_optimization_level = level
    session = InferenceSession(model.SerializeToString(), options)
    reference_model = ReferenceEvaluator(model)
    for seed in (0, 1):
        feeds = random_feeds(model, seed)
        expected = reference_model.run(None, feeds)[0]
        got = session.run(None, feeds)[0]
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name, receiver", [("phi3_mlp_split", "fast"),
                                            ("mobilevit_block", "chain")])
def test_exporter_style_models_feed_views_into_fast_steps(name, receiver):
    # what makes the models regression tests: at level 2 a fast step receives a non-contiguous
    # view (Phi-3's Split halves, into a fused chain or a fusion pass's fast kernel; MobileViT's
    # transposed Reshape, into a fused chain)
    options = SessionOptions()
    options.graph_optimization_level = 2
    model = InferenceSession(MODELS[name]().SerializeToString(), options).optimized_model
    if name.startswith("phi3"):  # level 2 now reads the halves in place (gate_up_halves):
        model = fuse_silu_mlp(MODELS[name]())  # SiluMul of the Split's halves, as before it
    plan = Plan(model, KERNELS, fuse_chains=True)
    seen = []
    for step in plan.steps:
        if step.kernel == "fast" and (receiver == "fast" or isinstance(step.run, chains.FusedChain)):
            def recording(*values, _run=step.run):
                seen.extend(isinstance(v, np.ndarray) and not v.flags.c_contiguous for v in values)
                return _run(*values)
            step.run = recording
    plan.run(random_feeds(model))
    assert any(seen)


def test_pointer_table_keeps_what_it_points_into_alive():
    # the table is the only owner of these copies: they must outlive every other reference
    table = kernels.PointerTable(4, {1: np.arange(600, dtype=np.float32)[::-1].copy(),
                                     3: np.full(600, 2.5, np.float32)})
    gc.collect()
    clobber = [np.full(600, -1.0, np.float32) for _ in range(8)]  # would reuse freed blocks
    assert table.table[0] == kernels.ffi.NULL and table.table[2] == kernels.ffi.NULL
    assert [table.table[1][i] for i in (0, 599)] == [599.0, 0.0]
    assert table.table[3][300] == 2.5
    assert all((c == -1.0).all() for c in clobber)
    with pytest.raises(ValueError, match="C-contiguous"):
        kernels.PointerTable(2, {0: np.zeros((4, 6), np.float32).T})


def test_pointers_reach_c_only_through_the_kernels_module():
    # the structural guard: a bare pointer (ffi.cast) keeps nothing alive, so optimized/ never
    # makes one, and only optimized/kernels.py calls into the C library, where every pointer
    # is a from_buffer cdata passed straight into the call or held by a PointerTable
    root = pathlib.Path(__file__).resolve().parents[2] / "optimized"
    offenders = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            target = ast.unparse(node.func)
            if target.endswith("ffi.cast") or (
                    (target.startswith("lib.") or ".lib." in target) and path.name != "kernels.py"):
                offenders.append(f"{path.relative_to(root.parent)}:{node.lineno}: {target}")
    assert offenders == []
