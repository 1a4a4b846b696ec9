"""onnx's own BackendTest (from the installed onnx) against reference.backend and
optimized.backend (level 99): node, simple, pytorch-converted, pytorch-operator and the light
real models. Every failure is listed with its reason in tests/data/onnx_backendtest.toml,
strict both ways: an unlisted failure fails, and a listed test that passes fails as an
unexpected success."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx.backend.test
import pytest
from onnx import TensorProto, helper

import optimized.backend
import reference.backend

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

EXPECTATIONS = tomllib.loads((Path(__file__).parent / "data" / "onnx_backendtest.toml").read_text())

LIGHT = "onnx/backend/test/data/light/"


def _needs_download() -> list[str]:
    """Real-model tests whose model is downloaded from the onnx model zoo when run (none in
    onnx 1.23: its real tests are the light models shipped in the wheel, which stay in)."""
    from onnx.backend.test.loader import load_model_tests

    return [t.name for t in load_model_tests(kind="real") if t.url and not t.url.startswith(LIGHT)]


class Level99:
    """optimized.backend at graph_optimization_level 99 (the fused, fastest configuration)."""

    @staticmethod
    def prepare(model, device="CPU", **kwargs):
        return optimized.backend.prepare(model, device, graph_optimization_level=99, **kwargs)

    run_model = staticmethod(optimized.backend.run_model)
    run_node = staticmethod(optimized.backend.run_node)
    supports_device = staticmethod(optimized.backend.supports_device)
    is_compatible = staticmethod(lambda model, device="CPU", **kwargs: True)


def _backend_test(backend, name: str) -> dict:
    test = onnx.backend.test.BackendTest(backend, __name__)
    test.exclude(r"(_cuda$)")  # the CUDA provider's GPU tests live in tests/optimized/cuda
    for case in _needs_download():
        test.exclude(f"^{case}_cpu$")  # needs a download
    for test_name in {**EXPECTATIONS.get("all", {}), **EXPECTATIONS.get(name, {})}:
        test.xfail(f"^{test_name}_cpu$")
    return {f"{cls_name}_{name}": cls for cls_name, cls in test.test_cases.items()}


def test_every_expectation_has_a_reason():
    for section, entries in EXPECTATIONS.items():
        for test_name, reason in entries.items():
            assert isinstance(reason, str) and len(reason) > 20, (section, test_name)


# the backend interface itself, beside onnxruntime.backend -------------------------------------
BACKENDS = [reference.backend, optimized.backend]
A = np.arange(6, dtype=np.float32).reshape(2, 3)
B = np.array([10, 20, 30], np.float32)


def _add_model():
    node = helper.make_node("Add", ["a", "b"], ["c"])
    graph = helper.make_graph([node], "add", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3]),
                                              helper.make_tensor_value_info("b", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2, 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("backend", BACKENDS, ids=["reference", "optimized"])
def test_prepare_run_model_and_devices(backend):
    rep = backend.prepare(_add_model(), "CPU")
    outputs = rep.run([A, B])
    assert isinstance(outputs, list) and len(outputs) == 1
    np.testing.assert_array_equal(outputs[0], A + B)
    np.testing.assert_array_equal(rep.run({"a": A, "b": B})[0], A + B)
    np.testing.assert_array_equal(backend.run_model(_add_model(), [A, B])[0], A + B)
    assert backend.supports_device("CPU")
    assert not backend.supports_device("CUDA") or backend is optimized.backend
    with pytest.raises(RuntimeError, match="FOO"):
        backend.prepare(_add_model(), "FOO")
    onnxruntime_backend = pytest.importorskip("onnxruntime.backend", reason="the anchors extra's onnxruntime")
    np.testing.assert_array_equal(onnxruntime_backend.prepare(_add_model(), "CPU").run([A, B])[0], outputs[0])
    with pytest.raises(RuntimeError, match="FOO"):
        onnxruntime_backend.prepare(_add_model(), "FOO")


@pytest.mark.parametrize("backend", BACKENDS, ids=["reference", "optimized"])
def test_run_node_types_its_outputs(backend):
    np.testing.assert_array_equal(backend.run_node(helper.make_node("Add", ["a", "b"], ["c"]), [A, B])[0], A + B)
    values, indices = backend.run_node(helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1),
                                       [A, np.array([2], np.int64)])
    np.testing.assert_array_equal(values, [[2, 1], [5, 4]])
    assert indices.dtype == np.int64 and indices.tolist() == [[2, 1], [2, 1]]
    old = backend.run_node(helper.make_node("Relu", ["x"], ["y"]), [A - 3], opset_version=6)
    np.testing.assert_array_equal(old[0], np.maximum(A - 3, 0))


def test_optimized_prepare_takes_session_options_and_refuses_misspelled_ones():
    rep = optimized.backend.prepare(_add_model(), graph_optimization_level=0, intra_op_num_threads=1)
    np.testing.assert_array_equal(rep.run([A, B])[0], A + B)
    with pytest.raises(TypeError, match="graph_optimisation_level"):
        optimized.backend.prepare(_add_model(), graph_optimisation_level=0)


globals().update(_backend_test(reference.backend, "reference"))
globals().update(_backend_test(Level99, "optimized"))
pytestmark = pytest.mark.timeout(300)
