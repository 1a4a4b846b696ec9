"""Threads: the wait policy libgomp runs our OpenMP pool with (optimized/kernels.py sets it
before the extension loads libgomp, unless the user set one), and results that do not depend
on the thread count.

The policy is read back from libgomp itself (omp_display_env prints the values it runs with),
in a fresh interpreter each time, since libgomp reads the environment once, when it loads."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import optimized
from optimized import kernels
from reference import ReferenceEvaluator

WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")

# Imports optimized, then prints libgomp's wait settings (as omp_display_env reports them, on
# stderr) and what this process's environment holds afterwards (on stdout).
PROBE = """
import ctypes, json, os
import optimized.kernels
ctypes.CDLL("libgomp.so.1").omp_display_env(1)
print(json.dumps({k: os.environ.get(k) for k in %r}))
""" % (WAIT_VARIABLES,)  # noqa: UP031 - the probe's own braces would need doubling in an f-string


def libgomp_settings(**env: str) -> tuple[dict[str, str], str]:
    """({variable: value libgomp runs with}, the environment after import as JSON) in a fresh
    interpreter whose environment holds exactly `env` of the wait variables."""
    environment = {k: v for k, v in os.environ.items() if k not in WAIT_VARIABLES}
    environment.update(env)
    done = subprocess.run([sys.executable, "-c", PROBE], env=environment, capture_output=True,
                          text=True, timeout=120, check=True)
    shown = dict(re.findall(r"^\s*(OMP_WAIT_POLICY|GOMP_SPINCOUNT) = '([^']*)'", done.stderr,
                            flags=re.MULTILINE))
    assert set(shown) == set(WAIT_VARIABLES), f"omp_display_env printed:\n{done.stderr}"
    return shown, done.stdout.strip().splitlines()[-1]


def test_without_a_user_setting_libgomp_spins_the_documented_count():
    shown, after = libgomp_settings()
    assert shown["GOMP_SPINCOUNT"] == str(kernels.OPENMP_SPIN_COUNT)
    assert shown["GOMP_SPINCOUNT"] != "300000"  # libgomp's own default, which starves others
    # the default is libgomp's alone: the process's environment (and its children's) is as
    # the user left it
    assert after == '{"OMP_WAIT_POLICY": null, "GOMP_SPINCOUNT": null}'


@pytest.mark.parametrize("env, expected", [
    ({"OMP_WAIT_POLICY": "ACTIVE"}, {"OMP_WAIT_POLICY": "ACTIVE"}),
    ({"OMP_WAIT_POLICY": "PASSIVE"}, {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "0"}),
    ({"GOMP_SPINCOUNT": "123457"}, {"GOMP_SPINCOUNT": "123457"}),
], ids=["active", "passive", "spincount"])
def test_a_users_own_setting_is_kept(env, expected):
    shown, after = libgomp_settings(**env)
    assert {k: shown[k] for k in expected} == expected
    assert after == "{%s}" % ", ".join(  # noqa: UP031 - a JSON object's braces
        f'"{k}": ' + (f'"{env[k]}"' if k in env else "null") for k in WAIT_VARIABLES)


# --- thread-count invariance ---------------------------------------------------------------

def small_model() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Conv + bias + Relu, a strided 1x1 Conv (our im2col kernel, whose one image must still
    split across threads, by output channels), a MaxPool, a MatMul over the flattened map and a Softmax: work big
    enough that the kernels split it across two threads (N=1, C=3, H=46, W=37; non-square so
    an axis mix-up shows)."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((16, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    w2 = rng.standard_normal((320, 16, 1, 1)).astype(np.float32)
    m = rng.standard_normal((16 * 23 * 18, 300)).astype(np.float32) / 80
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Conv", ["r", "w2"], ["s"], strides=[2, 2]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("MatMul", ["f", "m"], ["y0"]),
        helper.make_node("Softmax", ["y0"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes, "threads", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 46, 37])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 300]),
         helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, 16, 46, 37]),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, 320, 23, 19])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"), numpy_helper.from_array(w2, "w2"),
         numpy_helper.from_array(m, "m")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, {"x": rng.standard_normal((1, 3, 46, 37)).astype(np.float32)}


@pytest.mark.parametrize("level", [1, 99])
def test_outputs_do_not_depend_on_the_thread_count(level):
    model, feeds = small_model()
    outputs = {}
    for threads in (1, 2):
        options = optimized.SessionOptions()
        options.intra_op_num_threads = threads
        options.graph_optimization_level = optimized.GraphOptimizationLevel(level)
        session = optimized.InferenceSession(model.SerializeToString(), options,
                                             providers=["CPUExecutionProvider"])
        outputs[threads] = session.run(None, feeds)
    (y1, c1, s1), (y2, c2, s2) = outputs[1], outputs[2]
    # the same sums taken in the same order whichever thread takes them: the kernels split
    # work by output element, never a reduction between threads
    np.testing.assert_array_equal(y1, y2)
    np.testing.assert_array_equal(c1, c2)
    # the strided 1x1 Conv's one image is cut into one chunk of its output channels per
    # thread, and the BLAS may take a smaller GEMM through another micro-kernel: a sum of 16 products (up to
    # ~120 here) may round differently, by an ulp or two (7.6e-6 at 64 to 128)
    np.testing.assert_allclose(s1, s2, rtol=1e-6, atol=2e-5)
    # and both are right: float32 sums of up to 27 products (the 3x3 Conv), 16 (the 1x1) and
    # 6624 (the MatMul), blocked differently from the reference's NumPy
    for got, want in zip(outputs[2], ReferenceEvaluator(model).run(None, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("in_c, out_c, h, w", [
    (24, 100, 13, 11),  # one image in one im2col block: its 7 tiles of channels are cut in two
    (40, 8, 9, 7),  # one tile of channels: its plane is cut in two instead
    (600, 50, 45, 41),  # 483 positions at depth 600 fill two im2col blocks: one per thread
], ids=["channel-chunks", "plane-pieces", "blocks"])
def test_strided_pointwise_conv_splits_give_the_one_thread_values(threads, in_c, out_c, h, w):
    """A strided 1x1 Conv (csrc/conv.c's im2col kernel) with bias, residual and Relu, cut across
    two threads by output channels, by pieces of the plane or by blocks: the values of one
    thread and of the reference, channel by channel (a chunk's bias, residual or output row
    taken from the wrong offset shows)."""
    rng = np.random.default_rng(in_c * out_c)
    x = rng.standard_normal((1, in_c, h, w)).astype(np.float32)
    weight = (rng.standard_normal((out_c, in_c, 1, 1)) / 4).astype(np.float32)
    bias = rng.standard_normal(out_c).astype(np.float32)
    out_h, out_w = (h + 1) // 2, (w + 1) // 2
    residual = rng.standard_normal((1, out_c, out_h, out_w)).astype(np.float32)
    results = {}
    for count in (1, 2):
        threads(count)
        results[count] = kernels.conv2d(x, weight, bias, strides=[2, 2], residual=residual,
                                         activation="Relu")
    expected = np.maximum(np.einsum("oc,chw->ohw", weight[:, :, 0, 0].astype(np.float64),
                                    x[0, :, ::2, ::2].astype(np.float64))
                          + bias[:, None, None] + residual[0], 0)
    # the BLAS may take a GEMM of another width through another micro-kernel, so the two
    # thread counts may differ by an ulp or two
    np.testing.assert_allclose(results[2], results[1], rtol=1e-6, atol=4e-6)
    # float32 sums of up to 600 products against float64 ones
    np.testing.assert_allclose(results[2][0], expected, rtol=1e-4, atol=1e-4)


# Prints the configured thread count and the count a kernel's team gets now, at 2 threads.
TEAM_PROBE = """
import optimized.kernels as k
k.set_num_threads(2)
print(k.get_num_threads(), k.lib.kernels_get_num_threads())
"""


@pytest.mark.parametrize("setting, team", [
    ("0", 1),  # a load of 0 per CPU or more: always oversubscribed, so teams of one
    ("ignore", 2),  # every configured thread whatever the load
    ("1000000", 2),  # no machine carries a million tasks per CPU
])
def test_oversubscribed_machine_runs_kernels_on_the_calling_thread(setting, team):
    environment = dict(os.environ, ONNX_PARITY_BUSY_MACHINE=setting)
    done = subprocess.run([sys.executable, "-c", TEAM_PROBE], env=environment,
                          capture_output=True, text=True, timeout=120, check=True)
    configured, now = map(int, done.stdout.split())
    assert (configured, now) == (2, team)


def test_results_do_not_depend_on_the_machine_being_busy():
    model = helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Softmax", ["y"], ["z"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [37, 96])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [37, 200])],
        [numpy_helper.from_array(np.random.default_rng(3).standard_normal((96, 200), np.float32),
                                 "w")]), opset_imports=[helper.make_opsetid("", 21)])
    script = """
import sys, numpy as np, optimized
options = optimized.SessionOptions(); options.intra_op_num_threads = 2
session = optimized.InferenceSession(sys.stdin.buffer.read(), options)
x = np.random.default_rng(4).standard_normal((37, 96), np.float32)
sys.stdout.write(session.run(None, {"x": x})[0].tobytes().hex())
"""
    outputs = []
    for setting in ("0", "ignore"):
        environment = dict(os.environ, ONNX_PARITY_BUSY_MACHINE=setting)
        done = subprocess.run([sys.executable, "-c", script], env=environment,
                              input=model.SerializeToString(), capture_output=True,
                              timeout=120, check=True)
        outputs.append(np.frombuffer(bytes.fromhex(done.stdout.decode()), np.float32))
    # the GEMM splits its columns across a team of two, which may round differently
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=1e-5, atol=1e-6)
    assert outputs[0].size == 37 * 200


def test_a_run_through_iobinding_uses_its_own_sessions_thread_count():
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5])]),
        opset_imports=[helper.make_opsetid("", 21)])
    sessions = {}
    for threads in (1, 2):
        options = optimized.SessionOptions()
        options.intra_op_num_threads = threads
        sessions[threads] = optimized.InferenceSession(model.SerializeToString(), options)
    x = np.arange(15, dtype=np.float32).reshape(3, 5) - 7
    sessions[1].run(None, {"x": x})
    assert kernels.get_num_threads() == 1
    binding = sessions[2].io_binding()
    binding.bind_cpu_input("x", x)
    binding.bind_output("y")
    sessions[2].run_with_iobinding(binding)
    assert kernels.get_num_threads() == 2
    np.testing.assert_array_equal(binding.copy_outputs_to_cpu()[0], np.maximum(x, 0))
