"""The diff's error statistics, by their diff names: the one comparison lives in
reference.agreement. The diff screens values with its own rtol/atol (looser than the corpus's
atol, tighter in rtol) before judging divergent ones by the bound policy."""
from __future__ import annotations

from reference.agreement import Metrics, measure, ordered_bits  # noqa: F401

DEFAULT_RTOL = 1e-4
DEFAULT_ATOL = 1e-5


def compare(a, b, rtol: float = DEFAULT_RTOL, atol: float = DEFAULT_ATOL) -> Metrics:
    """Metrics of `b` against `a`; sequences are compared element by element (worst one kept)."""
    return measure(a, b, rtol, atol)
