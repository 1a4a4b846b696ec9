"""Loading a model and the checks that go beyond onnx's checker, each failing with a message
that names what is wrong: the file (empty, not a model), external data (missing, truncated,
or outside the model's folder), the graph's structure (cycles, order, undefined or twice-made
values) and operators that nothing here implements."""
from __future__ import annotations

import math
import os

import onnx
from onnx import AttributeProto, GraphProto, ModelProto, TensorProto

from .errors import InvalidModelError, UnsupportedOpError
from .functions import has_function_body, schema_for
from .registry import canonical_domain, lookup
from .weights import is_stub

# Sub-byte types store two (4-bit) or four (2-bit) elements per byte.
_BITS = {getattr(TensorProto, n): b for n, b in (("INT4", 4), ("UINT4", 4), ("FLOAT4E2M1", 4),
                                                  ("INT2", 2), ("UINT2", 2)) if hasattr(TensorProto, n)}


def load_model(model) -> ModelProto:
    """A ModelProto from a ModelProto, serialized bytes or a path; a path's external data is
    read from the model's folder, and only from there."""
    if isinstance(model, ModelProto):
        refuse_external_data(model, "the model was given as a ModelProto")
        return model
    if isinstance(model, (bytes, bytearray)):
        try:
            loaded = onnx.load_model_from_string(bytes(model))
        except Exception as e:
            raise InvalidModelError(f"cannot parse model bytes: {e}") from e
        refuse_external_data(loaded, "the model was given as bytes")
        return loaded
    if isinstance(model, (str, os.PathLike)):
        return load_model_file(os.fspath(model))
    raise TypeError(f"expected a ModelProto, a path or bytes, got {type(model).__name__}")


def load_model_file(path: str) -> ModelProto:
    if not os.path.exists(path):
        raise FileNotFoundError(f"model file not found: {path}")
    if os.path.isdir(path):
        raise InvalidModelError(f"{path} is a directory, not an ONNX model file")
    if os.path.getsize(path) == 0:
        raise InvalidModelError(f"model file {path} is empty (0 bytes)")
    try:
        model = onnx.load(path, load_external_data=False)
    except Exception as e:
        raise InvalidModelError(f"cannot parse {path}: it is not an ONNX model ({e})") from e
    if not model.HasField("graph") and not model.opset_import:
        raise InvalidModelError(f"cannot parse {path}: it is not an ONNX model (no graph)")
    load_external_data(model, os.path.dirname(os.path.abspath(path)))
    return model


# external data -------------------------------------------------------------------------------
def graph_tensors(graph: GraphProto):
    """Every TensorProto a graph holds: initializers and attribute tensors, subgraphs included."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        yield from node_tensors(node)


def node_tensors(node):
    for a in node.attribute:
        if a.type == AttributeProto.TENSOR:
            yield a.t
        elif a.type == AttributeProto.TENSORS:
            yield from a.tensors
        elif a.type == AttributeProto.SPARSE_TENSOR:
            yield from (a.sparse_tensor.values, a.sparse_tensor.indices)
        elif a.type == AttributeProto.GRAPH:
            yield from graph_tensors(a.g)
        elif a.type == AttributeProto.GRAPHS:
            for g in a.graphs:
                yield from graph_tensors(g)


def model_tensors(model: ModelProto):
    yield from graph_tensors(model.graph)
    for function in model.functions:
        for node in function.node:
            yield from node_tensors(node)


def _external(tensor) -> bool:
    return tensor.data_location == TensorProto.EXTERNAL and not is_stub(tensor)  # stubs are in memory


def refuse_external_data(model: ModelProto, how: str) -> None:
    for tensor in model_tensors(model):
        if _external(tensor):
            location = {e.key: e.value for e in tensor.external_data}.get("location", "")
            raise InvalidModelError(
                f"tensor {tensor.name!r} keeps its data in the external file {location!r}, but "
                f"{how}, so there is no folder to find it in: load the model from its path")


def load_external_data(model: ModelProto, folder: str) -> None:
    """Read every external tensor's bytes into the model, after checking that its file lies
    inside `folder` (no absolute path, no '..', no symlink out) and holds enough bytes."""
    for tensor in model_tensors(model):
        if _external(tensor):
            tensor.raw_data = _read_external(tensor, folder)
            tensor.data_location = TensorProto.DEFAULT
            del tensor.external_data[:]


def _read_external(tensor, folder: str) -> bytes:
    info = {e.key: e.value for e in tensor.external_data}
    location = info.get("location", "")
    where = f"external data of tensor {tensor.name!r}"
    if not location:
        raise InvalidModelError(f"{where}: no location given")
    if os.path.isabs(location) or os.path.splitdrive(location)[0]:
        raise InvalidModelError(f"{where}: location {location!r} is an absolute path; external "
                                f"data must lie in the model's folder {folder}")
    root = os.path.realpath(folder)
    target = os.path.realpath(os.path.join(folder, location))
    if os.path.commonpath([root, target]) != root:
        raise InvalidModelError(f"{where}: location {location!r} resolves to {target}, outside "
                                f"the directory that holds the model, {root}")
    if not os.path.exists(target):
        raise InvalidModelError(f"{where}: file {location!r} not found in {root}")
    if not os.path.isfile(target):
        raise InvalidModelError(f"{where}: {location!r} is not a regular file")
    try:
        offset = int(info.get("offset", 0))
        length = int(info["length"]) if "length" in info else None
    except ValueError as e:
        raise InvalidModelError(f"{where}: offset and length must be integers ({e})") from e
    size = os.path.getsize(target)
    if offset < 0 or (length is not None and length < 0):
        raise InvalidModelError(f"{where}: negative offset {offset} or length {length}")
    if length is not None and offset + length > size:
        raise InvalidModelError(f"{where}: {location!r} is {size} bytes, too short for length "
                                f"{length} from offset {offset} (file has {max(size - offset, 0)} "
                                f"bytes from there)")
    needed = tensor_nbytes(tensor)
    available = size - offset if length is None else length
    if needed is not None and available != needed:
        raise InvalidModelError(f"{where}: {location!r} has {available} bytes from offset "
                                f"{offset}, but a tensor of shape {list(tensor.dims)} needs {needed}")
    with open(target, "rb") as f:
        f.seek(offset)
        return f.read(available)


def tensor_nbytes(tensor) -> int | None:
    """Bytes of raw data a tensor's type and shape call for (None for strings)."""
    if tensor.data_type in (TensorProto.STRING, TensorProto.UNDEFINED):
        return None
    count = math.prod(tensor.dims)
    if tensor.data_type in _BITS:
        per_byte = 8 // _BITS[tensor.data_type]
        return (count + per_byte - 1) // per_byte
    return count * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize


