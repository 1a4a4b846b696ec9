"""conv_bn_folding: Conv then inference BatchNormalization becomes one Conv."""
import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from conformance.diff import ReferenceSide, diff_models
from conformance.inputs import random_inputs
from optimized.passes import optimize
from optimized.passes.constant_folding import fold_constants
from optimized.passes.conv_bn_folding import fold_conv_batchnorm
from optimized.passes.initializer_inputs import freeze_initializer_inputs

from .helpers import assert_same_outputs, light_model, make_model, op_types

RNG = np.random.default_rng(3)


def conv_bn(bias=True, opset=15, extra_reader=False, **bn_attrs):
    c = 4
    inits = {"w": RNG.standard_normal((c, 3, 3, 3)).astype(np.float32),
             "gamma": RNG.uniform(0.5, 2, c).astype(np.float32),
             "beta": RNG.standard_normal(c).astype(np.float32),
             "mean": RNG.standard_normal(c).astype(np.float32),
             "var": RNG.uniform(0.5, 2, c).astype(np.float32)}
    if bias:
        inits["b"] = RNG.standard_normal(c).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["conv"],
                              pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["conv", "gamma", "beta", "mean", "var"],
                              ["y"], epsilon=1e-3, **bn_attrs)]
    outputs = [("y", [1, c, 5, 5])]
    if extra_reader:
        nodes.append(helper.make_node("Relu", ["conv"], ["z"]))
        outputs.append(("z", [1, c, 5, 5]))
    return make_model(nodes, [("x", [1, 3, 5, 5])], outputs, inits, opset=opset)


def test_folded_weights_by_hand():
    # 1x1 conv, one channel: w=2, b=1; s = gamma/sqrt(var+eps) = 3/sqrt(3+1) = 1.5
    inits = {"w": np.full((1, 1, 1, 1), 2.0, np.float32), "b": np.array([1.0], np.float32),
             "gamma": np.array([3.0], np.float32), "beta": np.array([0.5], np.float32),
             "mean": np.array([1.0], np.float32), "var": np.array([3.0], np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]),
             helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["y"],
                              epsilon=1.0)]
    model = make_model(nodes, [("x", [1, 1, 2, 2])], [("y", [1, 1, 2, 2])], inits)
    folded = fold_conv_batchnorm(model)
    assert op_types(folded) == {"Conv": 1}
    values = {i.name: numpy_helper.to_array(i) for i in folded.graph.initializer}
    w_name, b_name = folded.graph.node[0].input[1:]
    assert values[w_name].reshape(-1).tolist() == [3.0]  # 2 * 1.5
    assert values[b_name].tolist() == [0.5]  # (1 - 1) * 1.5 + 0.5
    assert_same_outputs(model, folded)


@pytest.mark.parametrize("bias", [True, False])
def test_conv_bn_becomes_one_conv(bias):
    model = conv_bn(bias=bias)
    folded = fold_conv_batchnorm(model)
    assert op_types(folded) == {"Conv": 1}
    assert_same_outputs(model, folded)


def test_training_mode_batchnorm_is_kept():
    model = conv_bn(training_mode=1)
    assert op_types(fold_conv_batchnorm(model)) == op_types(model)


def test_conv_output_read_elsewhere_is_kept():
    model = conv_bn(extra_reader=True)
    assert op_types(fold_conv_batchnorm(model)) == op_types(model)


def test_batchnorm_with_non_constant_statistics_is_kept():
    model = conv_bn()
    model.graph.input.append(helper.make_tensor_value_info("mean", 1, [4]))  # overridable
    assert op_types(fold_conv_batchnorm(model)) == op_types(model)


def test_light_resnet50_folds_every_batchnorm():
    model = fold_constants(freeze_initializer_inputs(light_model("light_resnet50")))
    assert op_types(model)["BatchNormalization"] == 53
    folded = fold_conv_batchnorm(model)
    counts = op_types(folded)
    assert counts["Conv"] == 53 and "BatchNormalization" not in counts


def random_weights(model, seed=0):
    """light_resnet50 ships every weight as the same constant, which would hide a weight put in
    the wrong channel: give each one seeded random values of a sensible scale."""
    rng = np.random.default_rng(seed)
    for init in model.graph.initializer:
        value = numpy_helper.to_array(init)
        if value.dtype != np.float32:
            continue
        if value.ndim == 4:  # conv weights, He-scaled
            new = rng.standard_normal(value.shape) * np.sqrt(2.0 / np.prod(value.shape[1:]))
        elif value.ndim == 2:
            new = rng.standard_normal(value.shape) * 0.01
        else:  # BN scale, bias, mean and (positive) variance
            new = rng.uniform(0.5, 1.5, value.shape)
        init.CopyFrom(numpy_helper.from_array(new.astype(np.float32), init.name))
    return model


def test_light_resnet50_at_level_2_gives_the_same_outputs():
    model = random_weights(fold_constants(freeze_initializer_inputs(
        light_model("light_resnet50"))))
    # the Softmax saturates; the logits before it show any difference
    logits = next(n for n in model.graph.node if n.op_type == "Gemm").output[0]
    model.graph.output.append(helper.make_tensor_value_info(logits, 1, [1, 1000]))
    optimized = optimize(model, 2)
    counts = op_types(optimized)
    # every Relu joins its Conv: conv1, the first two convs of each of the 16 bottlenecks, and
    # the residual Sum + Relu at the end of each bottleneck
    assert counts["com.microsoft::FusedConv"] == 1 + 2 * 16 + 16 and counts["Conv"] == 4
    assert not {"BatchNormalization", "Relu", "Sum"} & set(counts)
    onnx.checker.check_model(optimized, full_check=True)
    # A fixed rtol/atol on the logits depended on the BLAS kernel (one logit near -0.98 among
    # values near 1e3 moved by 2.4e-3 under OpenBLAS's default kernel, not under Haswell's).
    # Node by node, each value out of the diff's tolerance is judged instead by the error its
    # node's arithmetic allows in any summation order: the folded FusedConv on the original's
    # activations against its exact float64 value, and the original's chain against the same.
    report = diff_models(ReferenceSide(model), ReferenceSide(optimized, label="level 2"),
                         feeds=random_inputs(model, seed=0))
    assert report.divergent == [], report.summary()
    assert report.row(logits).metrics is not None
