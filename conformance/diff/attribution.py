"""Was a node's error made there, inherited from its inputs, or only rounding?

Side B's node is re-run on side A's inputs (constants only B has, such as the weights a
rewrite folded, come from B), and the same node is computed exactly: the reference op on
float64 inputs. Each side's result on those same inputs is judged against that exact value by
the bound policy of reference.agreement:

- either side past the error its node's arithmetic allows: the error is **made here**;
- both within their bounds: the node is right on both sides, so a difference at this row came
  in with the inputs. If some value upstream is itself made here or inherited, the row is
  **inherited**; if every difference upstream is rounding too, the row is **within bound**: a
  rounding difference, not a divergence.

When side B cannot re-run a node (a saved run), side A's node is re-run on B's inputs instead,
and B's value is judged against the exact value on B's inputs. An op without a written bound
falls back to the diff's rtol/atol: B's node on A's inputs agreeing with A means inherited."""
from __future__ import annotations

import numpy as np
from onnx import NodeProto, helper

from reference.agreement import judge, widen
from reference.bounds import rule_for
from reference.registry import canonical_domain
from reference.types import value_type_proto

from .metrics import compare
from .repro import node_feeds, node_input_names, node_model

MADE, INHERITED, UNKNOWN, MADE_INSIDE = "made here", "inherited", "unknown", "made in subgraph"
WITHIN = "within bound"
DIVERGENT_VERDICTS = (MADE, INHERITED, UNKNOWN, MADE_INSIDE)


