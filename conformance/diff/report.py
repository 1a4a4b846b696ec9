"""The diff report: rows in A's topological order, and its console, JSON and HTML forms."""
from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, field

from .align import FUSED, ONLY_A, ONLY_B
from .attribution import INHERITED, MADE, MADE_INSIDE, WITHIN
from .metrics import Metrics

EXIT_OK, EXIT_DIVERGED = 0, 1


@dataclass
class Row:
    pair: object  # align.Pair
    metrics: Metrics | None = None
    verdict: str = ""  # attribution of a row out of tolerance
    note: str = ""
    bound_used: float | None = None  # the larger share of its error bound either side used

    @property
    def record(self):
        return self.pair.a if self.pair.a is not None else self.pair.b

    @property
    def out_of_tolerance(self) -> bool:
        return self.metrics is not None and not self.metrics.within_tolerance

    @property
    def diverged(self) -> bool:
        """Out of tolerance, and not explained by rounding within both sides' error bounds."""
        return self.out_of_tolerance and self.verdict != WITHIN

    @property
    def status(self) -> str:
        """What the row says at a glance."""
        if self.pair.status == FUSED:
            return f"fused into {self.pair.fused_into}"
        if self.pair.status in (ONLY_A, ONLY_B):
            return self.pair.status
        if self.metrics is None:
            return ""
        if self.verdict == WITHIN:
            return f"{WITHIN} ({self.bound_used:.0%} used)" if self.bound_used is not None \
                else WITHIN
        if self.diverged:
            head = self.metrics.status if self.metrics.status == "mismatch" else "diverged"
            return f"{head}, {self.verdict}" if self.verdict else head
        return self.metrics.status

    def to_dict(self) -> dict:
        rec = self.record
        d = {
            "alignment": self.pair.status, "marker": self.pair.marker, "kind": rec.kind,
            "name": rec.name, "where": rec.where, "dtype": rec.dtype or rec.type,
            "shape": list(rec.shape) if rec.shape is not None else None, "op_type": rec.op_type,
            "node": rec.node_name, "is_output": rec.is_output,
            "name_b": self.pair.b.name if self.pair.b is not None else None,
            "op_type_b": self.pair.b.op_type if self.pair.b is not None else None,
            "fused_into": self.pair.fused_into or None, "verdict": self.verdict or None,
            "status": self.status, "note": self.note or None, "bound_used": self.bound_used,
            "metrics": self.metrics.to_dict() if self.metrics is not None else None,
        }
        return d


