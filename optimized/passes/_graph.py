"""Helpers the passes share: reading constants, finding producers and consumers, renaming
values and splicing nodes, all on the main graph of a ModelProto."""
from __future__ import annotations

import math
import operator
import sys
from collections import OrderedDict
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np
import onnx
from onnx import AttributeProto, helper, numpy_helper

from reference.weights import (
    RAW_DATA_DTYPES,
    SMALL_TENSOR,
    WeightStore,
    store_of,
    stored_array,
    tensor_array,
)

MS_DOMAIN = "com.microsoft"
# the ops our fusions write as model-local functions, whose bodies the reference runs
FUSED_DOMAIN = "onnx_parity.fused"
FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16)


class WorkingModel:
    """The one copy of the model that optimize() hands from pass to pass: the passes rewrite it
    in place (copy_model gives it back itself) instead of each copying the model and rebuilding
    what it reads of it. `version` counts the passes that changed it; what is read of one
    version (its inferred types) is shared by every pass that sees that version."""

    def __init__(self, model: onnx.ModelProto):
        self.model = onnx.ModelProto()
        self.model.CopyFrom(model)  # the caller's model stays as it was, whatever a pass does
        self.serialized = self.model.SerializeToString()
        self.version = 0
        self.types: dict = {}  # (version, data_prop) -> inferred types
        # data_prop -> (the types last inferred, the names that have lived since): see VersionTypes
        self.carried: dict = {}
        self.views: dict = {}  # kind -> (version, the nodes it was built on, view)
        # every Shapes of it follows shapes through the graph (data_prop): set where a pass
        # that asks that will run, so one inference of a version serves every pass
        self.data_prop = False

    def update(self, model: onnx.ModelProto) -> bool:
        """Take a pass's result as the working model; True when it differs from the last one."""
        self.model = model
        serialized = model.SerializeToString()
        if serialized == self.serialized:
            return False
        self.serialized = serialized
        self.version += 1
        self.carried.update((data_prop, found) for (_, data_prop), found in self.types.items())
        self.types.clear()
        if self.carried:
            present = value_names(model.graph)
            self.carried = {data_prop: (types, names & present)
                            for data_prop, (types, names) in self.carried.items()}
        return True


_WORKING: ContextVar[WorkingModel | None] = ContextVar("working_model", default=None)


@contextmanager
def working_copy(model: onnx.ModelProto):
    """A WorkingModel of `model`, rewritten in place by the passes called meanwhile."""
    working = WorkingModel(model)
    token = _WORKING.set(working)
    try:
        yield working
    finally:
        _WORKING.reset(token)


