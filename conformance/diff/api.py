"""diff_models: run two sides, align their values, measure, attribute, and report."""
from __future__ import annotations

import os

from conformance.inputs import load_inputs, random_inputs
from reference.errors import InvalidFeedError, InvalidModelError, UnsupportedOpError

from .align import align
from .attribution import MADE, MADE_INSIDE, Attributor
from .capture import Capture, ValueStore
from .metrics import DEFAULT_ATOL, DEFAULT_RTOL, compare
from .report import DiffReport, Row
from .repro import node_feeds, node_input_names, node_model, write_repro
from .sides import Side, SideError, make_side, save_run


def diff_models(a, b=None, *, side_a: str = "reference", side_b: str | None = None,
                feeds: dict | None = None, inputs: str | None = None, dims: dict | None = None,
                seed: int = 0, rtol: float = DEFAULT_RTOL, atol: float = DEFAULT_ATOL,
                keep: bool = False, attribute: bool = True, extract: str | None = None,
                save_run_to: str | None = None, level: int = 99) -> DiffReport:
    """Compare two executions value by value.

    `a` and `b` are models (path, bytes or ModelProto) or Side objects. With one model, side A
    runs it with `side_a` and side B with `side_b` (default "optimized"); with two models both
    run with `side_a` unless `side_b` says otherwise. Feeds come from `feeds`, from `inputs`
    (.npz or a folder of input_N.pb), or are seeded random values (`seed`, symbolic `dims`).
    `keep` keeps every tensor in the report (report.values_a / values_b); otherwise tensors are
    spilled to a temporary folder and dropped at the end. `extract` writes a repro of the first
    node where error is made; `save_run_to` saves side A's run for a later `--against-run`."""
    sa = a if isinstance(a, Side) else make_side(side_a, a, level)
    if isinstance(b, Side):
        sb = b
    elif b is None:
        if sa.model is None:
            raise ValueError("side A has no model to run on side B; give b")
        sb = make_side(side_b or "optimized", getattr(sa, "original", sa.model), level)
    else:
        sb = make_side(side_b or side_a, b, level)
        for side, model in ((sa, a), (sb, b)):  # two models: say which is which
            if isinstance(model, (str, os.PathLike)):
                side.label = f"{side.label} {os.path.basename(model)}"
    feeds = _feeds(sa, sb, feeds, inputs, dims, seed)
    cap_a = Capture(sa.label, store=ValueStore(spill=not keep))
    cap_b = Capture(sb.label, store=ValueStore(spill=not keep))
    try:
        for name, kind, value, path, node in _values(sa, feeds):
            cap_a.add(name, kind, value, path, node)
        metrics = _capture_against(sb, feeds, cap_b, cap_a, keep, rtol, atol)
        if save_run_to:
            save_run(cap_a, save_run_to)
        report = _compare(sa, sb, cap_a, cap_b, metrics, rtol, atol, attribute)
        if extract and report.first_made is not None:
            report.repro = _extract(extract, report.first_made, report, sa, sb, cap_a, cap_b)
        if keep:
            report.values_a = {r.key: cap_a.value(r.key) for r in cap_a.records}
            report.values_b = {r.key: cap_b.value(r.key) for r in cap_b.records}
    finally:
        cap_a.store.close()
        cap_b.store.close()
    return report


def _feeds(sa, sb, feeds, inputs, dims, seed) -> dict:
    if feeds is not None and inputs is not None:
        raise ValueError("give feeds or inputs, not both")
    if feeds is not None:
        return dict(feeds)
    model = sa.model if sa.model is not None else sb.model
    if inputs is not None:
        if not os.path.exists(inputs):
            raise ValueError(f"inputs not found: {inputs}")
        return load_inputs(inputs, _Names(sa.input_names() if sa.model is not None
                                          else sb.input_names()))
    if model is None:
        raise ValueError("two saved runs: nothing to run, so no inputs to make")
    return random_inputs(model, seed, dims)


class _Names:
    def __init__(self, names):
        self.input_names = names


def _values(side, feeds):
    """The side's values; a failure to run says which side failed. A model or feeds the side
    cannot take stay usage errors (ValueError, InvalidModelError, UnsupportedOpError), named by
    the side, which names its model when there are two."""
    try:
        yield from side.values(feeds)
    except InvalidFeedError as e:
        raise InvalidFeedError(f"side {side.label!r}: {e}") from e
    except ValueError as e:
        raise ValueError(f"side {side.label!r}: {e}") from e
    except (SideError, InvalidModelError, UnsupportedOpError):
        raise
    except Exception as e:  # any backend's failure, reported with its side
        raise SideError(f"side {side.label!r} failed: {type(e).__name__}: {e}") from e


