"""Shared pytest options: which backend and pins the conformance corpus tests run."""
import os


def pytest_addoption(parser):
    group = parser.getgroup("onnx-parity conformance")
    group.addoption("--corpus-backend", default=os.environ.get("ONNX_PARITY_BACKEND", "reference"),
                    help="backend the corpus tests run (default: reference)")
    group.addoption("--corpus-opset", default=os.environ.get("ONNX_PARITY_OPSET", "all"),
                    help="pins the corpus tests cover: N, '7,13', '18-28' or 'all' (default)")
    group.addoption("--corpus-filter", default=os.environ.get("ONNX_PARITY_FILTER"),
                    help="regex on corpus test ids")
