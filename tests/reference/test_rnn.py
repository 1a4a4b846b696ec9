"""RNN, GRU, LSTM: checked against tiny hand-written step loops (one batch entry and one time
step at a time), with sequence_lens shorter than the sequence in every direction, layout 1,
the activation functions and their alpha/beta, clip, input_forget and the opset-1 attributes."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference import NodeError
from tests.reference.oneop import run_node

N_OUT = {"RNN": 2, "GRU": 2, "LSTM": 3}


def run(op_type, *inputs, opset=22, **attrs):
    """All of the node's outputs."""
    return run_node(op_type, *inputs, n_out=N_OUT[op_type], opset=opset, **attrs)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def rand(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float64)


# Hand-written loops: one batch entry, one time step at a time, straight from the equations.
def order(length, reverse):
    return range(length - 1, -1, -1) if reverse else range(length)


def lstm_loop(X, W, R, B, lens, h0, c0, P, reverse, input_forget=0):
    seq, batch, _ = X.shape
    hid = R.shape[-1]
    Wi, Wo, Wf, Wc = np.split(W, 4)
    Ri, Ro, Rf, Rc = np.split(R, 4)
    Wbi, Wbo, Wbf, Wbc, Rbi, Rbo, Rbf, Rbc = np.split(B, 8)
    Pi, Po, Pf = np.split(P, 3)
    Y = np.zeros((seq, batch, hid))
    Yh, Yc = h0.copy(), c0.copy()
    for b in range(batch):
        H, C = h0[b].copy(), c0[b].copy()
        for t in order(lens[b], reverse):
            x = X[t, b]
            i = sigmoid(Wi @ x + Ri @ H + Pi * C + Wbi + Rbi)
            f = 1 - i if input_forget else sigmoid(Wf @ x + Rf @ H + Pf * C + Wbf + Rbf)
            c = np.tanh(Wc @ x + Rc @ H + Wbc + Rbc)
            C = f * C + i * c
            o = sigmoid(Wo @ x + Ro @ H + Po * C + Wbo + Rbo)
            H = o * np.tanh(C)
            Y[t, b] = H
        Yh[b], Yc[b] = H, C
    return Y, Yh, Yc


def gru_loop(X, W, R, B, lens, h0, reverse, linear_before_reset):
    seq, batch, _ = X.shape
    hid = R.shape[-1]
    Wz, Wr, Wh = np.split(W, 3)
    Rz, Rr, Rh = np.split(R, 3)
    Wbz, Wbr, Wbh, Rbz, Rbr, Rbh = np.split(B, 6)
    Y = np.zeros((seq, batch, hid))
    Yh = h0.copy()
    for b in range(batch):
        H = h0[b].copy()
        for t in order(lens[b], reverse):
            x = X[t, b]
            z = sigmoid(Wz @ x + Rz @ H + Wbz + Rbz)
            r = sigmoid(Wr @ x + Rr @ H + Wbr + Rbr)
            if linear_before_reset:
                h = np.tanh(Wh @ x + r * (Rh @ H + Rbh) + Wbh)
            else:
                h = np.tanh(Wh @ x + Rh @ (r * H) + Rbh + Wbh)
            H = (1 - z) * h + z * H
            Y[t, b] = H
        Yh[b] = H
    return Y, Yh


def rnn_loop(X, W, R, B, lens, h0, reverse, f=np.tanh):
    seq, batch, _ = X.shape
    Wb, Rb = np.split(B, 2)
    Y = np.zeros((seq, batch, R.shape[-1]))
    Yh = h0.copy()
    for b in range(batch):
        H = h0[b].copy()
        for t in order(lens[b], reverse):
            H = f(W @ X[t, b] + R @ H + Wb + Rb)
            Y[t, b] = H
        Yh[b] = H
    return Y, Yh


