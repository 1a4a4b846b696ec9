"""Every device kernel, run with numpy as its array module, against the reference op."""
import numpy as np
import pytest
from onnx import helper

from optimized.cpu import KERNELS as CPU_KERNELS
from optimized.cuda.arrays import FakeDevice
from optimized.cuda.kernels import KERNELS
from optimized.cuda.plan import DevicePlan
from reference import ReferenceEvaluator

from .helpers import model, rand

R = np.random.default_rng(0)
MS = "com.microsoft"


def _i64(*v):
    return np.array(v, np.int64)


# (op, domain, inputs, initializers, attrs, opset, n_outputs)
CASES = {
    "matmul": ("MatMul", "", [rand(R, (2, 3, 4)), rand(R, (4, 5))], {}, {}, 18, 1),
    "gemm": ("Gemm", "", [rand(R, (4, 3)), rand(R, (5, 4)), rand(R, (5,))], {},
             {"alpha": 0.5, "beta": 2.0, "transA": 1, "transB": 1}, 18, 1),
    "fused_gemm": ("FusedGemm", MS, [rand(R, (3, 4)), rand(R, (4, 5)), rand(R, (5,))], {},
                   {"activation": "LeakyRelu", "activation_alpha": 0.2}, 18, 1),
    "fused_matmul": ("FusedMatMul", MS, [rand(R, (2, 4, 3)), rand(R, (2, 5, 4))], {},
                     {"alpha": 0.125, "transA": 1, "transB": 1}, 18, 1),
    "conv": ("Conv", "", [rand(R, (2, 4, 9, 8)), rand(R, (6, 2, 3, 3)), rand(R, (6,))], {},
             {"group": 2, "strides": [2, 1], "pads": [1, 0, 2, 1], "dilations": [1, 2]}, 18, 1),
    "conv_same": ("Conv", "", [rand(R, (1, 3, 7, 7)), rand(R, (4, 3, 3, 3))], {},
                  {"auto_pad": "SAME_UPPER", "strides": [2, 2]}, 18, 1),
    "fused_conv": ("FusedConv", MS, [rand(R, (1, 3, 6, 6)), rand(R, (4, 3, 3, 3)), rand(R, (4,)),
                                     rand(R, (1, 4, 4, 4))], {}, {"activation": "Relu"}, 18, 1),
    "max_pool_ceil": ("MaxPool", "", [rand(R, (1, 2, 7, 7))], {},
                      {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1, "pads": [1, 1, 0, 0]}, 18, 1),
    "avg_pool": ("AveragePool", "", [rand(R, (1, 2, 7, 6))], {},
                 {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 1, 1, 0]}, 18, 1),
    "avg_pool_incl": ("AveragePool", "", [rand(R, (1, 2, 7, 6))], {},
                      {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                           "count_include_pad": 1, "ceil_mode": 1}, 19, 1),
    "global_avg": ("GlobalAveragePool", "", [rand(R, (2, 3, 4, 5))], {}, {}, 18, 1),
    "softmax": ("Softmax", "", [rand(R, (2, 3, 7))], {}, {"axis": -1}, 18, 1),
    "layer_norm": ("LayerNormalization", "", [rand(R, (2, 3, 8)), rand(R, (3, 8)), rand(R, (8,))],
                   {}, {"axis": -2, "epsilon": 1e-3}, 18, 1),
    "gelu_tanh": ("Gelu", "", [rand(R, (3, 5))], {}, {"approximate": "tanh"}, 20, 1),
    "gelu": ("Gelu", "", [rand(R, (3, 5))], {}, {}, 20, 1),
    "fast_gelu": ("FastGelu", MS, [rand(R, (3, 5)), rand(R, (5,))], {}, {}, 18, 1),
    "reduce_mean": ("ReduceMean", "", [rand(R, (2, 3, 4))], {"axes": _i64(-1, 0)},
                    {"keepdims": 0}, 18, 1),
    "reduce_sum_all": ("ReduceSum", "", [rand(R, (2, 3, 4))], {}, {}, 18, 1),
    "reduce_max_attr": ("ReduceMax", "", [rand(R, (2, 3, 4))], {}, {"axes": [1]}, 13, 1),
    "transpose": ("Transpose", "", [rand(R, (2, 3, 4))], {}, {"perm": [2, 0, 1]}, 18, 1),
    "gather": ("Gather", "", [rand(R, (5, 3))], {"idx": _i64(-1, 0, 3)}, {"axis": 0}, 18, 1),
    "concat": ("Concat", "", [rand(R, (2, 3)), rand(R, (2, 1))], {}, {"axis": -1}, 18, 1),
    "slice": ("Slice", "", [rand(R, (6, 5))], {"s": _i64(-1, 1), "e": _i64(-100, 5),
                                                "a": _i64(0, 1), "st": _i64(-2, 2)}, {}, 18, 1),
    "reshape": ("Reshape", "", [rand(R, (2, 3, 4))], {"shape": _i64(0, -1)}, {}, 18, 1),
    "split": ("Split", "", [rand(R, (2, 7))], {"sizes": _i64(3, 4)}, {"axis": 1}, 18, 2),
    "unsqueeze": ("Unsqueeze", "", [rand(R, (2, 3))], {"axes": _i64(0, -1)}, {}, 18, 1),
    "squeeze": ("Squeeze", "", [rand(R, (1, 3, 1))], {"axes": _i64(-1)}, {}, 18, 1),
    "flatten": ("Flatten", "", [rand(R, (2, 3, 4))], {}, {"axis": -1}, 18, 1),
    "expand": ("Expand", "", [rand(R, (3, 1))], {"shape": _i64(2, 3, 4)}, {}, 18, 1),
    "cast": ("Cast", "", [rand(R, (3, 4))], {}, {"to": 7}, 18, 1),
    "mha_causal_cache": ("MultiHeadAttention", MS,
                         [rand(R, (2, 3, 8)), rand(R, (2, 3, 8)), rand(R, (2, 3, 8))],
                         {"bias_": None, "kpm": None, "ab": rand(R, (1, 2, 3, 7)),
                          "pk": rand(R, (2, 2, 4, 4)), "pv": rand(R, (2, 2, 4, 4))},
                         {"num_heads": 2, "unidirectional": 1}, 18, 3),
}


