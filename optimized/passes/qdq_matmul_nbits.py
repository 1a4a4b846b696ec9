"""DequantizeLinear(constant 4- or 8-bit weight) -> MatMul becomes com.microsoft MatMulNBits,
with the weight's codes (and blockwise zero points) repacked straight from the initializer's
bytes by kernels.matmul_nbits_pack and the scales transposed by kernels.matmul_nbits_scales, so
the float copy never exists. It runs before constant folding, which would otherwise evaluate
the DequantizeLinear into exactly that copy (onnxruntime's DQ -> MatMulNBits fusion exists for
the same reason).

The forms matched are those onnxruntime's quantizers write:
- MatMul4BitsQuantizer/MatMulNBitsQuantizer in QDQ format: DequantizeLinear of an int4 (symmetric,
  no zero point) or uint4 (with zero points) weight [K, N], scales [ceil(K / block), N], axis 0,
  block_size (opset 21), or block_size K when quantized per channel;
- its channel-wise symmetric variant for NPUs: an int4 weight [N, K], scales [N, 1], axis 1,
  block_size K, then Transpose(perm [1, 0]);
- quantize_static's QDQ weights: int8/uint8 [K, N] per output channel (scales [N], axis 1) or
  per tensor, or blockwise along K as above.
DequantizeLinear gives (q - zero point) * scale, rounded once to float32; MatMulNBits's
weights are (code - zero point) * scale with unsigned codes, so signed codes and zero points
move by 2^(bits - 1), which keeps every difference. Per-tensor and per-channel scales are
repeated over MatMulNBits blocks; a blockwise DequantizeLinear whose block size has no power-of-2
divisor >= 16 (MatMulNBits's block sizes) stays as it is, as do float16 scales, weights
read by anything but MatMul's second input, and external data not loaded.

In a session the weights live in a WeightStore (reference/weights.py): the repacked ones go
straight into it, and each quantized weight leaves it as soon as it is repacked (optimize would
drop it after this pass anyway), so only one weight is ever held twice.
"""
from __future__ import annotations

import collections
import math
import sys
from typing import NamedTuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from reference.weights import (
    SMALL_TENSOR,
    copy_without_initializers,
    is_stub,
    store_of,
    stored_array,
    tensor_array,
)

from .. import kernels
from ..huge_page_memory import HUGE_PAGE
from ._graph import (
    MS_DOMAIN,
    attr,
    constant_tensors,
    consumers,
    ensure_opset,
    graph_output_names,
    opset_version,
    set_nodes,
)

# element type -> (bits, signed)
CODE_TYPES = {TensorProto.INT4: (4, True), TensorProto.UINT4: (4, False),
              TensorProto.INT8: (8, True), TensorProto.UINT8: (8, False)}
# MatMulNBits block size for a weight quantized per channel or per tensor: few scales, and
# little padding past K
WHOLE_K_BLOCK = 128


def fuse_dequantize_matmul(model: onnx.ModelProto) -> onnx.ModelProto:
    graph = model.graph
    constants = constant_tensors(graph)
    uses = consumers(graph)
    outputs = graph_output_names(graph)
    opset = opset_version(model)
    matches = [m for node in graph.node
               if (m := _match(node, constants, uses, outputs, opset)) is not None]
    if not matches:
        return model
    made_by = {o: i for i, n in enumerate(graph.node) for o in n.output if o}
    removed_outputs = {name for m in matches for name in m.removed}
    removed = {made_by[name] for name in removed_outputs}
    weights = {name for i in removed for name in graph.node[i].input if name}
    read = _read_elsewhere(graph, weights, uses, removed_outputs)
    result = copy_without_initializers(model, weights - read)
    taken = ({t.name for t in result.graph.initializer} | {i.name for i in graph.input}
             | set(made_by))
    fused = {}
    pending = collections.Counter(name for m in matches for name in m.quantized)
    held = _held_in_stores(constants, pending)
    spare: dict[int, np.ndarray] = {}  # by size: codes released, for a later weight's repacking
    for match in matches:
        inputs, attrs = _nbits_weights(result.graph, constants, held, match, taken, spare)
        for name in match.quantized:  # repacked: only one weight is ever held twice
            pending[name] -= 1
            if not pending[name] and name not in read and name in held:
                store, stored = held.pop(name)
                store.release(constants[name])
                if (memory := _reusable_memory(stored)) is not None:
                    spare[memory.nbytes] = memory
        for out in match.matmul_outputs:
            matmul = graph.node[made_by[out]]
            fused[made_by[out]] = helper.make_node(
                "MatMulNBits", [matmul.input[0], *inputs], [out], name=matmul.name,
                domain=MS_DOMAIN, **attrs)
    nodes = [fused.get(i, n) for i, n in enumerate(result.graph.node) if i not in removed]
    set_nodes(result.graph, nodes)
    ensure_opset(result, MS_DOMAIN, 1)
    return result


