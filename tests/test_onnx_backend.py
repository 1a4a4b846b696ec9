"""onnx's own BackendTest (from the installed onnx) against reference.backend and
optimized.backend (level 99): node, simple, pytorch-converted, pytorch-operator and the light
real models. Every failure is listed with its reason in tests/data/onnx_backendtest.toml,
strict both ways: an unlisted failure fails, and a listed test that passes fails as an
unexpected success."""
from __future__ import annotations

import sys
from pathlib import Path

import onnx.backend.test
import pytest

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


globals().update(_backend_test(reference.backend, "reference"))
globals().update(_backend_test(Level99, "optimized"))
pytestmark = pytest.mark.timeout(300)
