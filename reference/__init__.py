"""Pure-NumPy reference evaluator for ONNX: every operator, readable against the spec."""
from .errors import InvalidFeedError, InvalidModelError, NodeError, UnsupportedOpError
from .evaluator import ReferenceEvaluator, Result
from .registry import op
from .values import EMPTY

__all__ = [
    "EMPTY",
    "InvalidFeedError",
    "InvalidModelError",
    "NodeError",
    "ReferenceEvaluator",
    "Result",
    "UnsupportedOpError",
    "op",
]