@dataclass
class DiffReport:
    label_a: str
    label_b: str
    rows: list
    rtol: float
    atol: float
    repro: dict = field(default_factory=dict)
    values_a: dict | None = None  # with keep=True: every tensor by record key
    values_b: dict | None = None

    @property
    def divergent(self) -> list[Row]:
        return [r for r in self.rows if r.diverged]

    @property
    def first_divergence(self) -> Row | None:
        return next(iter(self.divergent), None)

    @property
    def made_here(self) -> list[Row]:
        """Rows where error is made, in topological order (the first is where to look)."""
        return [r for r in self.rows if r.verdict == MADE]

    @property
    def first_made(self) -> Row | None:
        return next(iter(self.made_here), None)

    @property
    def inherited(self) -> list[Row]:
        return [r for r in self.rows if r.verdict == INHERITED]

    @property
    def within_bound(self) -> list[Row]:
        """Rows out of tolerance whose difference is rounding within both sides' bounds."""
        return [r for r in self.rows if r.verdict == WITHIN]

    @property
    def outputs_within_tolerance(self) -> bool:
        outputs = [r for r in self.rows if r.record.is_output and not r.record.path]
        return all(r.metrics is not None and not r.diverged for r in outputs)

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.outputs_within_tolerance else EXIT_DIVERGED

    def row(self, name: str, where: str = "") -> Row:
        for r in self.rows:
            if r.record.name == name and r.record.where == where:
                return r
        raise KeyError(f"no row for value {name!r} at {where or 'the main graph'!r}")

    def summary(self) -> str:
        first = self.first_divergence
        made = self.made_here
        compared = sum(r.metrics is not None for r in self.rows)
        rounding = self._rounding()
        if first is None:
            return (f"{self.label_a} and {self.label_b} agree on all {compared} compared values "
                    f"(rtol={self.rtol:g}, atol={self.atol:g}){rounding}{self._unpaired()}.")
        lines = [f"first divergence: {_label(first)}"]
        if made:
            names = ", ".join(_label(r) for r in made[:5]) + (" ..." if len(made) > 5 else "")
            lines.append(f"error made at {len(made)} node(s): {names}")
        lines.append(f"{len(self.divergent)} of {compared} compared values diverge, "
                     f"{len(self.inherited)} of them inherited{rounding}{self._unpaired()}; "
                     f"outputs {'within' if self.outputs_within_tolerance else 'out of'} tolerance")
        return "\n".join(lines)

    def _rounding(self) -> str:
        n = len(self.within_bound)
        if not n:
            return ""
        worst = max((r.bound_used for r in self.within_bound if r.bound_used is not None),
                    default=None)
        used = f", at most {worst:.0%} of a bound used" if worst is not None else ""
        return (f"; {n} more differ beyond rtol/atol only by rounding, within both sides' "
                f"error bounds{used}")

    def _unpaired(self) -> str:
        counts = {s: sum(r.pair.status == s for r in self.rows) for s in (FUSED, ONLY_A, ONLY_B)}
        words = {FUSED: "fused away", ONLY_A: "only in A", ONLY_B: "only in B"}
        parts = [f"{n} {words[s]}" for s, n in counts.items() if n]
        return f"; {', '.join(parts)}" if parts else ""

    def _notable_rows(self) -> list[Row]:
        """Divergent rows first (in order), then the graph outputs; values on one side only
        are counted in the summary line, not listed."""
        divergent = self.divergent
        listed = {id(r) for r in divergent}
        return divergent + [r for r in self.rows if _worth_showing(r) and id(r) not in listed]

    # forms -----------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        first = self.first_divergence
        return {
            "side_a": self.label_a, "side_b": self.label_b, "rtol": self.rtol, "atol": self.atol,
            "exit_code": self.exit_code,
            "first_divergence": first.to_dict() if first else None,
            "made_here": [_label(r) for r in self.made_here],
            "repro": self.repro or None,
            "rows": [r.to_dict() for r in self.rows],
        }

    def to_json(self, path: str | None = None) -> str:
        text = json.dumps(_strict(self.to_dict()), indent=1, default=_json_default,
                          allow_nan=False)
        if path:
            with open(path, "w") as f:
                f.write(text)
        return text

    def print(self, console=None, all_rows: bool = False, limit: int = 40) -> None:
        from rich.console import Console
        from rich.table import Table

        console = console or Console()
        table = Table(title=f"A: {self.label_a}   B: {self.label_b}   "
                            f"(rtol={self.rtol:g}, atol={self.atol:g})")
        for col in ("", "kind", "dtype", "shape", "op", "name", "max abs", "max rel", "verdict"):
            table.add_column(col, justify="right" if col.startswith("max") else "left")
        shown = self.rows if all_rows else self._notable_rows()
        for r in shown[:limit] if limit else shown:
            rec, m = r.record, r.metrics
            style = ("red" if r.verdict in (MADE, MADE_INSIDE) else "yellow" if r.diverged
                     else "dim" if r.pair.status in (FUSED,) else None)
            table.add_row(r.pair.marker, rec.kind, rec.dtype or rec.type, _shape(rec.shape),
                          rec.op_type, _qualified(rec), _num(m.max_abs) if m else "",
                          _num(m.max_rel) if m else "", r.status, style=style)
        console.print(table)
        if not all_rows and self._unpaired():
            console.print(f"not listed:{self._unpaired()[1:]} (see --all)")
        if limit and len(shown) > limit:
            console.print(f"... {len(shown) - limit} more rows (see --json or --html)")
        console.print(self.summary())
        if self.repro:
            console.print(f"repro: {' '.join(self.repro.get('command', [])) or self.repro}")

    def to_html(self, path: str | None = None) -> str:
        text = render_html(self)
        if path:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        return text

    def _repr_html_(self) -> str:
        return render_html(self, standalone=False)

    def __repr__(self) -> str:
        return f"<DiffReport {self.label_a} vs {self.label_b}: {self.summary()}>"