def _read_elsewhere(graph, weights: set[str], uses, removed_outputs: set[str]) -> set[str]:
    """The weights that a graph input or output names, or that a node the pass keeps reads."""
    io = {o.name for o in graph.output} | {i.name for i in graph.input}
    return {name for name in weights
            if name in io or any(not node.output or node.output[0] not in removed_outputs
                                 for node in uses.get(name, ()))}


def _held_in_stores(constants, names) -> dict[str, tuple]:
    """name -> (its weight store, the array the store holds) for each of `names` that is a
    stub: looked up once (each lookup parses the stub's entries)."""
    held = {}
    for name in names:
        if (store := store_of(constants[name])) is not None:
            held[name] = store, stored_array(constants[name])
    return held


class Match(NamedTuple):
    weight: str  # the quantized weight's name
    bits: int
    signed: bool
    k: int
    n: int
    transposed: bool  # the weight is [N, K], read through Transpose(perm [1, 0])
    dq_block: int  # the DequantizeLinear's block size along K (K when per channel or tensor)
    layout: str  # of its scales and zero points: "blocks", "channel" or "tensor"
    quantized: list[str]  # the weight, scales and zero points (if any)
    removed: list[str]  # outputs of the DequantizeLinear (and Transpose) nodes that go
    matmul_outputs: list[str]


def _match(node, constants, uses, outputs, opset) -> Match | None:
    """What replaces a DequantizeLinear whose every reader is MatMul's weight, or None."""
    if node.op_type != "DequantizeLinear" or node.domain not in ("", "ai.onnx"):
        return None
    x = constants.get(node.input[0])
    scale = constants.get(node.input[1]) if len(node.input) > 1 else None
    zp_name = node.input[2] if len(node.input) > 2 else ""
    if x is None or x.data_type not in CODE_TYPES or len(x.dims) != 2 or scale is None:
        return None
    if (x.data_location == TensorProto.EXTERNAL and not is_stub(x)) or scale.data_type != TensorProto.FLOAT:
        return None
    if zp_name and (zp_name not in constants or constants[zp_name].data_type != x.data_type):
        return None
    if attr(node, "output_dtype", 0) not in (0, TensorProto.FLOAT):
        return None
    removed = [node.output[0]]
    readers = _readers(node.output[0], uses, outputs)
    transposed = len(readers) == 1 and _is_transpose(readers[0])
    if transposed:
        removed.append(readers[0].output[0])
        readers = _readers(readers[0].output[0], uses, outputs)
    if not readers or not all(_reads_as_weight(r, removed[-1]) for r in readers):
        return None
    rows, cols = int(x.dims[0]), int(x.dims[1])
    k, n = (cols, rows) if transposed else (rows, cols)
    if k == 0 or n == 0:
        return None
    zp_dims = tuple(constants[zp_name].dims) if zp_name else None
    params = _along_k(node, k, n, transposed, tuple(scale.dims), zp_dims, opset)
    if params is None or _nbits_block(params[0], k) is None:
        return None
    bits, signed = CODE_TYPES[x.data_type]
    return Match(node.input[0], bits, signed, k, n, transposed, *params,
                 [name for name in node.input[:3] if name], removed,
                 [r.output[0] for r in readers])


