"""Pairing the values of two runs: by name first, then by structure for renamed or fused values.

The structural pass is an edit distance between the leftover records of each side, in the
order produced, over (kind, dtype, shape, op type, value signature); insertions and deletions
cost 1, so values only one side has do not pull the rest out of line."""
from __future__ import annotations

from dataclasses import dataclass

MATCHED, APPROX, ONLY_A, ONLY_B, FUSED = "matched", "approx", "only-A", "only-B", "fused"
MARKERS = {MATCHED: "=", APPROX: "~", ONLY_A: "-", ONLY_B: "+", FUSED: "f"}
FUSED_OPS = {"FusedConv", "FusedGemm", "FusedMatMul", "SkipLayerNormalization", "FastGelu",
             "BiasGelu", "Attention", "MultiHeadAttention", "LayerNormalization", "Gelu",
             "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization", "GroupQueryAttention",
             "QuickGelu", "BiasAdd", "BiasSoftmax"}


@dataclass
class Pair:
    """One row of the alignment: a record of A, of B, or both."""

    status: str
    a: object = None  # Record
    b: object = None
    fused_into: str = ""

    @property
    def marker(self) -> str:
        return MARKERS[self.status]


def align(records_a: list, records_b: list, model_a=None, model_b=None) -> list[Pair]:
    """Rows in A's order, with B-only rows placed after the row B produced them after.

    Name matches come first; then values that a rewrite in B fused away (or B-only constants
    it made for a fused node) are marked; what is left is aligned by edit distance."""
    keys_b = {r.key: r for r in records_b}
    keys_a = {r.key for r in records_a}
    matched = {r.key: Pair(MATCHED, r, keys_b[r.key]) for r in records_a if r.key in keys_b}
    left_a = [r for r in records_a if r.key not in keys_b]
    left_b = [r for r in records_b if r.key not in keys_a]
    fused_a, fused_b = fused_values(model_a, model_b, left_a, left_b)
    structural = {}
    for ra, rb in _edit_alignment([r for r in left_a if r.key not in fused_a],
                                  [r for r in left_b if r.key not in fused_b]):
        if ra is not None and rb is not None:
            structural[ra.key] = Pair(APPROX, ra, rb)
    paired_b = {p.b.key for p in structural.values()}
    rows = []
    for r in records_a:
        pair = matched.get(r.key) or structural.get(r.key)
        if pair is None:
            pair = Pair(FUSED, r, fused_into=fused_a[r.key]) if r.key in fused_a else Pair(ONLY_A, r)
        rows.append(pair)
    extra = [r for r in left_b if r.key not in paired_b]
    return _place_only_b(rows, extra, records_b, fused_b)


def _place_only_b(rows: list[Pair], only_b: list, records_b: list, fused_b: dict) -> list[Pair]:
    """Insert each B-only record after the last row whose B record precedes it."""
    if not only_b:
        return rows
    position = {}  # B index -> row index
    for i, p in enumerate(rows):
        if p.b is not None:
            position[p.b.index] = i
    inserts: dict[int, list] = {}
    last_row = -1
    pending = {r.key for r in only_b}
    for rb in records_b:
        if rb.index in position:
            last_row = position[rb.index]
        elif rb.key in pending:
            pair = (Pair(FUSED, None, rb, fused_into=fused_b[rb.key]) if rb.key in fused_b
                    else Pair(ONLY_B, None, rb))
            inserts.setdefault(last_row, []).append(pair)
    out = list(inserts.get(-1, []))
    for i, p in enumerate(rows):
        out.append(p)
        out.extend(inserts.get(i, []))
    return out


def substitution_cost(ra, rb) -> float:
    """Up to APPROX_LIMIT for look-alikes; 2 (a deletion plus an insertion) for values that
    cannot be the same: other type, or contents too far apart (a constant must be the same)."""
    if ra.dtype != rb.dtype or ra.shape != rb.shape or ra.type != rb.type:
        return 2.0
    sig = signature_distance(ra.signature, rb.signature)
    constant = ra.kind == "initializer" or rb.kind == "initializer"
    if sig > (0.01 if constant else 0.1):
        return 2.0
    cost = sig
    if ra.kind != rb.kind:
        cost += 0.3
    if ra.op_type != rb.op_type:
        cost += 0.3
    if ra.path != rb.path:
        cost += 0.2
    return cost


