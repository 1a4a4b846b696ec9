"""Reports of a conformance run: per-pin summary table, JSON, JUnit XML and Markdown."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict

from .expectations import VERDICTS

COLUMNS = VERDICTS


def summarize(results) -> dict[int, Counter]:
    per_pin: dict[int, Counter] = defaultdict(Counter)
    for r in results:
        per_pin[r.opset][r.verdict] += 1
        per_pin[r.opset]["total"] += 1
        if r.kind == "node":
            per_pin[r.opset]["node-total"] += 1
            per_pin[r.opset]["node-pass"] += r.outcome == "pass"
        if r.anchor_outcome:
            per_pin[r.opset]["anchor-pass"] += r.anchor_outcome == "pass"
            per_pin[r.opset]["anchor-run"] += 1
    return dict(sorted(per_pin.items()))


def summary_rows(results, anchor: str | None = None) -> tuple[list[str], list[list[str]]]:
    header = ["pin", "tests", "node pass", *COLUMNS]
    if anchor:
        header.append(f"{anchor} pass")
    rows = []
    totals: Counter = Counter()
    for opset, c in summarize(results).items():
        totals.update(c)
        rows.append(_row(f"opset{opset}", c, anchor))
    if len(rows) > 1:
        rows.append(_row("all", totals, anchor))
    return header, rows


def _row(label: str, c: Counter, anchor) -> list[str]:
    row = [label, str(c["total"]), f"{c['node-pass']}/{c['node-total']}"]
    row += [str(c[v]) for v in COLUMNS]
    if anchor:
        row.append(f"{c['anchor-pass']}/{c['anchor-run']}")
    return row


def print_summary(results, console, anchor: str | None = None, backend: str = "") -> None:
    from rich.table import Table

    header, rows = summary_rows(results, anchor)
    table = Table(title=f"conformance: {backend}" if backend else None)
    for h in header:
        table.add_column(h, justify="left" if h == "pin" else "right")
    for row in rows:
        table.add_row(*row)
    console.print(table)


def problems(results) -> list:
    return [r for r in results if r.verdict in ("unexpected-fail", "stale-expectation", "error")]


def write_json(results, path: str, meta: dict) -> None:
    payload = {
        **meta,
        "summary": {f"opset{k}": dict(v) for k, v in summarize(results).items()},
        "results": [r.to_dict() for r in results],
    }
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)


def write_junit(results, path: str, backend: str) -> None:
    suites = ET.Element("testsuites", name=f"onnx-parity {backend}")
    by_pin = defaultdict(list)
    for r in results:
        by_pin[r.opset].append(r)
    for opset, rs in sorted(by_pin.items()):
        counts = Counter(r.verdict for r in rs)
        suite = ET.SubElement(
            suites, "testsuite", name=f"opset{opset}", tests=str(len(rs)),
            failures=str(counts["unexpected-fail"] + counts["stale-expectation"]),
            errors=str(counts["error"]),
            skipped=str(counts["expected-fail"] + counts["unavailable"]),
        )
        for r in rs:
            case = ET.SubElement(suite, "testcase", classname=f"opset{opset}", name=r.key,
                                 time=f"{r.seconds:.3f}")
            if r.verdict == "unexpected-fail":
                ET.SubElement(case, "failure", message=r.message[:500]).text = r.message
            elif r.verdict == "stale-expectation":
                ET.SubElement(case, "failure", message="stale expectation: the test passes").text = r.reason
            elif r.verdict == "error":
                ET.SubElement(case, "error", message=r.message[:500]).text = r.message
            elif r.verdict in ("expected-fail", "unavailable"):
                ET.SubElement(case, "skipped", message=r.reason or r.message[:500])
    ET.ElementTree(suites).write(path, encoding="utf-8", xml_declaration=True)


def anchor_differences(results) -> list:
    """Tests that pass on one of the two backends and not on the other (with --compare-with)."""
    return [r for r in results if r.anchor_outcome and r.outcome != "unavailable"
            and (r.outcome == "pass") != (r.anchor_outcome == "pass")]


NODE_PASS_NOTE = ("*node pass*: node tests (one operator each, from the corpus's `node` folder) "
                  "that pass, of those run; the other tests are whole models.")


def _cell(text: str, limit: int = 300) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:limit]


def write_markdown(results, path: str, backend: str, anchor: str | None = None) -> None:
    header, rows = summary_rows(results, anchor)
    lines = [f"# Conformance: {backend}", "", "| " + " | ".join(header) + " |",
             "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    lines += ["", NODE_PASS_NOTE]
    bad = problems(results)
    if bad:
        lines += ["", "## Problems", "", "| test | verdict | message |", "|---|---|---|"]
        for r in bad:
            lines.append(f"| {r.id} | {r.verdict} | {_cell(r.message or r.reason)} |")
    if anchor:
        differ = anchor_differences(results)
        lines += ["", f"## Tests where {backend} and {anchor} differ ({len(differ)})", ""]
        if differ:
            lines += [f"| test | {backend} | {anchor} | message |", "|---|---|---|---|"]
            for r in differ:
                message = r.anchor_message if r.outcome == "pass" else r.message
                lines.append(f"| {r.id} | {r.outcome} | {r.anchor_outcome} | {_cell(message)} |")
        else:
            lines.append("Every test that ran has the same outcome on both.")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
