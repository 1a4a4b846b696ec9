"""The C kernels of optimized/kernels.py beside numpy, the reference op and onnxruntime.

One benchmark group per case and thread count; in each, `optimized` is our kernel, `numpy` is
`a @ b` (GEMM only; its BLAS limited to the same thread count through threadpoolctl when that
is installed), `reference` the reference Conv, and `onnxruntime` a one-node model with
intra_op_num_threads set.  Every contender's result is checked against ours before timing.

    pytest benchmarks/test_kernels.py --benchmark-only --benchmark-group-by=group
"""
from __future__ import annotations

import contextlib
import gc

import numpy as np
import pytest
from onnx import TensorProto, helper

from optimized import kernels
from reference.registry import lookup

GEMMS = {  # name: (M, K, N)
    "gemv_1x768x768": (1, 768, 768),
    "gemm_128x768x768": (128, 768, 768),
    "gemm_512x512x512": (512, 512, 512),
}

CONVS = {  # name: (x shape, w shape, group, pads, strides)
    "conv3x3_64x56x56": ((1, 64, 56, 56), (64, 64, 3, 3), 1, [1, 1, 1, 1], [1, 1]),
    "conv1x1_256to64_56x56": ((1, 256, 56, 56), (64, 256, 1, 1), 1, [0, 0, 0, 0], [1, 1]),
    "conv7x7s2_3to64_224": ((1, 3, 224, 224), (64, 3, 7, 7), 1, [3, 3, 3, 3], [2, 2]),
    "depthwise3x3_128x28x28": ((1, 128, 28, 28), (128, 1, 3, 3), 128, [1, 1, 1, 1], [1, 1]),
}


def rand(seed, shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@contextlib.contextmanager
def numpy_blas_threads(n):
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # numpy keeps its own default
        yield
        return
    with threadpool_limits(limits=n, user_api="blas"):
        yield




def ort_session(nodes, inputs, initializers, threads):
    ort = pytest.importorskip("onnxruntime")
    graph = helper.make_graph(
        nodes, "bench",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, v.shape) for n, v in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[helper.make_tensor(n, TensorProto.FLOAT, v.shape, v.ravel())
                     for n, v in initializers.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("impl", ["optimized", "numpy", "onnxruntime"])
@pytest.mark.parametrize("case", sorted(GEMMS))
def test_gemm(benchmark, case, impl, threads):
    m, k, n = GEMMS[case]
    a, b, c = rand(1, (m, k)), rand(2, (k, n)), rand(3, (n,))
    benchmark.group = f"{case} {threads}thr"
    expected = kernels.gemm(a, b, c)
    if impl == "optimized":
        out = np.empty((m, n), np.float32)
        got = benchmark(kernels.gemm, a, b, c, out=out)
    elif impl == "numpy":
        with numpy_blas_threads(threads):
            got = benchmark(lambda: a @ b + c)
    else:
        sess = ort_session([helper.make_node("Gemm", ["a", "b", "c"], ["y"])], {"a": a},
                           {"b": b, "c": c}, threads)
        got = benchmark(sess.run, None, {"a": a})[0]
        del sess  # its spinning pool threads would compete with the next benchmarks
        gc.collect()
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-3)


# MatMul/Gemm over constant weights in the transformer benchmarks (M x K -> N): vit's 37 rows
# (36 patches and the class token) of 192, bert-mini's 128 of 256, bert_layer and gpt2's 128
# of 768
PACKED_GEMMS = {
    "vit_37x192to192": (37, 192, 192), "vit_37x192to768": (37, 192, 768),
    "vit_37x768to192": (37, 768, 192), "bert_mini_128x256to1024": (128, 256, 1024),
    "bert_128x768to768": (128, 768, 768), "bert_128x768to3072": (128, 768, 3072),
    "bert_128x3072to768": (128, 3072, 768),
}


@pytest.mark.parametrize("impl", ["packed", "blas", "onnxruntime"])
@pytest.mark.parametrize("case", sorted(PACKED_GEMMS))
def test_gemm_packed_vs_blas(benchmark, case, impl, threads):
    """csrc/gemm_packed.c over B packed once, against the BLAS path (kernels.gemm, which the
    BLAS repacks B for on every call) and onnxruntime's Gemm with B an initializer."""
    m, k, n = PACKED_GEMMS[case]
    a, b, c = rand(1, (m, k)), rand(2, (k, n)), rand(3, (n,))
    benchmark.group = f"packed {case} {threads}thr"
    expected = kernels.gemm(a, b, c)
    out = np.empty((m, n), np.float32)
    if impl == "packed":
        packed = kernels.PackedWeights(b)
        got = benchmark(kernels.gemm_packed, a, packed, c, out=out)
    elif impl == "blas":
        got = benchmark(kernels.gemm, a, b, c, out=out)
    else:
        sess = ort_session([helper.make_node("Gemm", ["a", "b", "c"], ["y"])], {"a": a},
                           {"b": b, "c": c}, threads)
        got = benchmark(sess.run, None, {"a": a})[0]
        del sess
        gc.collect()
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("impl", ["optimized", "reference", "onnxruntime"])
@pytest.mark.parametrize("case", sorted(CONVS))
def test_conv2d(benchmark, case, impl, threads):
    x_shape, w_shape, group, pads, strides = CONVS[case]
    x, w, bias = rand(1, x_shape), rand(2, w_shape), rand(3, (w_shape[0],))
    benchmark.group = f"{case} {threads}thr"
    attrs = {"group": group, "pads": pads, "strides": strides}
    expected = kernels.conv2d(x, w, bias, activation="Relu", **attrs)
    if impl == "optimized":
        out = np.empty_like(expected)
        got = benchmark(kernels.conv2d, x, w, bias, activation="Relu", out=out, **attrs)
    elif impl == "reference":
        conv = lookup("", "Conv", 11).fn
        with numpy_blas_threads(threads):
            got = benchmark.pedantic(lambda: np.maximum(conv(x, w, bias, **attrs), 0),
                                     rounds=5, iterations=1)
    else:
        # Conv then Relu: onnxruntime fuses the pair, as conv2d fuses the activation
        nodes = [helper.make_node("Conv", ["x", "w", "b"], ["z"], **attrs),
                 helper.make_node("Relu", ["z"], ["y"])]
        sess = ort_session(nodes, {"x": x}, {"w": w, "b": bias}, threads)
        got = benchmark(sess.run, None, {"x": x})[0]
        del sess  # its spinning pool threads would compete with the next benchmarks
        gc.collect()
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-3)
