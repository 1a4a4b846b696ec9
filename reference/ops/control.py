"""Control flow: If, Loop, Scan.

Graph attributes arrive as `Subgraph` callables that see the enclosing scope; each call is
tagged with its iteration ("iter 3") so that iter_results can say where a body value came from.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from ..dtypes import np_dtype
from ..registry import op


def _single_bool(value, what: str) -> bool:
    a = np.asarray(value)
    if a.size != 1:
        raise ValueError(f"{what} must hold a single element, got shape {list(a.shape)}")
    return bool(a.reshape(-1)[0])


def _empty_stack(body, index: int, axis: int = 0) -> np.ndarray:
    """A zero-length scan output, typed and shaped from the body's declared output."""
    tp = body.graph.output[index].type
    dtype, shape = np.dtype(np.float32), []
    if tp.WhichOneof("value") == "tensor_type":
        tt = tp.tensor_type
        if tt.elem_type != TensorProto.UNDEFINED:
            dtype = np_dtype(tt.elem_type)
        if tt.HasField("shape"):
            shape = [d.dim_value if d.HasField("dim_value") else 0 for d in tt.shape.dim]
    axis = axis if axis >= 0 else axis + len(shape) + 1
    shape.insert(axis, 0)
    return np.zeros(shape, dtype=dtype)


def _stack(values: list, what: str, axis: int = 0) -> np.ndarray:
    for v in values:
        if not isinstance(v, np.ndarray):
            raise TypeError(f"{what} must be a tensor, got {type(v).__name__}")
    first = values[0]
    for i, v in enumerate(values[1:], 1):
        if v.shape != first.shape or v.dtype != first.dtype:
            raise ValueError(
                f"{what} changes across iterations: {first.dtype}{list(first.shape)} in "
                f"iteration 0, {v.dtype}{list(v.shape)} in iteration {i}"
            )
    return np.stack(values, axis=axis)


@op("If", 1)
def if_(cond, *, then_branch, else_branch):
    branch = then_branch if _single_bool(cond, "If condition 'cond'") else else_branch
    return tuple(branch())


@op("Loop", 1)
def loop(M=None, cond=None, *v_initial, body):
    # Without a `cond` input the body's condition output is computed but ignored (spec table).
    if M is None and cond is None:
        raise ValueError("Loop has neither a trip count 'M' nor a condition 'cond'; it never ends")
    trip_count = None if M is None else int(np.asarray(M).reshape(-1)[0])
    keep_going = True if cond is None else _single_bool(cond, "Loop input 'cond'")
    n = len(v_initial)
    state, scans = list(v_initial), []
    i = 0
    while keep_going and (trip_count is None or i < trip_count):
        outs = body(np.array(i, dtype=np.int64), np.array(keep_going), *state, tag=f"iter {i}")
        if len(outs) < 1 + n:
            raise ValueError(f"Loop body returns {len(outs)} values, expected at least {1 + n}")
        body_cond = _single_bool(outs[0], "Loop body condition output")
        if cond is not None:
            keep_going = body_cond
        state = list(outs[1 : 1 + n])
        scans.append(outs[1 + n :])
        i += 1
    k = len(body.output_names) - 1 - n
    if scans:
        stacked = [_stack([s[j] for s in scans], f"Loop scan output {j}") for j in range(k)]
    else:
        stacked = [_empty_stack(body, 1 + n + j) for j in range(k)]
    return tuple(state + stacked)


def _num_states(inputs, num_scan_inputs: int) -> int:
    if not 0 < num_scan_inputs <= len(inputs):
        raise ValueError(f"num_scan_inputs={num_scan_inputs} does not fit {len(inputs)} inputs")
    return len(inputs) - num_scan_inputs


def _scan_directions(flags, count: int, name: str) -> list[int]:
    flags = list(flags) if flags is not None else [0] * count
    if len(flags) != count or any(f not in (0, 1) for f in flags):
        raise ValueError(f"attribute '{name}' must hold {count} flags of 0 or 1, got {flags}")
    return flags