def copy_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy the caller may edit; inside working_copy, the working model itself (which only the
    passes see)."""
    working = _WORKING.get()
    if working is not None and working.model is model:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def opset_version(model: onnx.ModelProto, domain: str = "") -> int:
    for o in model.opset_import:
        if o.domain in ((domain, "ai.onnx") if domain == "" else (domain,)):
            return o.version
    return 0


def ensure_opset(model: onnx.ModelProto, domain: str, version: int = 1) -> None:
    if not opset_version(model, domain):
        model.opset_import.append(helper.make_opsetid(domain, version))


def add_fused_functions(model: onnx.ModelProto, op_types, build) -> None:
    """Declare FUSED_DOMAIN and append `build(op_type)` for each fused op type the model does
    not define yet."""
    ensure_opset(model, FUSED_DOMAIN, 1)
    have = {(f.domain, f.name) for f in model.functions}
    for op_type in sorted(op_types):
        if (FUSED_DOMAIN, op_type) not in have:
            model.functions.append(build(op_type))


def set_nodes(graph: onnx.GraphProto, nodes: list) -> None:
    if len(nodes) == len(graph.node) and all(map(operator.is_, nodes, graph.node)):
        return  # the graph's own nodes, in order (extend would copy each one back in)
    del graph.node[:]
    graph.node.extend(nodes)


def graph_output_names(graph) -> set[str]:
    return {o.name for o in graph.output}


def subgraphs(node):
    for a in node.attribute:
        if a.type == AttributeProto.GRAPH:
            yield a.g
        elif a.type == AttributeProto.GRAPHS:
            yield from a.graphs


# the ai.onnx ops whose attributes hold graphs: onnx's checker refuses a graph attribute on
# any other (a session validates its model before the passes), so their attributes go unread
ONNX_SUBGRAPH_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})


def holds_subgraph(node) -> bool:
    """Whether subgraphs(node) yields any (asked of every node by cse, constant folding, dead
    code and consumers: reading a fused convolution's attributes cost more than its inputs)."""
    if node.op_type not in ONNX_SUBGRAPH_OPS and node.domain in ("", "ai.onnx"):
        return False
    attributes = node.attribute
    return bool(attributes) and any(
        a.type == AttributeProto.GRAPH or (a.type == AttributeProto.GRAPHS and a.graphs)
        for a in attributes)


def outer_names(graph) -> set[str]:
    """Names a subgraph reads from the scopes around it."""
    defined = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    used = set()
    for node in graph.node:
        used.update(n for n in node.input if n and n not in defined)
        for g in subgraphs(node):
            used.update(n for n in outer_names(g) if n not in defined)
        defined.update(node.output)
    used.update(o.name for o in graph.output if o.name not in defined)
    return used


def node_inputs(node) -> list[str]:
    """Explicit inputs plus the outer-scope names its subgraphs read."""
    names = [n for n in node.input if n]
    for g in subgraphs(node):
        names.extend(outer_names(g))
    return names


def consumers(graph) -> dict[str, list]:
    """Value name -> the nodes that read it (read-only: passes that see the same nodes share
    it)."""
    return _shared_view(graph, "consumers", _consumers)


def _consumers(graph) -> dict[str, list]:
    uses: dict[str, list] = {}
    for node in graph.node:
        names = node_inputs(node) if holds_subgraph(node) else node.input
        for name in dict.fromkeys(names) if len(names) > 1 else names:
            if name:
                if name in uses:
                    uses[name].append(node)
                else:
                    uses[name] = [node]
    return uses


def producers(graph) -> dict:
    """Value name -> the node that makes it (read-only, shared as consumers is)."""
    return _shared_view(graph, "producers", _producers)


def _producers(graph) -> dict:
    return {name: node for node in graph.node for name in node.output if name}


def _shared_view(graph, kind: str, build, parts=lambda graph: list(graph.node)):
    """build(graph), shared between the passes that ask it of the working model's main graph
    while neither the version nor the objects `parts` lists (the graph's nodes) have changed (a
    pass asks before it edits; an edit that changes nothing the bytes show keeps the version,
    so the objects are checked one by one, which costs far less than building the view)."""
    working = _WORKING.get()
    if working is None or working.model.graph is not graph:
        return build(graph)
    cached, now = working.views.get(kind), parts(graph)
    if cached is not None and cached[0] == working.version and len(cached[1]) == len(
            now) and all(map(operator.is_, cached[1], now)):
        return cached[2]
    view = build(graph)
    working.views[kind] = (working.version, now, view)
    return view


def rename_uses(nodes, old: str, new: str) -> None:
    """Every read of `old` (subgraphs included, unless they define it) now reads `new`."""
    for node in nodes:
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new
        for g in subgraphs(node):
            defined = {i.name for i in g.input} | {i.name for i in g.initializer}
            defined |= {o for n in g.node for o in n.output}
            if old not in defined:
                rename_uses(g.node, old, new)
                for o in g.output:
                    if o.name == old:
                        o.name = new


def initializer_names(graph) -> set[str]:
    return {i.name for i in graph.initializer}


def constant_tensors(graph) -> dict[str, onnx.TensorProto]:
    """Initializers that no graph input can override, and Constant nodes holding a tensor (a
    dict of the caller's own; one build is shared, as consumers is, while the graph's nodes,
    initializers and inputs stay the same objects: each pass asks it first, and building it
    cost light_densenet121 1.6 ms a pass)."""
    return dict(_shared_view(graph, "constants", _constant_tensors, _value_sources))


def _value_sources(graph) -> list:
    """What constant_tensors reads: the nodes, initializers and inputs (None between them)."""
    return [*graph.node, None, *graph.initializer, None, *graph.input]


def _constant_tensors(graph) -> dict[str, onnx.TensorProto]:
    inputs = {i.name for i in graph.input}
    found = {i.name: i for i in graph.initializer if i.name not in inputs}
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            tensor = _constant_node_tensor(node)
            if tensor is not None:
                found[node.output[0]] = tensor
    return found


def _constant_node_tensor(node):
    a = node.attribute[0] if len(node.attribute) == 1 else None
    if a is None:
        return None
    if a.name == "value":
        return a.t
    simple = {"value_float": np.float32, "value_floats": np.float32,
              "value_int": np.int64, "value_ints": np.int64}
    if a.name in simple:
        return numpy_helper.from_array(
            np.asarray(helper.get_attribute_value(a), dtype=simple[a.name]))
    return None


class Constants:
    """Constant values of a graph, converted to numpy on first use."""

    def __init__(self, graph):
        self.tensors = constant_tensors(graph)
        self._arrays: dict[str, np.ndarray] = {}

    def __contains__(self, name) -> bool:
        return name in self.tensors

    def get(self, name):
        if name not in self.tensors:
            return None
        if name not in self._arrays:
            self._arrays[name] = tensor_values(self.tensors[name])
        return self._arrays[name]


# element types held in a typed field of their own numpy type when there is no raw_data
_TYPED_FIELDS = {onnx.TensorProto.FLOAT: ("float_data", np.dtype(np.float32)),
                 onnx.TensorProto.DOUBLE: ("double_data", np.dtype(np.float64)),
                 onnx.TensorProto.INT64: ("int64_data", np.dtype(np.int64)),
                 onnx.TensorProto.INT32: ("int32_data", np.dtype(np.int32))}


def tensor_values(tensor: onnx.TensorProto) -> np.ndarray:
    """tensor_array, read straight from raw_data (or from the typed field of a float, double,
    int64 or int32 tensor without it) for a tensor of a plain numeric type
    (numpy_helper.to_array took 3x as long from raw_data, 20x from float_data, and the passes
    read hundreds of shape and fill constants)."""
    dtype = RAW_DATA_DTYPES.get(tensor.data_type)
    if dtype is None or sys.byteorder != "little" or tensor.data_location != 0:
        return tensor_array(tensor)
    shape = tuple(tensor.dims)
    if not tensor.HasField("raw_data"):
        typed = _TYPED_FIELDS.get(tensor.data_type)
        if typed is None or tensor.HasField("segment"):
            return tensor_array(tensor)
        values = getattr(tensor, typed[0])
        if len(values) != math.prod(shape):
            return tensor_array(tensor)  # its own error names the mismatch
        return np.array(values, typed[1]).reshape(shape)
    raw = tensor.raw_data
    if len(raw) != math.prod(shape) * dtype.itemsize:
        return tensor_array(tensor)  # its own error names the mismatch
    return np.frombuffer(raw, dtype).reshape(shape).copy()


def scalar(constants: Constants, name: str):
    """The value of a constant that holds one number, else None."""
    value = constants.get(name)
    if value is None or value.size != 1 or value.dtype.kind not in "fiu":
        return None
    return float(value.reshape(-1)[0])


def is_close(value, target, rel=1e-3) -> bool:
    return value is not None and abs(value - target) <= rel * abs(target)


def attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def add_initializer(graph, base: str, array: np.ndarray, taken: set[str] | None = None) -> str:
    """A new initializer of the main graph holding `array`, under a name made from `base`."""
    name = unique_name(graph, base, taken)
    graph.initializer.append(initializer(name, array))
    return name


# inside weights_into(store): the store that new large initializers go to straight away
_STORE: ContextVar[WeightStore | None] = ContextVar("weight_store", default=None)
# element types a store holds as the plain little-endian bytes of their numpy array
_STORED_DTYPES = {np.dtype(t) for t in (np.float32, np.float64, np.float16, np.int8, np.int16,
                                         np.int32, np.int64, np.uint8, np.uint16, np.uint32,
                                         np.uint64, np.bool_)}
_TENSOR_TYPES = {t: helper.np_dtype_to_tensor_dtype(t) for t in _STORED_DTYPES}


# inside weights_into(store): the ids of the arrays the store held when it began (the caller's
# model may name them); an array a pass has made since belongs to the passes alone
_HELD_BEFORE: ContextVar[frozenset] = ContextVar("held_before", default=frozenset())


@contextmanager
def weights_into(store: WeightStore | None):
    """initializer() makes large tensors of the main graph as stubs in `store` meanwhile."""
    token = _STORE.set(store)
    held = _HELD_BEFORE.set(frozenset(map(id, store.arrays.values())) if store else frozenset())
    try:
        yield
    finally:
        _HELD_BEFORE.reset(held)
        _STORE.reset(token)


def own_weight(constants: Constants, name: str, reader, uses, graph_outputs
               ) -> np.ndarray | None:
    """The array of the stub initializer `name`, made writable, where `reader` alone reads it
    (once), a pass made it inside this weights_into (so no model but the working one names it)
    and it owns its memory of floats; else None. The pass that replaces `reader` may rewrite it
    in place: fresh pages fault in one by one, which on this VM cost more than the arithmetic
    written into them."""
    tensor = constants.tensors.get(name)
    store = _STORE.get()
    if (tensor is None or store is None or name in graph_outputs or uses.get(name) != [reader]
            or list(reader.input).count(name) != 1 or store_of(tensor) is not store):
        return None
    array = stored_array(tensor)
    if (id(array) in _HELD_BEFORE.get() or array.base is not None or not array.flags.owndata
            or not array.flags.c_contiguous or array.dtype.kind != "f"):
        return None
    array.setflags(write=True)
    return array


def initializer(name: str, array: np.ndarray) -> onnx.TensorProto:
    """A main-graph initializer holding `array`: inside weights_into, a large one is a stub of
    the store that keeps `array` itself (its bytes are never copied into a TensorProto, only to
    be moved out again when the pass is done), else numpy_helper.from_array."""
    store = _STORE.get()
    array = np.asarray(array)
    plain = (array.dtype in _STORED_DTYPES and sys.byteorder == "little"
             and array.dtype.byteorder != ">")
    if plain and array.size <= SMALL_TENSOR:  # as from_array makes it, in a tenth of its time
        return onnx.TensorProto(name=name, data_type=_TENSOR_TYPES[array.dtype],
                                dims=array.shape, raw_data=array.tobytes())
    if store is None or not plain:
        return numpy_helper.from_array(array, name)
    if not (array.flags.c_contiguous and array.flags.owndata):
        array = np.array(array, order="C")  # the store's array is its own, read-only
    tensor = onnx.TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype),
                              dims=array.shape)
    store.stub(tensor, array)
    return tensor


