"""The one walk that checks a model given as bytes or a ModelProto (optimized/loading.py's
fast path) reaches every tensor the model holds: external data or another store's in-memory
weights are refused in sparse initializers, sparse Constant values, If branches and model-local
function bodies, not only in the main graph's initializers."""
import numpy as np
import pytest
from onnx import TensorProto, helper

import optimized as ort
from reference.weights import WeightStore

SHAPE = [2, 3]


def _external(name: str) -> TensorProto:
    t = helper.make_tensor(name, TensorProto.FLOAT, SHAPE, np.zeros(6, np.float32).tobytes(),
                           raw=True)
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value="w.bin")
    return t


def _in_other_store(name: str, store: WeightStore) -> TensorProto:
    """A stub naming weights that `store` (another session's, say) holds in memory."""
    t = helper.make_tensor(name, TensorProto.FLOAT, SHAPE, np.zeros(6, np.float32).tobytes(),
                           raw=True)
    store.stub(t, np.ones(SHAPE, np.float32))
    return t


def _sparse(values: TensorProto):
    values.dims[:] = [2]
    indices = helper.make_tensor(values.name + "_at", TensorProto.INT64, [2], [0, 4])
    return helper.make_sparse_tensor(values, indices, SHAPE)


def _model(where: str, tensor: TensorProto):
    """y = x + k, k holding `tensor` (its name "k") at `where`."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)
    inputs, add = [x], helper.make_node("Add", ["x", "k"], ["y"])
    nodes, initializers, sparse, functions = [add], [], [], []
    if where == "sparse initializer":
        sparse = [_sparse(tensor)]
    elif where == "sparse Constant":
        nodes = [helper.make_node("Constant", [], ["k"], sparse_value=_sparse(tensor)), add]
    elif where == "If branch":
        out = helper.make_tensor_value_info("k", TensorProto.FLOAT, SHAPE)
        branch = helper.make_graph([helper.make_node("Constant", [], ["k"], value=tensor)],
                                   "then", [], [out])
        other = helper.make_graph([helper.make_node("Identity", ["x"], ["k"])], "else", [], [out])
        inputs.append(helper.make_tensor_value_info("c", TensorProto.BOOL, []))
        nodes = [helper.make_node("If", ["c"], ["k"], then_branch=branch, else_branch=other),
                 add]
    elif where == "function body":
        functions = [helper.make_function(
            "local", "AddK", ["a"], ["b"],
            [helper.make_node("Constant", [], ["k"], value=tensor),
             helper.make_node("Add", ["a", "k"], ["b"])], [helper.make_opsetid("", 17)])]
        nodes = [helper.make_node("AddK", ["x"], ["y"], domain="local")]
    graph = helper.make_graph(nodes, "g", inputs, [y], initializer=initializers,
                              sparse_initializer=sparse)
    return helper.make_model(graph, functions=functions,
                             opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("local", 1)])


WHERE = ["sparse initializer", "sparse Constant", "If branch", "function body"]


@pytest.mark.parametrize("given_as", ["bytes", "a ModelProto"])
@pytest.mark.parametrize("where", WHERE)
def test_external_data_anywhere_is_refused_without_a_folder(where, given_as):
    model = _model(where, _external("k"))
    source = model.SerializeToString() if given_as == "bytes" else model
    with pytest.raises(ort.InvalidGraph, match=f"'k' keeps its data in the external file "
                                                f"'w.bin', but the model was given as {given_as}"):
        ort.InferenceSession(source)


@pytest.mark.parametrize("given_as", ["bytes", "a ModelProto"])
@pytest.mark.parametrize("where", WHERE)
def test_weights_of_another_store_anywhere_are_refused(where, given_as):
    other = WeightStore()  # alive: the stub names weights that are really there
    model = _model(where, _in_other_store("k", other))
    source = model.SerializeToString() if given_as == "bytes" else model
    with pytest.raises(ort.InvalidGraph, match="'k': external data location .* names weights"):
        ort.InferenceSession(source)
