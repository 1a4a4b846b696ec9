"""lighten, the copy of a model that shape inference sees: large initializers become typed
inputs, fused nodes their ai.onnx stand-ins, edited in place."""
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from optimized.passes._graph import MS_DOMAIN, SMALL_CONSTANT, lighten, shape_stand_ins


def _model():
    big = numpy_helper.from_array(np.ones((SMALL_CONSTANT + 3, 2), np.float32), "big")
    wide = numpy_helper.from_array(np.ones((2, 3, SMALL_CONSTANT), np.float16), "wide")
    small = numpy_helper.from_array(np.array([3, 2], np.int64), "shape")
    nodes = [
        helper.make_node("SkipLayerNormalization", ["x", "x", "g"], ["s", "", "", "sum"],
                         domain=MS_DOMAIN),
        helper.make_node("Reshape", ["s", "shape"], ["r"]),
        helper.make_node("MatMulNBits", ["r", "q", "scales"], ["m"], domain=MS_DOMAIN, K=2, N=5,
                         bits=4, block_size=16),
        helper.make_node("Gelu", ["m"], ["y"], domain=MS_DOMAIN),
        helper.make_node("Add", ["sum", "sum"], ["z"]),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        initializer=[big, small, wide])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid(MS_DOMAIN, 1)])


def test_lighten_makes_weights_inputs_and_fused_nodes_stand_ins_in_order():
    model = _model()
    expected_nodes = [s for n in model.graph.node for s in shape_stand_ins(n, 17)]
    lighten(model)
    graph = model.graph
    assert [t.name for t in graph.initializer] == ["shape"]
    assert [v.name for v in graph.input] == ["x", "big", "wide"]
    assert graph.input[1] == helper.make_tensor_value_info("big", TensorProto.FLOAT,
                                                           [SMALL_CONSTANT + 3, 2])
    assert graph.input[2] == helper.make_tensor_value_info("wide", TensorProto.FLOAT16,
                                                           [2, 3, SMALL_CONSTANT])
    assert list(graph.node) == expected_nodes
    assert [n.op_type for n in graph.node][:3] == ["Identity", "Identity", "Reshape"]
    assert all(n.domain != MS_DOMAIN for n in graph.node)
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type for v in inferred.graph.value_info}
    assert [d.dim_value for d in types["m"].tensor_type.shape.dim] == [3, 5]


def test_matmul_nbits_stand_in_is_what_onnx_helper_writes_for_it():
    def constant(name, value):
        return helper.make_node("Constant", [], [name],
                                value=numpy_helper.from_array(np.array([value], np.int64)))

    for n in (1, 5, 32000, 2**40):
        node = helper.make_node("MatMulNBits", ["a", "q", "scales"], ["out/0"], domain=MS_DOMAIN,
                                K=64, N=n, bits=4, block_size=32)
        p = "out/0__shape_"
        expected = [constant(p + "zero", 0), constant(p + "one", 1), constant(p + "last", -1),
                    constant(p + "n", n),
                    helper.make_node("Slice", ["a", p + "zero", p + "one", p + "last"],
                                     [p + "column"]),
                    helper.make_node("Expand", [p + "column", p + "n"], ["out/0"])]
        made = shape_stand_ins(node, 21)
        assert [m.SerializeToString() for m in made] == [e.SerializeToString() for e in expected]