def taken_names(graph) -> set[str]:
    """The names of the graph's initializers, inputs and node outputs."""
    taken = {i.name for i in graph.initializer} | {i.name for i in graph.input}
    taken.update(o for n in graph.node for o in n.output)
    return taken


def unique_name(graph, base: str, taken: set[str] | None = None) -> str:
    """`base`, or `base_k`, unused in the graph. A pass that names many values passes the
    `taken_names` it made once (gathering them is O(graph) per call); the new name joins it."""
    if taken is None:
        taken = taken_names(graph)
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


def single_consumer(uses, graph_outputs, name, consumer) -> bool:
    """`name` is read by `consumer` alone and is no graph output."""
    readers = uses.get(name, [])
    return name not in graph_outputs and len(readers) == 1 and readers[0] is consumer


def only_reader(uses, graph_outputs, name):
    """The one node that reads `name`, when it has exactly one and is no graph output."""
    readers = uses.get(name, [])
    if name in graph_outputs or len(readers) != 1:
        return None
    return readers[0]


def private_values(pattern, results, uses, graph_outputs) -> bool:
    """Every value the nodes of `pattern` make, except those named in `results`, is read by
    nodes of the pattern alone and is no graph output: the pattern may be replaced whole."""
    inside = {id(n) for n in pattern}
    for node in pattern:
        for name in node.output:
            if not name or name in results:
                continue
            if name in graph_outputs or any(id(r) not in inside for r in uses.get(name, [])):
                return False
    return True