# graph structure -----------------------------------------------------------------------------
def _describe(node, index: int) -> str:
    return f"node {node.name!r} ({node.op_type})" if node.name else f"node #{index} ({node.op_type})"


def check_graph_structure(graph: GraphProto, outer: frozenset = frozenset()) -> None:
    """Every value defined once, before it is read; no cycles. Subgraphs see the values their
    node's graph defines before that node."""
    defined = set(outer)
    made_by: dict[str, int] = {}
    for vi in graph.input:
        defined.add(vi.name)
    defined |= {t.name for t in graph.initializer}
    defined |= {s.values.name for s in graph.sparse_initializer}
    for i, node in enumerate(graph.node):
        for name in node.output:
            if not name:
                continue
            if name in made_by:
                first = graph.node[made_by[name]]
                raise InvalidModelError(
                    f"value {name!r} is made more than once: by {_describe(first, made_by[name])} "
                    f"and by {_describe(node, i)}")
            made_by[name] = i
    for i, node in enumerate(graph.node):
        for name in node.input:
            if name and name not in defined:
                _raise_undefined(graph, i, name, made_by)
        for a in node.attribute:
            if a.type == AttributeProto.GRAPH:
                check_graph_structure(a.g, frozenset(defined))
            elif a.type == AttributeProto.GRAPHS:
                for g in a.graphs:
                    check_graph_structure(g, frozenset(defined))
        defined.update(node.output)  # "" too, which no read looks up


def _raise_undefined(graph: GraphProto, i: int, name: str, made_by: dict) -> None:
    node = graph.node[i]
    if name not in made_by:
        raise InvalidModelError(
            f"input {name!r} of {_describe(node, i)} is not defined: it is not a graph input, an "
            f"initializer, or the output of any node")
    cycle = _find_cycle(graph, made_by)
    if cycle:
        names = " -> ".join(_describe(graph.node[j], j) for j in cycle + cycle[:1])
        raise InvalidModelError(f"the graph has a cycle: {names}")
    maker = made_by[name]
    raise InvalidModelError(
        f"nodes are not in topological order: {_describe(node, i)} reads {name!r} before "
        f"{_describe(graph.node[maker], maker)} makes it")


def _find_cycle(graph: GraphProto, made_by: dict) -> list[int]:
    """Node indices of one cycle, in order, or [] if the graph is acyclic."""
    deps = [[made_by[n] for n in node.input if n in made_by] for node in graph.node]
    state = [0] * len(deps)  # 0 new, 1 on the stack, 2 done
    for start in range(len(deps)):
        if state[start]:
            continue
        stack = [(start, iter(deps[start]))]
        path = [start]
        state[start] = 1
        while stack:
            j, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[j] = 2
                stack.pop()
                path.pop()
            elif state[nxt] == 1:
                return list(reversed(path[path.index(nxt):]))
            elif state[nxt] == 0:
                state[nxt] = 1
                stack.append((nxt, iter(deps[nxt])))
                path.append(nxt)
    return []


# operators -----------------------------------------------------------------------------------
def check_ops_implemented(model: ModelProto) -> None:
    """Refuse, at load, a node that no op, model-local function or schema function body
    implements (onnxruntime refuses an unregistered custom op at load too)."""
    opsets = {canonical_domain(o.domain): o.version for o in model.opset_import}
    if "" not in opsets and model.ir_version < 3:
        opsets[""] = 1
    functions = {(f.domain, f.name) for f in model.functions}
    _check_graph_ops(model.graph, opsets, functions, (), set())


def _check_graph_ops(graph: GraphProto, opsets: dict, functions: set, path: tuple,
                     implemented: set) -> None:
    """`implemented`: the (domain, op type) pairs found implemented so far (a graph repeats a
    few op types many times; looking each node up cost densenet121 4 ms)."""
    for i, node in enumerate(graph.node):
        key = (node.domain, node.op_type)
        if key not in implemented and key not in functions:
            domain = canonical_domain(node.domain)
            opset = opsets.get(domain)
            if opset is not None and lookup(domain, node.op_type, opset) is None:
                schema = schema_for(node.op_type, opset, domain)
                if schema is None or not has_function_body(schema, opset):
                    where = f" in {'/'.join(path)}" if path else ""
                    raise UnsupportedOpError(
                        f"no implementation of {domain or 'ai.onnx'}::{node.op_type} for opset "
                        f"{opset} ({_describe(node, i)}{where})")
            implemented.add(key)
        for a in node.attribute:
            for g in ([a.g] if a.type == AttributeProto.GRAPH else
                      list(a.graphs) if a.type == AttributeProto.GRAPHS else []):
                _check_graph_ops(g, opsets, functions, path + (node.name or node.op_type, a.name),
                                 implemented)
