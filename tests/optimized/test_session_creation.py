"""Session creation from bytes or a ModelProto: the load checks that its fast path makes in
one walk over the tensors (external data without a folder, weights named in another session's
memory) still refuse what they refused; a dropped session frees its plan at once."""
import gc
import weakref

import numpy as np
import pytest
from onnx import AttributeProto, TensorProto, helper

import optimized as ort
from optimized.plan import Plan
from reference.evaluator import GraphRunner, ReferenceEvaluator, Scope
from reference.functions import schema_for
from reference.registry import canonical_domain


def _model_bytes():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _external_model(where: str, forged_store: str | None = None):
    """y = x + w, w's data in an external file (an initializer, or a Constant node's value);
    with forged_store, a second weight names that store's memory after it."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    w = helper.make_tensor("w", TensorProto.FLOAT, [2, 3], np.zeros(6, np.float32).tobytes(),
                           raw=True)
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    w.external_data.add(key="location", value="w.bin")
    nodes = [helper.make_node("Add", ["x", "w"], ["s"])]
    initializers = [w]
    if where == "attribute":
        nodes.insert(0, helper.make_node("Constant", [], ["w"], value=w))
        initializers = []
    if forged_store is not None:
        v = helper.make_tensor("v", TensorProto.FLOAT, [2, 3], np.zeros(6, np.float32))
        v.ClearField("float_data")
        v.data_location = TensorProto.EXTERNAL
        for key, value in (("location", "*/onnx-parity-memory/*"), ("store", forged_store),
                           ("key", "0")):
            v.external_data.add(key=key, value=value)
        initializers.append(v)
        nodes.append(helper.make_node("Add", ["s", "v"], ["y"]))
    else:
        nodes.append(helper.make_node("Identity", ["s"], ["y"]))
    graph = helper.make_graph(nodes, "g", [x], [y], initializer=initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("given_as", ["bytes", "a ModelProto"])
@pytest.mark.parametrize("where", ["initializer", "attribute"])
def test_external_data_without_a_folder_is_refused_naming_the_tensor(given_as, where):
    model = _external_model(where)
    source = model.SerializeToString() if given_as == "bytes" else model
    with pytest.raises(ort.InvalidGraph, match=f"'w' keeps its data in the external file "
                                                f"'w.bin', but the model was given as {given_as}"):
        ort.InferenceSession(source)


def test_a_forged_stub_is_named_before_external_data():
    victim = ort.InferenceSession(_model_bytes())
    model = _external_model("initializer", forged_store=victim._weights.token)
    with pytest.raises(ort.InvalidGraph, match="'v': external data location .* names weights"):
        ort.InferenceSession(model.SerializeToString())


def _chain_model_bytes():
    """y = relu(x * w + w) over [3, 5]: a chain the plan fuses and compiles."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5])
    w = helper.make_tensor("w", TensorProto.FLOAT, [5], np.linspace(-1, 1, 5, dtype=np.float32))
    nodes = [helper.make_node("Mul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "w"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    graph = helper.make_graph(nodes, "g", [x], [y], initializer=[w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.fixture
def collection_paused():
    """No garbage collection during the test, so only reference counting can free a plan."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    yield
    if was_enabled:
        gc.enable()


def test_a_dropped_session_frees_its_plan_without_a_garbage_collection(collection_paused):
    session = ort.InferenceSession(_chain_model_bytes(), providers=["CPUExecutionProvider"])
    feeds = {"x": np.arange(15, dtype=np.float32).reshape(3, 5) - 7}
    want = session.run(None, feeds)
    for _ in range(3):  # the second run of a signature compiles it (plan.CompiledRun)
        np.testing.assert_array_equal(session.run(None, feeds)[0], want[0])
    assert session._plan._programs, "the runs above were to compile a step table"
    plan = weakref.ref(session._plan)
    session.set_providers(["CPUExecutionProvider"])  # a new plan: the old one goes at once
    assert plan() is None
    np.testing.assert_array_equal(session.run(None, feeds)[0], want[0])
    plan = weakref.ref(session._plan)
    del session
    assert plan() is None


def _attribute_model():
    """Nodes whose attributes cover each plain type, schema defaults of each kind (a string, an
    int, a float, ints, strings), ops without an onnx schema, a tensor, a reference to a
    function's attribute, and a subgraph."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    reference = helper.make_attribute_ref("alpha", AttributeProto.FLOAT)
    leaky_ref = helper.make_node("LeakyRelu", ["x"], ["r"])
    leaky_ref.attribute.append(reference)
    branch = helper.make_graph([helper.make_node("Identity", ["x"], ["b"])], "branch", [],
                               [helper.make_tensor_value_info("b", TensorProto.FLOAT, None)])
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1], pads=[0, 0, 0, 0]),
        helper.make_node("LeakyRelu", ["c"], ["l"]),
        helper.make_node("LeakyRelu", ["l"], ["l2"], alpha=0.25),
        helper.make_node("MeanVarianceNormalization", ["l2"], ["m"]),
        helper.make_node("MeanVarianceNormalization", ["m"], ["m2"]),
        helper.make_node("RNN", ["s", "rw", "rr"], ["o"], hidden_size=4),
        helper.make_node("Cast", ["m2"], ["k"], to=TensorProto.DOUBLE, saturate=0),
        helper.make_node("FusedConv", ["x", "w"], ["f"], domain="com.microsoft",
                         activation="LeakyRelu", activation_params=[0.5]),
        helper.make_node("Custom", ["x"], ["u"], domain="test.custom", names=["a", "é"],
                         scale=2.5, label="z"),
        helper.make_node("ConstantOfShape", ["shape"], ["t"],
                         value=helper.make_tensor("v", TensorProto.FLOAT, [1], [3.0])),
        leaky_ref,
        helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=branch),
    ]
    graph = helper.make_graph(nodes, "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                   helper.make_opsetid("com.microsoft", 1),
                                                   helper.make_opsetid("test.custom", 1)])


def _runner_attributes(evaluator, node):
    domain = canonical_domain(node.domain)
    schema = schema_for(node.op_type, evaluator.opsets.get(domain, 0), domain)
    return GraphRunner(evaluator, lambda result: None).attributes(node, Scope(), (), None, schema)


def test_the_plan_reads_attributes_as_the_reference_does():
    """The plan converts plain attributes and schema defaults itself (once per op and opset
    for the defaults); every node's must equal the reference runner's, value and type."""
    model = _attribute_model()
    evaluator = ReferenceEvaluator(model, check=False)
    plan = Plan(model, {}, evaluator)
    for node in model.graph.node:
        got = plan.static_attributes(node)
        if node.op_type == "If":
            assert got is None
            continue
        want = _runner_attributes(evaluator, node)
        assert list(got) == list(want), node.op_type
        for name, value in want.items():
            if isinstance(value, np.ndarray):
                np.testing.assert_array_equal(got[name], value)
            else:
                assert got[name] == value and type(got[name]) is type(value), (node.op_type, name)
    conv, leaky, leaky_given, mvn, mvn2, rnn = (plan.static_attributes(n)
                                                 for n in model.graph.node[:6])
    assert conv["auto_pad"] == "NOTSET" and conv["group"] == 1
    assert leaky["alpha"] == pytest.approx(0.01) and leaky_given["alpha"] == 0.25
    assert mvn["axes"] == [0, 2, 3] and rnn["activations"] == ["Tanh", "Tanh"]
    mvn["axes"].append(9)  # a node's default list is its own, not shared with its op's others
    assert mvn2["axes"] == [0, 2, 3]
