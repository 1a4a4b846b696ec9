"""One-node and small models for the device-path tests, and the reference result."""
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from reference import ReferenceEvaluator


def model(nodes, inputs: dict, outputs, initializers: dict | None = None, opset: int = 18,
          ms: bool = False, out_type=TensorProto.FLOAT):
    """inputs: name -> array (its dtype and shape declare the graph input)."""
    vi = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
          for n, a in inputs.items()]
    inits = [numpy_helper.from_array(v, n) for n, v in (initializers or {}).items()]
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("com.microsoft", 1)] if ms else [])
    graph = helper.make_graph(nodes, "g", vi, [], inits)
    inferred = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=opsets))
    known = {v.name: v for v in inferred.graph.value_info}
    for o in outputs:
        rank_unknown = helper.make_tensor_value_info(o, out_type, None)
        rank_unknown.type.tensor_type.shape.SetInParent()
        graph.output.append(known.get(o, rank_unknown))
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def reference(m, feeds):
    return ReferenceEvaluator(m).run(None, feeds)


def rand(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


F = TensorProto.FLOAT


def optimized_for_device(m):
    """The model as a session on the CUDA provider rewrites it (every pass but the CPU-only
    ones), with its evaluator: what the device plan gets from such a session."""
    from optimized.passes import optimize

    rewritten = optimize(m, 99, for_cpu=False)
    return rewritten, ReferenceEvaluator(rewritten, check=False)
