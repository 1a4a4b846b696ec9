"""The comparison policy of the onnx backend runner, with NaN == NaN and containers recursive.

Floats (every floating dtype, ml_dtypes included) use allclose(rtol, atol); integers, bools
and strings compare exactly; dtype and shape must match exactly.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from reference.dtypes import is_float
from reference.values import EMPTY, describe

DEFAULT_RTOL = 1e-3
DEFAULT_ATOL = 1e-7


@dataclass(frozen=True)
class Tolerance:
    rtol: float = DEFAULT_RTOL
    atol: float = DEFAULT_ATOL


class Mismatch(AssertionError):
    """Expected and actual differ; the message says where and how."""


def _float_view(a: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "c":
        return a
    return a.astype(np.float64)


def compare_tensor(expected: np.ndarray, actual, tol: Tolerance, where: str) -> None:
    if not isinstance(actual, np.ndarray):
        raise Mismatch(f"{where}: expected a tensor {describe(expected)}, got {describe(actual)}")
    if expected.dtype != actual.dtype:
        same_strings = expected.dtype.kind in "OUS" and actual.dtype.kind in "OUS"
        if not same_strings:
            raise Mismatch(f"{where}: dtype {actual.dtype} != expected {expected.dtype}")
    if expected.shape != actual.shape:
        raise Mismatch(f"{where}: shape {list(actual.shape)} != expected {list(expected.shape)}")
    if expected.dtype.kind in "OUS":
        exp = np.vectorize(_as_text, otypes=[object])(expected) if expected.size else expected
        act = np.vectorize(_as_text, otypes=[object])(actual) if actual.size else actual
        bad = np.argwhere(exp != act) if exp.size else []
        if len(bad):
            idx = tuple(int(i) for i in bad[0])
            raise Mismatch(f"{where}: strings differ at {list(idx)}: {act[idx]!r} != {exp[idx]!r}")
        return
    if is_float(expected.dtype) or expected.dtype.kind == "c":
        exp, act = _float_view(expected), _float_view(actual)
        close = np.isclose(act, exp, rtol=tol.rtol, atol=tol.atol, equal_nan=True)
        if not close.all():
            bad = np.argwhere(~close)
            idx = tuple(int(i) for i in bad[0])
            err = np.abs(act - exp)
            raise Mismatch(
                f"{where}: {len(bad)} of {exp.size} values differ beyond rtol={tol.rtol}, "
                f"atol={tol.atol}; first at {list(idx)}: {act[idx]} != {exp[idx]}; "
                f"max abs error {np.nanmax(err) if err.size else 0}"
            )
        return
    exp, act = expected.view(np.uint8) if expected.dtype.itemsize == 0 else expected, actual
    if expected.dtype.kind == "V":  # int4/uint4 from ml_dtypes compare as integers
        exp, act = expected.astype(np.int16), actual.astype(np.int16)
    if not np.array_equal(exp, act):
        bad = np.argwhere(exp != act)
        idx = tuple(bad[0])
        raise Mismatch(f"{where}: {len(bad)} values differ; first at {list(idx)}: {act[idx]} != {exp[idx]}")


def _as_text(s):
    return s.decode("utf-8", errors="surrogateescape") if isinstance(s, bytes) else str(s)


def compare_values(expected, actual, tol: Tolerance = Tolerance(), where: str = "output") -> None:
    """Raise Mismatch unless `actual` matches `expected` under the policy."""
    if expected is None or expected is EMPTY:
        if actual is not None and actual is not EMPTY:
            raise Mismatch(f"{where}: expected an empty optional, got {describe(actual)}")
        return
    if isinstance(expected, np.generic):
        expected = np.asarray(expected)
    if isinstance(expected, np.ndarray):
        compare_tensor(expected, actual, tol, where)
    elif isinstance(expected, list):
        if not isinstance(actual, list):
            raise Mismatch(f"{where}: expected a sequence, got {describe(actual)}")
        if len(expected) != len(actual):
            raise Mismatch(f"{where}: sequence length {len(actual)} != expected {len(expected)}")
        for i, (e, a) in enumerate(zip(expected, actual)):
            compare_values(e, a, tol, f"{where}[{i}]")
    elif isinstance(expected, dict):
        if not isinstance(actual, dict):
            raise Mismatch(f"{where}: expected a map, got {describe(actual)}")
        if set(expected) != set(actual):
            raise Mismatch(f"{where}: map keys {sorted(actual)} != expected {sorted(expected)}")
        for k in expected:
            compare_values(np.asarray(expected[k]), np.asarray(actual[k]), tol, f"{where}[{k!r}]")
    else:
        raise Mismatch(f"{where}: cannot compare a {type(expected).__name__}")


def compare_outputs(expected: list, actual: list, tol: Tolerance = Tolerance(), names=None) -> None:
    if len(expected) != len(actual):
        raise Mismatch(f"{len(actual)} outputs != expected {len(expected)}")
    names = names or [f"output {i}" for i in range(len(expected))]
    for name, e, a in zip(names, expected, actual):
        compare_values(e, a, tol, name)
