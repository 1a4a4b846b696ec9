"""Errors raised by the reference evaluator; each says what is wrong and where."""
from __future__ import annotations


class ReferenceError_(Exception):
    """Base class of the evaluator's errors."""


class InvalidModelError(ReferenceError_):
    """The model cannot be loaded or fails validation."""


class InvalidFeedError(ReferenceError_, ValueError):
    """A feed is unknown, missing, or has the wrong type or shape."""


class UnsupportedOpError(ReferenceError_):
    """No implementation (direct or function body) exists for an operator."""


class NodeError(ReferenceError_):
    """A node failed; the message names the node, its op, domain and version."""

    def __init__(self, node, opset: int | None, cause: str):
        self.node = node
        self.opset = opset
        self.cause = cause
        domain = node.domain or "ai.onnx"
        where = f"node {node.name!r} ({domain}::{node.op_type}, opset {opset})"
        super().__init__(f"{where}: {cause}")
