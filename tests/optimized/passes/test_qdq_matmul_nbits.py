"""qdq_matmul_nbits: DequantizeLinear(constant 4/8-bit weight) -> MatMul becomes MatMulNBits
without the float weights ever existing. Models are built with onnx.helper in the forms
onnxruntime's quantizers write (and, where onnxruntime is installed, by its quantizer itself);
every rewritten model's output is judged against the reference on the QDQ graph by the bound
policy of reference/agreement.py."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import optimized
from optimized.passes import PASSES, optimize
from optimized.passes.qdq_matmul_nbits import fuse_dequantize_matmul
from reference import ReferenceEvaluator, agreement

from .helpers import check_model, op_types

CODE_RANGE = {TensorProto.INT4: (-8, 7), TensorProto.UINT4: (0, 15),
              TensorProto.INT8: (-128, 127), TensorProto.UINT8: (0, 255)}


def code_type(bits, signed):
    return {(4, True): TensorProto.INT4, (4, False): TensorProto.UINT4,
            (8, True): TensorProto.INT8, (8, False): TensorProto.UINT8}[bits, signed]


def code_tensor(name, codes, elem, raw=True):
    """A 4/8-bit initializer as onnxruntime's quantizer writes it: raw bytes, 4-bit codes two
    a byte (the first in the low nibble); raw=False keeps them in int32_data instead."""
    if not raw:
        return helper.make_tensor(name, elem, codes.shape, codes.reshape(-1).tolist())
    flat = codes.reshape(-1).astype(np.int64)
    if elem in (TensorProto.INT4, TensorProto.UINT4):
        nibbles = np.append(flat & 15, np.zeros(flat.size % 2, np.int64)).astype(np.uint8)
        data = (nibbles[0::2] | (nibbles[1::2] << 4)).tobytes()
    else:
        data = (flat & 255).astype(np.uint8).tobytes()
    return helper.make_tensor(name, elem, codes.shape, data, raw=True)


def qdq_model(rng, *, k, n, bits=4, signed=True, scheme="block", block=32, zero_points=False,
              transposed=False, a_shape=("M",), raw=True, scale_dtype=np.float32):
    """y = a @ DequantizeLinear(w): w [K, N] (or [N, K] then Transpose, the NPU form), scales
    per block along K (opset 21's block_size), per output channel (block_size K when 4-bit, as
    MatMulNBitsQuantizer writes it, else a 1-D scale), or per tensor."""
    elem = code_type(bits, signed)
    lo, hi = CODE_RANGE[elem]
    w_shape = (n, k) if transposed else (k, n)
    codes = rng.integers(lo, hi + 1, w_shape)
    k_axis = 1 if transposed else 0
    attrs = {}
    if scheme == "block":
        blocks = -(-k // block)
        p_shape = (n, blocks) if transposed else (blocks, n)
        attrs = {"axis": k_axis, "block_size": block}
    elif scheme == "channel_block":  # MatMulNBitsQuantizer's channel_wised_quantize
        p_shape = (n, 1) if transposed else (1, n)
        attrs = {"axis": k_axis, "block_size": k}
    elif scheme == "channel":
        p_shape = (n,)
        attrs = {"axis": 1 - k_axis}
    else:
        p_shape = ()
    scale = ((rng.random(p_shape) + 0.05) * rng.choice([-1, 1], p_shape) / 8).astype(scale_dtype)
    inits = [code_tensor("w_q", codes, elem, raw), numpy_helper.from_array(np.asarray(scale), "w_scale")]
    dq_inputs = ["w_q", "w_scale"]
    if zero_points:
        zp = rng.integers(lo, hi + 1, p_shape)
        inits.append(code_tensor("w_zp", np.asarray(zp), elem, raw))
        dq_inputs.append("w_zp")
    nodes = [helper.make_node("DequantizeLinear", dq_inputs, ["w_dq"], name="w_DQ", **attrs)]
    weight = "w_dq"
    if transposed:
        nodes.append(helper.make_node("Transpose", ["w_dq"], ["w_t"], perm=[1, 0]))
        weight = "w_t"
    nodes.append(helper.make_node("MatMul", ["a", weight], ["y"], name="proj"))
    elem_a = helper.np_dtype_to_tensor_dtype(np.dtype(scale_dtype))
    graph = helper.make_graph(
        nodes, "qdq",
        [helper.make_tensor_value_info("a", elem_a, [*a_shape, k])],
        [helper.make_tensor_value_info("y", elem_a, [*a_shape, n])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def dequantized_weight(model):
    """The float32 weight [K, N] the first MatMul reads, as the reference computes it on the QDQ
    graph (the DequantizeLinear and Transpose nodes alone)."""
    weight = next(n.input[1] for n in model.graph.node if n.op_type == "MatMul")
    nodes = [n for n in model.graph.node if n.op_type != "MatMul"]
    graph = helper.make_graph(nodes, "weight", [], [helper.make_tensor_value_info(
        weight, TensorProto.FLOAT, None)], list(model.graph.initializer))
    return ReferenceEvaluator(helper.make_model(graph, opset_imports=model.opset_import)).run(
        None, {})[0]


def assert_agrees_with_qdq_graph(model, rewritten, a, got):
    """The MatMulNBits result against the float64 truth a @ w, w the reference's float32
    DequantizeLinear output on the QDQ graph, within MatMulNBits's bound."""
    [node] = [n for n in rewritten.graph.node if n.op_type == "MatMulNBits"]
    inits = {t.name: numpy_helper.to_array(t) for t in rewritten.graph.initializer}
    w = dequantized_weight(model).astype(np.float64)
    rows = a.reshape(-1, w.shape[0])
    inputs = [rows] + [inits[name] for name in node.input[1:]]
    truth = rows.astype(np.float64) @ w
    verdict = agreement.judge(node, 1, inputs, [got.reshape(-1, w.shape[1])], [truth])
    assert verdict.ok, verdict.message()
    reference = ReferenceEvaluator(model).run(None, {"a": a})[0]
    assert got.shape == reference.shape and got.dtype == reference.dtype