def _capture_against(side, feeds, cap, cap_a, keep, rtol, atol) -> dict:
    """Capture side B, comparing each value with A's of the same name as it comes, so that
    only values A lacks (or all, with keep) are held for later."""
    hold_all = keep or not side.can_rerun  # attribution then re-runs A's nodes on B's values
    metrics = {}
    for name, kind, value, path, node in _values(side, feeds):
        key = (tuple(path), name)
        in_a = key in cap_a.by_key
        differs = False
        if in_a and key not in metrics:
            metrics[key] = compare(cap_a.value(key), value, rtol, atol)
            differs = not metrics[key].within_tolerance
        # A differing initializer goes into the repro of the node that reads it.
        hold = hold_all or not in_a or (differs and kind == "initializer")
        cap.add(name, kind, value, path, node, keep_value=hold)
    return metrics


def _compare(sa, sb, cap_a, cap_b, metrics, rtol, atol, attribute) -> DiffReport:
    pairs = align(cap_a.records, cap_b.records, sa.model, sb.model)
    rows = []
    for pair in pairs:
        m = None
        if pair.a is not None and pair.b is not None:
            m = metrics.get(pair.b.key) if pair.a.key == pair.b.key else None
            if m is None:
                m = compare(cap_a.value(pair.a.key), cap_b.value(pair.b.key), rtol, atol)
        rows.append(Row(pair=pair, metrics=m))
    report = DiffReport(label_a=sa.label, label_b=sb.label, rows=rows, rtol=rtol, atol=atol)
    if attribute:
        _attribute(report, Attributor(sa, sb, cap_a, cap_b, pairs, rtol, atol))
    return report


def _attribute(report: DiffReport, attributor: Attributor) -> None:
    """Attribute every divergent row; a node whose subgraph made an error says so."""
    made_paths = []
    for row in report.rows:
        if row.metrics is None or row.metrics.within_tolerance:
            continue
        verdict = attributor.verdict(row.pair)
        ra = row.pair.a
        if verdict == MADE and ra.node is not None and _subgraph_made(ra, made_paths):
            verdict = MADE_INSIDE
        row.verdict = verdict
        attributor.verdicts[ra.key] = verdict
        row.bound_used = attributor.shares.get(ra.key)
        row.note = attributor.notes.get(ra.key, "")
        if verdict == MADE:
            made_paths.append(ra.path)


def _subgraph_made(rec, made_paths) -> bool:
    inner = rec.path + (rec.node.name or rec.node.op_type,)
    return any(p[:len(inner)] == inner for p in made_paths)


def _extract(directory, row, report, sa, sb, cap_a, cap_b) -> dict:
    """Repro of the first node where error is made; for a source value (an initializer), of the
    first divergent node that reads it."""
    if row.pair.a.node is None:
        row = _first_reader(report, row) or row
    ra, rb = row.pair.a, row.pair.b
    if ra.node is None:
        return {}
    values_a, inits_a = _node_values(ra, cap_a)
    model_a = node_model(ra.node, values_a, sa.model.opset_import, sa.model.ir_version, inits_a)
    model_b = None
    if rb is not None and rb.node is not None and sb.model is not None:
        _, inits_b = _node_values(rb, cap_b, fallback=cap_a)
        model_b = node_model(rb.node, values_a, sb.model.opset_import, sb.model.ir_version,
                             inits_b)
    info = {"node": ra.node_name, "op_type": ra.op_type, "where": ra.where,
            "side_a": _side_kind(sa), "side_b": _side_kind(sb),
            "max_abs": row.metrics.max_abs if row.metrics else None}
    return write_repro(directory, model_a, model_b, node_feeds(model_a, values_a), info)


def _first_reader(report, source_row):
    name, path = source_row.pair.a.name, source_row.pair.a.path
    for row in report.rows:
        ra = row.pair.a
        if (ra is not None and ra.node is not None and row.metrics is not None
                and not row.metrics.within_tolerance and ra.path[:len(path)] == path
                and name in node_input_names(ra.node)):
            return row
    return None


def _node_values(rec, cap, fallback=None) -> tuple[dict, dict]:
    """Values a node reads on its own side, and which of them are initializers. A value the
    side did not hold (because it equals A's) comes from `fallback`."""
    values, inits = {}, {}
    for name in node_input_names(rec.node):
        src = cap.find(name, rec.path)
        if src is None:
            continue
        values[name] = cap.value(src.key)
        if values[name] is None and fallback is not None:
            values[name] = fallback.value(src.key)
        if src.kind == "initializer":
            inits[name] = values[name]
    return values, inits


def _side_kind(side) -> str:
    from .sides import OnnxruntimeSide, OptimizedSide

    if isinstance(side, OptimizedSide):
        return "optimized"
    if isinstance(side, OnnxruntimeSide):
        return "onnxruntime"
    return "reference"

