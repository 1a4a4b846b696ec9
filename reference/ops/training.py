"""ai.onnx.preview.training: optimizers (Adagrad, Adam, Momentum) and the Gradient operator."""

from __future__ import annotations

import numpy as np

from ..registry import op

TRAINING = "ai.onnx.preview.training"


def _split(tensors, groups: int, name: str):
    if len(tensors) % groups:
        raise ValueError(
            f"{name}: expected a multiple of {groups} tensors after R and T, got {len(tensors)}"
        )
    n = len(tensors) // groups
    return [tensors[i * n : (i + 1) * n] for i in range(groups)]


@op("Adagrad", 1, TRAINING)
def adagrad(r, t, *tensors, decay_factor=0.0, epsilon=1e-6, norm_coefficient=0.0):
    xs, gs, hs = _split(tensors, 3, "Adagrad")
    rate = float(r) / (1.0 + float(t) * decay_factor)
    new_x, new_h = [], []
    for x, g, h in zip(xs, gs, hs):
        g_reg = norm_coefficient * x + g
        h_new = h + g_reg * g_reg
        new_x.append((x - rate * g_reg / (np.sqrt(h_new) + epsilon)).astype(x.dtype))
        new_h.append(h_new.astype(h.dtype))
    return tuple(new_x + new_h)


@op("Adam", 1, TRAINING)
def adam(
    r,
    t,
    *tensors,
    alpha=0.9,
    beta=0.999,
    epsilon=1e-6,
    norm_coefficient=0.0,
    norm_coefficient_post=0.0,
):
    xs, gs, vs, hs = _split(tensors, 4, "Adam")
    t = float(t)
    rate = float(r)
    if t > 0:
        rate = rate * np.sqrt(1.0 - beta**t) / (1.0 - alpha**t)
    new_x, new_v, new_h = [], [], []
    for x, g, v, h in zip(xs, gs, vs, hs):
        g_reg = norm_coefficient * x + g
        v_new = alpha * v + (1 - alpha) * g_reg
        h_new = beta * h + (1 - beta) * g_reg * g_reg
        x_new = x - rate * v_new / (np.sqrt(h_new) + epsilon)
        new_x.append(((1 - norm_coefficient_post) * x_new).astype(x.dtype))
        new_v.append(v_new.astype(v.dtype))
        new_h.append(h_new.astype(h.dtype))
    return tuple(new_x + new_v + new_h)


@op("Momentum", 1, TRAINING)
def momentum(r, t, *tensors, alpha, beta, mode, norm_coefficient):
    if mode not in ("standard", "nesterov"):
        raise ValueError(f"Momentum: mode {mode!r} is not 'standard' or 'nesterov'")
    xs, gs, vs = _split(tensors, 3, "Momentum")
    beta_adj = beta if float(t) > 0 else 1.0
    rate = float(r)
    new_x, new_v = [], []
    for x, g, v in zip(xs, gs, vs):
        g_reg = norm_coefficient * x + g
        v_new = alpha * v + beta_adj * g_reg
        step = v_new if mode == "standard" else g_reg + alpha * v_new
        new_x.append((x - rate * step).astype(x.dtype))
        new_v.append(v_new.astype(v.dtype))
    return tuple(new_x + new_v)


# Gradient ------------------------------------------------------------------------------------
def _unbroadcast(grad, shape):
    """Sum `grad` down to `shape` (the adjoint of numpy broadcasting)."""
    shape = tuple(shape)
    while grad.ndim > len(shape):
        grad = grad.sum(axis=0)
    for axis, size in enumerate(shape):
        if size == 1 and grad.shape[axis] != 1:
            grad = grad.sum(axis=axis, keepdims=True)
    return grad


