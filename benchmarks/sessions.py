"""Workloads for benchmarks/isolated.py: one benchmark model's session in each runtime.

A factory builds the model of benchmarks/models.py by name (seeded, so every process builds
the same bytes), serializes it, and creates the session from those bytes, timing the creation:
`first_creation_seconds` is the first session of the process (one-time initialisation
included), `creation_seconds` the median of CREATION_REPEATS more sessions built the same way
(only one more when the first took over a second). The session that runs is the first one.

Both runtimes get the same feeds and intra_op_num_threads; optimized runs at `level` (99 is
ORT_ENABLE_ALL), onnxruntime at ORT_ENABLE_ALL, sequential, inter_op_num_threads 1.

The `profile` command runs a separate profiling session `runs` times (after WARM_UPS runs) and
returns, per op type, the number of node events and their mean total microseconds per run.
Ours times its normal (compiled) run, a fused chain's time split evenly among its nodes
(optimized/plan.py Profiler).

    python -m benchmarks.sessions MODEL THREADS [RUNS] [--shapes] [--pause SECONDS]
                                          # both runtimes' profiles, by op type (or op type and
                                          # input shapes), top first; with a sleep before each
                                          # run (the suite's rounds pause 0.1 s: caches go cold)
    python -m benchmarks.sessions MODEL THREADS --creation   # where one more session's creation
                                          # spends its CPU time (cProfile, by cumulative time)
    python -m benchmarks.sessions MODEL THREADS [REPEATS] --phases   # median CPU of creation
                                          # by phase and in garbage collections, no profiler

cProfile's own cost falls on Python calls, so it inflates Python-heavy phases several times over
(a plan of 100 nodes: 26 ms under it, 2 ms without); --phases times whole phases instead.
"""
from __future__ import annotations

import cProfile
import gc
import importlib
import json
import pstats
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from benchmarks import models
from benchmarks.isolated import Workload

CREATION_REPEATS = 3
# --phases sleeps this long before timing each runtime's creations: the worker built just before
# has spinning pool threads (onnxruntime's, 2 threads, mobilenet_v3_small: 20-40 ms of CPU in
# the 100 ms after its creations, then none), which took the cores of the creations timed next
# on a busy machine (ours then read 31 ms of CPU at 2 threads against 20 at 1, with no thread
# of ours but the creating one)
QUIET_SECONDS = 1.0
# an optimized session's creation by phase, as (module, function, label): the session looks
# each one up when it is called, so a wrapper put in its place times every call of it
OPTIMIZED_PHASES = (("optimized.session", "load_for_session", "load"),
                    ("optimized.session", "validate", "validate"),
                    ("optimized.passes", "optimize", "passes"),
                    ("optimized.session", "ReferenceEvaluator", "evaluator"),
                    ("optimized.providers", "make_plan", "plan"))
# its list of passes, each timed too ("pass NAME"; "passes: between" is the rest of "passes")
OPTIMIZED_PASSES = ("optimized.passes", "PASSES")
# onnxruntime writes the wait before and after a kernel as separate node events
NOT_KERNEL_TIME = ("_fence_before", "_fence_after")
WARM_UPS = 2  # runs before a profile's: ours are compiled from a signature's third run on


def timed_creations(create) -> tuple[object, float, float]:
    """(first session, its creation seconds, median seconds of the repeats)."""
    start = time.perf_counter()
    session = create()
    first = time.perf_counter() - start
    repeats = []
    for _ in range(CREATION_REPEATS if first < 1.0 else 1):
        start = time.perf_counter()
        create()
        repeats.append(time.perf_counter() - start)
    return session, first, statistics.median(repeats)


def event_key(event: dict, by_shape: bool) -> str:
    args = event.get("args", {})
    op = args.get("op_name", "?")
    if not by_shape:
        return op
    shapes = [next(iter(s.values())) if isinstance(s, dict) and s else s
              for s in args.get("input_type_shape", [])[:2]]
    return f"{op} {shapes}"


