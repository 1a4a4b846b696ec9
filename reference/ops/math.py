"""Elementwise arithmetic: Add, Sub, Mul, Div, Abs, Neg, ... (placeholder seed; see issue 3)."""
import numpy as np

from ..registry import op


@op("Add", 1)
def add(a, b, **legacy):
    return np.add(a, b)
