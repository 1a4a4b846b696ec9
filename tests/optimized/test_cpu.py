"""The CPU provider's kernel table (optimized/cpu.py) against the reference ops: each entry must
take the cases it claims (not fall back) and give the reference result."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

from optimized import cpu
from reference import ReferenceEvaluator

MS = "com.microsoft"
hsettings = settings(max_examples=25, deadline=None)


def reference(op_type, domain, inputs, **attrs):
    names = [f"in{i}" if v is not None else "" for i, v in enumerate(inputs)]
    graph = helper.make_graph(
        [helper.make_node(op_type, names, ["y"], domain=domain, **attrs)], "t",
        [helper.make_tensor_value_info(n, 1, v.shape) for n, v in zip(names, inputs) if v is not None],
        [helper.make_empty_tensor_value_info("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22),
                                                    helper.make_opsetid(MS, 1)])
    feeds = {n: v for n, v in zip(names, inputs) if v is not None}
    return ReferenceEvaluator(model, check=False).run(None, feeds)[0]


def fast(op_type, domain, inputs, **attrs):
    result = cpu.KERNELS[(domain, op_type)](*inputs, **attrs)
    assert result is not NotImplemented, f"{op_type} fell back to the reference op"
    return result


def arrays(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@hsettings
@given(batch=st.integers(1, 2), q_len=st.integers(1, 5), kv_len=st.integers(1, 6),
       heads=st.integers(1, 3), head_size=st.integers(1, 4), bias_shape=st.sampled_from(
           [None, "full", "per_key", "per_head"]), scale=st.sampled_from([0.0, 0.3]),
       seed=st.integers(0, 1000))
def test_multi_head_attention_matches_reference(batch, q_len, kv_len, heads, head_size,
                                                bias_shape, scale, seed):
    hidden = heads * head_size
    q, k, v = arrays(seed, batch, q_len, hidden), arrays(seed + 1, batch, kv_len, hidden), \
        arrays(seed + 2, batch, kv_len, hidden)
    shapes = {"full": (batch, heads, q_len, kv_len), "per_key": (batch, 1, 1, kv_len),
              "per_head": (1, heads, 1, 1)}
    bias = None if bias_shape is None else arrays(seed + 3, *shapes[bias_shape])
    inputs = [q, k, v, None, None, bias]
    expected = reference("MultiHeadAttention", MS, inputs, num_heads=heads, scale=scale)
    got = fast("MultiHeadAttention", MS, inputs, num_heads=heads, scale=scale)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_multi_head_attention_leaves_other_forms_to_the_reference():
    q = arrays(0, 1, 2, 4)
    kernel = cpu.KERNELS[(MS, "MultiHeadAttention")]
    assert kernel(q, q, q, num_heads=2, unidirectional=1) is NotImplemented
    assert kernel(q, q, q, arrays(1, 12), num_heads=2) is NotImplemented  # packed bias
    assert kernel(q, q, q, num_heads=3) is NotImplemented  # hidden not divisible by heads


@hsettings
@given(shape=st.lists(st.integers(0, 5), min_size=0, max_size=3), seed=st.integers(0, 1000))
def test_ms_gelu_matches_reference(shape, seed):
    x = arrays(seed, *shape) * 4
    np.testing.assert_allclose(fast("Gelu", MS, [x]), reference("Gelu", MS, [x]),
                               rtol=1e-5, atol=1e-6)


@hsettings
@given(lead=st.lists(st.integers(1, 3), min_size=1, max_size=2), m=st.integers(1, 4),
       k=st.integers(1, 5), n=st.integers(1, 4), trans_b=st.booleans(),
       alpha=st.sampled_from([1.0, 0.125]), seed=st.integers(0, 1000))
def test_fused_matmul_and_matmul_match_reference(lead, m, k, n, trans_b, alpha, seed):
    a = arrays(seed, *lead, m, k)
    b = arrays(seed + 1, *lead, *((n, k) if trans_b else (k, n)))
    expected = reference("FusedMatMul", MS, [a, b], alpha=alpha, transB=int(trans_b))
    got = fast("FusedMatMul", MS, [a, b], alpha=alpha, transB=int(trans_b))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    w = arrays(seed + 2, k, n)  # N-D activation times a 2-D weight: the linear layers' case
    np.testing.assert_allclose(fast("MatMul", "", [a, w]), reference("MatMul", "", [a, w]),
                               rtol=1e-4, atol=1e-5)