def reads_type_only(node, name) -> bool:
    """`node` reads `name` only for its element type: CastLike(other, name)."""
    return node.op_type == "CastLike" and node.domain in ("", "ai.onnx") and (
        list(node.input[1:2]) == [name] and node.input[0] != name)


def scalar_through_cast(constants: Constants, made_by: dict, name: str):
    """`scalar`, also for a constant that reaches `name` through Cast or CastLike (the dynamo
    exporter writes CastLike(constant, x) so a literal takes x's type)."""
    value = scalar(constants, name)
    node = made_by.get(name)
    if value is None and node is not None and node.op_type in ("Cast", "CastLike") and (
            node.domain in ("", "ai.onnx")):
        value = scalar(constants, node.input[0])
    return value


def splice(nodes: list, old: list, new: list) -> list:
    """`nodes` with `old` replaced by `new`, placed where the last of `old` stood."""
    # positions found by list.index over the nodes' ids (a pass splices once per match, so a
    # Python loop over every node each time made fusing a large graph quadratic in Python)
    node_ids = list(map(id, nodes))
    positions = sorted({node_ids.index(i) for i in set(map(id, old)) if i in node_ids})
    if not positions:
        raise ValueError("splice: none of the nodes to replace is in the list")
    spliced, start = [], 0
    for i in positions:
        spliced.extend(nodes[start:i])
        start = i + 1
    spliced.extend(new)
    spliced.extend(nodes[start:])
    return spliced