def signature_distance(sa: tuple, sb: tuple) -> float:
    if not sa or not sb:
        return 0.0 if sa == sb else 0.5
    d = 0.0
    for x, y in zip(sa, sb):
        d += min(1.0, abs(x - y) / (abs(x) + abs(y) + 1e-12))
    return d / len(sa)


APPROX_LIMIT = 0.8  # a substitution dearer than this is not called a match


def _edit_alignment(left_a: list, left_b: list) -> list[tuple]:
    """Levenshtein alignment of two record lists: (a, b) pairs, (a, None) and (None, b)."""
    n, m = len(left_a), len(left_b)
    if n == 0 or m == 0:
        return [(r, None) for r in left_a] + [(None, r) for r in left_b]
    dist = [[0.0] * (m + 1) for _ in range(n + 1)]
    for i in range(1, n + 1):
        dist[i][0] = float(i)
    for j in range(1, m + 1):
        dist[0][j] = float(j)
    for i in range(1, n + 1):
        ra = left_a[i - 1]
        row, prev = dist[i], dist[i - 1]
        for j in range(1, m + 1):
            sub = substitution_cost(ra, left_b[j - 1])
            row[j] = min(prev[j] + 1.0, row[j - 1] + 1.0,
                         prev[j - 1] + (sub if sub <= APPROX_LIMIT else 2.0))
    pairs = []
    i, j = n, m
    while i > 0 or j > 0:
        if i > 0 and j > 0:
            sub = substitution_cost(left_a[i - 1], left_b[j - 1])
            if sub <= APPROX_LIMIT and dist[i][j] == dist[i - 1][j - 1] + sub:
                pairs.append((left_a[i - 1], left_b[j - 1]))
                i, j = i - 1, j - 1
                continue
        if i > 0 and dist[i][j] == dist[i - 1][j] + 1.0:
            pairs.append((left_a[i - 1], None))
            i -= 1
        else:
            pairs.append((None, left_b[j - 1]))
            j -= 1
    return pairs[::-1]


def fused_values(model_a, model_b, left_a: list, left_b: list) -> tuple[dict, dict]:
    """Keys of A-only values computed inside a B node that replaced A's computation (a fused
    op, or a node whose output A makes with another op), and of B-only constants such a node
    reads (folded weights), each with the name of that node."""
    if model_a is None or model_b is None:
        return {}, {}
    producers_a = {o: n for n in model_a.graph.node for o in n.output}
    only_a = {r.name: r.key for r in left_a if not r.path}
    only_b = {r.name: r.key for r in left_b if not r.path and r.kind == "initializer"}
    fused_a, fused_b = {}, {}
    for node_b in model_b.graph.node:
        outs = [o for o in node_b.output if o in producers_a]
        if not outs:
            continue
        if node_b.op_type not in FUSED_OPS and all(
                producers_a[o].op_type == node_b.op_type for o in outs):
            continue
        label = f"{node_b.name or '?'} ({node_b.op_type})"
        for name in _values_between(set(node_b.input), outs, producers_a):
            if name in only_a:
                fused_a.setdefault(only_a[name], label)
        for name in node_b.input:
            if name in only_b:
                fused_b.setdefault(only_b[name], label)
    _mark_folded_constants(model_a, model_b, only_a, fused_a)
    return fused_a, fused_b


def _mark_folded_constants(model_a, model_b, only_a: dict, fused_a: dict) -> None:
    """A-only initializers that B no longer needs: every value read from them became a B
    initializer (constant folding), or nothing read them (dead code)."""
    consumers = {}
    for node in model_a.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    b_constants = {i.name for i in model_b.graph.initializer}
    for init in model_a.graph.initializer:
        key = only_a.get(init.name)
        if key is None or key in fused_a:
            continue
        readers = consumers.get(init.name, [])
        if not readers:
            fused_a[key] = "nothing (unused, removed)"
        elif all(o in b_constants for n in readers for o in n.output if o):
            fused_a[key] = "a constant (folded)"


def _values_between(inputs: set, outputs: list, producers: dict) -> set:
    """Values computed on the way from `inputs` to `outputs` (walking producers backwards),
    with the constants and initializers read on the way."""
    seen, stack = set(), list(outputs)
    while stack:
        name = stack.pop()
        if name in seen or name in inputs:
            continue
        seen.add(name)
        if name in producers:
            stack.extend(i for i in producers[name].input if i)
    return seen - set(outputs)
