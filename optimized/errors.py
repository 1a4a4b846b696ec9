"""onnxruntime's exception classes, under its names, raised where onnxruntime raises them.

Each class also subclasses the exception this package raised before, so that both an app's
`except InvalidArgument` (written for onnxruntime) and our own `except ValueError` or
`except InvalidModelError` catch it.
"""
from __future__ import annotations

import contextlib

from reference.errors import InvalidFeedError, InvalidModelError, NodeError, UnsupportedOpError


class Fail(NodeError, RuntimeError):
    """A node failed while running, or a run was refused (onnxruntime: FAIL).
    Fail(node, opset, cause) as NodeError, or Fail(message)."""

    def __init__(self, *args):
        if len(args) == 3:
            super().__init__(*args)
        else:
            Exception.__init__(self, *args)
            self.node, self.opset, self.cause = None, None, str(args[0]) if args else ""

    @classmethod
    def from_node_error(cls, error: NodeError) -> Fail:
        return cls(error.node, error.opset, error.cause)


class InvalidArgument(InvalidFeedError):
    """A feed, output name, option or bound value is wrong (onnxruntime: INVALID_ARGUMENT)."""


class NoSuchFile(FileNotFoundError):
    """The model file does not exist (onnxruntime: NO_SUCHFILE)."""


class NoModel(InvalidModelError):
    """No model was given (onnxruntime: NO_MODEL)."""


class EngineError(RuntimeError):
    """onnxruntime: ENGINE_ERROR; not raised here, defined so that except clauses work."""


class RuntimeException(RuntimeError):
    """onnxruntime: RUNTIME_EXCEPTION; not raised here, defined so that except clauses work."""


class InvalidProtobuf(InvalidModelError):
    """The model bytes or file do not parse as an ONNX ModelProto (onnxruntime: INVALID_PROTOBUF)."""


class ModelLoaded(RuntimeError):
    """onnxruntime: MODEL_LOADED; not raised here, defined so that except clauses work."""


class NotImplemented(UnsupportedOpError, NotImplementedError):
    """An operator or feature that this runtime does not implement (onnxruntime: NOT_IMPLEMENTED)."""


# The same class under a name that does not read as Python's NotImplemented constant.
NotImplementedFeature = NotImplemented


class InvalidGraph(InvalidModelError):
    """The model fails validation (onnxruntime: INVALID_GRAPH)."""


class EPFail(RuntimeError):
    """An execution provider failed (onnxruntime: EP_FAIL)."""


ALL = ["EPFail", "EngineError", "Fail", "InvalidArgument", "InvalidGraph", "InvalidProtobuf",
       "ModelLoaded", "NoModel", "NoSuchFile", "NotImplemented", "RuntimeException"]


def load_error(error: Exception) -> Exception:
    """The onnxruntime class for an error raised while loading or validating a model."""
    if isinstance(error, (FileNotFoundError,)) and not isinstance(error, NoSuchFile):
        return NoSuchFile(str(error))
    if isinstance(error, InvalidModelError) and not isinstance(
            error, (InvalidGraph, InvalidProtobuf, NoModel)):
        text = str(error)
        if text.startswith("cannot parse") or text.endswith(("is empty (0 bytes)", "not an ONNX model file")):
            return InvalidProtobuf(text)  # reference.loading's messages for what does not parse
        return InvalidGraph(text)
    return error


@contextlib.contextmanager
def as_load_errors():
    try:
        yield
    except (FileNotFoundError, InvalidModelError) as e:
        translated = load_error(e)
        if translated is e:
            raise
        raise translated from e


@contextlib.contextmanager
def as_run_errors():
    """Feed errors become InvalidArgument, node failures Fail, missing ops NotImplemented."""
    try:
        yield
    except (InvalidArgument, Fail, NotImplementedFeature):
        raise
    except InvalidFeedError as e:
        raise InvalidArgument(str(e)) from e
    except UnsupportedOpError as e:
        raise NotImplementedFeature(str(e)) from e
    except NodeError as e:
        raise Fail.from_node_error(e) from e
