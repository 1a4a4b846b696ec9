"""Constant folding: a node whose inputs are all constants is evaluated once, through the
reference op, and its outputs become initializers. Constant nodes become initializers too."""
from __future__ import annotations

import functools
import math
import sys

import numpy as np
import onnx
from onnx import helper, numpy_helper

from reference import ReferenceEvaluator
from reference.errors import ReferenceError_
from reference.weights import RAW_DATA_DTYPES, SMALL_TENSOR

from ._graph import (
    Constants,
    copy_model,
    graph_output_names,
    holds_subgraph,
    initializer,
    set_nodes,
)
from .large_fill_folding import constant_fill

# a different value on every run, so never a constant
RANDOM_OPS = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
              "Multinomial", "Bernoulli", "Dropout"}
# a folded result bigger than this would bloat the saved model more than it saves at run time
MAX_FOLDED_ELEMENTS = 1 << 22
# numpy dtype -> the element type whose raw_data holds its little-endian bytes
_PLAIN_TYPES = {dtype: data_type for data_type, dtype in RAW_DATA_DTYPES.items()}
# nodes whose inputs hold at most this many elements in all are evaluated together, in
# models that fill at most BATCHED_OUTPUT elements (a bound on the memory they hold at once)
BATCHED = 1024
BATCHED_OUTPUT = 1 << 20


def fold_constants(model: onnx.ModelProto, max_elements: int = MAX_FOLDED_ELEMENTS
                   ) -> onnx.ModelProto:
    model = copy_model(model)
    graph = model.graph
    constants = Constants(graph)
    outputs = graph_output_names(graph)
    nodes = list(graph.node)
    # nodes are evaluated in waves, each wave in one model: those whose inputs are constants
    # that no undecided node makes. A node folds as it would node by node in graph order.
    undecided = [i for i, node in enumerate(nodes) if _may_fold(node, outputs)]
    folded: dict[int, list] = {}
    tensors = constants.tensors  # folded values join it
    made = {name for i in undecided for name in nodes[i].output}
    while True:
        wave = [i for i in undecided if all(name in tensors and name not in made
                                            for name in nodes[i].input if name)]
        if not wave:
            break
        taken = set(wave)
        undecided = [i for i in undecided if i not in taken]
        made = {name for i in undecided for name in nodes[i].output}
        # a plain fill is made as it is (a light model's weights are hundreds of them: a model
        # run for them cost more than the rest of the session's creation)
        fills = {i: fill for i in wave if (fill := constant_fill(nodes[i], constants))}
        values = {i: _input_values(nodes[i], constants, max_elements) for i in wave
                  if i not in fills}
        wave = [i for i in wave if (_small_fill(fills[i], max_elements) if i in fills
                                    else values[i] is not None)]
        evaluated = [i for i in wave if i not in fills]
        together = _evaluate_small(model, [(nodes[i], values[i]) for i in evaluated])
        position = {i: k for k, i in enumerate(evaluated)}
        for i in wave:
            k = position.get(i)
            if k is None:
                tensor = _small_fill_tensor(nodes[i], *fills[i])
                if tensor is not None:
                    folded[i] = [tensor]
                    constants.tensors[tensor.name] = tensor
                    continue
                shape, value, _ = fills[i]
                arrays = [np.full(shape, value, value.dtype)]
            else:
                arrays = together[k] if k in together else _evaluate_one(model, nodes[i],
                                                                         values[i])
            arrays = _kept(nodes[i], arrays, max_elements)
            if arrays is None:
                continue
            folded[i] = [initializer(name, value) for name, value in zip(nodes[i].output, arrays)]
            constants.tensors.update((t.name, t) for t in folded[i])
    graph.initializer.extend(t for i in sorted(folded) for t in folded[i])
    if folded and model.ir_version < 4:
        model.ir_version = 4  # before IR 4 every initializer also had to be a graph input
    set_nodes(graph, [node for i, node in enumerate(nodes) if i not in folded])
    return model


def _small_fill_tensor(node, shape, value, data_type):
    """The initializer of a fill of at most SMALL_TENSOR elements of a plain type, made from its
    value's bytes repeated, as initializer() makes a small tensor from the filled array (a light
    model folds hundreds: the array and its copy cost more than the rest of the fold); else None."""
    count = math.prod(shape)
    tensor_type = _PLAIN_TYPES.get(value.dtype)
    if (count > SMALL_TENSOR or tensor_type != data_type or len(node.output) != 1
            or sys.byteorder != "little" or value.dtype.byteorder == ">"):
        return None
    return onnx.TensorProto(name=node.output[0], data_type=tensor_type, dims=shape,
                            raw_data=value.tobytes() * count)


def _may_fold(node, outputs) -> bool:
    """What a node's inputs do not decide: it is no random op, holds no subgraph, makes no
    graph output and names each output."""
    if node.op_type in RANDOM_OPS or holds_subgraph(node):
        return False
    made = node.output
    if not outputs.isdisjoint(made) or not all(made):
        return False
    return bool(node.input) or node.op_type == "Constant"