def profile_summary(trace_path: str, runs: int, by_shape: bool = False) -> dict[str, dict]:
    """{op type: {"nodes": events per run, "us": microseconds per run}} from a Chrome trace of
    warm-up runs and then `runs` runs: the node events from the start of the last `runs`
    "model_run" events on (both runtimes write one per run; ours leave steps worked out once
    out of a compiled run, so runs differ in events), else (no such events) the last
    runs/(runs + WARM_UPS) of the events. With by_shape, keyed by op type and first two input
    shapes."""
    with open(trace_path) as f:
        trace = json.load(f)
    events = sorted((e for e in trace if e.get("cat") == "Node"
                     and not e.get("name", "").endswith(NOT_KERNEL_TIME)),
                    key=lambda e: e.get("ts", 0))
    starts = sorted(e.get("ts", 0) for e in trace
                    if e.get("cat") == "Session" and e.get("name") == "model_run")
    if len(starts) >= runs:
        summarised = [e for e in events if e.get("ts", 0) >= starts[-runs]]
    else:
        summarised = events[len(events) * WARM_UPS // (runs + WARM_UPS):]
    summary: dict[str, dict] = defaultdict(lambda: {"nodes": 0.0, "us": 0.0})
    for event in summarised:
        op = event_key(event, by_shape)
        summary[op]["nodes"] += 1 / runs
        summary[op]["us"] += event.get("dur", 0) / runs
    return dict(summary)


def workload(name: str, create, make_profiled, version: str, phases: tuple = (),
             passes: tuple | None = None) -> Workload:
    model, feeds = models.build(name)
    data = model.SerializeToString()
    session, first, creation = timed_creations(lambda: create(data))

    def profile(runs: int = 10, by_shape: bool = False, pause: float = 0.0) -> dict:
        with tempfile.TemporaryDirectory() as tmp:
            profiled = make_profiled(data, str(Path(tmp) / "profile"))
            for _ in range(runs + WARM_UPS):  # the runs summarised come last
                if pause:
                    time.sleep(pause)
                profiled.run(None, feeds)
            return profile_summary(profiled.end_profiling(), runs, by_shape)

    def creation_profile(top: int = 30) -> dict:
        return creation_summary(lambda: create(data), top)

    def phase_times(repeats: int = 10) -> dict:
        return creation_phases(lambda: create(data), repeats, phases, passes)

    return Workload(step=lambda: session.run(None, feeds),
                    info={"creation_seconds": creation, "first_creation_seconds": first,
                          "version": version, "model_bytes": len(data)},
                    commands={"profile": profile, "creation_profile": creation_profile,
                              "creation_phases": phase_times})


def creation_phases(create, repeats: int, phases: tuple = (),
                    passes: tuple | None = None) -> dict:
    """Median CPU seconds (process time) of `repeats` calls of `create`, with no profiler: in
    all, in the creating thread alone ("all, creating thread": a runtime's pool threads left
    spinning by an earlier run or session count in "all" only), in each of `phases` ((module, function, label), see OPTIMIZED_PHASES), in the
    garbage collections that landed inside it and, with `passes` ((module, list attribute):
    entries with .name and .function, see OPTIMIZED_PASSES), in each pass that ran, slowest
    first, and in "passes: between" them ({label: seconds}, "all" first)."""
    spent: dict[str, float] = defaultdict(float)
    started: list[float] = []

    def timed(function, label):
        def call(*args, **kwargs):
            start = time.process_time()
            try:
                return function(*args, **kwargs)
            finally:
                spent[label] += time.process_time() - start
        return call

    def collection(phase: str, info: dict) -> None:
        if phase == "start":
            started.append(time.process_time())
        elif started:
            spent["garbage collection"] += time.process_time() - started.pop()

    originals = [(importlib.import_module(module), name) for module, name, _ in phases]
    originals = [(module, name, getattr(module, name)) for module, name in originals]
    listed = getattr(importlib.import_module(passes[0]), passes[1]) if passes else []
    kept = list(listed)
    samples: dict[str, list[float]] = defaultdict(list)
    gc.callbacks.append(collection)
    try:
        for (module, name, function), (_, _, label) in zip(originals, phases):
            setattr(module, name, timed(function, label))
        listed[:] = [p._replace(function=timed(p.function, f"pass {p.name}")) for p in kept]
        for _ in range(repeats):
            spent.clear()
            start, own = time.process_time(), time.thread_time()
            create()
            samples["all"].append(time.process_time() - start)
            samples["all, creating thread"].append(time.thread_time() - own)
            for label in [p[2] for p in phases] + ["garbage collection"]:
                samples[label].append(spent.get(label, 0.0))
            if passes:
                each = {f"pass {p.name}": spent.get(f"pass {p.name}", 0.0) for p in kept}
                samples["passes: between"].append(spent.get("passes", 0.0) - sum(each.values()))
                for label, seconds in each.items():
                    samples[label].append(seconds)
    finally:
        gc.callbacks.remove(collection)
        for module, name, function in originals:
            setattr(module, name, function)
        listed[:] = kept
    medians = {label: statistics.median(values) for label, values in samples.items()}
    ran = sorted((label for label in medians if label.startswith("pass ") and medians[label]),
                 key=lambda label: -medians[label])
    return {label: seconds for label, seconds in medians.items()
            if not label.startswith("pass ")} | {label: medians[label] for label in ran}


def format_phases(phases: dict) -> str:
    width = max(map(len, phases), default=0)
    return "\n".join(f"  {label:<{width}} {seconds * 1e3:8.2f} ms" for label, seconds in phases.items())


def creation_summary(create, top: int) -> dict:
    """CPU seconds of one call of `create` under cProfile (process time, so that other
    processes on a busy machine do not count), and its `top` functions by cumulative time:
    [(function, calls, own seconds, cumulative seconds)]."""
    profiler = cProfile.Profile(time.process_time)
    start = time.process_time()
    profiler.enable()
    create()
    profiler.disable()
    total = time.process_time() - start
    rows = [(f"{Path(file).parent.name}/{Path(file).name}:{line}({function})", calls, own, cumulative)
            for (file, line, function), (_, calls, own, cumulative, _) in
            pstats.Stats(profiler).stats.items()]
    rows.sort(key=lambda row: -row[3])
    return {"seconds": total, "rows": rows[:top]}


def format_creation(summary: dict) -> str:
    lines = [f"  CPU {summary['seconds'] * 1e3:.1f} ms under the profiler",
             f"  {'cumulative ms':>13} {'own ms':>8} {'calls':>7}  function"]
    lines += [f"  {cumulative * 1e3:>13.1f} {own * 1e3:>8.1f} {calls:>7}  {function}"
              for function, calls, own, cumulative in summary["rows"]]
    return "\n".join(lines)


def optimized(name: str, threads: int, level: int = 99) -> Workload:
    import optimized as ort

    return _workload_of(ort, name, OPTIMIZED_PHASES, OPTIMIZED_PASSES,
                        graph_optimization_level=ort.GraphOptimizationLevel(level),
                        intra_op_num_threads=threads)


def onnxruntime(name: str, threads: int) -> Workload:
    import onnxruntime as ort

    return _workload_of(ort, name, (), None,
                        graph_optimization_level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
                        execution_mode=ort.ExecutionMode.ORT_SEQUENTIAL,
                        intra_op_num_threads=threads, inter_op_num_threads=1,
                        # the light models carry unused initializers it warns about
                        log_severity_level=3)


def _workload_of(ort, name: str, phases: tuple, passes: tuple | None, **settings) -> Workload:
    """The workload of `name` on a runtime with onnxruntime's API (optimized or onnxruntime
    itself), its SessionOptions set as given; `phases` and `passes` are its creation's
    (creation_phases)."""
    def create(data, prefix=None):
        options = ort.SessionOptions()
        for key, value in settings.items():
            setattr(options, key, value)
        if prefix:
            options.enable_profiling = True
            options.profile_file_prefix = prefix
        return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])

    return workload(name, create, create, ort.__version__, phases, passes)


