"""A one-graph model at opset 21, as the step-table tests build them."""
from onnx import helper, numpy_helper

OPSET = 21


def make_model(nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, "t", inputs, outputs,
                              initializer=[numpy_helper.from_array(v, n) for n, v in initializers])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
