"""The corpus policy, by its conformance names: the one comparison lives in
reference.agreement (the onnx backend runner's rule: exact dtype and shape, allclose rtol 1e-3,
atol 1e-7, NaN == NaN, strings and integers exact, containers recursive)."""
from reference.agreement import (  # noqa: F401
    DEFAULT_ATOL,
    DEFAULT_RTOL,
    Mismatch,
    Tolerance,
    compare_outputs,
    compare_tensor,
    compare_values,
)
