"""A model as a session loads it: external data given in memory, initializers given through
SessionOptions.add_initializer, and free dimensions fixed by name or denotation. Its large
initializers are held once, as arrays in a WeightStore (reference/weights.py), with stubs in
the model: a model file's weights are read straight into those arrays."""
from __future__ import annotations

import os

import onnx
from onnx import ModelProto, external_data_helper, numpy_helper

from reference.errors import InvalidModelError
from reference.loading import load_external_data, load_model, model_tensors, refuse_external_data
from reference.weights import (
    MEMORY_LOCATION,
    WeightStore,
    copy_without_weights,
    detach_initializers,
    is_stub,
    read_model_bytes,
    read_model_file,
    store_of,
)

from .errors import InvalidArgument

# serialized models larger than this are walked into the weight store (reference.weights.
# read_model_bytes) rather than parsed whole: the parse would hold up to this much twice
WALK_BYTES = 16 << 20


def load_for_session(path_or_bytes, options) -> tuple[ModelProto, WeightStore]:
    """The model to run, its large initializers as stubs in the store that comes with it."""
    store = WeightStore()
    model, folder = _parse(path_or_bytes, store)
    if folder is None and not options.external_files and not options.initializers:
        # bytes or a ModelProto as given: its weights were stored as it was parsed, and one walk
        # over its tensors makes both checks (each walk cost densenet121 2 ms)
        refuse_foreign_stubs_and_external_data(model, store, _no_folder(path_or_bytes))
        fix_free_dimensions(model, options.free_dimensions_by_name,
                            options.free_dimensions_by_denotation)
        return model, store
    refuse_foreign_stubs(model, store)
    fill_external_data(model, options.external_files)
    replace_initializers(model, options.initializers)
    if folder is None:
        refuse_external_data(model, _no_folder(path_or_bytes))
    else:
        load_external_data(model, folder)
    fix_free_dimensions(model, options.free_dimensions_by_name, options.free_dimensions_by_denotation)
    detach_initializers(model, store)  # external data, and what the options added
    store.retain(model)  # less what add_initializer replaced
    return model, store


def _no_folder(path_or_bytes) -> str:
    """Why a model has no folder to read external data from."""
    if isinstance(path_or_bytes, ModelProto):
        return "the model was given as a ModelProto"
    if isinstance(path_or_bytes, (bytes, bytearray)):
        return "the model was given as bytes"
    return "the model was given without a path"


