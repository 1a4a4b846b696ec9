"""Recurrent networks: RNN, GRU, LSTM.

One function per op covers every version: opset 1's `output_sequence` only makes Y optional
(Y is always computed), opset 14 adds `layout`, opset 22 only widens types.

The time loop is inherent; each step is vectorised over the batch.  A batch entry whose
`sequence_lens` is shorter than the sequence keeps its state past its length (so Y_h/Y_c hold
its last valid step) and gets zeros in Y there; in the reverse direction it starts at its own
last valid step.
"""
from __future__ import annotations

import numpy as np

from ..registry import op

# name -> (fn(x, alpha, beta), default alpha, default beta); None: the function takes no such
# parameter.  Defaults are those of the ONNX operators of the same name.
_ACTIVATIONS = {
    "relu": (lambda x, a, b: np.maximum(x, 0), None, None),
    "tanh": (lambda x, a, b: np.tanh(x), None, None),
    "sigmoid": (lambda x, a, b: np.exp(-np.logaddexp(0, -x)), None, None),  # no exp overflow
    "affine": (lambda x, a, b: a * x + b, 1.0, 0.0),
    "leakyrelu": (lambda x, a, b: np.where(x >= 0, x, a * x), 0.01, None),
    "thresholdedrelu": (lambda x, a, b: np.where(x >= a, x, 0), 1.0, None),
    "scaledtanh": (lambda x, a, b: a * np.tanh(b * x), 1.0, 1.0),
    "hardsigmoid": (lambda x, a, b: np.clip(a * x + b, 0, 1), 0.2, 0.5),
    "elu": (lambda x, a, b: np.where(x >= 0, x, a * np.expm1(np.minimum(x, 0))), 1.0, None),
    "softsign": (lambda x, a, b: x / (1 + np.abs(x)), None, None),
    "softplus": (lambda x, a, b: np.logaddexp(0, x), None, None),
}


def _activations(names, alphas, betas, defaults, num_directions, clip):
    """Per direction, the list of activation callables (clip applied to their input).

    activation_alpha/beta values are consumed in order by the functions that take them.
    """
    per_dir = len(defaults)
    names = list(names) if names else list(defaults)
    if len(names) == per_dir:
        names = names * num_directions
    if len(names) < per_dir * num_directions:
        raise ValueError(f"activations: expected {per_dir * num_directions} functions, got {names}")
    names = names[: per_dir * num_directions]  # RNN's schema default lists two even for one direction
    alphas, betas = list(alphas or []), list(betas or [])
    funcs = []
    for name in names:
        if name.lower() not in _ACTIVATIONS:
            raise ValueError(f"activations: unsupported activation function {name!r}")
        fn, a, b = _ACTIVATIONS[name.lower()]
        if a is not None and alphas:
            a = alphas.pop(0)
        if b is not None and betas:
            b = betas.pop(0)
        if clip is None:
            funcs.append(lambda x, fn=fn, a=a, b=b: fn(x, a, b))
        else:
            funcs.append(lambda x, fn=fn, a=a, b=b: fn(np.clip(x, -clip, clip), a, b))
    return [funcs[d * per_dir:(d + 1) * per_dir] for d in range(num_directions)]


def _recurrent(X, W, R, B, sequence_lens, initial, *, n_gates, direction, layout, hidden_size,
               activations, activation_alpha, activation_beta, clip, defaults, make_step):
    """Shared driver for the three ops.

    `initial` lists the optional initial states (initial_h, and initial_c for LSTM) as given;
    `make_step(d, R_d, Rb_d, acts_d)` returns step(xw_t, states) -> new states for direction d, where
    xw_t = X_t W^T + Wb is precomputed for every time step.  Returns Y and the final states,
    in the node's layout and dtype.
    """
    direction = "forward" if direction == "foward" else direction  # GRU-1's default is misspelt
    if direction not in ("forward", "reverse", "bidirectional"):
        raise ValueError(f"direction must be forward, reverse or bidirectional, got {direction!r}")
    if layout not in (0, 1):
        raise ValueError(f"layout must be 0 or 1, got {layout}")
    num_directions = 2 if direction == "bidirectional" else 1
    if W.shape[0] != num_directions or R.shape[0] != num_directions:
        raise ValueError(
            f"W/R have {W.shape[0]}/{R.shape[0]} directions; direction={direction!r} "
            f"needs {num_directions}"
        )
    dtype = X.dtype
    work = np.float64 if dtype == np.float64 else np.float32  # f16/bf16 accumulate in float32
    if layout == 1:
        X = np.swapaxes(X, 0, 1)
        initial = [None if s is None else np.swapaxes(s, 0, 1) for s in initial]
    X, W, R = X.astype(work), W.astype(work), R.astype(work)
    seq_length, batch = X.shape[0], X.shape[1]
    hidden = R.shape[-1]
    if hidden_size is not None and hidden_size != hidden:
        raise ValueError(f"hidden_size={hidden_size} does not match R's last dimension {hidden}")
    if W.shape[1] != n_gates * hidden or R.shape[1] != n_gates * hidden:
        raise ValueError(f"W and R must have {n_gates}*hidden_size={n_gates * hidden} rows")
    if sequence_lens is None:
        lens = np.full(batch, seq_length, dtype=np.int64)
    else:
        lens = np.asarray(sequence_lens).astype(np.int64).reshape(-1)
        if lens.shape != (batch,) or (lens < 0).any() or (lens > seq_length).any():
            raise ValueError(
                f"sequence_lens must hold {batch} lengths in [0, {seq_length}], got {lens.tolist()}"
            )
    B = np.zeros((num_directions, 2 * n_gates * hidden), work) if B is None else B.astype(work)
    acts = _activations(activations, activation_alpha, activation_beta, defaults,
                        num_directions, clip)
    states0 = [np.zeros((num_directions, batch, hidden), work) if s is None else s.astype(work)
               for s in initial]

    Y = np.zeros((seq_length, num_directions, batch, hidden), work)
    finals = [np.empty_like(s) for s in states0]
    rows = np.arange(batch)
    for d in range(num_directions):
        reverse = direction == "reverse" or d == 1
        xw = X @ W[d].T + B[d, : n_gates * hidden]
        step = make_step(d, R[d], B[d, n_gates * hidden:], acts[d])
        states = [s[d] for s in states0]
        for s in range(int(lens.max(initial=0))):
            valid = s < lens
            t = np.where(valid, lens - 1 - s if reverse else s, 0)
            new = step(xw[t, rows], states)
            states = [np.where(valid[:, None], n, o) for n, o in zip(new, states)]
            Y[t[valid], d, rows[valid]] = states[0][valid]
        for f, st in zip(finals, states):
            f[d] = st
    if layout == 1:
        Y = Y.transpose(2, 0, 1, 3)
        finals = [np.swapaxes(f, 0, 1) for f in finals]
    return (Y.astype(dtype), *(f.astype(dtype) for f in finals))


