"""Sequences and optionals: Sequence*, SplitToSequence, ConcatFromSequence, Optional*.

A sequence is a Python list of arrays (ops return new lists, never mutate their input);
an empty optional is EMPTY, and an absent optional input arrives as None.
"""
from __future__ import annotations

import numpy as np

from ..registry import op
from ..values import EMPTY


def _position(position, n: int, upper: int, what: str) -> int:
    p = np.asarray(position)
    if p.ndim != 0 and p.size != 1:
        raise ValueError(f"{what} 'position' must be a scalar, got shape {list(p.shape)}")
    pos = int(p.reshape(-1)[0])
    if not -n <= pos <= upper:
        raise ValueError(f"{what} 'position' {pos} is out of range [{-n}, {upper}] "
                         f"for a sequence of {n}")
    return pos + n if pos < 0 else pos


def _check_elem_type(seq: list, tensor, what: str) -> None:
    if seq and seq[0].dtype != tensor.dtype:
        raise TypeError(f"{what}: tensor of {tensor.dtype} does not match a sequence of "
                        f"{seq[0].dtype}")


@op("SequenceEmpty", 11)
def sequence_empty(*, dtype=None):
    return []


@op("SequenceConstruct", 11)
def sequence_construct(*inputs):
    for t in inputs[1:]:
        if t.dtype != inputs[0].dtype:
            raise TypeError(f"SequenceConstruct inputs mix {inputs[0].dtype} and {t.dtype}")
    return list(inputs)


@op("SequenceLength", 11)
def sequence_length(input_sequence):
    return np.array(len(input_sequence), dtype=np.int64)


@op("SequenceAt", 11)
def sequence_at(input_sequence, position):
    n = len(input_sequence)
    return input_sequence[_position(position, n, n - 1, "SequenceAt")]


@op("SequenceInsert", 11)
def sequence_insert(input_sequence, tensor, position=None):
    _check_elem_type(input_sequence, tensor, "SequenceInsert")
    n = len(input_sequence)
    pos = n if position is None else _position(position, n, n, "SequenceInsert")
    return input_sequence[:pos] + [tensor] + input_sequence[pos:]


@op("SequenceErase", 11)
def sequence_erase(input_sequence, position=None):
    n = len(input_sequence)
    if position is None:
        if n == 0:
            raise ValueError("SequenceErase on an empty sequence")
        pos = n - 1
    else:
        pos = _position(position, n, n - 1, "SequenceErase")
    return input_sequence[:pos] + input_sequence[pos + 1 :]


@op("SequenceMap", 17)
def sequence_map(input_sequence, *additional_inputs, body):
    n = len(input_sequence)
    for i, extra in enumerate(additional_inputs, 1):
        if isinstance(extra, list) and len(extra) != n:
            raise ValueError(f"SequenceMap input {i} holds {len(extra)} elements, "
                             f"the first holds {n}")
    outputs = [[] for _ in body.output_names]
    for i in range(n):
        args = [input_sequence[i]] + [x[i] if isinstance(x, list) else x for x in additional_inputs]
        for out, value in zip(outputs, body(*args, tag=f"iter {i}")):
            out.append(value)
    return tuple(outputs)


@op("SplitToSequence", 11)
def split_to_sequence(input, split=None, *, axis=0, keepdims=1):
    if not -input.ndim <= axis < input.ndim:
        raise ValueError(f"SplitToSequence 'axis' {axis} is out of range for rank {input.ndim}")
    axis %= input.ndim
    dim = input.shape[axis]
    if split is None:
        parts = np.split(input, dim, axis=axis) if dim else []
        return [np.squeeze(p, axis=axis) for p in parts] if not keepdims else parts
    split = np.asarray(split).astype(np.int64)
    if split.ndim == 0:
        size = int(split)
        if size <= 0:
            raise ValueError(f"SplitToSequence scalar 'split' must be positive, got {size}")
        if dim == 0:
            return []
        bounds = np.arange(size, dim, size)
    elif split.ndim == 1:
        if (split < 0).any() or split.sum() != dim:
            raise ValueError(f"SplitToSequence 'split' {split.tolist()} must be >= 0 "
                             f"and sum to {dim}")
        bounds = np.cumsum(split)[:-1]
    else:
        raise ValueError(f"SplitToSequence 'split' must be a scalar or 1-D, "
                         f"got shape {list(split.shape)}")
    return np.split(input, bounds, axis=axis)


@op("ConcatFromSequence", 11)
def concat_from_sequence(input_sequence, *, axis, new_axis=0):
    if not input_sequence:
        raise ValueError("ConcatFromSequence needs a non-empty sequence")
    rank = input_sequence[0].ndim + (1 if new_axis else 0)
    if not -rank <= axis < rank:
        raise ValueError(f"ConcatFromSequence 'axis' {axis} is out of range for rank {rank}")
    if new_axis:
        return np.stack(input_sequence, axis=axis)
    return np.concatenate(input_sequence, axis=axis)


@op("Optional", 15)
def optional(input=None, *, type=None):
    if input is None and type is None:
        raise ValueError("Optional without an input needs the 'type' attribute")
    return EMPTY if input is None else input


@op("OptionalHasElement", 15)
def optional_has_element(input=None):
    return np.array(input is not None and input is not EMPTY)


@op("OptionalGetElement", 15)
def optional_get_element(input):
    if input is None or input is EMPTY:
        raise ValueError("OptionalGetElement of an empty optional")
    return input