class Splices:
    """A pass's node list under many splice()s, applied in one walk at the end (splice
    rebuilds the whole list each time: 240 matches in a 1700-node light model cost 20 ms).
    A replacement whose old nodes are all nodes of the list that no replacement has touched
    yet is recorded where the last of them stands; any other is spliced at once into the list
    as it is by then. nodes() is what splice() one after another gives."""

    def __init__(self, nodes):
        self._reset(list(nodes))

    def _reset(self, nodes: list) -> None:
        self._base = nodes
        self._position = {id(n): k for k, n in enumerate(nodes)}
        self._placed: dict[int, list] = {}  # position of the last old node -> its new nodes
        self._removed: set[int] = set()

    def replace(self, old, new) -> None:
        positions = {self._position.get(id(n)) for n in old}
        if positions and None not in positions and positions.isdisjoint(self._removed):
            self._removed.update(positions)
            self._placed[max(positions)] = list(new)
            return
        self._reset(splice(self.nodes(), old, new))

    def nodes(self) -> list:
        if not self._removed:
            return self._base
        placed, removed, out = self._placed, self._removed, []
        for k, node in enumerate(self._base):
            if k in placed:
                out.extend(placed[k])
            elif k not in removed:
                out.append(node)
        return out


class Shapes:
    """Element types and shapes from onnx shape inference (None where unknown)."""

    def __init__(self, model, data_prop: bool = False):
        # data_prop: shapes computed in the graph (Shape, Gather, Concat) are followed too
        self._types = _types_as_now(model, data_prop)  # inferred on the first question only
        self._graph = model.graph
        # an initializer's own type and shape where inference names none (built on first use)
        self._initializers: dict | None = None
        self._initializer_types: dict = {}

    def _type(self, name):
        tp, self._source = _typed(self._types, name)
        if tp is None:
            if name in self._initializer_types:
                return self._initializer_types[name]
            if self._initializers is None:
                self._initializers = {i.name: (i.data_type, list(i.dims))
                                      for i in self._graph.initializer}
            if name in self._initializers:
                tp = self._initializer_types[name] = helper.make_tensor_type_proto(
                    *self._initializers.pop(name))
        return tp

    def elem_type(self, name):
        tp = self._type(name)
        if tp is None or tp.WhichOneof("value") != "tensor_type" or not tp.tensor_type.elem_type:
            return None
        return tp.tensor_type.elem_type

    def shape(self, name):
        """List of ints / dim_param strings / None per axis, or None if the rank is unknown."""
        tp = self._type(name)
        if tp is None or tp.WhichOneof("value") != "tensor_type":
            return None
        tt = tp.tensor_type
        if not tt.HasField("shape"):
            return None
        return [d.dim_value if d.HasField("dim_value") else self._symbol(d.dim_param)
                for d in tt.shape.dim]

    def _symbol(self, dim_param: str):
        """The dimension's name; one that inference made up (unk__N) names the inference too:
        each numbers its own from 0, and a version's types may come from two of them."""
        if dim_param.startswith(GENERATED_SYMBOL):
            return f"{dim_param}@{self._source}"
        return dim_param or None

    def rank(self, name):
        shape = self.shape(name)
        return None if shape is None else len(shape)

    def static_shape(self, name):
        shape = self.shape(name)
        if shape is None or not all(isinstance(d, int) for d in shape):
            return None
        return shape

    def same_shape(self, a, b) -> bool:
        """Both shapes known and equal axis by axis (symbolic names must match)."""
        sa, sb = self.shape(a), self.shape(b)
        return sa is not None and sb is not None and len(sa) == len(sb) and all(
            x is not None and x == y for x, y in zip(sa, sb))


