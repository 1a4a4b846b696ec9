"""A tiny synthetic corpus in the wheel layout, and a pins.toml that points at it by file:// URL."""
from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

DATA = "onnx/backend/test/data"


def _relu_model(name: str):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _seq_model():
    seq = helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, None)
    graph = helper.make_graph(
        [helper.make_node("Identity", ["s"], ["t"])], "seq", [seq],
        [helper.make_tensor_sequence_value_info("t", TensorProto.FLOAT, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])


def build_wheel(path: Path, wrong_output: bool = False) -> Path:
    x = np.array([-1.0, 0.5, 2.0], np.float32)
    y = np.maximum(x, 0) + (1.0 if wrong_output else 0.0)
    with zipfile.ZipFile(path, "w") as z:
        for name in ("test_relu_tiny", "test_hang", "test_crash"):
            base = f"{DATA}/node/{name}"
            z.writestr(f"{base}/model.onnx", _relu_model(name).SerializeToString())
            z.writestr(f"{base}/test_data_set_0/input_0.pb", numpy_helper.from_array(x).SerializeToString())
            z.writestr(f"{base}/test_data_set_0/output_0.pb", numpy_helper.from_array(y).SerializeToString())
        seq = [np.array([1.0], np.float32), np.array([2.0, 3.0], np.float32)]
        base = f"{DATA}/simple/test_sequence_identity"
        z.writestr(f"{base}/model.onnx", _seq_model().SerializeToString())
        raw = numpy_helper.from_list(seq, "s").SerializeToString()
        z.writestr(f"{base}/test_data_set_0/input_0.pb", raw)
        z.writestr(f"{base}/test_data_set_0/output_0.pb", raw)
        z.writestr(f"{DATA}/real/test_big/data.json",
                   json.dumps({"url": "https://example.invalid/big.tar.gz", "model_name": "big"}))
    return path


def write_pins(folder: Path, wheel: Path, sha256: str | None = None, node_tests: int = 3) -> Path:
    digest = sha256 or hashlib.sha256(wheel.read_bytes()).hexdigest()
    pins = folder / "pins.toml"
    pins.write_text(
        f'[[pin]]\nopset = 13\nonnx = "0.0.1"\nwheel = "{wheel.name}"\n'
        f'url = "{wheel.as_uri()}"\nsha256 = "{digest}"\nnode_tests = {node_tests}\n'
    )
    return pins