SEQ, BATCH, INP, HID = 5, 3, 4, 3
LENS = np.array([5, 2, 3], dtype=np.int32)  # shorter than the sequence for two entries


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_lstm_sequence_lens_all_directions(direction):
    rng = np.random.default_rng(0)
    nd = 2 if direction == "bidirectional" else 1
    X = rand(rng, SEQ, BATCH, INP)
    W, R = rand(rng, nd, 4 * HID, INP), rand(rng, nd, 4 * HID, HID)
    B, P = rand(rng, nd, 8 * HID), rand(rng, nd, 3 * HID)
    h0, c0 = rand(rng, nd, BATCH, HID), rand(rng, nd, BATCH, HID)
    Y, Yh, Yc = run("LSTM", X, W, R, B, LENS, h0, c0, P, hidden_size=HID, direction=direction)
    assert Y.shape == (SEQ, nd, BATCH, HID) and Y.dtype == np.float64
    for d in range(nd):
        reverse = direction == "reverse" or d == 1
        ey, eh, ec = lstm_loop(X, W[d], R[d], B[d], LENS, h0[d], c0[d], P[d], reverse)
        np.testing.assert_allclose(Y[:, d], ey, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(Yh[d], eh, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(Yc[d], ec, rtol=1e-12, atol=1e-12)
    # Past a batch entry's length its outputs are exactly zero.
    assert not Y[2:, :, 1].any() and not Y[3:, :, 2].any()


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("linear_before_reset", [0, 1])
def test_gru_sequence_lens_all_directions(direction, linear_before_reset):
    rng = np.random.default_rng(1)
    nd = 2 if direction == "bidirectional" else 1
    X = rand(rng, SEQ, BATCH, INP)
    W, R, B = rand(rng, nd, 3 * HID, INP), rand(rng, nd, 3 * HID, HID), rand(rng, nd, 6 * HID)
    h0 = rand(rng, nd, BATCH, HID)
    Y, Yh = run("GRU", X, W, R, B, LENS, h0, hidden_size=HID, direction=direction,
                linear_before_reset=linear_before_reset)
    for d in range(nd):
        reverse = direction == "reverse" or d == 1
        ey, eh = gru_loop(X, W[d], R[d], B[d], LENS, h0[d], reverse, linear_before_reset)
        np.testing.assert_allclose(Y[:, d], ey, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(Yh[d], eh, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_rnn_sequence_lens_all_directions(direction):
    rng = np.random.default_rng(2)
    nd = 2 if direction == "bidirectional" else 1
    X = rand(rng, SEQ, BATCH, INP)
    W, R, B = rand(rng, nd, HID, INP), rand(rng, nd, HID, HID), rand(rng, nd, 2 * HID)
    h0 = rand(rng, nd, BATCH, HID)
    Y, Yh = run("RNN", X, W, R, B, LENS, h0, hidden_size=HID, direction=direction)
    for d in range(nd):
        ey, eh = rnn_loop(X, W[d], R[d], B[d], LENS, h0[d], direction == "reverse" or d == 1)
        np.testing.assert_allclose(Y[:, d], ey, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(Yh[d], eh, rtol=1e-12, atol=1e-12)


def test_zero_length_keeps_initial_state():
    rng = np.random.default_rng(3)
    X = rand(rng, 2, 2, 1)
    W, R, B = rand(rng, 1, 4, 1), rand(rng, 1, 4, 1), rand(rng, 1, 8)
    h0, c0 = rand(rng, 1, 2, 1), rand(rng, 1, 2, 1)
    Y, Yh, Yc = run("LSTM", X, W, R, B, np.array([0, 2], np.int32), h0, c0, hidden_size=1)
    assert not Y[:, 0, 0].any()
    assert Yh[0, 0] == h0[0, 0] and Yc[0, 0] == c0[0, 0]


def test_lstm_input_forget_couples_gates():
    rng = np.random.default_rng(4)
    X = rand(rng, 3, 2, 2)
    W, R, B, P = rand(rng, 1, 8, 2), rand(rng, 1, 8, 2), rand(rng, 1, 16), rand(rng, 1, 6)
    h0, c0 = rand(rng, 1, 2, 2), rand(rng, 1, 2, 2)
    Y, Yh, Yc = run("LSTM", X, W, R, B, None, h0, c0, P, hidden_size=2, input_forget=1)
    ey, eh, ec = lstm_loop(X, W[0], R[0], B[0], [3, 3], h0[0], c0[0], P[0], False, input_forget=1)
    np.testing.assert_allclose(Y[:, 0], ey, rtol=1e-12)
    np.testing.assert_allclose(Yh[0], eh, rtol=1e-12)
    np.testing.assert_allclose(Yc[0], ec, rtol=1e-12)


@pytest.mark.parametrize("op_type,gates,n_states", [("RNN", 1, 1), ("GRU", 3, 1), ("LSTM", 4, 2)])
def test_layout_1_is_batch_major(op_type, gates, n_states):
    rng = np.random.default_rng(5)
    X = rand(rng, SEQ, BATCH, INP).astype(np.float32)
    W = rand(rng, 2, gates * HID, INP).astype(np.float32)
    R = rand(rng, 2, gates * HID, HID).astype(np.float32)
    states = [rand(rng, 2, BATCH, HID).astype(np.float32) for _ in range(n_states)]
    extra = [None, None] + states  # B, sequence_lens absent
    base = run(op_type, X, W, R, *extra, direction="bidirectional", opset=14)
    swapped = [np.swapaxes(s, 0, 1).copy() for s in states]
    out = run(op_type, np.swapaxes(X, 0, 1).copy(), W, R, None, None, *swapped,
              direction="bidirectional", layout=1, opset=14)
    np.testing.assert_allclose(out[0], base[0].transpose(2, 0, 1, 3), rtol=1e-6)
    for o, b in zip(out[1:], base[1:]):
        np.testing.assert_allclose(o, np.swapaxes(b, 0, 1), rtol=1e-6)
    assert all(o.dtype == np.float32 for o in out)


# One step with W = identity, R = 0, B = 0: Y = f(x), so each activation is visible directly.
ACT_CASES = [
    ("Relu", [], [], lambda x: np.maximum(x, 0)),
    ("Tanh", [], [], np.tanh),
    ("Sigmoid", [], [], sigmoid),
    ("Affine", [2.0], [0.5], lambda x: 2 * x + 0.5),
    ("LeakyRelu", [], [], lambda x: np.where(x >= 0, x, 0.01 * x)),
    ("LeakyRelu", [0.3], [], lambda x: np.where(x >= 0, x, 0.3 * x)),
    ("ThresholdedRelu", [], [], lambda x: np.where(x >= 1.0, x, 0)),
    ("ThresholdedRelu", [0.5], [], lambda x: np.where(x >= 0.5, x, 0)),
    ("ScaledTanh", [2.0], [0.5], lambda x: 2 * np.tanh(0.5 * x)),
    ("HardSigmoid", [], [], lambda x: np.clip(0.2 * x + 0.5, 0, 1)),
    ("HardSigmoid", [0.5], [0.25], lambda x: np.clip(0.5 * x + 0.25, 0, 1)),
    ("Elu", [], [], lambda x: np.where(x >= 0, x, np.exp(x) - 1)),
    ("Elu", [2.0], [], lambda x: np.where(x >= 0, x, 2 * (np.exp(x) - 1))),
    ("Softsign", [], [], lambda x: x / (1 + np.abs(x))),
    ("Softplus", [], [], lambda x: np.log1p(np.exp(x))),
]


@pytest.mark.parametrize("name,alpha,beta,fn", ACT_CASES, ids=[f"{c[0]}{c[1]}" for c in ACT_CASES])
def test_rnn_activation_functions(name, alpha, beta, fn):
    x = np.array([-3.0, -0.75, 0.0, 0.5, 1.0, 4.0])
    X = x.reshape(1, 1, -1)
    n = x.size
    attrs = {"activations": [name]}
    if alpha:
        attrs["activation_alpha"] = alpha
    if beta:
        attrs["activation_beta"] = beta
    Y, _ = run("RNN", X, np.eye(n)[None], np.zeros((1, n, n)), hidden_size=n, **attrs)
    np.testing.assert_allclose(Y[0, 0, 0], fn(x), rtol=1e-7, atol=1e-15)  # alphas are float32


def test_activation_alpha_consumed_by_functions_that_take_it():
    # Tanh takes no alpha, so the single alpha goes to LeakyRelu (the reverse direction).
    x = np.array([-2.0, 1.0])
    X = x.reshape(1, 1, 2)
    W, R = np.stack([np.eye(2)] * 2), np.zeros((2, 2, 2))
    Y, _ = run("RNN", X, W, R, hidden_size=2, direction="bidirectional",
               activations=["Tanh", "LeakyRelu"], activation_alpha=[0.5])
    np.testing.assert_allclose(Y[0, 0, 0], np.tanh(x))
    np.testing.assert_allclose(Y[0, 1, 0], [-1.0, 1.0])


def test_clip_bounds_activation_inputs():
    # Affine(alpha=1, beta=0) is the identity, so Y shows the clipped pre-activation.
    X = np.array([[[-5.0, 0.25, 7.0]]])
    Y, _ = run("RNN", X, np.eye(3)[None], np.zeros((1, 3, 3)), hidden_size=3, clip=1.0,
               activations=["Affine"], activation_alpha=[1.0], activation_beta=[0.0])
    np.testing.assert_array_equal(Y[0, 0, 0], [-1.0, 0.25, 1.0])


def test_lstm_clip_applies_to_cell_activation_input():
    # With W=R=0 and biases: i=f=o=sigmoid(0)=.5, c=tanh(clip(3))=tanh(1); C=.5*C0+.5*tanh(1).
    hid = 1
    B = np.zeros((1, 8 * hid))
    B[0, 3] = 3.0  # Wbc
    c0 = np.array([[[10.0]]])
    _, Yh, Yc = run("LSTM", np.zeros((1, 1, 1)), np.zeros((1, 4, 1)), np.zeros((1, 4, 1)), B,
                    None, np.zeros((1, 1, 1)), c0, hidden_size=1, clip=1.0)
    C = 0.5 * 10 + 0.5 * math.tanh(1.0)
    assert Yc[0, 0, 0] == pytest.approx(C)  # the cell state itself is not clipped
    assert Yh[0, 0, 0] == pytest.approx(0.5 * math.tanh(1.0))  # h(clip(C)) = tanh(1)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_dtype_is_preserved(dtype):
    rng = np.random.default_rng(6)
    X = rand(rng, 2, 1, 2).astype(dtype)
    W, R = rand(rng, 1, 9, 2).astype(dtype), rand(rng, 1, 9, 3).astype(dtype)
    Y, Yh = run("GRU", X, W, R, hidden_size=3)
    assert Y.dtype == dtype and Yh.dtype == dtype
    ey, _ = gru_loop(X.astype(np.float64), W[0].astype(np.float64), R[0].astype(np.float64),
                     np.zeros(18), [2], np.zeros((1, 3)), False, 0)
    np.testing.assert_allclose(Y[:, 0].astype(np.float64), ey, rtol=2e-3, atol=2e-3)


def test_opset1_legacy_attributes():
    # GRU-1: output_sequence and the misspelt default direction "foward" (forward).
    rng = np.random.default_rng(7)
    X = rand(rng, 3, 2, 2).astype(np.float32)
    W, R = rand(rng, 1, 6, 2).astype(np.float32), rand(rng, 1, 6, 2).astype(np.float32)
    Y, Yh = run("GRU", X, W, R, opset=1, hidden_size=2, output_sequence=1)
    ey, eh = gru_loop(X.astype(np.float64), W[0], R[0], np.zeros(12), [3, 3], np.zeros((2, 2)),
                      False, 0)
    np.testing.assert_allclose(Y[:, 0], ey, rtol=1e-5)
    np.testing.assert_allclose(Yh[0], eh, rtol=1e-5)
    # RNN-1's schema default lists two activations even for one direction.
    Y, _ = run("RNN", X, rand(rng, 1, 2, 2).astype(np.float32), np.zeros((1, 2, 2), np.float32),
               opset=1, output_sequence=0)
    assert Y.shape == (3, 1, 2, 2)


@pytest.mark.parametrize("attrs", [{"direction": "sideways"}, {"activations": ["Gelu"]},
                                   {"hidden_size": 5}])
def test_bad_attributes_raise(attrs):
    X = np.zeros((1, 1, 1), np.float32)
    with pytest.raises(NodeError):
        run("RNN", X, np.zeros((1, 2, 1), np.float32), np.zeros((1, 2, 2), np.float32), **attrs)


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 4), st.integers(1, 3), st.lists(st.integers(0, 4), min_size=1, max_size=3),
       st.integers(0, 2**31 - 1))
def test_bidirectional_is_forward_and_reverse(seq, hid, lens, seed):
    # Law: each half of a bidirectional run equals the single-direction run with its weights.
    lens = np.minimum(np.array(lens, np.int32), seq)
    rng = np.random.default_rng(seed)
    batch = len(lens)
    X = rand(rng, seq, batch, 2)
    W, R, B = rand(rng, 2, 4 * hid, 2), rand(rng, 2, 4 * hid, hid), rand(rng, 2, 8 * hid)
    both = run("LSTM", X, W, R, B, lens, hidden_size=hid, direction="bidirectional")
    fwd = run("LSTM", X, W[:1], R[:1], B[:1], lens, hidden_size=hid)
    rev = run("LSTM", X, W[1:], R[1:], B[1:], lens, hidden_size=hid, direction="reverse")
    for k in range(3):
        axis = 1 if k == 0 else 0
        np.testing.assert_array_equal(np.take(both[k], [0], axis=axis), fwd[k])
        np.testing.assert_array_equal(np.take(both[k], [1], axis=axis), rev[k])
