"""Memory for the outputs a compiled run makes anew every run, used again once nothing refers
to it.

A decode step returns a dozen new arrays (the logits and the cache's present tensors) and the
caller drops the last step's.  Freed to the C heap, that memory went back to the kernel at the
heap's top (glibc trims it above 128 KiB) and the next step's outputs took page faults on first
touch: 112 minor faults and 0.4 ms of system time a llama decode step (benchmarks/decoders.py's
bench size; onnxruntime, whose arena keeps its blocks, had none).  Here each output is a view of
a block this pool holds; a block is handed out again only when the pool's own references are
the only ones left, so an output the caller still holds (or a view of it, which refers to the
block through its base) is never written.
"""
from __future__ import annotations

import math
import sys

import numpy as np

BLOCKS_PER_SIZE = 4  # blocks kept per output: a caller holding more of its arrays gets plain ones
LARGEST = 16 << 20  # bytes: larger outputs are plain arrays (their memory goes back at once)


def _free_refcount() -> int:
    """sys.getrefcount of a block that nothing but the pool refers to, read as empty() reads it
    (the list, the loop's name, the call's argument: what counts among those is the
    interpreter's business)."""
    blocks = [np.empty(1, np.uint8)]
    for block in blocks:
        return sys.getrefcount(block)
    raise AssertionError("unreachable")


_FREE_REFCOUNT = _free_refcount()


class OutputMemory:
    """empty(key, shape, dtype): an array for the output that key names, whose memory is a
    block no other array views.  Each key keeps blocks of one size: the size of a key's last
    request (an output that grows with a KV cache gets new memory every run, and the old goes
    back to the heap).  Not thread-safe: one compiled run's outputs, made under the plan's
    lock."""

    def __init__(self):
        self._blocks: dict = {}  # key -> (nbytes, [blocks])

    def empty(self, key, shape: tuple, dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize  # np.prod took 9 us, more than the run of chain100
        if nbytes == 0 or nbytes > LARGEST or dtype.hasobject:
            return np.empty(shape, dtype)
        held = self._blocks.get(key)
        if held is None or held[0] != nbytes:
            held = self._blocks[key] = (nbytes, [])
        blocks = held[1]
        for block in blocks:
            if sys.getrefcount(block) == _FREE_REFCOUNT:
                return block.view(dtype).reshape(shape)
        if len(blocks) >= BLOCKS_PER_SIZE:
            return np.empty(shape, dtype)
        block = np.empty(nbytes, np.uint8)
        blocks.append(block)
        return block.view(dtype).reshape(shape)
