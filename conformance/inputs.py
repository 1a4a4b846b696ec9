"""Inputs for running a model: seeded random values shaped from the model, or loaded from files."""
from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import numpy_helper

from reference.dtypes import np_dtype


def random_inputs(model, seed: int = 0, dims: dict | None = None) -> dict:
    """One seeded random value per graph input that is not an initializer.

    Symbolic dimensions take their value from `dims` (default 1).
    """
    rng = np.random.default_rng(seed)
    dims = dims or {}
    initializers = {i.name for i in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in initializers:
            continue
        tt = vi.type.tensor_type
        if vi.type.WhichOneof("value") != "tensor_type":
            raise ValueError(f"input {vi.name!r}: random values only for tensors; use --inputs")
        shape = []
        for d in tt.shape.dim:
            if d.HasField("dim_value"):
                shape.append(d.dim_value)
            else:
                shape.append(dims.get(d.dim_param, 1))
        dtype = np_dtype(tt.elem_type)
        feeds[vi.name] = _random(rng, tuple(shape), dtype)
    return feeds


def _random(rng, shape, dtype):
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        return rng.integers(0, 10, size=shape).astype(dtype)
    if dtype == object:
        out = np.empty(shape, dtype=object)
        out.reshape(-1)[:] = [f"s{i}" for i in range(out.size)]
        return out
    return rng.standard_normal(shape).astype(dtype)


def load_inputs(path: str, evaluator) -> dict:
    """Feeds from an .npz (keys are input names) or a folder of input_N.pb TensorProtos."""
    if os.path.isdir(path):
        names = evaluator.input_names
        feeds = {}
        for i, name in enumerate(names):
            pb = os.path.join(path, f"input_{i}.pb")
            if not os.path.exists(pb):
                raise FileNotFoundError(f"{pb} is missing (the model has inputs {names})")
            tensor = onnx.TensorProto()
            with open(pb, "rb") as f:
                tensor.ParseFromString(f.read())
            feeds[name] = numpy_helper.to_array(tensor)
        return feeds
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}
