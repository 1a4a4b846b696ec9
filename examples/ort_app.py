"""A small app written for onnxruntime. It runs unchanged on onnx-parity's optimized runtime:

    python examples/ort_app.py                    # onnxruntime
    python -c "import optimized, runpy; optimized.register_as_onnxruntime(); \
runpy.run_path('examples/ort_app.py', run_name='__main__')"      # optimized, same file

It builds a two-layer model, inspects its inputs, runs it with OrtValues, with an IOBinding and
with RunOptions, and catches InvalidArgument for a feed of the wrong type. It prints one line
per step, so the two runtimes' outputs can be compared line by line.
"""
import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument


def build_model() -> bytes:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((5, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Add", ["h", "b"], ["z"]),
             helper.make_node("Relu", ["z"], ["y"])]
    graph = helper.make_graph(nodes, "app", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    return model.SerializeToString()


def main() -> None:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(build_model(), options, providers=["CPUExecutionProvider"])
    for arg in sess.get_inputs():
        print("input", arg.name, arg.type, arg.shape)
    for arg in sess.get_outputs():
        print("output", arg.name, arg.type, arg.shape)

    x = np.linspace(-1, 1, 20, dtype=np.float32).reshape(4, 5)
    (y,) = sess.run(None, {"x": x})
    print("run", y.dtype, y.shape, np.round(y.sum(), 4))

    value = ort.OrtValue.ortvalue_from_numpy(x)
    (out,) = sess.run_with_ort_values(["y"], {"x": value})
    print("ortvalue", out.data_type(), out.shape(), out.device_name(), np.allclose(out.numpy(), y))

    binding = sess.io_binding()
    binding.bind_cpu_input("x", x)
    result = np.empty((4, 3), np.float32)
    binding.bind_output("y", "cpu", 0, np.float32, result.shape, result.ctypes.data)
    sess.run_with_iobinding(binding)
    print("iobinding", np.allclose(result, y), np.allclose(binding.copy_outputs_to_cpu()[0], y))

    run_options = ort.RunOptions()
    run_options.logid = "app-run"
    run_options.log_severity_level = 3
    (again,) = sess.run(["y"], {"x": x}, run_options)
    print("run options", np.array_equal(again, y))

    try:
        sess.run(None, {"x": x.astype(np.float64)})
    except InvalidArgument as e:
        print("caught InvalidArgument", type(e).__name__)


if __name__ == "__main__":
    main()
