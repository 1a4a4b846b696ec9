"""Operator registry: op functions keyed by (domain, op_type), one entry per since-version.

An op is a plain function.  Node inputs arrive positionally (None for an absent optional
input), attributes as keyword arguments (the evaluator fills schema defaults), and graph
attributes as callable `Subgraph` objects.  A function that declares a keyword-only
parameter named `ctx` also receives an `OpContext`.  It returns one value, or a tuple of
values for a node with several outputs.
"""
from __future__ import annotations

import bisect
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# ai.onnx is spelled "" in models; "ai.onnx" is accepted as an alias.
DOMAIN_ALIASES = {"ai.onnx": ""}


@dataclass(frozen=True)
class OpImpl:
    domain: str
    op_type: str
    since: int
    fn: Callable[..., Any]
    wants_ctx: bool


@dataclass
class OpContext:
    """What an op may need beyond its inputs and attributes."""

    opset: int  # the model's opset for this op's domain
    node: Any  # NodeProto
    outputs: list[str]  # the node's output names ('' where an optional output is omitted)
    evaluator: Any = None
    extra: dict = field(default_factory=dict)

    @property
    def n_outputs(self) -> int:
        return len(self.outputs)


_OPS: dict[tuple[str, str], list[OpImpl]] = {}


def canonical_domain(domain: str) -> str:
    return DOMAIN_ALIASES.get(domain, domain)


def op(op_type: str, since: int = 1, domain: str = ""):
    """Register `fn` as `op_type` of `domain` from opset version `since` onwards.

    Register again with a later `since` only where the semantics change; versions that
    only widen type constraints share one function.
    """

    def register(fn):
        wants_ctx = "ctx" in inspect.signature(fn).parameters
        impl = OpImpl(canonical_domain(domain), op_type, since, fn, wants_ctx)
        impls = _OPS.setdefault((impl.domain, op_type), [])
        if any(i.since == since for i in impls):
            raise ValueError(f"{domain or 'ai.onnx'}::{op_type} since {since} registered twice")
        bisect.insort(impls, impl, key=lambda i: i.since)
        return fn

    return register


def lookup(domain: str, op_type: str, opset: int) -> OpImpl | None:
    """The implementation with the highest since-version <= opset, or None."""
    impls = _OPS.get((canonical_domain(domain), op_type), [])
    best = None
    for impl in impls:
        if impl.since <= opset:
            best = impl
    return best


def registered() -> dict[tuple[str, str], list[OpImpl]]:
    return {k: list(v) for k, v in _OPS.items()}