def _input_values(node, constants, max_elements):
    """The node's constant inputs by name, or None when they are too large to fold."""
    values = {name: constants.get(name) for name in node.input if name}
    if sum(v.size for v in values.values()) > max_elements:
        return None
    if node.op_type == "ConstantOfShape" and _filled_elements(values, node) > max_elements:
        return None  # not even made once: a large fill would only be dropped again
    return values


def _small_fill(fill, max_elements) -> bool:
    """Whether a fill (constant_fill's shape, value, type) is folded: what _input_values decides
    of its node, from the shape alone."""
    shape = fill[0]
    return len(shape) <= max_elements and math.prod(shape) <= max_elements


def _evaluate_small(model, wave) -> dict:
    """Output arrays by position in `wave` (node, input values) of the nodes with small
    inputs (shape arithmetic and fills, where making a model per node costs most), run as a
    few models, each making at most BATCHED_OUTPUT elements of fills (all its results live
    until it ends); a model that fails is left out (node by node then names the node, or
    raises as it would)."""
    small = [k for k, (_, vs) in enumerate(wave) if sum(v.size for v in vs.values()) <= BATCHED]
    arrays: dict = {}
    for batch in _batches(small, wave):
        if len(batch) < 2:
            continue
        inputs = {name: v for k in batch for name, v in wave[k][1].items()}
        try:
            results = iter(_evaluate(model, [wave[k][0] for k in batch], inputs,
                                     max_made=BATCHED_OUTPUT))
            made = {k: [np.asarray(next(results)) for _ in wave[k][0].output] for k in batch}
        except Exception:  # noqa: BLE001 (see above)
            made = {}
        arrays.update(made)
    return arrays


def _batches(small, wave):
    batch, filled = [], 0
    for k in small:
        node, values = wave[k]
        size = _filled_elements(values, node) if node.op_type == "ConstantOfShape" else 0
        if batch and filled + size > BATCHED_OUTPUT:
            yield batch
            batch, filled = [], 0
        batch.append(k)
        filled += size
    if batch:
        yield batch


def _evaluate_one(model, node, values):
    try:
        return [np.asarray(r) for r in _evaluate(model, [node], values)]
    except (ReferenceError_, TypeError, ValueError):
        return None


def _kept(node, arrays, max_elements):
    """The node's output values, or None where it must stay a node."""
    if arrays is None:
        return None
    if node.op_type != "Constant" and sum(a.size for a in arrays) > max_elements:
        return None  # checked before any TensorProto copy of a large result is made
    if not all(map(_tensor_holds, {a.dtype for a in arrays})) or len(arrays) != len(node.output):
        return None  # a type no TensorProto holds stays a node
    return arrays


@functools.lru_cache(maxsize=256)
def _tensor_holds(dtype: np.dtype) -> bool:
    """Whether a TensorProto holds arrays of this dtype (asked once per dtype: from_array cost
    each folded node as much as making its value)."""
    if dtype == object:
        return False
    try:
        numpy_helper.from_array(np.empty(0, dtype))
    except (TypeError, ValueError):
        return False
    return True


def _filled_elements(values: dict, node) -> int:
    """Elements a ConstantOfShape makes (0 when its shape input is not a plain vector)."""
    shape = values.get(node.input[0]) if node.input else None
    if shape is None or shape.ndim != 1 or shape.dtype.kind not in "iu":
        return 0
    # Python integers: an int64 product could wrap past the size limit it is checked against
    sizes = shape.tolist()
    return math.prod(sizes) if all(d >= 0 for d in sizes) else 0


def _evaluate(model, nodes, values, max_made=None):
    """The nodes' outputs; past `max_made` elements made in all (Constant nodes aside) it
    stops (MemoryError): ops such as Expand or Tile make far more than their small inputs
    hold, and a model keeps every result until it ends."""
    # the values are fed as they are: as initializers each was copied into a TensorProto and
    # read back (light_densenet121's 242 Unsqueezes of per-channel constants: most of the run)
    graph = helper.make_graph(
        nodes, "fold",
        inputs=[onnx.ValueInfoProto(name=name) for name in values],
        outputs=[onnx.ValueInfoProto(name=o) for node in nodes for o in node.output],
    )
    fold = helper.make_model(graph, opset_imports=list(model.opset_import),
                             functions=list(model.functions), ir_version=model.ir_version)
    # the graph outputs in order (run() looks each one up in a list: quadratic in a wave)
    outputs, made = [], 0
    feeds = {name: _read_only(v) for name, v in values.items()}
    for r in ReferenceEvaluator(fold, check=False).iter_results(feeds):
        if r.kind == "result" and max_made is not None:
            # a Constant's value is the model's already, and always kept
            made += 0 if r.node.op_type == "Constant" else getattr(r.value, "size", 0)
            if made > max_made:
                raise MemoryError(f"constant folding: more than {max_made} elements made")
        elif r.kind == "output" and not r.path:
            outputs.append(r.value)
    return outputs


def _read_only(value: np.ndarray) -> np.ndarray:
    """A read-only view of a constant's cached array (an op must not write to it, as to an
    initializer's value; the cache stays as it was)."""
    view = value.view()
    view.setflags(write=False)
    return view
