"""Weight packing (optimized/passes/weight_packing.py, level 99): a MatMul's constant B becomes
the packed GEMM's panels, held instead of B, and every consumer still gets B's exact values."""
from __future__ import annotations

import gc
import weakref

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import optimized
from optimized import kernels
from optimized.passes import optimize
from optimized.passes.weight_packing import PACKED_MATMUL
from reference import ReferenceEvaluator
from reference.weights import WeightStore, detach_initializers

ROWS, K, N = 37, 48, 64  # rows of A in the packed GEMM's range; N a multiple of 16
ALL = optimized.GraphOptimizationLevel.ORT_ENABLE_ALL
EXTENDED = optimized.GraphOptimizationLevel.ORT_ENABLE_EXTENDED


def matmul_model(a_shape=(2, ROWS, K), k=K, n=N, extra_nodes=(), extra_outputs=(),
                 weight_is_input=False) -> onnx.ModelProto:
    w = np.random.default_rng(0).standard_normal((k, n), dtype=np.float32)
    w[0, 0], w[1, 1] = -0.0, np.float32(1e-42)  # a signed zero and a subnormal, kept exactly
    y_shape = list(a_shape[:-1]) + [n]
    nodes = [helper.make_node("MatMul", ["a", "w"], ["y"], name="mm"), *extra_nodes]
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, list(a_shape))]
    if weight_is_input:
        inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [k, n]))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape), *extra_outputs]
    graph = helper.make_graph(nodes, "packed", inputs, outputs, [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def feeds(a_shape=(2, ROWS, K)):
    return {"a": np.random.default_rng(1).standard_normal(a_shape, dtype=np.float32)}


def session(model, level=ALL, threads=1, **options):
    opts = optimized.SessionOptions()
    opts.graph_optimization_level = level
    opts.intra_op_num_threads = threads
    for key, value in options.items():
        setattr(opts, key, value)
    return optimized.InferenceSession(model.SerializeToString(), opts)


def op_types(model):
    return [n.op_type for n in model.graph.node]


def test_a_weight_only_matmuls_read_becomes_panels_and_leaves_the_store():
    model = matmul_model()
    store = WeightStore()
    detach_initializers(model, store)
    original = weakref.ref(store.arrays["0"])
    packed = optimize(model, int(ALL), store)
    assert op_types(packed) == [PACKED_MATMUL]
    [panels] = packed.graph.initializer
    assert list(panels.dims) == [N // 16, K, 16]
    gc.collect()
    assert original() is None, "the original weight is still alive beside its panels"
    assert len(store.arrays) == 1


def test_a_model_for_the_cuda_provider_keeps_its_weights_unpacked():
    """The CUDA provider has no PackedMatMul kernel: packing would send the MatMul to the
    host, so a session on it is optimized without the CPU-only passes."""
    for for_cpu, expected in ((True, [PACKED_MATMUL]), (False, ["MatMul"])):
        model, store = matmul_model(), WeightStore()
        detach_initializers(model, store)
        assert op_types(optimize(model, int(ALL), store, for_cpu=for_cpu)) == expected


def test_a_session_optimizes_for_the_providers_it_got(monkeypatch):
    """The CUDA provider when it is really selected (no GPU here: a stand-in for select)."""
    from optimized import providers

    chosen = {"CUDAExecutionProvider": dict(providers.CUDA_OPTIONS), "CPUExecutionProvider": {}}
    monkeypatch.setattr(providers, "select", lambda *args: (list(chosen), chosen))
    monkeypatch.setattr(providers, "make_plan", lambda *args: None)
    assert op_types(session(matmul_model()).optimized_model) == ["MatMul"]


def test_the_rewritten_model_computes_bit_for_bit_what_the_original_does():
    """The reference runs PackedMatMul's function body (Transpose, Flatten: B unpacked by
    copies) and then the same MatMul: the same bits as the original model."""
    model = matmul_model()
    packed = session(model).optimized_model
    assert op_types(packed) == [PACKED_MATMUL]
    [ours] = ReferenceEvaluator(packed).run(None, feeds())
    [theirs] = ReferenceEvaluator(model).run(None, feeds())
    np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32))


@pytest.mark.parametrize("threads", [1, 2])
def test_runs_match_the_unpacked_plan_at_every_thread_count(threads):
    """Level 2 takes the same packed GEMM over B packed on its first run: the same bits, on
    the first (Python) run and on the compiled runs after it."""
    model = matmul_model()
    [expected] = session(model, EXTENDED, threads).run(None, feeds())
    packed = session(model, ALL, threads)
    for _ in range(3):
        [y] = packed.run(None, feeds())
        np.testing.assert_array_equal(y, expected)
    [reference] = ReferenceEvaluator(model).run(None, feeds())
    np.testing.assert_allclose(y, reference, rtol=1e-5, atol=1e-5)


def test_check_mode_iter_results_and_other_rows():
    model = matmul_model()
    checked = session(model, check_nodes=True)
    [y] = checked.run(None, feeds())
    results = {r.name: r.value for r in session(model).iter_results(feeds())}
    np.testing.assert_array_equal(results["y"], y)
    # the session refuses feeds of other shapes; the kernel itself takes any rows of A (a
    # single row, the GEMV's case; more than the packed range; a vector)
    packed = session(model)
    w = numpy_helper.to_array(model.graph.initializer[0]).astype(np.float64)
    rng = np.random.default_rng(2)
    for shape in ((1, K), (600, K), (3, 1, K), (K,)):
        a = rng.standard_normal(shape, dtype=np.float32)
        np.testing.assert_allclose(optimized_kernel(a, packed), a @ w, rtol=1e-4, atol=1e-4)


def optimized_kernel(a, packed_session):
    from optimized.cpu import KERNELS
    from optimized.passes.weight_packing import FUSED_DOMAIN

    [panels] = packed_session.optimized_model.graph.initializer
    return KERNELS[(FUSED_DOMAIN, PACKED_MATMUL)](a, numpy_helper.to_array(panels))


@pytest.mark.parametrize("case", ["one_row", "free_rows", "read_by_add", "graph_output",
                                  "graph_input", "n_not_16", "a_is_the_weight_side"])
def test_weights_another_consumer_needs_stay_as_they_are(case):
    extra = []
    kwargs = {}
    if case == "one_row":
        kwargs["a_shape"] = (1, K)
    elif case == "free_rows":
        kwargs["a_shape"] = ("seq", K)
    elif case == "read_by_add":
        extra = [helper.make_node("Add", ["w", "w"], ["w2"])]
        kwargs["extra_outputs"] = [helper.make_tensor_value_info("w2", TensorProto.FLOAT, [K, N])]
    elif case == "graph_output":
        kwargs["extra_outputs"] = [helper.make_tensor_value_info("w", TensorProto.FLOAT, [K, N])]
    elif case == "graph_input":
        kwargs["weight_is_input"] = True
    elif case == "n_not_16":
        kwargs["n"] = N + 8
    elif case == "a_is_the_weight_side":  # w read as A too (w @ w needs a square w)
        kwargs["n"] = K
        extra = [helper.make_node("MatMul", ["w", "w"], ["ww"])]
        kwargs["extra_outputs"] = [helper.make_tensor_value_info("ww", TensorProto.FLOAT, [K, K])]
    model = matmul_model(extra_nodes=extra, **kwargs)
    packed = session(model).optimized_model
    assert PACKED_MATMUL not in op_types(packed)
    assert "w" in {t.name for t in packed.graph.initializer}


def test_overriding_an_initializer_input_still_works():
    model = matmul_model(weight_is_input=True)
    sess = session(model)
    w = np.full((K, N), 0.5, np.float32)
    [y] = sess.run(None, {**feeds(), "w": w})
    np.testing.assert_allclose(y, feeds()["a"] @ w, rtol=1e-5, atol=1e-4)


@settings(max_examples=60, deadline=None)
@given(k=st.integers(1, 40), n=st.integers(1, 70), trans_b=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_panels_unpack_to_b_bit_for_bit(k, n, trans_b, seed):
    bits = np.random.default_rng(seed).integers(0, 2**32, (n, k) if trans_b else (k, n),
                                                dtype=np.uint32)
    b = bits.view(np.float32)  # any bit pattern: NaN payloads, infinities, signed zeros
    panels = kernels.pack_b_panels(b, trans_b=trans_b)
    assert panels.shape == (-(-n // 16), k, 16)
    assert not panels[-1, :, n - 16 * (panels.shape[0] - 1):].any()  # zero padding
    back = kernels.unpack_b_panels(panels, n, trans_b=trans_b)
    np.testing.assert_array_equal(back.view(np.uint32), bits)
    view = kernels.PackedWeights.from_panels(panels, n)
    assert (view.k, view.n) == (k, n) and np.shares_memory(view.data, panels)
    assert np.array_equal(kernels.PackedWeights(b, trans_b=trans_b).data.view(np.uint32),
                          panels.reshape(-1).view(np.uint32))


def test_from_panels_refuses_a_wrong_shape():
    with pytest.raises(ValueError, match="packed panels"):
        kernels.PackedWeights.from_panels(np.zeros((2, 3, 8), np.float32))
    with pytest.raises(ValueError, match="packed panels"):
        kernels.PackedWeights.from_panels(np.zeros((2, 3, 16), np.float32), n=5)