@op("Scan", 8)
def scan_8(sequence_lens=None, *initial_state_and_scan_inputs, body, num_scan_inputs,
           directions=None):
    """Scan-8: axis 0 is the batch axis and axis 1 the sequence axis of every scan input."""
    m = num_scan_inputs
    n = _num_states(initial_state_and_scan_inputs, m)
    inits, xs = initial_state_and_scan_inputs[:n], initial_state_and_scan_inputs[n:]
    dirs = _scan_directions(directions, m, "directions")
    batch, max_len = xs[0].shape[0], xs[0].shape[1]
    for x in xs:
        if x.shape[:2] != (batch, max_len):
            raise ValueError(f"scan inputs disagree on [batch, sequence]: "
                             f"{list(x.shape[:2])} vs {[batch, max_len]}")
    lens = (np.full(batch, max_len, dtype=np.int64) if sequence_lens is None
            else np.asarray(sequence_lens).reshape(-1).astype(np.int64))
    if lens.shape != (batch,) or (lens < 0).any() or (lens > max_len).any():
        raise ValueError(f"sequence_lens must hold {batch} lengths in [0, {max_len}], "
                         f"got {lens.tolist()}")
    k = len(body.output_names) - n
    final_states, scan_outs = [], []
    for b in range(batch):
        state = [s[b] for s in inits]
        per_step = []
        for t in range(int(lens[b])):
            elems = [x[b, lens[b] - 1 - t if d else t] for x, d in zip(xs, dirs)]
            outs = body(*state, *elems, tag=f"batch {b} iter {t}")
            state = list(outs[:n])
            per_step.append(outs[n:])
        final_states.append(state)
        outs_b = []
        for j in range(k):
            if per_step:
                seq = _stack([p[j] for p in per_step], f"Scan output {j}")
                pad = np.zeros((max_len - len(per_step),) + seq.shape[1:], dtype=seq.dtype)
                outs_b.append(np.concatenate([seq, pad]))
            else:
                empty = _empty_stack(body, n + j)
                outs_b.append(np.zeros((max_len,) + empty.shape[1:], dtype=empty.dtype))
        scan_outs.append(outs_b)
    if batch == 0:
        scans = [_empty_stack(body, n + j) for j in range(k)]
        return tuple(list(inits) + [np.zeros((0, max_len) + s.shape[1:], s.dtype) for s in scans])
    states = [_stack([fs[i] for fs in final_states], f"Scan state {i}") for i in range(n)]
    scans = [_stack([so[j] for so in scan_outs], f"Scan output {j}") for j in range(k)]
    return tuple(states + scans)


@op("Scan", 9)
def scan(*initial_state_and_scan_inputs, body, num_scan_inputs, scan_input_axes=None,
         scan_input_directions=None, scan_output_axes=None, scan_output_directions=None):
    m = num_scan_inputs
    n = _num_states(initial_state_and_scan_inputs, m)
    state, xs = list(initial_state_and_scan_inputs[:n]), initial_state_and_scan_inputs[n:]
    k = len(body.output_names) - n
    in_axes = list(scan_input_axes) if scan_input_axes is not None else [0] * m
    out_axes = list(scan_output_axes) if scan_output_axes is not None else [0] * k
    if len(in_axes) != m or len(out_axes) != k:
        raise ValueError(f"scan_input_axes needs {m} entries and scan_output_axes {k}, "
                         f"got {in_axes} and {out_axes}")
    for x, a in zip(xs, in_axes):
        if not -x.ndim <= a < x.ndim:
            raise ValueError(f"scan_input_axes value {a} is out of range for a rank-{x.ndim} input")
    in_axes = [a % x.ndim for x, a in zip(xs, in_axes)]
    in_dirs = _scan_directions(scan_input_directions, m, "scan_input_directions")
    out_dirs = _scan_directions(scan_output_directions, k, "scan_output_directions")
    length = xs[0].shape[in_axes[0]] if m else 0
    for x, a in zip(xs, in_axes):
        if x.shape[a] != length:
            raise ValueError(f"scan inputs disagree on the sequence length: {x.shape[a]} vs "
                             f"{length}")
    per_step = []
    for t in range(length):
        elems = [np.take(x, length - 1 - t if d else t, axis=a)
                 for x, a, d in zip(xs, in_axes, in_dirs)]
        outs = body(*state, *elems, tag=f"iter {t}")
        state = list(outs[:n])
        per_step.append(outs[n:])
    scans = []
    for j, (axis, prepend) in enumerate(zip(out_axes, out_dirs)):
        values = [p[j] for p in per_step]
        if not values:
            scans.append(_empty_stack(body, n + j, axis))
            continue
        rank = np.ndim(values[0]) + 1
        if not -rank <= axis < rank:
            raise ValueError(f"scan_output_axes value {axis} is out of range for a rank-{rank} "
                             "output")
        scans.append(_stack(values[::-1] if prepend else values, f"Scan output {j}", axis))
    return tuple(state + scans)
