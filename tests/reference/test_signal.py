"""DFT, STFT, window functions, MelWeightMatrix."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import TensorProto

from tests.reference.oneop import run_node


def dft_matrix(n, inverse=False):
    """The DFT as the spec writes it: sum_n exp(-2 pi j k n / N) x[n] (and 1/N, +j inverse)."""
    k = np.arange(n)
    sign = 1 if inverse else -1
    m = np.exp(sign * 2j * np.pi * np.outer(k, k) / n)
    return m / n if inverse else m


def as_complex(y):
    return y[..., 0] + 1j * y[..., 1]


def axis(a):
    return np.array(a, dtype=np.int64)


# ----------------------------------------------------------------------------------- DFT
def test_dft_matches_the_defining_sum_on_a_non_square_input():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 5, 2))  # complex signal, transform over axis 1 (length 3)
    y = run_node("DFT", x, None, axis(1), opset=20)
    assert y.shape == (2, 3, 5, 2) and y.dtype == np.float64
    expected = np.einsum("kn,bnc->bkc", dft_matrix(3), as_complex(x))
    np.testing.assert_allclose(as_complex(y), expected, atol=1e-12)
    # negative axis -2 is the last signal axis (length 5); opset 17 takes it as an attribute
    y20 = run_node("DFT", x, None, axis(-2), opset=20)
    y17 = run_node("DFT", x, opset=17, axis=2)
    expected = np.einsum("kn,bcn->bck", dft_matrix(5), as_complex(x))
    np.testing.assert_allclose(as_complex(y20), expected, atol=1e-12)
    np.testing.assert_array_equal(y17, y20)


def test_dft_default_axes():
    x = np.arange(6, dtype=np.float32).reshape(2, 3, 1)
    # opset 17 defaults to axis 1, opset 20 to -2: the same axis for rank 3
    y17, y20 = run_node("DFT", x, opset=17), run_node("DFT", x, opset=20)
    assert y17.dtype == np.float32 and y17.shape == (2, 3, 2)
    np.testing.assert_array_equal(y17, y20)
    np.testing.assert_allclose(as_complex(y17[0]), dft_matrix(3) @ np.array([0, 1, 2]), atol=1e-6)


def test_dft_length_pads_and_truncates():
    x = np.array([[1.0], [2.0], [3.0]], dtype=np.float32)[None]  # [1, 3, 1]
    padded = run_node("DFT", x, np.array(4, np.int64), opset=20)
    assert padded.shape == (1, 4, 2)
    np.testing.assert_allclose(as_complex(padded[0]), dft_matrix(4) @ [1, 2, 3, 0], atol=1e-6)
    cut = run_node("DFT", x, np.array(2, np.int32), opset=20)
    np.testing.assert_allclose(as_complex(cut[0]), [3, -1], atol=1e-6)


def test_rfft_and_irfft():
    x = np.array([1.0, 2.0, 0.0, -1.0, 5.0], dtype=np.float32).reshape(1, 5, 1)
    half = run_node("DFT", x, opset=20, onesided=1)
    assert half.shape == (1, 3, 2)  # floor(5 / 2) + 1 bins
    np.testing.assert_allclose(as_complex(half[0]), (dft_matrix(5) @ x.ravel())[:3], atol=1e-5)
    # IRFFT: default length 2 * (3 - 1) = 4; with dft_length 5 it restores x
    back = run_node("DFT", half, np.array(5, np.int64), opset=20, onesided=1, inverse=1)
    assert back.shape == (1, 5, 1) and back.dtype == np.float32
    np.testing.assert_allclose(back.ravel(), x.ravel(), atol=1e-5)
    assert run_node("DFT", half, opset=20, onesided=1, inverse=1).shape == (1, 4, 1)


def test_onesided_needs_the_right_input_kind():
    with pytest.raises(Exception, match="real input"):
        run_node("DFT", np.zeros((1, 4, 2), np.float32), opset=20, onesided=1)
    with pytest.raises(Exception, match="axis"):
        run_node("DFT", np.zeros((1, 4, 2), np.float32), None, axis(2), opset=20)


@settings(max_examples=30, deadline=None)
@given(
    x=hnp.arrays(np.float64, hnp.array_shapes(min_dims=2, max_dims=4, max_side=6).map(
        lambda s: (*s, 2)), elements=st.floats(-1e3, 1e3)),
    data=st.data(),
)
def test_inverse_of_forward_is_identity(x, data):
    ax = data.draw(st.integers(-(x.ndim), x.ndim - 2).filter(lambda a: a != -1))
    forward = run_node("DFT", x, None, axis(ax), opset=20)
    back = run_node("DFT", forward, None, axis(ax), opset=20, inverse=1)
    np.testing.assert_allclose(back, x, atol=1e-9 * (1 + np.abs(x).max()))


# ---------------------------------------------------------------------------------- STFT
def test_stft_frames_and_window():
    signal = np.arange(10, dtype=np.float32).reshape(1, 10, 1)
    window = np.array([0.5, 1.0, 1.0, 0.5], dtype=np.float32)
    y = run_node("STFT", signal, np.array(3, np.int64), window, opset=17)
    # frames = floor((10 - 4) / 3) + 1 = 3, starting at 0, 3, 6; onesided: 4 // 2 + 1 bins
    assert y.shape == (1, 3, 3, 2) and y.dtype == np.float32
    for f, start in enumerate((0, 3, 6)):
        frame = np.arange(start, start + 4) * window
        np.testing.assert_allclose(as_complex(y[0, f]), (dft_matrix(4) @ frame)[:3], atol=1e-4)
    full = run_node("STFT", signal, np.array(3, np.int64), None, np.array(4, np.int64), opset=17,
                    onesided=0)
    assert full.shape == (1, 3, 4, 2)
    np.testing.assert_allclose(as_complex(full[0, 1]), dft_matrix(4) @ np.arange(3, 7), atol=1e-4)


def test_stft_window_length_must_match():
    signal = np.zeros((1, 8, 1), np.float32)
    with pytest.raises(Exception, match="frame_length"):
        run_node("STFT", signal, np.array(2, np.int64), np.ones(4, np.float32),
                 np.array(5, np.int64), opset=17)


# ------------------------------------------------------------------------------- windows
@pytest.mark.parametrize("op_type, periodic, expected", [
    # periodic: N = size; symmetric: N = size - 1
    ("HannWindow", 1, [0.0, 0.5, 1.0, 0.5]),
    ("HannWindow", 0, [0.0, 0.75, 0.75, 0.0]),
    ("HammingWindow", 1, [4 / 46, 25 / 46, 1.0, 25 / 46]),
    ("BlackmanWindow", 1, [0.0, 0.34, 1.0, 0.34]),
    ("BlackmanWindow", 0, [0.0, 0.63, 0.63, 0.0]),
])
def test_windows(op_type, periodic, expected):
    y = run_node(op_type, np.array(4, np.int64), opset=17, periodic=periodic)
    assert y.dtype == np.float32 and y.shape == (4,)
    np.testing.assert_allclose(y, expected, atol=1e-6)


def test_window_output_datatype():
    y = run_node("HannWindow", np.array(3, np.int32), opset=17, output_datatype=TensorProto.DOUBLE)
    assert y.dtype == np.float64
    np.testing.assert_allclose(y, [0, 0.75, 0.75])


# ------------------------------------------------------------------------ MelWeightMatrix
def test_mel_weight_matrix_shape_and_peaks():
    args = [np.array(v, np.int64) for v in (4, 32, 16000)]
    args += [np.array(100.0, np.float32), np.array(6000.0, np.float32)]
    y = run_node("MelWeightMatrix", *args, opset=17, output_datatype=TensorProto.DOUBLE)
    assert y.shape == (17, 4) and y.dtype == np.float64
    assert np.all((y >= 0) & (y <= 1))
    # every triangle peaks at 1, and the peaks move up the spectrum
    assert np.all(y.max(axis=0) == 1)
    peaks = y.argmax(axis=0)
    assert np.all(np.diff(peaks) > 0)