def run_session(model, a, level=optimized.GraphOptimizationLevel.ORT_ENABLE_ALL):
    options = optimized.SessionOptions()
    options.graph_optimization_level = level
    session = optimized.InferenceSession(model.SerializeToString(), options)
    return session, session.run(None, {"a": a})[0]


def assert_fused(rewritten, k, n):
    """One MatMulNBits [K, N] and no float weights: the only float initializers are its scales,
    and the only integer ones its uint8 codes and zero points."""
    assert op_types(rewritten) == {"com.microsoft::MatMulNBits": 1}, op_types(rewritten)
    [node] = rewritten.graph.node
    assert (helper.get_attribute_value(node.attribute[0]), helper.get_attribute_value(
        node.attribute[1])) == (k, n)
    kinds = {t.name: t.data_type for t in rewritten.graph.initializer}
    assert kinds[node.input[2]] == TensorProto.FLOAT
    assert {kinds[name] for name in node.input[1:] if name != node.input[2]} == {
        TensorProto.UINT8}
    assert set(kinds) == set(node.input[1:])


# the forms onnxruntime's quantizers write ---------------------------------------------------
@pytest.mark.parametrize("form", [
    {"bits": 4, "signed": True, "scheme": "block", "block": 32},  # MatMulNBitsQuantizer, symmetric
    {"bits": 4, "signed": False, "scheme": "block", "block": 128, "zero_points": True},  # asymmetric
    {"bits": 4, "signed": False, "scheme": "channel_block", "zero_points": True},  # channel-wise
    {"bits": 4, "signed": True, "scheme": "channel_block", "transposed": True},  # its NPU form
    {"bits": 8, "signed": True, "scheme": "channel"},  # quantize_static, per channel, symmetric
    {"bits": 8, "signed": False, "scheme": "channel", "zero_points": True},
    {"bits": 8, "signed": False, "scheme": "tensor", "zero_points": True},  # per tensor
    {"bits": 8, "signed": True, "scheme": "block", "block": 64, "zero_points": True},
    {"bits": 4, "signed": True, "scheme": "block", "block": 16, "raw": False},  # int32_data, not raw
], ids=lambda f: "-".join(f"{k}={v}" for k, v in f.items()))
@pytest.mark.parametrize("m", [1, 5])
def test_quantizer_forms_become_matmul_nbits(form, m):
    """K = 200 is no multiple of the block sizes, N = 37 is odd."""
    rng = np.random.default_rng(m)
    k, n = 200, 37
    model = qdq_model(rng, k=k, n=n, **form)
    a = rng.standard_normal((m, k), dtype=np.float32)
    session, got = run_session(model, a)
    assert_fused(session.optimized_model, k, n)
    assert_agrees_with_qdq_graph(model, session.optimized_model, a, got)
    check_model(session.optimized_model)


