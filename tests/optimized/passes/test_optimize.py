"""optimize(model, level) and the PASSES registry, over whole models."""
import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper

from optimized.passes import PASSES, optimize
from optimized.passes import op_types as graph_op_types

from .helpers import assert_same_outputs, gpt2_block, make_model, op_types


def test_registry_names_levels_and_functions():
    names = {p.name: p.level for p in PASSES}
    for name in ("constant_folding", "dead_code", "identity_elimination", "cse"):
        assert names[name] == 1
    for name in ("conv_bn_folding", "matmul_add_to_gemm", "fuse_bias_activation",
                 "layer_norm_fusion", "gelu_fusion", "attention_fusion"):
        assert names[name] == 2
    assert all(callable(p.function) for p in PASSES)


def test_level_0_changes_nothing():
    model = gpt2_block()
    assert optimize(model, 0) == model


@pytest.mark.parametrize("bad", [-1, 1.5, "2"])
def test_bad_level_is_named(bad):
    with pytest.raises(ValueError, match="optimization level"):
        optimize(gpt2_block(), bad)


def test_not_a_model_is_named():
    with pytest.raises(TypeError, match="ModelProto"):
        optimize(b"not a model", 1)


def test_level_1_cleans_up_without_fusing():
    model = gpt2_block()
    cleaned = optimize(model, 1)
    assert "Identity" not in op_types(cleaned)
    assert op_types(cleaned)["ReduceMean"] == 4 and "LayerNormalization" not in op_types(cleaned)
    assert_same_outputs(model, cleaned)


@pytest.mark.parametrize("opset,expected", [
    (17, {"LayerNormalization": 2, "com.microsoft::FastGelu": 1,
          "com.microsoft::MultiHeadAttention": 1}),
    (20, {"LayerNormalization": 2, "Gelu": 1, "com.microsoft::MultiHeadAttention": 1}),
    # before 17 the LayerNorm after the residual Add becomes SkipLayerNormalization, the other
    # onnxruntime's LayerNormalization-1
    (13, {"com.microsoft::SkipLayerNormalization": 1, "LayerNormalization": 1, "ReduceMean": 0,
          "com.microsoft::FastGelu": 1, "com.microsoft::MultiHeadAttention": 1}),
])
def test_gpt2_block_at_level_2(opset, expected):
    model = gpt2_block(opset)
    fused = optimize(model, 2)
    counts = op_types(fused)
    for op_type, count in expected.items():
        assert counts[op_type] == count, (op_type, counts)
    # what is left: the six projections (3-D MatMul + bias Add) and the two residual Adds
    assert counts["MatMul"] == 6 and not {"Softmax", "Erf", "Tanh", "Transpose"} & set(counts)
    assert_same_outputs(model, fused)


@pytest.mark.parametrize("opset", [13, 17])
def test_second_layer_fuses_behind_the_fused_nodes_of_the_first(opset):
    # shapes must be inferred through the com.microsoft nodes the first layer became
    model = gpt2_block(opset, layers=2)
    counts = op_types(optimize(model, 2))
    assert counts["com.microsoft::MultiHeadAttention"] == 2
    assert counts["com.microsoft::FastGelu"] == 2
    assert counts["LayerNormalization" if opset >= 17 else
                  "com.microsoft::SkipLayerNormalization"] == (4 if opset >= 17 else 3)
    assert counts["LayerNormalization"] == (4 if opset >= 17 else 1)
    assert_same_outputs(model, optimize(model, 2))


def test_gpt2_block_with_exact_gelu_and_no_mask():
    model = gpt2_block(gelu="erf", mask=False)
    fused = optimize(model, 2)
    assert op_types(fused)["com.microsoft::Gelu"] == 1
    assert op_types(fused)["com.microsoft::MultiHeadAttention"] == 1
    assert_same_outputs(model, fused)


def test_optimize_is_idempotent():
    once = optimize(gpt2_block(), 2)
    assert optimize(once, 2) == once


def test_saved_and_reloaded_model_still_checks(tmp_path):
    path = tmp_path / "optimized.onnx"
    onnx.save(optimize(gpt2_block(), 2), path)
    onnx.checker.check_model(str(path), full_check=True)


# a law: whatever chain of elementwise ops with (possibly neutral or repeated) constants,
# the optimized model computes what the original computes
UNARY = ["Relu", "Neg", "Abs", "Tanh", "Sigmoid", "Identity"]
BINARY = ["Add", "Sub", "Mul"]
CONSTANTS = st.sampled_from([0.0, 1.0, 2.0, -0.5])


