"""How far apart two values are: error statistics for floats, exact comparison for the rest."""
from __future__ import annotations

from dataclasses import asdict, dataclass

import ml_dtypes
import numpy as np

from reference.dtypes import is_float
from reference.values import EMPTY, describe

DEFAULT_RTOL = 1e-4
DEFAULT_ATOL = 1e-5


@dataclass
class Metrics:
    """The comparison of value A (taken as expected) with value B.

    status: "equal", "close" (within tolerance), "diverged" (values out of tolerance) or
    "mismatch" (type, dtype or shape differ; `detail` says how)."""

    status: str
    detail: str = ""
    size: int = 0
    max_abs: float = 0.0
    max_abs_index: tuple | None = None
    max_rel: float = 0.0
    mean_abs: float = 0.0
    median_abs: float = 0.0
    p99_abs: float = 0.0
    out_of_tolerance: int = 0
    nan_mismatch: int = 0
    inf_mismatch: int = 0
    cosine: float | None = None
    max_ulp: int | None = None
    atol_to_pass: float = 0.0
    rtol_to_pass: float = 0.0

    @property
    def within_tolerance(self) -> bool:
        return self.status in ("equal", "close")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["max_abs_index"] = list(self.max_abs_index) if self.max_abs_index is not None else None
        return d


def compare(a, b, rtol: float = DEFAULT_RTOL, atol: float = DEFAULT_ATOL) -> Metrics:
    """Metrics of `b` against `a`; sequences are compared element by element (worst one kept)."""
    if a is EMPTY or b is EMPTY or a is None or b is None:
        return Metrics("equal") if a is b else Metrics(
            "mismatch", f"{describe(a)} vs {describe(b)}")
    if isinstance(a, list) or isinstance(b, list):
        return _compare_sequences(a, b, rtol, atol)
    if isinstance(a, dict) or isinstance(b, dict):
        if not (isinstance(a, dict) and isinstance(b, dict)) or a.keys() != b.keys():
            return Metrics("mismatch", f"{describe(a)} vs {describe(b)}")
        return _worst([compare(a[k], b[k], rtol, atol) for k in a])
    if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
        return Metrics("mismatch", f"{describe(a)} vs {describe(b)}")
    if a.dtype != b.dtype and not (a.dtype.kind in "OUS" and b.dtype.kind in "OUS"):
        return Metrics("mismatch", f"dtype {a.dtype} vs {b.dtype}", size=a.size)
    if a.shape != b.shape:
        return Metrics("mismatch", f"shape {list(a.shape)} vs {list(b.shape)}", size=a.size)
    if is_float(a.dtype) or a.dtype.kind == "c":
        if _bitwise_equal(a, b):
            return Metrics("equal", size=a.size, cosine=1.0 if a.size else None,
                           max_ulp=0 if a.size else None)
        return _compare_floats(a, b, rtol, atol)
    return _compare_exact(a, b)


def _bitwise_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """The common case, answered cheaply: the same bits everywhere."""
    if a.dtype.itemsize not in (1, 2, 4, 8):
        return False
    unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    return bool(np.array_equal(np.ascontiguousarray(a).view(unsigned),
                               np.ascontiguousarray(b).view(unsigned)))


def _compare_sequences(a, b, rtol, atol) -> Metrics:
    if not (isinstance(a, list) and isinstance(b, list)):
        return Metrics("mismatch", f"{describe(a)} vs {describe(b)}")
    if len(a) != len(b):
        return Metrics("mismatch", f"sequence length {len(a)} vs {len(b)}")
    return _worst([compare(x, y, rtol, atol) for x, y in zip(a, b)])


def _worst(parts: list[Metrics]) -> Metrics:
    if not parts:
        return Metrics("equal")
    order = {"equal": 0, "close": 1, "diverged": 2, "mismatch": 3}
    return max(parts, key=lambda m: (order[m.status], m.max_abs))


def _compare_exact(a: np.ndarray, b: np.ndarray) -> Metrics:
    if a.dtype.kind in "OUS":
        a, b = a.astype(str), b.astype(str)
    elif a.dtype.kind == "V":  # int4/uint4
        a, b = a.astype(np.int16), b.astype(np.int16)
    differ = a != b
    n = int(np.count_nonzero(differ))
    if n == 0:
        return Metrics("equal", size=a.size)
    first = tuple(int(i) for i in np.argwhere(differ)[0])
    detail = f"{n} of {a.size} values differ; first at {list(first)}: {b[first]!r} vs {a[first]!r}"
    m = Metrics("diverged", detail, size=a.size, out_of_tolerance=n, max_abs_index=first)
    if a.dtype.kind in "iub":
        err = np.abs(a.astype(np.float64) - b.astype(np.float64))
        m.max_abs = float(err.max())
        m.max_abs_index = tuple(int(i) for i in np.unravel_index(int(err.argmax()), a.shape))
    return m


