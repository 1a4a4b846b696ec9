"""Was a node's error made there, or inherited from its inputs?

Side B's node is re-run on side A's inputs: if B's result still differs from A's, the error is
made at this node; if it agrees, the error came in with the inputs. When side B cannot re-run
a node (a saved run), side A's node is re-run on B's inputs instead: if that reproduces B's
result, the error was inherited."""
from __future__ import annotations

from .metrics import compare
from .repro import node_input_names

MADE, INHERITED, UNKNOWN, MADE_INSIDE = "made here", "inherited", "unknown", "made in subgraph"


class Attributor:
    def __init__(self, side_a, side_b, cap_a, cap_b, rows, rtol, atol):
        self.side_a, self.side_b = side_a, side_b
        self.cap_a, self.cap_b = cap_a, cap_b
        self.rtol, self.atol = rtol, atol
        self.b_to_a = {p.b.key: p.a.key for p in rows if p.a is not None and p.b is not None}
        self.a_to_b = {v: k for k, v in self.b_to_a.items()}
        self.notes: dict = {}

    def verdict(self, pair) -> str:
        """Attribution of one divergent row."""
        ra, rb = pair.a, pair.b
        kind = ra.kind
        if kind in ("initializer",) or (kind == "input" and not ra.path):
            return MADE
        if kind in ("input", "output"):  # a body input or pass-through output of a subgraph
            return INHERITED
        if self.side_b.can_rerun and rb.node is not None:
            return self._b_on_a_inputs(ra, rb)
        if self.side_a.can_rerun and ra.node is not None:
            return self._a_on_b_inputs(ra, rb)
        return UNKNOWN

    def _b_on_a_inputs(self, ra, rb) -> str:
        values = self._values(rb.node, rb.path, self.cap_b, self.b_to_a, self.cap_a)
        if values is None:
            return UNKNOWN
        try:
            outputs = self.side_b.rerun(rb.node, values)
        except Exception as e:  # noqa: BLE001 - reported as the reason attribution failed
            self.notes[ra.key] = f"re-run failed: {type(e).__name__}: {e}"
            return UNKNOWN
        m = compare(self.cap_a.value(ra.key), outputs.get(rb.name), self.rtol, self.atol)
        return INHERITED if m.within_tolerance else MADE

    def _a_on_b_inputs(self, ra, rb) -> str:
        values = self._values(ra.node, ra.path, self.cap_a, self.a_to_b, self.cap_b)
        if values is None:
            return UNKNOWN
        try:
            outputs = self.side_a.rerun(ra.node, values)
        except Exception as e:  # noqa: BLE001
            self.notes[ra.key] = f"re-run failed: {type(e).__name__}: {e}"
            return UNKNOWN
        m = compare(self.cap_b.value(rb.key), outputs.get(ra.name), self.rtol, self.atol)
        return INHERITED if m.within_tolerance else MADE

    def _values(self, node, path, own, own_to_other, other) -> dict | None:
        """Every name `node` reads, with the other side's value of it (None if one is missing)."""
        values = {}
        for name in node_input_names(node):
            rec = own.find(name, path)
            if rec is None or rec.key not in own_to_other:
                self.notes[(path, name)] = f"no counterpart for input {name!r}"
                return None
            value = other.value(own_to_other[rec.key])
            if value is None:
                return None
            values[name] = value
        return values
