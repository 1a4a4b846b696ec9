"""Session creation: the cycle collector is paused while a session is made, and left as the
caller had it afterwards, also when creation fails or sessions are made on several threads."""
import gc
import threading

import numpy as np
import pytest
from onnx import TensorProto, helper

import optimized as ort


def _model_bytes():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.fixture
def restore_gc():
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


@pytest.mark.parametrize("enabled", [True, False])
def test_collector_paused_while_making_a_session_and_left_as_it_was(enabled, restore_gc,
                                                                       monkeypatch):
    (gc.enable if enabled else gc.disable)()
    seen = []
    real_optimize = ort.session.InferenceSession._rewrite
    monkeypatch.setattr(ort.session.InferenceSession, "_rewrite",
                        lambda self, model: (seen.append(gc.isenabled()), real_optimize(self, model))[1])
    session = ort.InferenceSession(_model_bytes())
    assert seen == [False]
    assert gc.isenabled() is enabled
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], np.maximum(x, 0))


def test_collector_back_on_after_a_failed_creation(restore_gc):
    gc.enable()
    with pytest.raises(Exception, match="parse"):
        ort.InferenceSession(b"not a model")
    assert gc.isenabled()


def test_collector_back_on_once_sessions_made_on_several_threads_are_done(restore_gc):
    gc.enable()
    data, errors = _model_bytes(), []

    def make():
        try:
            for _ in range(5):
                ort.InferenceSession(data)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=make) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert gc.isenabled()


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