def _compare_floats(a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> Metrics:
    x, y = _wide(a).reshape(-1), _wide(b).reshape(-1)
    nan_x, nan_y = np.isnan(x), np.isnan(y)
    inf_x, inf_y = np.isinf(x), np.isinf(y)
    nan_mismatch = int(np.count_nonzero(nan_x != nan_y))
    # An infinity matches only the same infinity.
    inf_mismatch = int(np.count_nonzero((inf_x | inf_y) & ~(nan_x | nan_y) & (x != y)))
    finite = ~(nan_x | nan_y | inf_x | inf_y)
    all_finite = bool(finite.all())
    err = np.abs(x - y) if all_finite else np.where(finite, np.abs(x - y), 0.0)
    scale = np.abs(x)
    out = int(np.count_nonzero(err > atol + rtol * scale)) + nan_mismatch + inf_mismatch
    m = Metrics("close" if out == 0 else "diverged", size=a.size, out_of_tolerance=out,
                nan_mismatch=nan_mismatch, inf_mismatch=inf_mismatch)
    if a.size == 0:
        return m
    i = int(np.argmax(err))
    m.max_abs = float(err[i])
    m.max_abs_index = tuple(int(k) for k in np.unravel_index(i, a.shape))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        rel = np.where(err > 0, err / scale, 0.0)
    m.max_rel = float(rel.max())
    finite_err = err if all_finite else err[finite]
    if finite_err.size:
        m.mean_abs = float(finite_err.mean())
        m.median_abs, m.p99_abs = (float(v) for v in np.percentile(finite_err, [50, 99]))
    m.cosine = _cosine(x if all_finite else x[finite], y if all_finite else y[finite])
    m.max_ulp = _max_ulp(a.reshape(-1), b.reshape(-1), finite)
    m.atol_to_pass = float(max(0.0, np.max(err - rtol * scale)))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        m.rtol_to_pass = float(np.max(np.where(err > atol, (err - atol) / scale, 0.0)))
    if out:
        m.detail = (f"{out} of {a.size} values out of tolerance; max abs error {m.max_abs:.3g} "
                    f"at {list(m.max_abs_index)}")
    return m


def _wide(a: np.ndarray) -> np.ndarray:
    return a.astype(np.complex128) if a.dtype.kind == "c" else a.astype(np.float64)


def _cosine(x: np.ndarray, y: np.ndarray) -> float | None:
    if x.size == 0 or x.dtype.kind == "c":
        return None
    nx, ny = np.sqrt(np.einsum("i,i->", x, x)), np.sqrt(np.einsum("i,i->", y, y))
    if nx == 0 or ny == 0:
        return 1.0 if nx == ny else 0.0
    return float(np.clip(np.einsum("i,i->", x, y) / (nx * ny), -1.0, 1.0))


def _max_ulp(a: np.ndarray, b: np.ndarray, finite: np.ndarray) -> int | None:
    """Largest number of representable values between a and b, over finite pairs."""
    if a.dtype.kind == "c" or not finite.any():
        return None
    return int(np.max(np.abs(ordered_bits(a)[finite] - ordered_bits(b)[finite])))


def ordered_bits(a: np.ndarray) -> np.ndarray:
    """Integers in the order of the float values they encode (sign-magnitude to two's complement)."""
    bits = _float_bits(a.dtype)
    unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    raw = a.view(unsigned).astype(np.int64) if bits < 64 else a.view(np.int64)
    if bits == 64:
        return np.where(raw < 0, -(raw & 0x7FFFFFFFFFFFFFFF), raw)
    raw &= (1 << bits) - 1
    sign = raw >> (bits - 1)
    magnitude = raw & ((1 << (bits - 1)) - 1)
    return np.where(sign == 1, -magnitude, magnitude)


def _float_bits(dtype) -> int:
    if dtype.kind == "f":
        return np.finfo(dtype).bits
    return ml_dtypes.finfo(dtype).bits