@st.composite
def elementwise_chains(draw):
    nodes, inits, last = [], {}, "x"
    for i in range(draw(st.integers(1, 8))):
        if draw(st.booleans()):
            op_type = draw(st.sampled_from(UNARY))
            nodes.append(helper.make_node(op_type, [last], [f"t{i}"]))
        else:
            name = f"c{i}"
            inits[name] = np.float32(draw(CONSTANTS))
            # the constant may be folded first, so it comes through a small constant subgraph
            if draw(st.booleans()):
                nodes.append(helper.make_node("Identity", [name], [f"{name}_id"]))
                name = f"{name}_id"
            operands = [last, name] if draw(st.booleans()) else [name, last]
            nodes.append(helper.make_node(draw(st.sampled_from(BINARY)), operands, [f"t{i}"]))
        if draw(st.booleans()):  # the same node again, for cse to find
            nodes.append(helper.make_node(nodes[-1].op_type, list(nodes[-1].input), [f"u{i}"]))
            nodes.append(helper.make_node("Add", [f"t{i}", f"u{i}"], [f"s{i}"]))
            last = f"s{i}"
        else:
            last = f"t{i}"
    nodes.append(helper.make_node("Identity", [last], ["y"]))
    return make_model(nodes, [("x", [2, 3])], [("y", [2, 3])], inits)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(elementwise_chains(), st.integers(1, 2))
def test_optimized_chain_computes_the_same(model, level):
    assert_same_outputs(model, optimize(model, level), rtol=1e-5, atol=1e-6)


def conv_with_affine_and_batchnorm(opset=17):
    """Conv -> Mul -> Add (per channel) -> BatchNormalization -> Relu; MatMul -> Sigmoid."""
    rng = np.random.default_rng(0)
    channels = (3, 4)
    inits = {"w": rng.standard_normal((channels[1], channels[0], 3, 3)).astype(np.float32),
             "m": rng.standard_normal((channels[1], 1, 1)).astype(np.float32),
             "a": rng.standard_normal((channels[1], 1, 1)).astype(np.float32),
             "g": np.ones(channels[1], np.float32), "b": np.zeros(channels[1], np.float32),
             "mean": np.zeros(channels[1], np.float32), "var": np.ones(channels[1], np.float32),
             "k": rng.standard_normal((5, 5)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["c", "m"], ["cm"]),
             helper.make_node("Add", ["cm", "a"], ["ca"]),
             helper.make_node("BatchNormalization", ["ca", "g", "b", "mean", "var"], ["n"]),
             helper.make_node("Relu", ["n"], ["y"]),
             helper.make_node("MatMul", ["y", "k"], ["z"]),
             helper.make_node("Sigmoid", ["z"], ["s"]),
             helper.make_node("Mul", ["z", "s"], ["out"])]
    return make_model(nodes, [("x", [2, 3, 5, 5])], [("out", [2, 4, 5, 5])], inits, opset=opset)


def without(model, op_type):
    """The model with each `op_type` node replaced by Identity (same values where it is one)."""
    model = copy_of(model)
    for node in model.graph.node:
        if node.op_type == op_type:
            node.op_type = "Identity"
            del node.input[1:]
            del node.attribute[:]
    return model


def copy_of(model):
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


@pytest.mark.parametrize("p", [p for p in PASSES if p.anchors], ids=lambda p: p.name)
def test_a_pass_skipped_for_want_of_its_anchors_would_change_nothing(p):
    # optimize() skips a pass when the graph holds none of its anchor op types: on models
    # holding the rest of its patterns but not those, the pass must leave the model as it was
    models = [conv_with_affine_and_batchnorm(), gpt2_block(opset=17), gpt2_block(opset=13)]
    for model in models:
        for anchor in p.anchors:
            model = without(model, anchor)
        assert p.anchors.isdisjoint(graph_op_types(model))
        rewritten = p.function(model)
        assert rewritten.SerializeToString() == model.SerializeToString(), p.name



