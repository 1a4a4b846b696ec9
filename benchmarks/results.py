"""Turn the --benchmark-json of test_optimized_vs_ort.py into Markdown tables.

    python -m benchmarks.results BENCH.json [MORE.json ...] [--notes NOTES.md] \\
        [--command "how the JSON was made"] > benchmarks/RESULTS.md

Several JSON files (a suite run in parts) are merged; each (model, threads) must come from one
file only. A header gives the run's date, machine, versions and git commit (pytest-benchmark's
commit_info) and the command. Then, from the isolated-process benchmarks:

- per model and thread count: the median seconds per run of optimized and of onnxruntime, their
  ratio (below 1: optimized is faster; rows above FLAG_RATIO are flagged), and the session
  creation time of each with its ratio (above CREATION_TARGET flagged);
- the geometric mean of the run ratios per thread count and over all rows;
- the per-node overhead on the 100-node elementwise chain, fused (level 99) and node by node
  (level 1), against onnxruntime's;
- the shared-process rows (both sessions in one process), beside the isolated ones.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict

OPTIMIZED, ONNXRUNTIME, NODE_BY_NODE = "optimized", "onnxruntime", "optimized-level1"
CHAIN = "chain100"  # benchmarks.models.CHAIN
CHAIN_NODES = 100
FLAG_RATIO = 1.15  # issue 16: every model at most 1.15x onnxruntime
CREATION_TARGET = 1.5  # issue 16: session creation within 1.5x onnxruntime's
PER_NODE_TARGET = 1.5  # issue 16: chain100 node by node within 1.5x onnxruntime's per node
COMMAND = ("python -m pytest benchmarks/test_optimized_vs_ort.py --benchmark-only "
           "--benchmark-json BENCH.json -q && python -m benchmarks.results BENCH.json")

Row = dict[str, dict]  # runtime -> its extra_info record (median, creation_seconds, ...)


def rows(report: dict, process: str) -> dict[tuple[str, int], Row]:
    """(model, threads) -> runtime records, for the benchmarks run with `process`."""
    table: dict[tuple[str, int], Row] = {}
    for bench in report.get("benchmarks", []):
        info = bench.get("extra_info", {})
        if info.get("process") != process or "runtimes" not in info:
            continue  # another suite's benchmark, or a run in the other mode
        table[(info["model"], int(info["threads"]))] = info["runtimes"]
    return table


def merge(reports: list[dict]) -> dict:
    """One report: the first file's header, every file's benchmarks; a (model, threads,
    process) measured in two files is an error, since it is unclear which to keep."""
    seen: dict[tuple, int] = {}
    merged = dict(reports[0], benchmarks=[])
    for index, report in enumerate(reports):
        for bench in report.get("benchmarks", []):
            info = bench.get("extra_info", {})
            key = (info.get("model"), info.get("threads"), info.get("process"))
            if "runtimes" in info and key in seen:
                raise ValueError(f"{key} is in file {seen[key] + 1} and in file {index + 1}")
            seen[key] = index
            merged["benchmarks"].append(bench)
    merged["commits"] = sorted({commit_text(r) for r in reports})
    return merged


def commit_text(report: dict) -> str:
    commit = report.get("commit_info", {})
    text = commit.get("id", "unknown")[:12]
    return text + (" (with uncommitted changes)" if commit.get("dirty") else "")


def header(report: dict, command: str) -> str:
    machine = report.get("machine_info", {})
    cpu = machine.get("cpu", {})
    cpu_name = cpu.get("brand_raw") or machine.get("processor") or "unknown CPU"
    versions = sorted({b["extra_info"]["onnxruntime_version"]
                       for b in report.get("benchmarks", [])
                       if "onnxruntime_version" in b.get("extra_info", {})})
    commits = report.get("commits") or [commit_text(report)]
    loads = [b["extra_info"][k] for b in report.get("benchmarks", [])
             for k in ("load_average_before", "load_average_after") if k in b.get("extra_info", {})]
    load = (f"; 1-minute load average {min(loads):.1f} to {max(loads):.1f} during the run"
            if loads else "")
    return "\n".join([
        "# optimized vs onnxruntime",
        "",
        f"- Date: {report.get('datetime', 'unknown')}",
        f"- Commit: {', '.join(commits)}",
        (f"- Machine: {cpu_name}, {cpu.get('count', '?')} logical cores, "
         f"{machine.get('system', '')} {machine.get('release', '')}; Python "
         f"{machine.get('python_version', '?')}"
         + "".join(f", onnxruntime {v}" for v in versions) + load),
        f"- Command: `{command}`",
        ("- Each runtime runs in its own process (benchmarks/isolated.py); rounds alternate "
         "between them. Run times are the **median** over the rounds of the seconds per call "
         "measured inside the worker; creation is the median time to build an InferenceSession "
         "from the model's bytes after the process's first (benchmarks/sessions.py). Ratios "
         f"are optimized / onnxruntime: below 1 optimized is faster; ⚠ marks a run ratio above "
         f"{FLAG_RATIO} or a creation ratio above {CREATION_TARGET}."),
        "",
    ])


def format_time(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds >= 1.0:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} µs"


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def format_ratio(value: float | None, limit: float) -> str:
    if value is None:
        return "—"
    return f"{value:.2f}" + (" ⚠" if value > limit else "")


def field(row: Row, runtime: str, name: str) -> float | None:
    return row.get(runtime, {}).get(name)


def geometric_mean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def run_table(table: dict[tuple[str, int], Row]) -> list[str]:
    lines = [("| model | threads | optimized | onnxruntime | ratio | optimized creation | "
             "onnxruntime creation | creation ratio |"),
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for (model, threads), row in sorted(table.items()):
        run = [field(row, r, "median") for r in (OPTIMIZED, ONNXRUNTIME)]
        create = [field(row, r, "creation_seconds") for r in (OPTIMIZED, ONNXRUNTIME)]
        lines.append(f"| {model} | {threads} | {format_time(run[0])} | {format_time(run[1])} | "
                     f"{format_ratio(ratio(*run), FLAG_RATIO)} | {format_time(create[0])} | "
                     f"{format_time(create[1])} | "
                     f"{format_ratio(ratio(*create), CREATION_TARGET)} |")
    return lines


def summary(table: dict[tuple[str, int], Row]) -> list[str]:
    by_threads: dict[int, list[float]] = defaultdict(list)
    flagged, creation_flagged, creations = [], [], []
    for (model, threads), row in sorted(table.items()):
        r = ratio(field(row, OPTIMIZED, "median"), field(row, ONNXRUNTIME, "median"))
        if r is not None:
            by_threads[threads].append(r)
            if r > FLAG_RATIO:
                flagged.append(f"{model} t{threads} ({r:.2f})")
        c = ratio(field(row, OPTIMIZED, "creation_seconds"),
                  field(row, ONNXRUNTIME, "creation_seconds"))
        if c is not None:
            creations.append(c)
            if c > CREATION_TARGET:
                creation_flagged.append(f"{model} t{threads} ({c:.1f})")
    every = [r for rs in by_threads.values() for r in rs]
    if not every:
        return ["No model has both runtimes measured: no ratio to average."]
    means = "; ".join(f"**{geometric_mean(rs):.2f}** at {t} thread{'s' if t > 1 else ''} "
                      f"({len(rs)} models)" for t, rs in sorted(by_threads.items()))
    lines = [(f"Geometric mean of the run ratios: {means}; {geometric_mean(every):.2f} over all "
             f"{len(every)} rows."), "",
             f"Rows above {FLAG_RATIO}: {len(flagged)} of {len(every)}"
             + (": " + ", ".join(flagged) if flagged else "") + "."]
    if creations:
        lines += ["", f"Session creation: geometric mean of the ratios "
                      f"{geometric_mean(creations):.2f}; above {CREATION_TARGET}: "
                      f"{len(creation_flagged)} of {len(creations)}"
                      + (": " + ", ".join(creation_flagged) if creation_flagged else "") + "."]
    return lines


def chain_table(table: dict[tuple[str, int], Row]) -> list[str]:
    chain = {t: row for (model, t), row in table.items() if model == CHAIN}
    if not chain:
        return []
    lines = ["", (f"Per-node overhead on the {CHAIN_NODES}-node elementwise chain "
                 f"(median per run / {CHAIN_NODES}):"), "",
             ("| threads | optimized, level 99 (chain fused) | optimized, level 1 (node by "
              "node) | onnxruntime | ratio, fused | ratio, node by node |"),
             "|---:|---:|---:|---:|---:|---:|"]
    for t, row in sorted(chain.items()):
        fused, unfused, ort = (None if field(row, r, "median") is None
                               else field(row, r, "median") / CHAIN_NODES
                               for r in (OPTIMIZED, NODE_BY_NODE, ONNXRUNTIME))
        lines.append(f"| {t} | {format_time(fused)} | {format_time(unfused)} | "
                     f"{format_time(ort)} | {format_ratio(ratio(fused, ort), PER_NODE_TARGET)} | "
                     f"{format_ratio(ratio(unfused, ort), PER_NODE_TARGET)} |")
    lines += ["", (f"(⚠ here: above the issue's per-node target of {PER_NODE_TARGET}× "
                  "onnxruntime.)")]
    return lines


def shared_table(isolated: dict[tuple[str, int], Row],
                 shared: dict[tuple[str, int], Row]) -> list[str]:
    if not shared:
        return []
    lines = ["", "Both sessions in one process (alternating rounds), beside the isolated run:", "",
             ("| model | threads | optimized, isolated | optimized, shared | onnxruntime, isolated "
             "| onnxruntime, shared | ratio, shared |"),
             "|---|---:|---:|---:|---:|---:|---:|"]
    for key, row in sorted(shared.items()):
        alone = isolated.get(key, {})
        run = [field(row, r, "median") for r in (OPTIMIZED, ONNXRUNTIME)]
        lines.append(f"| {key[0]} | {key[1]} | {format_time(field(alone, OPTIMIZED, 'median'))} "
                     f"| {format_time(run[0])} | "
                     f"{format_time(field(alone, ONNXRUNTIME, 'median'))} | "
                     f"{format_time(run[1])} | {format_ratio(ratio(*run), FLAG_RATIO)} |")
    return lines


def markdown(report: dict) -> str:
    isolated, shared = rows(report, "isolated"), rows(report, "shared")
    lines = run_table(isolated) + [""] + summary(isolated) + chain_table(isolated) \
        + shared_table(isolated, shared)
    return "\n".join(lines) + "\n"


def read_json(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read the benchmark JSON {path!r}: {e}") from e


def read_text(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"cannot read the notes file {path!r}: {e}") from e


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.results",
                                     description="pytest-benchmark JSON -> Markdown tables")
    parser.add_argument("bench_json", nargs="+", help="files written by --benchmark-json")
    parser.add_argument("--notes", help="a Markdown file appended after the tables")
    parser.add_argument("--command", default=COMMAND,
                        help="the command written in the header (default: the one-file run)")
    args = parser.parse_args(argv)
    try:
        report = merge([read_json(p) for p in args.bench_json])
        notes = read_text(args.notes) if args.notes else ""
    except ValueError as e:
        print(e, file=sys.stderr)
        return 1
    if not rows(report, "isolated") and not rows(report, "shared"):
        print(f"{', '.join(args.bench_json)} hold no benchmark of test_optimized_vs_ort.py",
              file=sys.stderr)
        return 1
    sys.stdout.write(header(report, args.command) + "\n" + markdown(report)
                     + ("\n" + notes if notes else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
