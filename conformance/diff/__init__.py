"""Execution diff: find the node where two executions part, and whether the error was made
there or inherited.

>>> from conformance.diff import diff_models
>>> report = diff_models("model.onnx")                 # reference vs optimized
>>> report.first_made                                  # the first node where error is made
"""
from .api import diff_models
from .metrics import Metrics, compare
from .report import DiffReport, Row
from .sides import (
    OnnxruntimeSide,
    OptimizedSide,
    ReferenceSide,
    SavedRunSide,
    Side,
    make_side,
    save_run,
)

__all__ = [
    "DiffReport",
    "Metrics",
    "OnnxruntimeSide",
    "OptimizedSide",
    "ReferenceSide",
    "Row",
    "SavedRunSide",
    "Side",
    "compare",
    "diff_models",
    "make_side",
    "save_run",
]