def format_profile(summary: dict[str, dict], top: int = 12) -> str:
    total = sum(v["us"] for v in summary.values()) or 1.0
    rows = sorted(summary.items(), key=lambda kv: -kv[1]["us"])[:top]
    width = max([28] + [len(op) for op, _ in rows])
    lines = [f"  {'op':<{width}} {'nodes':>6} {'µs/run':>10} {'share':>6}"]
    lines += [f"  {op:<{width}} {v['nodes']:>6.0f} {v['us']:>10.1f} {v['us'] / total:>6.1%}"
              for op, v in rows]
    lines.append(f"  {'all node events':<{width}} "
                 f"{sum(v['nodes'] for v in summary.values()):>6.0f} {total:>10.1f}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    from benchmarks.isolated import IsolatedPair, WorkerSpec

    by_shape, creation, phases = "--shapes" in argv, "--creation" in argv, "--phases" in argv
    argv = [a for a in argv if a not in ("--shapes", "--creation", "--phases")]
    pause = 0.0
    if "--pause" in argv:
        at = argv.index("--pause")
        try:
            pause = float(argv[at + 1]) if at + 1 < len(argv) else -1.0
        except ValueError:
            pause = -1.0
        argv = argv[:at] + argv[at + 2:]
    if pause < 0:
        print("--pause takes a number of seconds to sleep before each profiled run",
              file=sys.stderr)
        return 2
    if len(argv) not in (2, 3):
        print("usage: python -m benchmarks.sessions MODEL THREADS [RUNS] [--shapes] "
              "[--pause SECONDS] [--creation | --phases]", file=sys.stderr)
        return 2
    name, threads, runs = argv[0], int(argv[1]), int(argv[2]) if len(argv) == 3 else 10
    specs = [WorkerSpec("optimized", "benchmarks.sessions:optimized", (name, threads)),
             WorkerSpec("onnxruntime", "benchmarks.sessions:onnxruntime", (name, threads))]
    with IsolatedPair(specs) as pair:
        for runtime in pair.names:
            if phases:
                time.sleep(QUIET_SECONDS)
                print(f"{runtime}, {name}, {threads} thread(s), median CPU of {runs} more "
                      f"sessions' creation:")
                print(format_phases(pair.command(runtime, "creation_phases", runs)))
                continue
            if creation:
                print(f"{runtime}, {name}, {threads} thread(s), one more session's creation:")
                print(format_creation(pair.command(runtime, "creation_profile")))
                continue
            after = f", each after a {pause:g} s sleep" if pause else ""
            print(f"{runtime}, {name}, {threads} thread(s), mean of {runs} runs{after}:")
            print(format_profile(pair.command(runtime, "profile", runs, by_shape, pause)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