# shape inference reads the values of small constants only (shapes, axes), so the weights
# can stay behind when the graph is copied for it
SMALL_CONSTANT = 1024
# inside shared_inference(): the types inference found for the last few light models, by
# their bytes (the passes of one optimize() each ask for the shapes of a graph that most of
# them leave as it was)
_INFERRED: ContextVar[OrderedDict | None] = ContextVar("inferred_types", default=None)
_INFERRED_KEPT = 4


@contextmanager
def shared_inference():
    """Shapes made inside share one shape inference per graph they see alike."""
    token = _INFERRED.set(OrderedDict())
    try:
        yield
    finally:
        _INFERRED.reset(token)


def _types_as_now(model, data_prop: bool):
    """The model's inferred types as they are now (a mapping asked with get), even once a pass
    has edited the model meanwhile: of the working model, those of its version (VersionTypes);
    of another model, inferred now."""
    working = _WORKING.get()
    if working is None or working.model is not model:
        return _inferred_types(model, data_prop)
    return VersionTypes(working, data_prop or working.data_prop)


# the prefix of the dimension names onnx shape inference makes up
GENERATED_SYMBOL = "unk__"


def _typed(types, name):
    """(name's type or None, which inference gave it) from an inferred dict or VersionTypes."""
    if isinstance(types, VersionTypes):
        return types.typed(name)
    return types.get(name), id(types)


# whether a version's types are taken from an earlier version's inference where they can be
# (a switch for the tests, which compare both ways)
CARRY_TYPES = True


class VersionTypes:
    """The inferred types of the working model's current version (from the version's bytes, so
    a pass editing the model meanwhile does not change them). A name that has lived since the
    last version inferred has the type that inference gave it: a pass keeps a value's name only
    for the same value (its fused node makes what the pattern made), so the type stays; the
    version itself is inferred only when a name made since is asked (inference of a decoder's
    graph cost 1.3 ms, and each fusion pass that changed the graph paid it again)."""

    def __init__(self, working: WorkingModel, data_prop: bool):
        self._working, self._data_prop = working, data_prop
        self._key = (working.version, data_prop)
        self._serialized = working.serialized

    def get(self, name):
        return self.typed(name)[0]

    def typed(self, name):
        """(name's type or None, the id of the inference's types it came from)."""
        working = self._working
        found = working.types.get(self._key)
        if found is None:
            carried = working.carried.get(self._data_prop)
            if CARRY_TYPES and carried is not None and name in carried[1]:
                found = carried
            else:
                found = self._inferred()
        return found[0].get(name), id(found[0])

    def _inferred(self):
        working = self._working
        if self._key not in working.types:
            version = onnx.ModelProto.FromString(self._serialized)  # its own copy, to lighten
            names = value_names(version.graph)
            working.types[self._key] = (_inferred_types(version, self._data_prop,
                                                        lighten_in_place=True), names)
        return working.types[self._key]


def value_names(graph) -> set[str]:
    """The names of a graph's inputs, initializers and node outputs."""
    names = {i.name for i in graph.input}
    names.update(i.name for i in graph.initializer)
    names.update(o for n in graph.node for o in n.output if o)
    return names


def _inferred_types(model, data_prop: bool, lighten_in_place: bool = False) -> dict:
    """Value name -> TypeProto from onnx shape inference (read-only: it may be shared). With
    lighten_in_place, the model is a copy of the caller's that may be lightened itself."""
    if not lighten_in_place:
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        model = copy
    lighten(model)
    if data_prop:
        _read_past_identities(model.graph)
    light = model.SerializeToString()
    key, cache = (light, data_prop), _INFERRED.get()
    if cache is not None and key in cache:
        cache.move_to_end(key)
        return cache[key]
    try:
        g = onnx.shape_inference.infer_shapes(light, data_prop=data_prop).graph
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
        g = model.graph  # passes that need a shape then find none and leave the node
        return {v.name: v.type for v in list(g.value_info) + list(g.input) + list(g.output)}
    types = {v.name: v.type for v in list(g.value_info) + list(g.input) + list(g.output)}
    if cache is not None:
        cache[key] = types
        while len(cache) > _INFERRED_KEPT:
            cache.popitem(last=False)
    return types