class Attributor:
    def __init__(self, side_a, side_b, cap_a, cap_b, rows, rtol, atol):
        self.side_a, self.side_b = side_a, side_b
        self.cap_a, self.cap_b = cap_a, cap_b
        self.rtol, self.atol = rtol, atol
        self.b_to_a = {p.b.key: p.a.key for p in rows if p.a is not None and p.b is not None}
        self.a_to_b = {v: k for k, v in self.b_to_a.items()}
        self.notes: dict = {}
        self.verdicts: dict = {}  # A's record key -> verdict, as rows are attributed
        self.shares: dict = {}  # A's record key -> the larger share of its bound either side used

    def verdict(self, pair) -> str:
        """Attribution of one row that is out of the diff's tolerance."""
        ra, rb = pair.a, pair.b
        kind = ra.kind
        if kind in ("initializer",) or (kind == "input" and not ra.path):
            return MADE
        if kind in ("input", "output"):  # a body input or pass-through output of a subgraph
            return INHERITED
        if self.side_b.can_rerun and rb.node is not None:
            return self._rerun(ra, rb.node, rb.name, rb.path, self.side_b, self.cap_b, self.b_to_a,
                               self.cap_a, self.cap_a.value(ra.key))
        if self.side_a.can_rerun and ra.node is not None:
            return self._rerun(ra, ra.node, ra.name, ra.path, self.side_a, self.cap_a, self.a_to_b,
                               self.cap_b, self.cap_b.value(rb.key))
        return UNKNOWN

    def _rerun(self, ra, node, name, path, side, own, own_to_other, other, recorded) -> str:
        """Re-run `side`'s node on the other side's inputs and judge both results there."""
        values = self._values(node, path, own, own_to_other, other)
        if values is None:
            return UNKNOWN
        try:
            outputs = _rerun_node(side, node, values, name, recorded)
        except Exception as e:  # noqa: BLE001 - reported as the reason attribution failed
            self.notes[ra.key] = f"re-run failed: {type(e).__name__}: {e}"
            return UNKNOWN
        rerun = outputs.get(name)
        judged = self._judge(node, name, side, values, rerun, recorded)
        if judged is not None:
            self.shares[ra.key] = max(j.used for j in judged)
        if judged is None:  # no bound for this op: the diff's tolerance decides
            m = compare(recorded, rerun, self.rtol, self.atol)
            return INHERITED if m.within_tolerance else MADE
        ok_rerun, ok_recorded = judged
        if not (ok_rerun.ok and ok_recorded.ok):
            return MADE
        return INHERITED if self._upstream_divergent(ra) else WITHIN

    def _judge(self, node, name, side, values, rerun, recorded):
        """Both results for one output of `node` on the same inputs, judged against the exact
        value; None when the op has no written bound or the exact value cannot be had."""
        if rule_for(node) is None or side.model is None:
            return None
        if not all(isinstance(v, np.ndarray) for v in (rerun, recorded)):
            return None
        from .sides import ReferenceSide

        exact_side = ReferenceSide(side.model, label="exact")
        truth_dtype = np.float64
        try:
            truth = exact_side.rerun(node, {k: widen(v) for k, v in values.items()}).get(name)
        except Exception:  # noqa: BLE001 - no float64 path: the reference op in the node's types
            truth = None
        if not isinstance(truth, np.ndarray):
            try:
                truth = exact_side.rerun(node, values).get(name)
                truth_dtype = getattr(truth, "dtype", None)
            except Exception:  # noqa: BLE001
                return None
        if not isinstance(truth, np.ndarray) or truth.shape != recorded.shape:
            return None
        one = _with_only_output(node, name)
        inputs = [values.get(n) if n else None for n in node.input]
        opsets = {canonical_domain(o.domain): o.version for o in side.model.opset_import}
        opset = opsets.get(canonical_domain(node.domain), 0)
        slots = [None] * len(node.output)
        index = list(node.output).index(name)

        def at(value):
            out = list(slots)
            out[index] = value
            return out

        a = judge(one, opset, inputs, at(rerun), at(truth), truth_dtype=truth_dtype)
        b = judge(one, opset, inputs, at(recorded), at(truth), truth_dtype=truth_dtype)
        return a, b

    def _upstream_divergent(self, ra) -> bool:
        """Whether a value this row is computed from carries a divergence (made or inherited);
        values a rewrite fused away are looked through to what they were computed from."""
        seen = set()
        stack = list(node_input_names(ra.node)) if ra.node is not None else []
        while stack:
            name = stack.pop()
            rec = self.cap_a.find(name, ra.path)
            if rec is None or rec.key in seen:
                continue
            seen.add(rec.key)
            verdict = self.verdicts.get(rec.key)
            if verdict in DIVERGENT_VERDICTS:
                return True
            if rec.key not in self.a_to_b and rec.node is not None:  # no row of its own
                stack.extend(node_input_names(rec.node))
        return False

    def _values(self, node, path, own, own_to_other, other) -> dict | None:
        """Every name `node` reads, with the other side's value of it (None if one is missing).
        A constant only this side has (a weight its rewrite folded) is taken from this side."""
        values = {}
        for name in node_input_names(node):
            rec = own.find(name, path)
            if rec is None:
                self.notes[(path, name)] = f"no value for input {name!r}"
                return None
            if rec.key in own_to_other:
                value = other.value(own_to_other[rec.key])
            elif rec.kind == "initializer":
                value = own.value(rec.key)
            else:
                self.notes[(path, name)] = f"no counterpart for input {name!r}"
                return None
            if value is None:
                return None
            values[name] = value
        return values


def _rerun_node(side, node, values: dict, name: str, like) -> dict:
    """side.rerun, with the judged output typed like the value it is compared with: shape
    inference cannot type a contrib op's outputs, and a session refuses untyped outputs."""
    if side.model is None:
        return side.rerun(node, values)
    model = node_model(node, values, side.model.opset_import, side.model.ir_version)
    for out in model.graph.output:
        if out.name == name and not out.type.WhichOneof("value") and isinstance(like, np.ndarray):
            out.CopyFrom(helper.make_value_info(name, value_type_proto(like)))
    outputs = side.run_model(model, node_feeds(model, values))
    return {o.name: v for o, v in zip(model.graph.output, outputs)}


def _with_only_output(node, name) -> NodeProto:
    """A copy of `node` that declares only the output `name` (the others left out)."""
    one = NodeProto()
    one.CopyFrom(node)
    del one.output[:]
    one.output.extend([o if o == name else "" for o in node.output])
    return one
