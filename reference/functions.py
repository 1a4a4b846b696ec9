"""Schema function bodies, for function ops that have no direct implementation."""
from __future__ import annotations

import functools

import onnx.defs
from onnx import FunctionProto

from .types import value_type_proto


@functools.cache
def schema_for(op_type: str, opset: int, domain: str):
    try:
        return onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None


def has_function_body(schema, opset: int) -> bool:
    return bool(
        schema.has_function
        or schema.has_context_dependent_function
        or schema.function_opset_versions
        or schema.context_dependent_function_opset_versions
    )


def function_body_from_schema(schema, node, inputs, opset: int) -> FunctionProto | None:
    """The FunctionProto that defines `node` at `opset`, or None if the schema has none."""
    versions = [v for v in schema.function_opset_versions if v <= opset]
    if versions:
        body = FunctionProto()
        body.ParseFromString(schema.get_function_with_opset_version(max(versions)))
        return body
    versions = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
    if versions:
        input_types = [
            value_type_proto(v).SerializeToString() if v is not None else b"" for v in inputs
        ]
        raw = schema.get_context_dependent_function_with_opset_version(
            max(versions), node.SerializeToString(), input_types
        )
        if not raw:
            return None
        body = FunctionProto()
        body.ParseFromString(raw)
        return body
    return None