def _matmul_grads(a, b, dy):
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    dy2 = dy
    if a.ndim == 1:
        dy2 = np.expand_dims(dy2, -2)
    if b.ndim == 1:
        dy2 = np.expand_dims(dy2, -1)
    da = dy2 @ np.swapaxes(b2, -1, -2)
    db = np.swapaxes(a2, -1, -2) @ dy2
    da = _unbroadcast(da, a2.shape).reshape(a.shape)
    db = _unbroadcast(db, b2.shape).reshape(b.shape)
    return da, db


# Vector-Jacobian products: (inputs, output, dy) -> gradient of each input.
_VJP = {
    "Add": lambda i, y, dy: [_unbroadcast(dy, i[0].shape), _unbroadcast(dy, i[1].shape)],
    "Sub": lambda i, y, dy: [_unbroadcast(dy, i[0].shape), _unbroadcast(-dy, i[1].shape)],
    "Mul": lambda i, y, dy: [
        _unbroadcast(dy * i[1], i[0].shape),
        _unbroadcast(dy * i[0], i[1].shape),
    ],
    "Div": lambda i, y, dy: [
        _unbroadcast(dy / i[1], i[0].shape),
        _unbroadcast(-dy * i[0] / (i[1] * i[1]), i[1].shape),
    ],
    "Neg": lambda i, y, dy: [-dy],
    "Identity": lambda i, y, dy: [dy],
    "Relu": lambda i, y, dy: [dy * (i[0] > 0)],
    "Sigmoid": lambda i, y, dy: [dy * y * (1 - y)],
    "Tanh": lambda i, y, dy: [dy * (1 - y * y)],
    "Exp": lambda i, y, dy: [dy * y],
    "Log": lambda i, y, dy: [dy / i[0]],
    "Sqrt": lambda i, y, dy: [dy / (2 * y)],
    "MatMul": lambda i, y, dy: list(_matmul_grads(i[0], i[1], dy)),
}


@op("Gradient", 1, TRAINING)
def gradient(*values, xs, y, zs=None, ctx):
    """Reverse-mode differentiation of the graph that contains this node.

    The forward pass is recomputed from the given values of xs and zs (plus initializers),
    then the VJP rules above are applied in reverse topological order.
    """
    from ..evaluator import GraphRunner, tensor_value

    names = list(xs) + list(zs or [])
    if len(values) != len(names):
        raise ValueError(f"Gradient: {len(values)} inputs for {len(names)} names in xs and zs")
    ev = ctx.evaluator
    graph = ev.graph
    if ctx.node not in graph.node:
        raise ValueError("Gradient: only supported in the main graph")
    env = {i.name: tensor_value(i) for i in graph.initializer}
    env.update(zip(names, values))
    runner = GraphRunner(ev, lambda r: None)
    depends = set(xs)  # values that depend on some x
    tape = []
    for node in graph.node:
        if node == ctx.node:
            break
        if any(o in env for o in node.output) or not all(n in env for n in node.input if n):
            continue
        inputs = [env[n] if n else None for n in node.input]
        while inputs and inputs[-1] is None:
            inputs.pop()
        outs = runner.call_op(node, inputs, None, ev.opsets, (), None)
        env.update((o, v) for o, v in zip(node.output, outs) if o)
        if depends & set(node.input):
            depends.update(node.output)
            tape.append(node)
    if y not in env:
        raise ValueError(f"Gradient: y {y!r} cannot be computed from xs and zs")
    grads = {y: np.ones_like(env[y])}
    for node in reversed(tape):
        dy = grads.get(node.output[0])
        if dy is None:
            continue
        if node.op_type not in _VJP or len(node.output) != 1 or node.domain not in ("", "ai.onnx"):
            raise ValueError(f"Gradient: no derivative rule for {node.op_type}")
        inputs = [env[n] for n in node.input]
        for name, g in zip(node.input, _VJP[node.op_type](inputs, env[node.output[0]], dy)):
            if name in depends:
                grads[name] = grads[name] + g if name in grads else g
    out = []
    for name, value in zip(xs, values):
        g = grads.get(name, np.zeros_like(value))
        out.append(np.asarray(g, dtype=value.dtype).reshape(value.shape))
    return tuple(out)