def _read_past_identities(graph) -> None:
    """In the copy made for inference with data propagation, every value passed on by an
    Identity is read from where it is made (as identity_elimination will leave it): onnx's data
    propagation stops at an Identity, and a graph output written by an Identity (TorchScript
    exports write them) gives its declared dimension names to the node that makes the value
    only once that node writes it. The Identities stay, turned around where needed, so every
    value is still typed; the inferred types are the same values', only better known."""
    outputs = {o.name for o in graph.output}
    made_by = {o: node for node in graph.node for o in node.output}
    identities = [n for n in graph.node
                  if n.op_type == "Identity" and n.domain in ("", "ai.onnx") and n.input[0]]
    if not identities:
        return
    turned = set()
    for node in identities:
        x, y = node.input[0], node.output[0]
        maker = made_by.get(x)
        if (y in outputs and x not in outputs and x not in turned and maker is not None
                and maker.op_type != "Identity"):
            k = list(maker.output).index(x)
            maker.output[k], node.input[0], node.output[0] = y, y, x
            turned.add(x)
    source = {n.output[0]: n.input[0] for n in identities}
    for node in graph.node:
        if node.op_type == "Identity" and node.output[0] in source:
            continue
        for i, name in enumerate(node.input):
            while name in source:
                name = source[name]
            node.input[i] = name


def lighten(model) -> None:
    """The model made ready for shape inference in place: its large initializers become typed
    inputs, and the fused nodes onnx knows no shapes for become their stand-ins."""
    graph = model.graph
    initializers = graph.initializer
    large = [k for k, i in enumerate(initializers) if math.prod(i.dims) > SMALL_CONSTANT]
    if large:
        declared = {i.name for i in graph.input}
        for k in large:
            if initializers[k].name not in declared:
                _declare_input(graph, initializers[k])
        for k in reversed(large):  # in place: the small ones are not copied
            del initializers[k]
    opset = opset_version(model)
    nodes = graph.node
    stand_ins = [(k, shape_stand_ins(node, opset)) for k, node in enumerate(nodes)
                 if _needs_stand_in(node, opset)]
    for k, replacement in reversed(stand_ins):  # in place: the other nodes are not copied
        if len(replacement) == 1 and replacement[0] is nodes[k]:
            continue
        if replacement:
            for extra in reversed(replacement[1:]):
                nodes.insert(k + 1, extra)
            nodes[k].CopyFrom(replacement[0])
        else:
            del nodes[k]
    model.ClearField("training_info")
    model.ir_version = max(model.ir_version, 4)


def _declare_input(graph, tensor) -> None:
    """A graph input of the initializer's type and shape (as make_tensor_value_info writes
    it, without its checks, which cost more than the rest of lightening a model)."""
    tensor_type = graph.input.add(name=tensor.name).type.tensor_type
    tensor_type.elem_type = tensor.data_type
    shape = tensor_type.shape  # a large initializer has at least one axis
    for d in tensor.dims:
        shape.dim.add().dim_value = d


def _needs_stand_in(node, opset) -> bool:
    """Whether shape_stand_ins gives other nodes than `node` itself (it may still, where it
    knows no stand-in, give the node back)."""
    op_type = node.op_type
    return (node.domain == MS_DOMAIN or op_type == "SimplifiedLayerNormalization"
            or (op_type == "LayerNormalization" and opset < 17
                and node.domain in ("", "ai.onnx")))


def shape_stand_ins(node, opset=0) -> list:
    """onnx knows no com.microsoft op, so shape inference would stop at the fused nodes the
    passes write: for shapes only, each stands in as the ai.onnx nodes with the same shapes.
    The same holds for the ai.onnx LayerNormalization layer_norm_fusion writes before opset 17
    (onnxruntime registers it from version 1, onnx from 17)."""
    if node.op_type == "LayerNormalization" and node.domain in ("", "ai.onnx") and opset < 17:
        return [helper.make_node("Identity", [node.input[0]], [node.output[0]])]
    if node.op_type == "SimplifiedLayerNormalization":  # rms_norm_fusion's, in either domain
        return [helper.make_node("Identity", [node.input[0]], [node.output[0]])]
    if node.domain != MS_DOMAIN:
        return [node]
    kept = {"FusedConv": ("Conv", {"auto_pad", "dilations", "group", "kernel_shape", "pads",
                                   "strides"}),
            "FusedGemm": ("Gemm", {"alpha", "beta", "transA", "transB"})}
    if node.op_type in kept:
        op_type, names = kept[node.op_type]
        stand_in = helper.make_node(op_type, list(node.input)[:3], list(node.output))
        stand_in.attribute.extend(a for a in node.attribute if a.name in names)
        return [stand_in]
    if node.op_type == "FusedMatMul" and not any(
            a.name.startswith("trans") and a.i for a in node.attribute):
        return [helper.make_node("MatMul", list(node.input)[:2], list(node.output)[:1])]
    if node.op_type == "MatMulNBits" and opset >= 10 and attr(node, "N") is not None:
        return _matmul_nbits_stand_in(node)
    # Gelu, FastGelu, SkipLayerNormalization (output and sum) and MultiHeadAttention as the
    # passes write it: the output has the first input's shape
    same_as_first = {"Gelu": (0,), "FastGelu": (0,), "SkipLayerNormalization": (0, 3),
                     "SkipSimplifiedLayerNormalization": (0, 3), "MultiHeadAttention": (0,)}
    if node.op_type in same_as_first:
        return [helper.make_node("Identity", [node.input[0]], [node.output[i]])
                for i in same_as_first[node.op_type] if i < len(node.output) and node.output[i]]
    return [node]


