"""Signal processing: DFT, STFT, window functions, MelWeightMatrix.

Complex values travel as a trailing dimension of size 2 (real, imaginary); a trailing
dimension of size 1 holds a real signal.
"""
from __future__ import annotations

import numpy as np

from ..dtypes import np_dtype
from ..registry import op


def _to_complex(x, name="input"):
    # transforms run in double precision whatever the input type; results are cast back
    if x.shape[-1] == 1:
        return x[..., 0].astype(np.float64)
    if x.shape[-1] == 2:
        return x[..., 0].astype(np.float64) + 1j * x[..., 1].astype(np.float64)
    raise ValueError(f"{name}'s last dimension must be 1 (real) or 2 (complex), got {x.shape[-1]}")


def _from_complex(z, dtype):
    return np.stack([z.real, z.imag], axis=-1).astype(dtype)


def _scalar(v, name):
    v = np.asarray(v)
    if v.size != 1:
        raise ValueError(f"{name} must be a scalar, got shape {v.shape}")
    return int(v.reshape(-1)[0])


def _dft(x, dft_length, axis, inverse, onesided):
    r = x.ndim
    if not (-r <= axis <= -2 or 0 <= axis <= r - 2):
        raise ValueError(f"axis {axis} out of range for rank {r} (the last axis holds re/im)")
    axis = axis + r if axis < 0 else axis
    real_input = x.shape[-1] == 1
    signal = _to_complex(x)
    n = signal.shape[axis]
    if onesided and inverse:
        if real_input:
            raise ValueError("onesided inverse DFT (IRFFT) needs complex input")
        length = 2 * (n - 1) if dft_length is None else _scalar(dft_length, "dft_length")
        # irfft zero-pads/truncates the half spectrum to length // 2 + 1 bins
        out = np.fft.irfft(signal, n=length, axis=axis)
        return out[..., None].astype(x.dtype)
    length = n if dft_length is None else _scalar(dft_length, "dft_length")
    if length < 1:
        raise ValueError(f"dft_length must be positive, got {length}")
    if onesided and not real_input:
        raise ValueError("onesided forward DFT (RFFT) needs real input")
    transform = np.fft.ifft if inverse else np.fft.fft
    z = transform(signal, n=length, axis=axis)
    if onesided:
        z = np.take(z, np.arange(length // 2 + 1), axis=axis)
    return _from_complex(z, x.dtype)


@op("DFT", 17)
def dft_17(input, dft_length=None, *, axis=1, inverse=0, onesided=0):
    return _dft(input, dft_length, axis, inverse, onesided)


@op("DFT", 20)
def dft_20(input, dft_length=None, axis=None, *, inverse=0, onesided=0):
    axis = -2 if axis is None else _scalar(axis, "axis")
    return _dft(input, dft_length, axis, inverse, onesided)


@op("STFT", 17)
def stft(signal, frame_step, window=None, frame_length=None, *, onesided=1):
    if signal.ndim != 3:
        raise ValueError(f"signal must have rank 3 [batch, length, 1|2], got shape {signal.shape}")
    step = _scalar(frame_step, "frame_step")
    length = signal.shape[1]
    if frame_length is not None:
        fl = _scalar(frame_length, "frame_length")
        if window is not None and window.shape[0] != fl:
            raise ValueError(f"window length {window.shape[0]} != frame_length {fl}")
    else:
        fl = window.shape[0] if window is not None else length
    if step < 1 or not 0 < fl <= length:
        raise ValueError(f"bad frame_step {step} or frame_length {fl} for signal length {length}")
    z = _to_complex(signal, "signal")
    n_frames = (length - fl) // step + 1
    frames = z[:, np.arange(n_frames)[:, None] * step + np.arange(fl)]  # [batch, frames, fl]
    if window is not None:
        if window.ndim != 1:
            raise ValueError(f"window must be 1-D, got shape {window.shape}")
        frames = frames * window.astype(np.float64)
    if onesided and signal.shape[-1] == 2:
        raise ValueError("onesided STFT needs a real signal")
    spectrum = np.fft.fft(frames, axis=-1)
    if onesided:
        spectrum = spectrum[..., : fl // 2 + 1]
    return _from_complex(spectrum, signal.dtype)


def _cosine_window(size, periodic, output_datatype, coefficients):
    n = _scalar(size, "size")
    if n < 0:
        raise ValueError(f"window size must be non-negative, got {n}")
    # a symmetric window spans size - 1 intervals, a periodic one size
    denominator = n if periodic else n - 1
    k = np.arange(n, dtype=np.float64)
    angle = 2 * np.pi * k / denominator if denominator > 0 else np.zeros(n)
    w = sum(
        (-1) ** i * a * np.cos(i * angle) for i, a in enumerate(coefficients)
    )
    return np.asarray(w).astype(np_dtype(output_datatype))


@op("HannWindow", 17)
def hann_window(size, *, periodic=1, output_datatype=1):
    return _cosine_window(size, periodic, output_datatype, (0.5, 0.5))


@op("HammingWindow", 17)
def hamming_window(size, *, periodic=1, output_datatype=1):
    return _cosine_window(size, periodic, output_datatype, (25 / 46, 21 / 46))


@op("BlackmanWindow", 17)
def blackman_window(size, *, periodic=1, output_datatype=1):
    return _cosine_window(size, periodic, output_datatype, (0.42, 0.5, 0.08))


def _hz_to_mel(f):
    return 2595 * np.log10(1 + f / 700)


def _mel_to_hz(m):
    return 700 * (10 ** (m / 2595) - 1)


@op("MelWeightMatrix", 17)
def mel_weight_matrix(num_mel_bins, dft_length, sample_rate, lower_edge_hertz,
                      upper_edge_hertz, *, output_datatype=1):
    n_mel = _scalar(num_mel_bins, "num_mel_bins")
    n_fft = _scalar(dft_length, "dft_length")
    rate = _scalar(sample_rate, "sample_rate")
    lo = float(np.asarray(lower_edge_hertz).reshape(-1)[0])
    hi = float(np.asarray(upper_edge_hertz).reshape(-1)[0])
    n_bins = n_fft // 2 + 1
    # n_mel + 2 triangle corners evenly spaced on the mel scale, mapped to spectrogram bins.
    # The spacing (range / (n_mel + 2)) and the bin mapping (floor((dft_length + 1) * f /
    # sample_rate)) are not in the spec text; the corpus (test_melweightmatrix) fixes them.
    step = (_hz_to_mel(hi) - _hz_to_mel(lo)) / (n_mel + 2)
    mel = _hz_to_mel(lo) + step * np.arange(n_mel + 2)
    edges = np.floor((n_fft + 1) * _mel_to_hz(mel) / rate).astype(np.int64)
    lower, center, upper = edges[:-2], edges[1:-1], edges[2:]
    j = np.arange(n_bins)[:, None]
    rising = (j - lower) / np.maximum(center - lower, 1)
    falling = (upper - j) / np.maximum(upper - center, 1)
    w = np.where((j >= lower) & (j <= center), rising, 0.0)
    w = np.where((j >= center) & (j < upper), falling, w)
    w = np.where(j == center, 1.0, w)  # the peak, also where a triangle side is empty
    return w.astype(np_dtype(output_datatype))
