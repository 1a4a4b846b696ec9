"""fuse_bias_activation: Conv/Gemm + activation -> FusedConv/FusedGemm, MatMul + scale ->
FusedMatMul (com.microsoft)."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from optimized.passes._graph import working_copy
from optimized.passes.fuse_bias_activation import fuse_bias_activation

from .helpers import assert_same_outputs, make_model, op_types

RNG = np.random.default_rng(11)
ACTIVATIONS = {  # op, extra inputs, attributes, the parameters onnxruntime's fused op gets
    "Relu": ([], {}, []),
    "Sigmoid": ([], {}, []),
    "Tanh": ([], {}, []),
    "LeakyRelu": ([], {"alpha": 0.25}, [0.25]),
    "HardSigmoid": ([], {"alpha": 0.5, "beta": 0.25}, [0.5, 0.25]),
    "Clip": (["lo", "hi"], {}, [-0.5, 0.75]),
}
BOUNDS = {"lo": np.float32(-0.5), "hi": np.float32(0.75)}


def attrs_of(node):
    values = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return {k: v.decode() if isinstance(v, bytes) else v for k, v in values.items()}


def conv_act(activation, extra_reader=False, dtype=np.float32):
    extra, attrs, _ = ACTIVATIONS[activation]
    inits = {"w": RNG.standard_normal((4, 3, 3, 3)).astype(dtype),
             "b": RNG.standard_normal(4).astype(dtype), **BOUNDS}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node(activation, ["c", *extra], ["y"], **attrs)]
    outputs = [("y", [1, 4, 5, 5])]
    if extra_reader:
        nodes.append(helper.make_node("Neg", ["c"], ["z"]))
        outputs.append(("z", [1, 4, 5, 5]))
    return make_model(nodes, [("x", [1, 3, 5, 5])], outputs, inits, opset=13)


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_conv_activation_becomes_fused_conv(activation):
    model = conv_act(activation)
    fused = fuse_bias_activation(model)
    assert op_types(fused) == {"com.microsoft::FusedConv": 1}
    attrs = attrs_of(fused.graph.node[0])
    assert attrs["activation"] == activation and attrs["pads"] == [1, 1, 1, 1]
    np.testing.assert_allclose(attrs.get("activation_params", []), ACTIVATIONS[activation][2])
    assert_same_outputs(model, fused)


@pytest.mark.parametrize("activation", [a for a in ACTIVATIONS if a != "Clip"])
def test_gemm_activation_becomes_fused_gemm(activation):
    extra, attrs, params = ACTIVATIONS[activation]
    inits = {"w": RNG.standard_normal((5, 4)).astype(np.float32),
             "b": RNG.standard_normal(5).astype(np.float32)}
    nodes = [helper.make_node("Gemm", ["a", "w", "b"], ["g"], transB=1, alpha=0.5),
             helper.make_node(activation, ["g", *extra], ["y"], **attrs)]
    model = make_model(nodes, [("a", [3, 4])], [("y", [3, 5])], inits, opset=13)
    fused = fuse_bias_activation(model)
    assert op_types(fused) == {"com.microsoft::FusedGemm": 1}
    got = attrs_of(fused.graph.node[0])
    assert got["activation"] == activation and got["transB"] == 1 and got["alpha"] == 0.5
    np.testing.assert_allclose([got[k] for k in ("activation_alpha", "activation_beta")
                                if k in got], params)
    assert_same_outputs(model, fused)


def test_gemm_clip_is_kept_for_onnxruntime_has_no_such_fused_gemm():
    nodes = [helper.make_node("Gemm", ["a", "w"], ["g"]),
             helper.make_node("Clip", ["g", "lo", "hi"], ["y"])]
    model = make_model(nodes, [("a", [3, 4])], [("y", [3, 5])],
                       {"w": np.ones((4, 5), np.float32), **BOUNDS}, opset=13)
    assert op_types(fuse_bias_activation(model)) == {"Gemm": 1, "Clip": 1}


@pytest.mark.parametrize("scale_op,constant,alpha", [("Mul", 0.125, 0.125), ("Div", 4.0, 0.25)])
def test_matmul_and_scale_become_fused_matmul(scale_op, constant, alpha):
    nodes = [helper.make_node("MatMul", ["a", "b"], ["mm"]),
             helper.make_node(scale_op, ["mm", "s"], ["y"])]
    model = make_model(nodes, [("a", [2, 3, 4]), ("b", [2, 4, 5])], [("y", [2, 3, 5])],
                       {"s": np.float32(constant)})
    fused = fuse_bias_activation(model)
    assert op_types(fused) == {"com.microsoft::FusedMatMul": 1}
    assert attrs_of(fused.graph.node[0])["alpha"] == alpha
    assert_same_outputs(model, fused)


def test_constant_divided_by_matmul_is_kept():
    nodes = [helper.make_node("MatMul", ["a", "b"], ["mm"]),
             helper.make_node("Div", ["s", "mm"], ["y"])]
    model = make_model(nodes, [("a", [3, 4]), ("b", [4, 5])], [("y", [3, 5])],
                       {"s": np.float32(2.0)})
    assert op_types(fuse_bias_activation(model)) == {"MatMul": 1, "Div": 1}


def test_conv_output_read_elsewhere_is_kept():
    model = conv_act("Relu", extra_reader=True)
    assert op_types(fuse_bias_activation(model)) == {"Conv": 1, "Relu": 1, "Neg": 1}


def test_double_conv_is_kept_for_the_fused_kernels_are_float32():
    model = conv_act("Relu", dtype=np.float64)
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.DOUBLE
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.DOUBLE
    assert op_types(fuse_bias_activation(model)) == {"Conv": 1, "Relu": 1}


@pytest.mark.parametrize("op_type,bias", [("Add", "b"), ("Sum", "b"), ("Add", "")])
def test_conv_residual_activation_becomes_fused_conv_with_z(op_type, bias):
    inits = {"w": RNG.standard_normal((4, 4, 3, 3)).astype(np.float32),
             "b": RNG.standard_normal(4).astype(np.float32)}
    conv_inputs = ["x", "w", "b"] if bias else ["x", "w"]
    nodes = [helper.make_node("Conv", conv_inputs, ["c"], pads=[1, 1, 1, 1]),
             helper.make_node(op_type, ["x", "c"], ["r"]),
             helper.make_node("Relu", ["r"], ["y"])]
    model = make_model(nodes, [("x", [1, 4, 5, 5])], [("y", [1, 4, 5, 5])], inits, opset=13)
    fused = fuse_bias_activation(model)
    assert op_types(fused) == {"com.microsoft::FusedConv": 1}
    assert list(fused.graph.node[0].input) == ["x", "w", bias, "x"]
    assert_same_outputs(model, fused)


def test_residual_that_broadcasts_is_kept():
    inits = {"w": RNG.standard_normal((4, 4, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("Add", ["c", "z"], ["r"]),
             helper.make_node("Relu", ["r"], ["y"])]
    model = make_model(nodes, [("x", [1, 4, 5, 5]), ("z", [1, 4, 1, 1])], [("y", [1, 4, 5, 5])],
                       inits, opset=13)
    assert op_types(fuse_bias_activation(model)) == {"Conv": 1, "Add": 1, "Relu": 1}


def conv_hard_swish(bias=True, extra_reader=False, out_hw=(5, 8), **conv_attrs):
    """Conv (N != C != H != W) + HardSwish at opset 14, where HardSwish starts."""
    inits = {"w": RNG.standard_normal((6, 3, 3, 2)).astype(np.float32)}
    if bias:
        inits["b"] = RNG.standard_normal(6).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"] if bias else ["x", "w"], ["c"],
                              **conv_attrs),
             helper.make_node("HardSwish", ["c"], ["y"])]
    outputs = [("y", [2, 6, *out_hw])]
    if extra_reader:
        nodes.append(helper.make_node("Neg", ["c"], ["z"]))
        outputs.append(("z", [2, 6, *out_hw]))
    return make_model(nodes, [("x", [2, 3, 7, 9])], outputs, inits, opset=14)


@pytest.mark.parametrize("out_hw, conv_attrs", [
    ((5, 8), {}),
    ((4, 8), {"pads": [1, 0, 1, 1], "strides": [2, 1], "dilations": [1, 2]}),
    ((7, 9), {"auto_pad": "SAME_UPPER", "kernel_shape": [3, 2]}),
])
def test_conv_hard_swish_becomes_a_fused_function(out_hw, conv_attrs):
    # onnxruntime's FusedConv has no HardSwish: a model-local function any runtime can run
    model = conv_hard_swish(out_hw=out_hw, **conv_attrs)
    fused = fuse_bias_activation(model)
    assert op_types(fused) == {"onnx_parity.fused::ConvHardSwish": 1}
    node = fused.graph.node[0]
    assert list(node.input) == ["x", "w", "b"] and list(node.output) == ["y"]
    assert attrs_of(node) == conv_attrs
    assert [(f.domain, f.name) for f in fused.functions] == [("onnx_parity.fused",
                                                              "ConvHardSwish")]
    assert "com.microsoft" not in {o.domain for o in fused.opset_import}
    assert_same_outputs(model, fused)


@pytest.mark.parametrize("variant", [{"bias": False}, {"extra_reader": True}])
def test_conv_hard_swish_without_bias_or_read_elsewhere_is_kept(variant):
    model = conv_hard_swish(**variant)
    assert op_types(fuse_bias_activation(model)) == op_types(model)


@pytest.mark.parametrize("dtype,fused", [(np.float32, True), (np.float64, False)])
def test_conv_type_is_read_from_its_weight_without_shape_inference(monkeypatch, dtype, fused):
    model = conv_act("Relu", dtype=dtype)
    for value in (model.graph.input[0], model.graph.output[0]):
        value.type.tensor_type.elem_type = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))

    def refuse(*args, **kwargs):
        raise AssertionError("shape inference was asked")
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", refuse)
    with working_copy(model) as working:  # where Shapes infers on its first question only
        rewritten = fuse_bias_activation(working.model)
    expected = {"com.microsoft::FusedConv": 1} if fused else {"Conv": 1, "Relu": 1}
    assert op_types(rewritten) == expected