def _matmul_nbits_stand_in(node) -> list:
    """A (..., K) -> (..., N) in A's type: A's first column, expanded to N columns."""
    out = node.output[0]
    names = [f"{out}__shape_{suffix}" for suffix in ("zero", "one", "last")]
    return [_int64_constant(names[0], 0), _int64_constant(names[1], 1),
            _int64_constant(names[2], -1), _int64_constant(f"{out}__shape_n", attr(node, "N")),
            onnx.NodeProto(input=[node.input[0], *names], output=[f"{out}__shape_column"],
                           op_type="Slice"),
            onnx.NodeProto(input=[f"{out}__shape_column", f"{out}__shape_n"], output=[out],
                           op_type="Expand")]


def _int64_constant(name: str, value: int) -> onnx.NodeProto:
    """Constant(value=[value]) as helper.make_node and numpy_helper.from_array write it, built
    directly (through them, the 114 stand-ins of a 4-bit decoder cost its lighten 14 ms)."""
    tensor = onnx.TensorProto(dims=[1], data_type=onnx.TensorProto.INT64,
                              raw_data=int(value).to_bytes(8, "little", signed=True))
    return onnx.NodeProto(output=[name], op_type="Constant", attribute=[
        AttributeProto(name="value", type=AttributeProto.TENSOR, t=tensor)])


def is_inference_batchnorm(bn, uses, outputs, opset) -> bool:
    """A BatchNormalization that only normalises with its running statistics (no training
    outputs read), over the channel axis."""
    if attr(bn, "training_mode", 0) or (opset < 7 and attr(bn, "is_test", 0) == 0):
        return False
    if attr(bn, "spatial", 1) == 0:
        return False
    # running statistics and saved mean/var are training outputs
    return not any(o and (o in outputs or o in uses) for o in bn.output[1:])


def batchnorm_affine(bn, constants):
    """(s, t) of an inference BatchNormalization, y = x * s + t per channel, in float64:
    s = gamma / sqrt(var + epsilon), t = beta - mean * s.  None unless its four parameters are
    float constants of one length."""
    params = [constants.get(name) for name in bn.input[1:5]]
    if any(p is None or p.dtype.kind != "f" for p in params):
        return None
    gamma, beta, mean, var = (p.astype(np.float64).reshape(-1) for p in params)
    if len({p.size for p in (gamma, beta, mean, var)}) != 1:
        return None
    s = gamma / np.sqrt(var + attr(bn, "epsilon", 1e-5))
    return s, beta - mean * s


def scale_channels(w: np.ndarray, scale: np.ndarray, out: np.ndarray | None = None
                   ) -> np.ndarray:
    """w * scale along w's first axis, computed in float64 and rounded to w's dtype once (what
    (w.astype(float64) * scale).astype(w.dtype) gives, bit for bit), in one ufunc call whose
    buffered casts hold a few thousand float64 elements at a time (whole float64 copies cost
    resnet50's session 3 passes over 200 MB; blocks of rows in a Python loop cost 1.4x the
    call). Into `out` (w's shape and dtype, C-contiguous; w itself to scale it in place) when
    given."""
    scale = np.asarray(scale, np.float64).reshape(-1)
    out = np.empty(w.shape, w.dtype) if out is None else out
    if w.size == 0:
        return out
    rows = w.shape[0]
    np.multiply(w.reshape(rows, -1), scale[:, None], out=out.reshape(rows, -1))
    return out