def refuse_foreign_stubs_and_external_data(model: ModelProto, store: WeightStore,
                                           how: str) -> None:
    """refuse_foreign_stubs, then refuse_external_data, in one walk over the tensors."""
    external = None
    for tensor in model_tensors(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        if is_stub(tensor):
            if store_of(tensor) is not store:
                refuse_foreign_stubs(model, store)  # raises, naming the tensor
        elif external is None:
            external = tensor
    if external is not None:
        refuse_external_data(model, how)  # raises, naming the first such tensor


def refuse_foreign_stubs(model: ModelProto, store: WeightStore) -> None:
    """A tensor of the model as given may not name in-memory weights (MEMORY_LOCATION): only
    the stubs loading just made, in this session's store, are the session's own; any other
    would read weights another session holds, past the external-data folder check."""
    for tensor in model_tensors(model):
        if is_stub(tensor) and store_of(tensor) is not store:
            raise InvalidModelError(
                f"tensor {tensor.name!r}: external data location {MEMORY_LOCATION!r} names "
                "weights held in memory by onnx-parity; a model given to a session cannot")


def _parse(path_or_bytes, store: WeightStore) -> tuple[ModelProto, str | None]:
    """A model we may edit, external data not yet read, and its folder (if a path)."""
    if isinstance(path_or_bytes, (str, os.PathLike)):
        path = os.fspath(path_or_bytes)
        if not os.path.isfile(path) or os.path.getsize(path) == 0:
            return load_model(path), None  # its error names what is wrong
        model = read_model_file(path, store)
        if model is None:
            try:
                model = onnx.load(path, load_external_data=False)
            except Exception as e:
                raise InvalidModelError(f"cannot parse {path}: it is not an ONNX model ({e})") from e
        if not model.HasField("graph") and not model.opset_import:
            raise InvalidModelError(f"cannot parse {path}: it is not an ONNX model (no graph)")
        return model, os.path.dirname(os.path.abspath(path))
    if isinstance(path_or_bytes, (bytes, bytearray)):
        # walked like a file: a parsed ModelProto would hold every weight's bytes until it is
        # freed (its fields are cleared in place), beside the caller's bytes and the arrays;
        # small models are parsed (the walk costs Python calls per field: densenet121's 0.4 MB
        # took 25 ms against 3)
        model = read_model_bytes(path_or_bytes, store) if len(path_or_bytes) > WALK_BYTES else None
        if model is None:
            try:
                model = onnx.load_model_from_string(bytes(path_or_bytes))
            except Exception as e:
                raise InvalidModelError(f"cannot parse model bytes: {e}") from e
        detach_initializers(model, store)  # what the walk left: data not in raw_data
        return model, None
    if isinstance(path_or_bytes, ModelProto):
        return copy_without_weights(path_or_bytes, store), None  # the caller's model stays as it is
    return load_model(path_or_bytes), None  # its error names the wrong type


def fill_external_data(model: ModelProto, files: dict[str, bytes]) -> None:
    """Initializers whose external data file is given in memory get their bytes from it."""
    if not files:
        return
    for tensor in model_tensors(model):
        if not external_data_helper.uses_external_data(tensor) or is_stub(tensor):
            continue
        info = external_data_helper.ExternalDataInfo(tensor)
        if info.location not in files:
            continue
        data = files[info.location]
        start = int(info.offset or 0)
        end = start + int(info.length) if info.length else len(data)
        if end > len(data):
            raise InvalidArgument(f"initializer {tensor.name!r}: bytes {start}..{end} of external "
                                  f"file {info.location!r}, which holds {len(data)} bytes")
        tensor.raw_data = data[start:end]
        del tensor.external_data[:]
        tensor.data_location = onnx.TensorProto.DEFAULT


def replace_initializers(model: ModelProto, values: dict) -> None:
    """SessionOptions.add_initializer: replaces the initializer of that name, or adds it."""
    if not values:
        return
    graph = model.graph
    for name, ort_value in values.items():
        tensor = numpy_helper.from_array(ort_value.numpy(), name)
        for i, existing in enumerate(graph.initializer):
            if existing.name == name:
                graph.initializer[i].CopyFrom(tensor)
                break
        else:
            graph.initializer.append(tensor)


def fix_free_dimensions(model: ModelProto, by_name: dict[str, int], by_denotation: dict[str, int]) -> None:
    if not by_name and not by_denotation:
        return
    for info in list(model.graph.input) + list(model.graph.output):
        if info.type.WhichOneof("value") != "tensor_type":
            continue
        for dim in info.type.tensor_type.shape.dim:
            value = by_name.get(dim.dim_param) if dim.HasField("dim_param") else None
            if value is None and dim.denotation:
                value = by_denotation.get(dim.denotation)
            if value is not None:
                dim.dim_value = value


def with_inferred_outputs(model: ModelProto) -> ModelProto:
    """The model with graph outputs declared without a shape given the inferred one (as
    onnxruntime reports them), or the model itself when every output has a shape or inference
    cannot tell."""
    def unshaped(info):
        return info.type.WhichOneof("value") == "tensor_type" and not info.type.tensor_type.HasField("shape")

    if not any(unshaped(o) for o in model.graph.output):
        return model
    try:
        return onnx.shape_inference.infer_shapes(model)
    except (ValueError, onnx.shape_inference.InferenceError):  # a nicety for NodeArg.shape
        return model