def test_weights_a_pass_makes_go_to_the_store_without_a_copy_in_the_model(monkeypatch):
    import optimized.passes
    from reference.weights import WeightStore, attached, is_stub, tensor_array

    # no detaching after each pass: the stub must be the pass's own
    monkeypatch.setattr(optimized.passes, "detach_initializers", lambda model, store: None)

    rng = np.random.default_rng(1)
    w = rng.standard_normal((32, 3, 5, 3)).astype(np.float32)  # 1440 elements: a store's
    scale = rng.standard_normal((32, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("Mul", ["c", "scale"], ["y"])]
    model = make_model(nodes, [("x", [1, 3, 7, 6])], [("y", [1, 32, 3, 4])],
                       {"w": w, "scale": scale})
    store = WeightStore()
    rewritten = optimize(model, 2, store)
    folded = [t for t in rewritten.graph.initializer if t.name not in ("w", "scale")]
    assert len(folded) == 2 and is_stub(folded[0]) and not folded[0].raw_data
    np.testing.assert_allclose(tensor_array(folded[0]), w * scale.reshape(32, 1, 1, 1),
                               rtol=1e-6)
    assert not is_stub(folded[1])  # the bias: 32 elements stay in the model
    assert_same_outputs(model, attached(rewritten))  # onnx's checker reads no stub


def two_relus():
    nodes = [helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    return make_model(nodes, [("x", [2, 3])], [("y", [2, 3])])


def passes_of(monkeypatch, *functions):
    import optimized.passes
    from optimized.passes import Pass

    monkeypatch.setattr(optimized.passes, "PASSES",
                        [Pass(f"pass_{i}", 1, f) for i, f in enumerate(functions)])


def test_a_pass_sees_what_the_pass_before_it_changed(monkeypatch):
    from optimized.passes._graph import Shapes, copy_model

    seen = []

    def widen(model):  # the second Relu reads h concatenated with itself, [2, 6]
        model = copy_model(model)
        model.graph.node.insert(1, helper.make_node("Concat", ["h", "h"], ["hh"], axis=1))
        model.graph.node[2].input[0] = "hh"
        return model

    def look(model):
        last = model.graph.node[-1].input[0]
        seen.append(([n.op_type for n in model.graph.node], Shapes(model).shape(last)))
        return model

    passes_of(monkeypatch, look, widen, look)
    model = two_relus()
    given = model.SerializeToString()
    rewritten = optimize(model, 1)
    assert seen == [(["Relu", "Relu"], [2, 3]), (["Relu", "Concat", "Relu"], [2, 6])]
    assert [n.op_type for n in rewritten.graph.node] == ["Relu", "Concat", "Relu"]
    assert model.SerializeToString() == given  # the passes edited optimize's copy alone


def test_a_failed_pass_leaves_the_given_model_intact(monkeypatch):
    from optimized.passes._graph import copy_model

    def break_then_fail(model):
        model = copy_model(model)
        del model.graph.node[:]
        raise RuntimeError("pass failed half-way")

    passes_of(monkeypatch, break_then_fail)
    model = two_relus()
    given = model.SerializeToString()
    with pytest.raises(RuntimeError, match="half-way"):
        optimize(model, 1)
    assert model.SerializeToString() == given


def test_passes_that_change_nothing_share_one_shape_inference(monkeypatch):
    from optimized.passes import _graph

    calls = []
    real = onnx.shape_inference.infer_shapes
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes",
                        lambda *a, **k: calls.append(1) or real(*a, **k))

    def look(model):
        assert _graph.Shapes(model).shape("h") == [2, 3]
        return _graph.copy_model(model)  # an equal model counts as no change

    def rename(model):
        model = _graph.copy_model(model)
        model.graph.node[0].name = "renamed"
        return model

    passes_of(monkeypatch, look, look, look)
    optimize(two_relus(), 1)
    assert len(calls) == 1
    calls.clear()
    passes_of(monkeypatch, look, rename, look)
    optimize(two_relus(), 1)
    assert len(calls) == 1  # "h" has lived since it was inferred: its type stays


def test_a_changed_model_is_inferred_anew_when_a_name_made_since_is_asked(monkeypatch):
    from optimized.passes import _graph

    calls = []
    real = onnx.shape_inference.infer_shapes
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    seen = []

    def look(name):
        def ask(model):
            seen.append(_graph.Shapes(model).shape(name))
            return model
        return ask

    def remake_h(model):  # "h" is made anew (as a pass's unique_name may reuse a dropped name)
        model = _graph.copy_model(model)
        model.graph.node[0].output[0] = "g"
        model.graph.node[1].input[0] = "g"
        return model

    def transpose_g(model):
        model = _graph.copy_model(model)
        model.graph.node[1].input[0] = "h"
        model.graph.node.insert(1, helper.make_node("Transpose", ["g"], ["h"]))
        return model

    passes_of(monkeypatch, look("h"), remake_h, transpose_g, look("h"), look("g"))
    optimize(two_relus(), 1)
    assert seen == [[2, 3], [3, 2], [2, 3]]  # "g" is asked of the inference "h" needed
    assert len(calls) == 2


def test_shapes_are_inferred_when_first_asked_as_the_graph_was_when_made(monkeypatch):
    from optimized.passes import _graph

    calls = []
    real = onnx.shape_inference.infer_shapes
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    seen = []

    def unasked(model):
        _graph.Shapes(model)
        return model

    def edit_then_ask(model):
        shapes = _graph.Shapes(model)
        model = _graph.copy_model(model)
        model.graph.node.insert(1, helper.make_node("Concat", ["h", "h"], ["hh"], axis=1))
        model.graph.node[2].input[0] = "hh"
        seen.append((shapes.shape("h"), shapes.shape("hh")))
        return model

    passes_of(monkeypatch, unasked)
    optimize(two_relus(), 1)
    assert calls == []
    passes_of(monkeypatch, edit_then_ask)
    optimize(two_relus(), 1)
    assert seen == [([2, 3], None)]  # hh did not exist when the pass asked for the shapes


def test_set_nodes_keeps_the_graphs_own_nodes_and_takes_any_other_list():
    from optimized.passes._graph import set_nodes

    graph = two_relus().graph
    nodes = list(graph.node)
    nodes[0].input[0] = "x2"  # edited in place: the graph's own node
    set_nodes(graph, nodes)
    assert graph.node[0] is nodes[0] and graph.node[0].input[0] == "x2"
    set_nodes(graph, nodes[::-1])
    assert [n.output[0] for n in graph.node] == ["y", "h"]
    set_nodes(graph, [helper.make_node("Relu", ["x"], ["y"])])
    assert [(list(n.input), list(n.output)) for n in graph.node] == [(["x"], ["y"])]


def test_passes_share_consumers_while_the_graphs_nodes_stay_the_same(monkeypatch):
    from optimized.passes import _graph

    seen = []

    def look(model):
        uses = _graph.consumers(model.graph)
        seen.append((uses, [id(n) for n in model.graph.node], _graph.producers(model.graph)))
        assert all(n in model.graph.node for readers in uses.values() for n in readers)
        return model

    def recopy(model):  # the same bytes from new node objects
        model = _graph.copy_model(model)
        copies = [onnx.NodeProto.FromString(n.SerializeToString()) for n in model.graph.node]
        del model.graph.node[:]
        model.graph.node.extend(copies)
        return model

    def rename(model):
        model = _graph.copy_model(model)
        model.graph.node[1].input[0] = "x"
        return model

    passes_of(monkeypatch, look, look, recopy, look, rename, look)
    optimize(two_relus(), 1)
    (first, _, made_by), (second, _, _), (third, _, _), (fourth, _, _) = seen
    assert second is first and third is not first and fourth is not third
    assert [n.output[0] for n in fourth["x"]] == ["h", "y"] and "h" not in fourth
    assert made_by["y"] in first["h"]


def test_weights_a_pass_adds_or_drops_outside_the_store_are_stored_or_released(monkeypatch):
    from onnx import numpy_helper

    from reference.weights import WeightStore, detach_initializers, is_stub, tensor_array

    big = np.arange(2 * 3 * 400, dtype=np.float32).reshape(400, 2, 3)  # past SMALL_TENSOR

    def add_raw(model):  # a large weight as a plain TensorProto, read by an Add
        from optimized.passes._graph import copy_model

        model = copy_model(model)
        model.graph.initializer.append(numpy_helper.from_array(big + 1, "w2"))
        model.graph.node[1].input.append("w2")
        model.graph.node[1].op_type = "Add"
        return model

    def drop(model):  # the first weight goes
        from optimized.passes._graph import copy_model

        model = copy_model(model)
        kept = [t for t in model.graph.initializer if t.name != "w"]
        del model.graph.initializer[:]
        model.graph.initializer.extend(kept)
        model.graph.node[0].input[1] = "w2"
        return model

    nodes = [helper.make_node("Add", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    model = make_model(nodes, [("x", [400, 2, 3])], [("y", [400, 2, 3])], {"w": big})
    store = WeightStore()
    detach_initializers(model, store)
    assert len(store.arrays) == 1
    passes_of(monkeypatch, add_raw, drop)
    rewritten = optimize(model, 1, store)
    (w2,) = rewritten.graph.initializer
    assert is_stub(w2) and len(store.arrays) == 1
    np.testing.assert_array_equal(tensor_array(w2), big + 1)


def _inferences(monkeypatch):
    """(light model bytes, data_prop) of every onnx shape inference optimize runs."""
    calls = []
    real = onnx.shape_inference.infer_shapes
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes",
                        lambda model, *a, **k: calls.append((model, k.get("data_prop")))
                        or real(model, *a, **k))
    return calls


def test_a_pass_asking_data_propagation_has_every_pass_share_its_inference(monkeypatch):
    import optimized.passes
    from optimized.passes import Pass
    from optimized.passes._graph import Shapes, copy_model

    def look(model):  # h2 is made by the second version only
        assert Shapes(model).shape("h2" if len(model.graph.node) == 3 else "h") == [2, 3]
        return model

    def look_followed(model):
        assert Shapes(model, data_prop=True).shape("h") == [2, 3]
        return model

    def rename(model):  # a second version, with a value "h2" made since
        model = copy_model(model)
        model.graph.node[0].output[0] = model.graph.node[1].input[0] = "h2"
        model.graph.node.insert(1, helper.make_node("Relu", ["h2"], ["h"]))
        return model

    calls = _inferences(monkeypatch)
    follows = Pass("follows", 1, look_followed, anchors=frozenset({"Relu"}), data_prop=True)
    monkeypatch.setattr(optimized.passes, "PASSES", [
        Pass("look", 1, look), follows, Pass("rename", 1, rename), Pass("again", 1, look),
        follows._replace(name="follows_again")])
    optimize(two_relus(), 1)
    assert [data_prop for _, data_prop in calls] == [True, True]  # one per version
    calls.clear()
    # its anchor missing, it does not run, and the others infer without data propagation
    monkeypatch.setattr(optimized.passes, "PASSES", [
        Pass("look", 1, look), follows._replace(anchors=frozenset({"Neg"})),
        Pass("rename", 1, rename), Pass("again", 1, look)])
    optimize(two_relus(), 1)
    assert [data_prop for _, data_prop in calls] == [False, False]


@pytest.mark.parametrize("name", ["llama_decode", "gpt2_seq1"])
def test_each_version_of_a_benchmark_model_is_inferred_once(monkeypatch, name):
    from benchmarks import models

    calls = _inferences(monkeypatch)
    optimize(models.build(name)[0], 99)
    assert calls
    assert len({model for model, _ in calls}) == len(calls), "a version inferred twice"
    if name == "llama_decode":  # rotary_fusion runs: every inference follows shapes
        assert all(data_prop for _, data_prop in calls)


def _dims(types, name):
    return [d.dim_value or d.dim_param for d in types[name].tensor_type.shape.dim]


def test_data_propagation_reads_past_identities(monkeypatch):
    from optimized.passes import _graph

    # the shape of x passed on by an Identity becomes y's target; the Concat's result leaves
    # the graph through an Identity, as the output "joined" of declared shape [a, "total"]
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Identity", ["s"], ["s_passed"]),
             helper.make_node("Reshape", ["y", "s_passed"], ["z"]),
             helper.make_node("Concat", ["x", "x"], ["both"], axis=1),
             helper.make_node("Identity", ["both"], ["joined"]),
             helper.make_node("Relu", ["both"], ["r"])]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["a", "b"]),
         helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["c"])],
        [helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, None),
         helper.make_tensor_value_info("joined", onnx.TensorProto.FLOAT, ["a", "total"]),
         helper.make_tensor_value_info("r", onnx.TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    given = model.SerializeToString()
    followed = _graph._inferred_types(model, data_prop=True)
    assert _dims(followed, "z") == ["a", "b"]
    assert _dims(followed, "both") == _dims(followed, "r") == ["a", "total"]
    assert set(followed) >= {"s", "s_passed", "both", "joined", "z", "r"}  # every value typed
    assert model.SerializeToString() == given  # only the copy made for inference is changed
    plain = _graph._inferred_types(model, data_prop=False)  # as before: no propagation asked
    assert _dims(plain, "z")[0] != "a"
