"""Turn the --benchmark-json of test_optimized_vs_ort.py into a Markdown table.

    python -m benchmarks.results BENCH.json [--notes NOTES.md] > benchmarks/RESULTS.md

A header gives the run's date and machine (from pytest-benchmark's record) and the command.
One row per model and thread count: the median latency of optimized and of onnxruntime, and
their ratio (below 1: optimized is faster). Then the geometric mean of the ratios, and the
per-node overhead on the 100-node elementwise chain (median / 100) for both runtimes.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict

RUNTIMES = ("optimized", "onnxruntime")
CHAIN = "chain100"  # benchmarks.models.CHAIN
CHAIN_NODES = 100
COMMAND = ("python -m pytest benchmarks/test_optimized_vs_ort.py --benchmark-only "
           "--benchmark-json BENCH.json -q")


def medians(report: dict) -> dict[tuple[str, int], dict[str, float]]:
    """(model, threads) -> {runtime: median seconds}, from the benchmarks' extra_info."""
    table: dict[tuple[str, int], dict[str, float]] = defaultdict(dict)
    for bench in report.get("benchmarks", []):
        info = bench.get("extra_info", {})
        if not {"model", "threads", "runtime"} <= info.keys():
            continue  # a benchmark of another suite in the same run
        table[(info["model"], int(info["threads"]))][info["runtime"]] = bench["stats"]["median"]
    return dict(table)


def header(report: dict) -> str:
    machine = report.get("machine_info", {})
    cpu = machine.get("cpu", {})
    cpu_name = cpu.get("brand_raw") or machine.get("processor") or "unknown CPU"
    cores = cpu.get("count", "?")
    ort_versions = sorted({b["extra_info"]["onnxruntime_version"]
                           for b in report.get("benchmarks", [])
                           if "onnxruntime_version" in b.get("extra_info", {})})
    versions = f"Python {machine.get('python_version', '?')}" + "".join(
        f", onnxruntime {v}" for v in ort_versions)
    return "\n".join([
        "# optimized vs onnxruntime",
        "",
        f"- Date: {report.get('datetime', 'unknown')}",
        (f"- Machine: {cpu_name}, {cores} logical cores, {machine.get('system', '')} "
         f"{machine.get('release', '')}; {versions}"),
        f"- Command: `{COMMAND}`, then `python -m benchmarks.results BENCH.json`",
        ("- Every time is the **median** over the rounds of pytest-benchmark (pedantic mode, "
         "one warm-up round); the ratio is optimized / onnxruntime, so below 1 means optimized "
         "is faster."),
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


def ratio(times: dict[str, float]) -> float | None:
    if all(r in times for r in RUNTIMES) and times["onnxruntime"] > 0:
        return times["optimized"] / times["onnxruntime"]
    return None


def geometric_mean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def markdown(table: dict[tuple[str, int], dict[str, float]]) -> str:
    lines = ["| model | threads | optimized median | onnxruntime median | optimized / onnxruntime |",
             "|---|---:|---:|---:|---:|"]
    ratios: dict[int, list[float]] = defaultdict(list)
    for (model, threads), times in sorted(table.items()):
        r = ratio(times)
        if r is not None:
            ratios[threads].append(r)
        lines.append(f"| {model} | {threads} | {format_time(times.get('optimized'))} | "
                     f"{format_time(times.get('onnxruntime'))} | "
                     f"{'—' if r is None else f'{r:.2f}'} |")
    lines.append("")
    every = [r for rs in ratios.values() for r in rs]
    if every:
        lines.append(f"Geometric mean of the ratios: **{geometric_mean(every):.2f}** "
                     f"over {len(every)} model/thread pairs"
                     + "".join(f"; {geometric_mean(rs):.2f} at {t} thread{'s' if t > 1 else ''}"
                               for t, rs in sorted(ratios.items())) + ".")
    else:
        lines.append("No model has both runtimes measured: no ratio to average.")
    chain = {t: times for (model, t), times in table.items() if model == CHAIN}
    if chain:
        lines += ["", (f"Per-node overhead on the {CHAIN_NODES}-node elementwise chain "
                       f"(median / {CHAIN_NODES}):"), "",
                  ("| threads | optimized (level 99, chain fused) | optimized (level 1, node by "
                   "node) | onnxruntime | ratio, fused | ratio, node by node |"),
                  "|---:|---:|---:|---:|---:|---:|"]
        for t, times in sorted(chain.items()):
            per_node = {k: v / CHAIN_NODES for k, v in times.items()}
            fused = ratio(per_node)
            unfused = ratio({"optimized": per_node.get("optimized-level1", 0.0),
                             "onnxruntime": per_node.get("onnxruntime", 0.0)}) \
                if "optimized-level1" in per_node else None
            lines.append(f"| {t} | {format_time(per_node.get('optimized'))} | "
                         f"{format_time(per_node.get('optimized-level1'))} | "
                         f"{format_time(per_node.get('onnxruntime'))} | "
                         f"{'—' if fused is None else f'{fused:.2f}'} | "
                         f"{'—' if unfused is None else f'{unfused:.2f}'} |")
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
                                     description="pytest-benchmark JSON -> Markdown table")
    parser.add_argument("bench_json", help="the file written by --benchmark-json")
    parser.add_argument("--notes", help="a Markdown file appended after the tables")
    args = parser.parse_args(argv)
    try:
        report = read_json(args.bench_json)
        notes = read_text(args.notes) if args.notes else ""
    except ValueError as e:
        print(e, file=sys.stderr)
        return 1
    table = medians(report)
    if not table:
        print(f"{args.bench_json} holds no benchmark of test_optimized_vs_ort.py",
              file=sys.stderr)
        return 1
    sys.stdout.write(header(report) + "\n" + markdown(table) + ("\n" + notes if notes else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