def _case_model(name):
    op, domain, inputs, inits, attrs, opset, n_out = CASES[name]
    feeds = {f"in{i}": v for i, v in enumerate(inputs)}
    names = list(feeds) + list(inits)
    names = ["" if inits.get(n, 0) is None else n for n in names]
    inits = {k: v for k, v in inits.items() if v is not None}
    outs = [f"out{i}" for i in range(n_out)]
    node = helper.make_node(op, names, outs, domain=domain, **attrs)
    out_type = 7 if op == "Cast" else 1
    return model([node], feeds, outs, inits, opset=opset, ms=domain == MS, out_type=out_type), feeds


@pytest.mark.parametrize("name", sorted(CASES))
def test_device_kernel_matches_the_reference_op(name):
    m, feeds = _case_model(name)
    ev = ReferenceEvaluator(m, check=False)
    plan = DevicePlan(m, CPU_KERNELS, ev, FakeDevice(), strict=True)
    assert set(plan.placement.devices.values()) == {"cuda"}, "the node should run on the device"
    declined = []
    plan._on_host = lambda run, values: declined.append(1) or run(*values)
    got = plan.run(feeds)
    assert not declined, "the device kernel declined"
    for g, e in zip(got, ev.run(None, feeds)):
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)


def test_every_registered_kernel_has_a_case_or_is_plain_elementwise():
    covered = {(CASES[c][1], CASES[c][0]) for c in CASES}
    elementwise = {"Add", "Sub", "Mul", "Div", "Neg", "Exp", "Log", "Sqrt", "Tanh", "Abs", "Pow",
                   "Relu", "Sigmoid", "LeakyRelu"}
    rest = {k for k in KERNELS if k not in covered and k[1] not in elementwise}
    assert rest <= {("", "Identity"), ("", "Shape"), ("", "Where"), ("", "GlobalMaxPool"),
                    ("", "ReduceMin"), (MS, "Gelu"), ("", "Conv")}, rest