@settings(max_examples=40, deadline=None)
@given(m=st.sampled_from([1, 2, 9]), k=st.integers(1, 300), n=st.integers(1, 41),
       bits=st.sampled_from([4, 8]), signed=st.booleans(), zero_points=st.booleans(),
       scheme=st.sampled_from(["block", "channel_block", "channel", "tensor"]),
       block=st.sampled_from([16, 32, 64, 128, 48, 96]), transposed=st.booleans(),
       rank3=st.booleans(), seed=st.integers(0, 2**16))
def test_against_the_qdq_graph(m, k, n, bits, signed, zero_points, scheme, block, transposed,
                               rank3, seed):
    """Any shape, code type, zero point and quantization scheme the pass takes agrees with the
    reference on the QDQ graph (blocks of 48 and 96 run as MatMulNBits blocks of 16 and 32)."""
    rng = np.random.default_rng(seed)
    a_shape = ("B", "S") if rank3 else ("M",)
    model = qdq_model(rng, k=k, n=n, bits=bits, signed=signed, zero_points=zero_points,
                      scheme=scheme, block=block, transposed=transposed, a_shape=a_shape)
    a = rng.standard_normal((2, m, k) if rank3 else (m, k), dtype=np.float32)
    session, got = run_session(model, a)
    assert_fused(session.optimized_model, k, n)
    assert_agrees_with_qdq_graph(model, session.optimized_model, a, got)