def _worth_showing(row: Row) -> bool:
    return row.diverged or row.record.is_output


def _label(row: Row) -> str:
    rec = row.record
    node = f" ({' '.join(filter(None, [rec.op_type, rec.node_name]))})" if rec.op_type \
        else f" ({rec.kind})"
    return _qualified(rec) + node


def _qualified(rec) -> str:
    return f"{rec.where}/{rec.name}" if rec.path else rec.name


def _shape(shape) -> str:
    return "" if shape is None else "[" + ",".join(map(str, shape)) + "]"


def _num(x) -> str:
    return "" if x is None else f"{x:.3g}"


def _strict(o):
    """JSON has no inf or NaN: they are written as the strings "inf", "-inf" and "nan"."""
    if isinstance(o, float) and not math.isfinite(o):
        return str(o)
    if isinstance(o, dict):
        return {k: _strict(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_strict(v) for v in o]
    return o


def _json_default(o):
    if hasattr(o, "item"):
        return _strict(o.item())
    return str(o)


# HTML ------------------------------------------------------------------------------------------
_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em}table{border-collapse:collapse;font-size:13px}
div.table-wrap{overflow:auto;max-width:100%;max-height:80vh}
th{position:sticky;top:0}td.name{min-width:14em;max-width:32em;overflow-wrap:anywhere}
svg.error-plot{max-width:100%;height:auto}pre{white-space:pre-wrap}
th,td{border-bottom:1px solid #ddd;padding:2px 8px;text-align:left}th{cursor:pointer;background:#f4f4f4}
tr.made td{background:#fdd}tr.diverged td{background:#ffd}tr.fused td{color:#888}
td.num{text-align:right;font-variant-numeric:tabular-nums}pre{background:#f8f8f8;padding:.5em}
"""
_SORT = """
document.querySelectorAll('table.diff th').forEach(function(th, col){
  th.addEventListener('click', function(){
    var body = th.closest('table').tBodies[0], rows = Array.from(body.rows);
    var asc = th.dataset.asc !== '1'; th.dataset.asc = asc ? '1' : '0';
    rows.sort(function(a, b){
      var x = a.cells[col].dataset.v || a.cells[col].textContent;
      var y = b.cells[col].dataset.v || b.cells[col].textContent;
      var nx = parseFloat(x), ny = parseFloat(y);
      var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
      return asc ? c : -c;
    });
    rows.forEach(function(r){ body.appendChild(r); });
  });
});
"""


def render_html(report: DiffReport, standalone: bool = True) -> str:
    """One self-contained page: summary, an SVG plot of error along the order, a sortable table."""
    e = html.escape
    head = ["#", "", "kind", "dtype", "shape", "op", "name", "max abs", "max rel", "cosine",
            "max ulp", "out of tol", "bound used", "verdict"]
    body = []
    for i, r in enumerate(report.rows):
        rec, m = r.record, r.metrics
        cls = ("made" if r.verdict in (MADE, MADE_INSIDE) else "diverged" if r.diverged
               else "fused" if r.pair.status == FUSED else "")
        cells = [
            _td(str(i), i), _td(r.pair.marker), _td(rec.kind), _td(rec.dtype or rec.type),
            _td(_shape(rec.shape)), _td(rec.op_type), _td(_qualified(rec), cls="name"),
            _td(_num(m.max_abs) if m else "", m.max_abs if m else -1, num=True),
            _td(_num(m.max_rel) if m else "", m.max_rel if m else -1, num=True),
            _td(_num(m.cosine) if m and m.cosine is not None else "", num=True),
            _td(str(m.max_ulp) if m and m.max_ulp is not None else "", num=True),
            _td(str(m.out_of_tolerance) if m else "", num=True),
            _td(f"{r.bound_used:.0%}" if r.bound_used is not None else "",
                r.bound_used if r.bound_used is not None else -1, num=True),
            _td(r.status),
        ]
        body.append(f'<tr class="{cls}">' + "".join(cells) + "</tr>")
    table = ('<div class="table-wrap"><table class="diff"><thead><tr>'
             + "".join(f"<th>{e(h)}</th>" for h in head)
             + "</tr></thead><tbody>" + "\n".join(body) + "</tbody></table></div>")
    repro = ""
    if report.repro:
        repro = f"<p>repro: <code>{e(' '.join(report.repro.get('command', [])))}</code></p>"
    content = (f"<h1>onnx-parity diff</h1><p>A: <b>{e(report.label_a)}</b> &nbsp; B: "
               f"<b>{e(report.label_b)}</b> &nbsp; rtol={report.rtol:g}, atol={report.atol:g}</p>"
               f"<pre>{e(report.summary())}</pre>{repro}{error_plot(report)}{table}")
    script = f"<script>{_SORT}</script>"
    if not standalone:
        return f"<div><style>{_STYLE}</style>{content}{script}</div>"
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>onnx-parity diff</title>"
            f"<style>{_STYLE}</style></head><body>{content}{script}</body></html>")


def _td(text: str, sort_value=None, num: bool = False, cls: str = "") -> str:
    attr = f' data-v="{sort_value}"' if sort_value is not None else ""
    names = " ".join(filter(None, ["num" if num else "", cls]))
    classes = f' class="{names}"' if names else ""
    return f"<td{attr}{classes}>{html.escape(text)}</td>"


def error_plot(report: DiffReport, width: int = 900, height: int = 220) -> str:
    """Inline SVG: log10 of max abs error of each compared value, in A's order."""
    points = [(i, r) for i, r in enumerate(report.rows) if r.metrics is not None]
    if not points:
        return ""
    floor = -12.0
    ys = [max(floor, math.log10(r.metrics.max_abs)) if r.metrics.max_abs > 0 else floor
          for _, r in points]
    top = max(max(ys), floor + 1)
    n = max(len(report.rows) - 1, 1)
    pad = 40

    def sx(i):
        return pad + (width - 2 * pad) * i / n

    def sy(y):
        return height - pad - (height - 2 * pad) * (y - floor) / (top - floor)

    line = " ".join(f"{sx(i):.1f},{sy(y):.1f}" for (i, _), y in zip(points, ys))
    dots = []
    for (i, r), y in zip(points, ys):
        colour = "#d00" if r.verdict in (MADE, MADE_INSIDE) else "#e90" if r.diverged else "#38c"
        title = html.escape(f"{_qualified(r.record)}: {r.metrics.max_abs:.3g}")
        dots.append(f'<circle cx="{sx(i):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{colour}">'
                    f"<title>{title}</title></circle>")
    axis = (f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" '
            f'stroke="#999"/><line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="#999"/>'
            f'<text x="{pad}" y="{pad - 8}" font-size="11">max abs error (log scale)</text>'
            f'<text x="{width - pad}" y="{height - 4}" font-size="11" text-anchor="end">'
            f"row (topological order)</text>")
    ticks = []
    step = max(1, math.ceil((top - floor) / 6))
    for y in range(math.ceil(floor), math.floor(top) + 1, step):
        ticks.append(f'<line x1="{pad - 4}" y1="{sy(y):.1f}" x2="{pad}" y2="{sy(y):.1f}" '
                     f'stroke="#999"/><text x="{pad - 6}" y="{sy(y) + 4:.1f}" font-size="10" '
                     f'text-anchor="end">1e{y}</text>')
    for i in _row_ticks(n):
        ticks.append(f'<line x1="{sx(i):.1f}" y1="{height - pad}" x2="{sx(i):.1f}" '
                     f'y2="{height - pad + 4}" stroke="#999"/><text x="{sx(i):.1f}" '
                     f'y="{height - pad + 15}" font-size="10" text-anchor="middle">{i}</text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" class="error-plot">{axis}{"".join(ticks)}'
            f'<polyline fill="none" stroke="#38c" stroke-width="1" points="{line}"/>'
            f'{"".join(dots)}</svg>')


def _row_ticks(last: int) -> list[int]:
    """Row numbers at a round step, about eight of them from 0 to `last`."""
    raw = max(last / 8, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    return list(range(0, last + 1, int(step)))
