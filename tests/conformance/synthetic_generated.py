"""A synthetic generated pin: a small corpus in the generated layout, its value pin, and a fake
generator that stands in for the generator subprocess (writing that corpus, or a tampered one)."""
from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from conformance import corpus, valuepin
from conformance.generate import MANIFEST, NODE_DIR
from conformance.pins import sha256_file

from .synthetic import build_wheel, write_pins

SHAPE = (3, 5, 7)  # non-square, so a transposed or reshaped tensor shows


def write_case(root, name, x, y, labels=None):
    folder = root / NODE_DIR / name
    data = folder / "test_data_set_0"
    data.mkdir(parents=True)
    # no shapes in the model, so a reshaped value file is the only change
    outputs = [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(y.dtype), None)]
    if labels is not None:
        outputs.append(helper.make_tensor_value_info("i", TensorProto.INT64, None))
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], name,
        [helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(x.dtype), None)],
        outputs)
    (folder / "model.onnx").write_bytes(helper.make_model(graph).SerializeToString())
    (data / "input_0.pb").write_bytes(numpy_helper.from_array(x, "x").SerializeToString())
    (data / "output_0.pb").write_bytes(numpy_helper.from_array(y, "y").SerializeToString())
    if labels is not None:
        (data / "output_1.pb").write_bytes(numpy_helper.from_array(labels, "i").SerializeToString())


def write_small_corpus(root, y=None, labels=None, x=None):
    rng = np.random.default_rng(0)
    base_x = rng.standard_normal(SHAPE).astype(np.float32)
    base_y = np.tanh(base_x)
    base_y[0, 1, 2] = np.nan
    write_case(root, "test_tanh", base_x if x is None else x, base_y if y is None else y,
                np.arange(4, dtype=np.int64) if labels is None else labels)
    big = rng.standard_normal(5000).astype(np.float64)  # several blocks
    write_case(root, "test_big", big, big * 2)
    return base_x, base_y


class FakeGenerator:
    """Stands in for the generator subprocess: writes a small corpus (tampered on request)."""

    def __init__(self, tampered: bool = False):
        self.tampered = tampered
        self.calls = 0

    def __call__(self, argv, **kwargs):
        self.calls += 1
        out = Path(argv[-1])
        y = None
        if self.tampered:
            x = np.random.default_rng(0).standard_normal((3, 5, 7)).astype(np.float32)
            y = np.tanh(x)[::-1].copy()
            y[0, 1, 2] = np.nan
            y[2, 1, 2] = 0.0  # NaN positions as pinned; values reordered
        write_small_corpus(out, y=y)
        (out / MANIFEST).write_text(json.dumps({"environment": {"numpy": np.__version__}}))
        return subprocess.CompletedProcess(argv, 0, "", "")



def write_generated_pins(tmp_path: Path, monkeypatch):
    """pins.toml with the synthetic wheel pin 13 and a generated pin 28 (pin data from a
    reference run of the fake generator), and the fake generator in place of the subprocess."""
    wheel = build_wheel(tmp_path / "onnx-0.0.1-py3-none-any.whl")
    generator_wheel = tmp_path / "onnx-0.0.2-py3-none-any.whl"
    with zipfile.ZipFile(generator_wheel, "w") as z:
        z.writestr("placeholder.txt", "the fake generator does not import it")
    write_small_corpus(tmp_path / "reference")
    valuepin.write_pin_data(valuepin.make_pin_data(tmp_path / "reference", "0.0.2"),
                            tmp_path / "opset28.json")
    pins_file = write_pins(tmp_path, wheel)
    with open(pins_file, "a") as f:
        f.write(f'\n[[pin]]\nopset = 28\nonnx = "0.0.2"\nnode_data = "generated"\n'
                f'values = "opset28.json"\nvalues_sha256 = "{sha256_file(tmp_path / "opset28.json")}"\n'
                f'node_tests = 2\n\n[[pin.generator_wheels]]\nwheel = "{generator_wheel.name}"\n'
                f'url = "{generator_wheel.as_uri()}"\nsha256 = "{sha256_file(generator_wheel)}"\n')
    fake = FakeGenerator()
    monkeypatch.setattr(corpus.subprocess, "run", fake)
    return pins_file, fake