def test_hand_checked_layout():
    """uint4 w [K=3, N=2] = [[1, 2], [3, 4], [5, 6]] per output channel, zero points 1 and 2,
    scales 0.5 and 2: column 0 is (0, 2, 4) * 0.5, column 1 (0, 2, 4) * 2, so a = (1, 1, 1)
    gives (3, 12); MatMulNBits holds column n's codes as row n, in order along K."""
    codes = np.array([[1, 2], [3, 4], [5, 6]])
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["q", "s", "z"], ["w"], axis=1),
         helper.make_node("MatMul", ["a", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
        [code_tensor("q", codes, TensorProto.UINT4),
         numpy_helper.from_array(np.array([0.5, 2], np.float32), "s"),
         code_tensor("z", np.array([1, 2]), TensorProto.UINT4)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    rewritten = fuse_dequantize_matmul(model)
    [node] = rewritten.graph.node
    inits = {t.name: numpy_helper.to_array(t) for t in rewritten.graph.initializer}
    b, zp = inits[node.input[1]], inits[node.input[3]]
    assert b.shape == (2, 1, 8) and b[0, 0, :2].tolist() == [0x31, 0x05]  # codes 1, 3, 5
    assert b[1, 0, :2].tolist() == [0x42, 0x06] and zp.tolist() == [[1], [2]]
    y = optimized.InferenceSession(rewritten.SerializeToString()).run(
        None, {"a": np.ones((1, 3), np.float32)})[0]
    assert y.tolist() == [[3.0, 12.0]]


def test_the_float_weights_are_never_made(monkeypatch):
    """Nothing reads the quantized weight as an array while the session is made (constant
    folding would, through numpy_helper.to_array, were the pass to run after it): its bytes go
    straight to the C repacking."""
    real = numpy_helper.to_array

    def guarded(tensor, *args, **kwargs):
        assert tensor.name != "w_q", "the quantized weight was read as an array"
        return real(tensor, *args, **kwargs)

    rng = np.random.default_rng(4)
    model = qdq_model(rng, k=96, n=24, bits=4, signed=False, zero_points=True)
    monkeypatch.setattr(numpy_helper, "to_array", guarded)
    a = rng.standard_normal((3, 96), dtype=np.float32)
    for level in (1, 2, 99):
        session, got = run_session(model, a, optimized.GraphOptimizationLevel(level))
        assert_fused(session.optimized_model, 96, 24)
    monkeypatch.undo()
    assert_agrees_with_qdq_graph(model, session.optimized_model, a, got)


def test_runs_before_constant_folding():
    names = [p.name for p in PASSES]
    assert names.index("qdq_matmul_nbits") < names.index("constant_folding")
    assert {p.name: p.level for p in PASSES}["qdq_matmul_nbits"] == 1


def test_one_weight_read_by_two_matmuls():
    """Tied weights: both MatMuls read the one repacked weight."""
    rng = np.random.default_rng(5)
    model = qdq_model(rng, k=64, n=16)
    model.graph.node.append(helper.make_node("MatMul", ["a", "w_dq"], ["y2"]))
    model.graph.output.append(helper.make_tensor_value_info("y2", TensorProto.FLOAT, ["M", 16]))
    rewritten = optimize(model, 99)
    assert op_types(rewritten) == {"com.microsoft::MatMulNBits": 2}
    [first, second] = rewritten.graph.node
    assert first.input[1:] == second.input[1:]
    a = rng.standard_normal((2, 64), dtype=np.float32)
    y, y2 = optimized.InferenceSession(model.SerializeToString()).run(None, {"a": a})
    np.testing.assert_array_equal(y, y2)


# left alone ------------------------------------------------------------------------------------
def also_read_by_add(model):
    model.graph.node.append(helper.make_node("Add", ["w_dq", "w_dq"], ["w2"]))
    model.graph.output.append(helper.make_tensor_value_info("w2", TensorProto.FLOAT, None))


def as_graph_output(model):
    model.graph.output.append(helper.make_tensor_value_info("w_dq", TensorProto.FLOAT, None))


@pytest.mark.parametrize("form,change", [
    ({"scheme": "block", "block": 24}, None),  # no power-of-2 block >= 16 divides 24
    ({"scheme": "block", "block": 32, "scale_dtype": np.float16}, None),  # float16 weights
    ({"scheme": "block", "block": 32}, also_read_by_add),  # the float weights are needed anyway
    ({"scheme": "block", "block": 32}, as_graph_output),
], ids=["block24", "float16", "other-reader", "graph-output"])
def test_left_alone(form, change):
    rng = np.random.default_rng(6)
    k, n = 72, 10
    model = qdq_model(rng, k=k, n=n, **form)
    if change is not None:
        change(model)
    assert fuse_dequantize_matmul(model) is model
    a = rng.standard_normal((2, k)).astype(form.get("scale_dtype", np.float32))
    got = optimized.InferenceSession(model.SerializeToString()).run(None, {"a": a})
    expected = ReferenceEvaluator(model).run(None, {"a": a})
    for g, e in zip(got, expected):
        # the float16 forms: outputs rounded to float16 (an ulp is 1e-3 near 1), summed in
        # another order by the fused kernel than by the reference
        np.testing.assert_allclose(g, e, rtol=2e-3, atol=2e-3)


def test_per_row_scale_along_k_is_left_alone():
    """A 1-D scale on axis 0 of a [K, N] weight scales each of the K rows: no MatMulNBits block
    holds one scale, so the pattern stays."""
    rng = np.random.default_rng(7)
    model = qdq_model(rng, k=20, n=20, bits=8, scheme="channel")
    model.graph.node[0].attribute[0].i = 0  # axis 1 -> 0: per row of K
    assert fuse_dequantize_matmul(model) is model


# onnxruntime's quantizer itself -------------------------------------------------------------------
@pytest.mark.parametrize("symmetric,channel_wise",
                         [(True, False), (False, False), (True, True), (False, True)])
def test_onnxruntime_quantizer_qdq_output(symmetric, channel_wise):
    """MatMulNBitsQuantizer in QDQ format (channel-wise symmetric is its Transpose form): our
    session fuses it and agrees with the reference on the QDQ graph, and with onnxruntime run
    at accuracy level 0 (float32 activations, as ours) on the same truth."""
    ort = pytest.importorskip("onnxruntime")
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    rng = np.random.default_rng(8)
    k, n = 200, 37
    w = rng.standard_normal((k, n)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["M", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", n])],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    config = DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=symmetric,
                                          quant_format=QuantFormat.QDQ,
                                          channel_wised_quantize=channel_wise)
    quantizer = MatMulNBitsQuantizer(model, algo_config=config)
    quantizer.process()
    qdq = quantizer.model.model
    assert "DequantizeLinear" in op_types(qdq)
    a = rng.standard_normal((3, k), dtype=np.float32)
    session, got = run_session(qdq, a)
    assert_fused(session.optimized_model, k, n)
    assert_agrees_with_qdq_graph(qdq, session.optimized_model, a, got)
    options = ort.SessionOptions()
    options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    theirs = ort.InferenceSession(qdq.SerializeToString(), options,
                                  providers=["CPUExecutionProvider"]).run(None, {"a": a})[0]
    assert_agrees_with_qdq_graph(qdq, session.optimized_model, a, theirs)


def test_two_dequantize_nodes_on_one_weight():
    """Two DequantizeLinear nodes read one quantized weight: both become MatMulNBits (the weight
    leaves the session's weight store only after its last repacking)."""
    rng = np.random.default_rng(9)
    model = qdq_model(rng, k=96, n=40, signed=False, zero_points=True)
    dq = model.graph.node[0]
    model.graph.node.append(helper.make_node("DequantizeLinear", list(dq.input), ["w_dq2"],
                                             axis=0, block_size=32))
    model.graph.node.append(helper.make_node("MatMul", ["a", "w_dq2"], ["y2"]))
    model.graph.output.append(helper.make_tensor_value_info("y2", TensorProto.FLOAT, ["M", 40]))
    a = rng.standard_normal((3, 96), dtype=np.float32)
    session = optimized.InferenceSession(model.SerializeToString())
    y, y2 = session.run(None, {"a": a})
    assert op_types(session.optimized_model) == {"com.microsoft::MatMulNBits": 2}
    np.testing.assert_array_equal(y, y2)
    reference = ReferenceEvaluator(model).run(None, {"a": a})[0]
    np.testing.assert_allclose(y, reference, rtol=1e-4, atol=1e-4)


def test_level_0_runs_the_qdq_graph_from_the_weight_store():
    """Without the pass (level 0) the DequantizeLinear runs as the reference op on the 4-bit
    weight the session's store holds packed: exactly the reference's result."""
    rng = np.random.default_rng(10)
    model = qdq_model(rng, k=100, n=64, signed=True)
    a = rng.standard_normal((2, 100), dtype=np.float32)
    session, got = run_session(model, a, optimized.GraphOptimizationLevel.ORT_DISABLE_ALL)
    assert "DequantizeLinear" in op_types(session.optimized_model)
    np.testing.assert_array_equal(got, ReferenceEvaluator(model).run(None, {"a": a})[0])


@pytest.mark.parametrize("k,n,block", [(1100, 130, 16), (512, 64, 16), (96, 200, 32)])
@pytest.mark.parametrize("bits,signed", [(4, False), (4, True), (8, False), (8, True)])
@pytest.mark.parametrize("transposed", [False, True])
def test_wide_weights_with_zero_points(k, n, block, bits, signed, transposed):
    """Shapes past the repacking's register tiles (32 code rows by 64 columns) for the codes
    and, with 32 blocks or more along K, for the zero points, which are repacked from their
    raw bytes the same way: an odd number of blocks (1100 / 16 = 69, the last one partial),
    whole tiles only (512 x 64), and N not a multiple of 64."""
    rng = np.random.default_rng(k + n + bits)
    model = qdq_model(rng, k=k, n=n, bits=bits, signed=signed, zero_points=True,
                      scheme="block", block=block, transposed=transposed)
    a = rng.standard_normal((3, k), dtype=np.float32)
    session, got = run_session(model, a)
    assert_fused(session.optimized_model, k, n)
    assert_agrees_with_qdq_graph(model, session.optimized_model, a, got)


def same_size_chain(rng, elem=TensorProto.UINT4, k=256, n=256):
    """Three layers of QDQ weights [K, N], each with blockwise scales and zero points of one
    size, so that the pass can reuse each released array's memory for the next layer."""
    low, high = CODE_RANGE[elem]
    nodes, inits, x = [], [], "a"
    for i in range(3):
        codes = rng.integers(low, high + 1, (k, n))
        scales = ((rng.random((k // 32, n)) + 0.05) / 64).astype(np.float32)
        zp = rng.integers(low, high + 1, (k // 32, n))
        inits += [code_tensor(f"w{i}_q", codes, elem),
                  numpy_helper.from_array(scales, f"w{i}_scale"),
                  code_tensor(f"w{i}_zp", zp, elem)]
        nodes += [helper.make_node("DequantizeLinear", [f"w{i}_q", f"w{i}_scale", f"w{i}_zp"],
                                   [f"w{i}"], axis=0, block_size=32),
                  helper.make_node("MatMul", [x, f"w{i}"], [f"y{i}"])]
        x = f"y{i}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["M", k])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["M", n])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize("k", [256, 512])
def test_model_file_with_weights_of_one_size(tmp_path, k):
    """Loaded from a file, each weight's codes are read into arrays of their own, and the pass
    repacks a later weight's codes and scales into the memory of those it has released (codes,
    scales and zero points of one size in three layers: each array is reused or freed, never
    shared; at K 512 the repacked zero points too, into the memory of released ones). The
    result is the bytes-loaded session's, bit for bit, and the reference's on the QDQ graph
    within MatMulNBits's rounding."""
    rng = np.random.default_rng(5)
    model = same_size_chain(rng, k=k, n=k)
    path = tmp_path / "chain.onnx"
    onnx.save(model, path)
    a = rng.standard_normal((3, k), dtype=np.float32)
    from_file = optimized.InferenceSession(str(path))
    assert op_types(from_file.optimized_model) == {"com.microsoft::MatMulNBits": 3}
    got = from_file.run(None, {"a": a})[0]
    np.testing.assert_array_equal(got, run_session(model, a)[1])
    reference = ReferenceEvaluator(model).run(None, {"a": a})[0]
    np.testing.assert_allclose(got, reference, rtol=0, atol=1e-4 * np.abs(reference).max())


def test_reusable_memory_only_where_nothing_else_sees_it():
    """The pass writes a later weight's codes into a released array's memory only when its one
    name (as the pass holds it) is all that refers to the array or its memory."""
    from optimized.passes.qdq_matmul_nbits import _reusable_memory

    array = np.arange(4096, dtype=np.float32)
    array.setflags(write=False)  # as the weight store holds it
    memory = _reusable_memory(array)
    assert memory is not None and memory.flags.writeable and memory.nbytes == array.nbytes
    assert np.shares_memory(memory, array)

    for keep in (lambda array: array,  # another name
                 lambda array: array[1:],  # a view of it
                 memoryview):  # a buffer over it
        array = np.arange(4096, dtype=np.float32)
        kept = keep(array)
        assert _reusable_memory(array) is None
        del kept
        assert _reusable_memory(array) is not None  # once it is gone
    owner = np.arange(4096, dtype=np.float32)
    array, sibling = owner[:2048], owner[2048:]
    del owner
    assert _reusable_memory(array) is None  # another view of the memory under it
    del sibling
    assert _reusable_memory(array) is not None
    data = bytearray(16384)
    assert _reusable_memory(np.frombuffer(data, np.float32)) is None  # a user's buffer
    assert _reusable_memory(np.frombuffer(bytes(16384), np.float32)) is None  # model bytes


def test_outputs_from_spares_else_one_fresh_allocation_on_a_huge_page():
    """A spare array of a size is taken (and leaves the spares); the other sizes share one
    fresh allocation, which starts on a 2 MiB boundary when it is large, without overlaps."""
    from optimized.passes.qdq_matmul_nbits import HUGE_PAGE, _outputs

    spare_memory = np.zeros(3000, np.uint8)
    spare = {3000: spare_memory, 10: np.zeros(10, np.uint8)}
    codes, scales, zero_points = _outputs(spare, 5 << 20, 3000, 100)
    assert scales is spare_memory and set(spare) == {10}
    assert [codes.nbytes, zero_points.nbytes] == [5 << 20, 100]
    assert codes.ctypes.data % HUGE_PAGE == 0 and codes.flags.writeable
    assert not np.shares_memory(codes, zero_points) and np.shares_memory(codes.base, zero_points)
    small, other = _outputs({}, 100, 24)
    assert (small.nbytes, other.nbytes) == (100, 24) and not np.shares_memory(small, other)
    assert other.ctypes.data % 4 == 0  # each starts on a 64-byte step: a float view fits


@pytest.mark.parametrize("given", ["file", "bytes", "walked bytes", "ModelProto", "add_initializer"])
def test_what_the_user_holds_is_never_written(given, monkeypatch, tmp_path):
    """Whatever the user keeps of the model (its bytes and a NumPy view of them, the ModelProto,
    an array given by add_initializer) is the same after the session is made and run, while
    the pass reuses the memory of the weights it releases; the outputs stay the reference's."""
    elem = TensorProto.UINT8 if given == "add_initializer" else TensorProto.UINT4
    rng = np.random.default_rng(6)
    model = same_size_chain(rng, elem)
    a = rng.standard_normal((3, 256), dtype=np.float32)
    reference = ReferenceEvaluator(model).run(None, {"a": a})[0]
    data = bytearray(model.SerializeToString())
    view = np.frombuffer(data, np.uint8)
    before = bytes(data)
    options = optimized.SessionOptions()
    codes = numpy_helper.to_array(model.graph.initializer[0]).copy()
    if given == "add_initializer":
        options.add_initializer("w0_q", optimized.OrtValue.ortvalue_from_numpy(codes))
    held = codes.copy()
    if given == "walked bytes":
        monkeypatch.setattr(optimized.loading, "WALK_BYTES", 0)
    if given == "file":
        path = tmp_path / "chain.onnx"
        path.write_bytes(data)
        source = str(path)
    else:
        source = model if given == "ModelProto" else data
    session = optimized.InferenceSession(source, options)
    assert op_types(session.optimized_model) == {"com.microsoft::MatMulNBits": 3}
    got = session.run(None, {"a": a})[0]
    assert bytes(data) == before and view.tobytes() == before
    assert model.SerializeToString() == before
    np.testing.assert_array_equal(codes, held)
    if given == "file":
        assert path.read_bytes() == before
    np.testing.assert_allclose(got, reference, rtol=0, atol=1e-4 * np.abs(reference).max())
