"""attention_fusion: split heads -> MatMul(Q, K^T) -> scale -> mask -> Softmax -> MatMul(V) ->
merge heads becomes com.microsoft MultiHeadAttention."""
import numpy as np
import pytest
from onnx import helper

from optimized.passes.attention_fusion import fuse_attention

from .helpers import assert_same_outputs, make_model, op_types

B, S, N, H = 2, 6, 4, 8
D = N * H
RNG = np.random.default_rng(2)


def attention_model(mask_shape=(1, 1, S, S), scale_op="Div", key_two_transposes=False,
                    softmax_axis=-1, scores_output=False):
    """q, k, v are graph inputs [B, S, D]; everything between them and y is the pattern."""
    nodes = [helper.make_node("Reshape", [t, "split"], [t + "4"]) for t in "qkv"]
    nodes += [helper.make_node("Transpose", ["q4"], ["qh"], perm=[0, 2, 1, 3]),
              helper.make_node("Transpose", ["v4"], ["vh"], perm=[0, 2, 1, 3])]
    if key_two_transposes:
        nodes += [helper.make_node("Transpose", ["k4"], ["kh"], perm=[0, 2, 1, 3]),
                  helper.make_node("Transpose", ["kh"], ["kt"], perm=[0, 1, 3, 2])]
    else:
        nodes.append(helper.make_node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]))
    nodes += [helper.make_node("MatMul", ["qh", "kt"], ["scores"]),
              helper.make_node(scale_op, ["scores", "scale"], ["scaled"])]
    inits = {"split": np.array([0, 0, N, H], np.int64), "merge": np.array([0, 0, D], np.int64),
             "scale": np.float32(np.sqrt(H) if scale_op == "Div" else 1 / np.sqrt(H))}
    logits = "scaled"
    if mask_shape is not None:
        inits["mask"] = np.where(RNG.random(mask_shape) < 0.3, -10000.0, 0.0).astype(np.float32)
        nodes.append(helper.make_node("Add", ["scaled", "mask"], ["masked"]))
        logits = "masked"
    nodes += [helper.make_node("Softmax", [logits], ["probs"], axis=softmax_axis),
              helper.make_node("MatMul", ["probs", "vh"], ["ctx"]),
              helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ctx_t", "merge"], ["y"])]
    outputs = [("y", [B, S, D])] + ([("scores", [B, N, S, S])] if scores_output else [])
    return make_model(nodes, [(t, [B, S, D]) for t in "qkv"], outputs, inits)


def attrs_of(node):
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


@pytest.mark.parametrize("kwargs", [
    {}, {"mask_shape": None}, {"mask_shape": (B, 1, S, S)}, {"scale_op": "Mul"},
    {"key_two_transposes": True},
], ids=["causal-style mask", "no mask", "per-batch mask", "Mul scale", "K^T in two steps"])
def test_becomes_multi_head_attention(kwargs):
    model = attention_model(**kwargs)
    fused = fuse_attention(model)
    assert op_types(fused) == {"com.microsoft::MultiHeadAttention": 1}
    node = fused.graph.node[0]
    assert list(node.input[:3]) == ["q", "k", "v"] and list(node.output) == ["y"]
    assert attrs_of(node)["num_heads"] == N
    assert attrs_of(node)["scale"] == pytest.approx(1 / np.sqrt(H))
    assert_same_outputs(model, fused)


def test_padding_mask_is_expanded_to_one_row_per_query():
    model = attention_model(mask_shape=(B, 1, 1, S))
    fused = fuse_attention(model)
    assert op_types(fused) == {"Expand": 1, "com.microsoft::MultiHeadAttention": 1}
    expand, mha = fused.graph.node
    assert mha.input[5] == expand.output[0] and expand.input[0] == "mask"
    assert_same_outputs(model, fused)


@pytest.mark.parametrize("kwargs", [
    {"softmax_axis": 2},               # not over the keys
    {"scores_output": True},           # the raw scores are wanted too
    {"mask_shape": (1, 1, S, 1)},      # MultiHeadAttention's attention_bias needs (.., S, T)
], ids=["softmax axis", "scores read elsewhere", "mask shape"])
def test_not_fused(kwargs):
    model = attention_model(**kwargs)
    assert op_types(fuse_attention(model)) == op_types(model)