def _readers(name, uses, outputs) -> list:
    return [] if name in outputs else uses.get(name, [])


def _is_transpose(node) -> bool:
    return (node.op_type == "Transpose" and node.domain in ("", "ai.onnx")
            and list(attr(node, "perm", [1, 0])) == [1, 0])


def _reads_as_weight(node, name) -> bool:
    return (node.op_type == "MatMul" and node.domain in ("", "ai.onnx") and len(node.input) == 2
            and node.input[1] == name and node.input[0] != name)


def _along_k(dq, k, n, transposed, scale_shape, zp_shape, opset):
    """(block size along K, layout of the scales) of the DequantizeLinear, or None when its
    quantization does not run in blocks along K; zero points, if any, have the scales' shape."""
    k_axis = 1 if transposed else 0
    block = attr(dq, "block_size", 0) if opset >= 21 else 0
    axis = attr(dq, "axis", 1)
    if not -2 <= axis < 2 or zp_shape not in (None, scale_shape):
        return None
    axis %= 2
    if block > 0:
        blocks = -(-k // block)
        expected = (blocks, n) if k_axis == 0 else (n, blocks)
        return (block, "blocks") if axis == k_axis and scale_shape == expected else None
    if len(scale_shape) <= 1 and math.prod(scale_shape) == 1:
        return k, "tensor"
    if axis != k_axis and scale_shape == (n,):  # per output channel
        return k, "channel"
    return None


def _per_block(values, match: Match) -> np.ndarray:
    """Scales or zero points as [DequantizeLinear blocks along K, N]."""
    if match.layout == "tensor":
        return np.full((1, match.n), values.reshape(-1)[0], values.dtype)
    if match.layout == "channel":
        return values.reshape(1, match.n)
    return values.T if match.transposed else values


def _nbits_block(dq_block: int, k: int) -> int | None:
    """A MatMulNBits block size (a power of 2 >= 16) whose every block lies inside one of the
    DequantizeLinear's blocks, or None."""
    if dq_block >= k:
        size = 16
        while size < min(k, WHOLE_K_BLOCK):
            size *= 2
        return size
    size = dq_block & -dq_block  # the largest power of 2 dividing it
    return size if size >= 16 else None


def _reusable_memory(array: np.ndarray) -> np.ndarray | None:
    """The memory under a released weight (the bytes the array covers), as writable bytes, when
    nothing but the caller's one name refers to the array or to its memory (no other view, no
    other holder), else None. sys.getrefcount counts, beside any other holder, the caller's
    name, this function's own names and its argument."""
    root = array.base if array.base is not None else array
    if (not isinstance(root, np.ndarray) or root.base is not None or not root.flags.owndata
            or not array.flags.c_contiguous):
        return None
    if root is array:
        if sys.getrefcount(array) > 4:  # the caller's name, array, root, the argument
            return None
    elif sys.getrefcount(array) > 3 or sys.getrefcount(root) > 3:  # root: array.base, root, argument
        return None
    root.setflags(write=True)
    start = array.ctypes.data - root.ctypes.data  # the store's file buffers start on a line
    return root.reshape(-1).view(np.uint8)[start:start + array.nbytes]


def _nbits_weights(graph, constants, held: dict[str, tuple], match: Match, taken: set[str],
                   spare: dict[int, np.ndarray]):
    """MatMulNBits's weight inputs (new initializers) and attributes for a match; the codes and
    scales are written into spare arrays of their sizes, if any (their pages are touched
    already: fresh ones fault in one by one, which cost as much as the repacking itself), else
    into fresh memory that huge pages back."""
    block = _nbits_block(match.dq_block, match.k)
    blocks = -(-match.k // block)
    dq_of = np.arange(blocks) * block // match.dq_block  # the DequantizeLinear block of each
    scale_name, zp_name = (match.quantized + [""])[1:3]
    same = blocks == -(-match.k // match.dq_block)  # the DequantizeLinear's own blocks
    per_block = _per_block(held[scale_name][1] if scale_name in held
                           else tensor_array(constants[scale_name]), match)
    per_block = per_block if same else per_block[dq_of]
    contiguous = per_block.flags.c_contiguous  # else _transposed_scales copies them
    repacked_zero_points = bool(zp_name) and match.layout == "blocks" and same
    sizes = ([match.n * blocks * block * match.bits // 8] + [per_block.nbytes] * contiguous
             + [_zero_points_pack_bytes(match, blocks)] * repacked_zero_points)
    outputs = _outputs(spare, *sizes)
    scales = _transposed_scales(per_block, outputs[1] if contiguous else None)
    weight = held.get(match.weight)
    codes = kernels.matmul_nbits_pack(
        _raw_codes(constants[match.weight], match.bits, weight), k=match.k, n=match.n,
        bits=match.bits, block_size=block, transposed=match.transposed, signed=match.signed,
        out=outputs[0])
    zero_points = _nbits_zero_points(constants[zp_name] if zp_name else None, held.get(zp_name),
                                     match, blocks, None if same else dq_of,
                                     outputs[-1] if repacked_zero_points else None)
    base, store = match.weight, None if weight is None else weight[0]
    names = [_add(graph, f"{base}_nbits", codes, taken, store),
             _add(graph, f"{base}_nbits_scales", scales, taken, store)]
    if zero_points is not None:
        names.append(_add(graph, f"{base}_nbits_zero_points", zero_points, taken, store))
    return names, {"K": match.k, "N": match.n, "bits": match.bits, "block_size": block}


def _outputs(spare: dict[int, np.ndarray], *sizes: int) -> list[np.ndarray]:
    """Writable uint8 memory of each size: a spare array of that size where there is one, the
    rest carved out of one fresh allocation that starts on a huge page (NumPy asks the kernel
    for transparent huge pages on allocations of 4 MiB and up, which it gives only to whole
    aligned 2 MiB ranges; a 4 KiB page faults in on its own, ~4 us on the benchmark's VM: a
    4096-wide linear's first codes and scales took 1000 faults). Not huge_page_memory's
    buffer, which rounds up to whole huge pages: the last one, mostly unused, raised the
    linears' peak by 1.8 MB (here the memory past the last size faults in only where the
    kernel can back a whole aligned 2 MiB inside the allocation)."""
    outputs = [spare.pop(size, None) for size in sizes]
    fresh = [i for i, out in enumerate(outputs) if out is None]
    offsets = np.cumsum([0] + [-(-sizes[i] // 64) * 64 for i in fresh]).tolist()
    if offsets[-1] >= 2 * HUGE_PAGE:
        memory = np.empty(offsets[-1] + HUGE_PAGE, np.uint8)
        memory = memory[-memory.ctypes.data % HUGE_PAGE:]
    else:
        memory = np.empty(offsets[-1], np.uint8)
    for i, at in zip(fresh, offsets):
        outputs[i] = memory[at:at + sizes[i]]
    return outputs


def _transposed_scales(per_block: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Scales [blocks, N] as MatMulNBits's [N, blocks], written into `out` (uint8 memory of
    their size) where they are [blocks, N] in memory; a transposed weight's are [N, blocks]
    already, and are copied."""
    if per_block.flags.c_contiguous:
        return kernels.matmul_nbits_scales(
            per_block, out=out.view(np.float32).reshape(per_block.shape[::-1]))
    return np.ascontiguousarray(per_block.T)


def _zero_points_pack_bytes(match: Match, blocks: int) -> int:
    """The size of matmul_nbits_pack's result on blockwise zero points (as codes [blocks, N] in
    MatMulNBits blocks of 16)."""
    return match.n * -(-blocks // 16) * 16 * match.bits // 8


def _nbits_zero_points(tensor, held: tuple | None, match: Match, blocks: int,
                       dq_of, out: np.ndarray | None = None) -> np.ndarray | None:
    """MatMulNBits's packed zero points [N, blocks] for the DequantizeLinear's (moved by
    2^(bits - 1) when signed), or None where each is MatMulNBits's default 2^(bits - 1).
    Blockwise ones in the DequantizeLinear's own blocks are repacked from their raw bytes as
    the codes are (the same layout: [blocks, N] to rows of N, first block in the low nibble);
    dq_of: the DequantizeLinear block of each MatMulNBits block, when they differ; held:
    (weight store, array) for a stub; out: memory for the repacked ones."""
    offset = 1 << (match.bits - 1)
    if tensor is None:  # DequantizeLinear's default zero point, 0
        return None if match.signed else _packed_zero_points(
            np.zeros((match.n, blocks), np.uint8), match.bits)
    if match.layout == "blocks" and dq_of is None:
        row = (blocks * match.bits + 7) // 8
        packed = kernels.matmul_nbits_pack(
            _raw_codes(tensor, match.bits, held), k=blocks, n=match.n, bits=match.bits,
            block_size=16, transposed=match.transposed, signed=match.signed, out=out,
        ).reshape(match.n, -1)[:, :row]
        default = _packed_zero_points(np.full((1, blocks), offset), match.bits)
        return None if (packed == default).all() else np.ascontiguousarray(packed)
    zp = _per_block(tensor_array(tensor), match)
    zp = (zp if dq_of is None else zp[dq_of]).T.astype(np.int16) + (offset if match.signed else 0)
    return None if np.all(zp == offset) else _packed_zero_points(zp, match.bits)


def _raw_codes(tensor, bits, held: tuple | None):
    """The tensor's codes as its raw data holds them (4-bit: two a byte, low nibble first);
    held: (weight store, array) for a stub."""
    if held is not None:  # held by a session's weight store: its bytes, without a copy
        return np.ascontiguousarray(held[1]).reshape(-1).view(np.uint8)
    raw = tensor.raw_data
    if raw:
        return raw
    values = numpy_helper.to_array(tensor)  # int32_data's
    if bits == 8:  # int8/uint8: the bytes are the codes
        return np.ascontiguousarray(values).reshape(-1).view(np.uint8)
    codes = (values.astype(np.int16).reshape(-1) & 15).astype(np.uint8)
    if bits == 4:
        codes = np.append(codes, np.zeros(codes.size % 2, np.uint8))
        codes = codes[0::2] | (codes[1::2] << 4)
    return np.ascontiguousarray(codes)


def _packed_zero_points(zp, bits):
    """Zero points [N, blocks] packed as MatMulNBits reads them: uint8, 4-bit two a byte
    (the first block in the low nibble), each row padded to whole bytes."""
    zp = zp.astype(np.uint8)
    if bits == 8:
        return zp
    if zp.shape[1] % 2:
        zp = np.concatenate([zp, np.zeros((zp.shape[0], 1), np.uint8)], axis=1)
    return zp[:, 0::2] | (zp[:, 1::2] << 4)


def _add(graph, base: str, array: np.ndarray, taken: set[str], store) -> str:
    """A new initializer; a large one goes straight into the weight store (if the weights came
    from one), never into a TensorProto."""
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    if store is None or array.size <= SMALL_TENSOR:
        graph.initializer.append(numpy_helper.from_array(array, name))
    else:
        tensor = graph.initializer.add()
        tensor.name, tensor.data_type = name, helper.np_dtype_to_tensor_dtype(array.dtype)
        tensor.dims.extend(array.shape)
        store.stub(tensor, array)
    return name