@op("RNN", 1)
def rnn(X, W, R, B=None, sequence_lens=None, initial_h=None, *, activation_alpha=None,
        activation_beta=None, activations=None, clip=None, direction="forward",
        hidden_size=None, layout=0, output_sequence=0):
    """Ht = f(Xt*(Wi^T) + Ht-1*(Ri^T) + Wbi + Rbi)."""

    def make_step(d, Rd, Rb, acts):
        (f,) = acts
        return lambda xw, st: [f(xw + st[0] @ Rd.T + Rb)]

    return _recurrent(X, W, R, B, sequence_lens, [initial_h], n_gates=1, direction=direction,
                      layout=layout, hidden_size=hidden_size, activations=activations,
                      activation_alpha=activation_alpha, activation_beta=activation_beta,
                      clip=clip, defaults=["Tanh"], make_step=make_step)


@op("GRU", 1)
def gru(X, W, R, B=None, sequence_lens=None, initial_h=None, *, activation_alpha=None,
        activation_beta=None, activations=None, clip=None, direction="forward",
        hidden_size=None, layout=0, linear_before_reset=0, output_sequence=0):
    """Gates z, r, h in that order; linear_before_reset moves Rh inside the reset product."""

    def make_step(d, Rd, Rb, acts):
        f, g = acts
        Rz, Rr, Rh = np.split(Rd, 3)
        Rbz, Rbr, Rbh = np.split(Rb, 3)

        def step(xw, st):
            (H,) = st
            xz, xr, xh = np.split(xw, 3, axis=-1)
            z = f(xz + H @ Rz.T + Rbz)
            r = f(xr + H @ Rr.T + Rbr)
            if linear_before_reset:
                h = g(xh + r * (H @ Rh.T + Rbh))
            else:
                h = g(xh + (r * H) @ Rh.T + Rbh)
            return [(1 - z) * h + z * H]

        return step

    return _recurrent(X, W, R, B, sequence_lens, [initial_h], n_gates=3, direction=direction,
                      layout=layout, hidden_size=hidden_size, activations=activations,
                      activation_alpha=activation_alpha, activation_beta=activation_beta,
                      clip=clip, defaults=["Sigmoid", "Tanh"], make_step=make_step)


@op("LSTM", 1)
def lstm(X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, *,
         activation_alpha=None, activation_beta=None, activations=None, clip=None,
         direction="forward", hidden_size=None, input_forget=0, layout=0, output_sequence=0):
    """Gates i, o, f, c in that order; peepholes P[iof]; input_forget couples f = 1 - i."""
    work = np.float64 if X.dtype == np.float64 else np.float32

    def make_step(d, Rd, Rb, acts):
        f, g, h = acts
        hidden = Rd.shape[-1]
        Pi, Po, Pf = (np.zeros((3, hidden), work) if P is None
                      else P[d].astype(work).reshape(3, hidden))

        def step(xw, st):
            H, C = st
            gi, go, gf, gc = np.split(xw + H @ Rd.T + Rb, 4, axis=-1)
            i = f(gi + Pi * C)
            ft = 1 - i if input_forget else f(gf + Pf * C)
            C = ft * C + i * g(gc)
            o = f(go + Po * C)
            return [o * h(C), C]

        return step

    return _recurrent(X, W, R, B, sequence_lens, [initial_h, initial_c], n_gates=4,
                      direction=direction, layout=layout, hidden_size=hidden_size,
                      activations=activations, activation_alpha=activation_alpha,
                      activation_beta=activation_beta, clip=clip,
                      defaults=["Sigmoid", "Tanh", "Tanh"], make_step=make_step)
