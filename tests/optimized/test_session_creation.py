"""Session creation from bytes or a ModelProto: the load checks that its fast path makes in
one walk over the tensors (external data without a folder, weights named in another session's
memory) still refuse what they refused; a dropped session frees its plan at once."""
import gc
import weakref

import numpy as np
import pytest
from onnx import TensorProto, helper

import optimized as ort


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
