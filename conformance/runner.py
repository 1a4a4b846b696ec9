"""Score a backend against pinned corpora.

Tests run in worker processes, so a hung test is killed at its timeout and a crashing kernel
takes down one worker, not the run; both are reported and the run goes on.
"""
from __future__ import annotations

import functools
import multiprocessing as mp
import os
import time
import traceback
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import wait

from .backends import make_backend
from .compare import Mismatch, Tolerance, compare_outputs
from .corpus import Corpus, CorpusTest, open_corpus
from .expectations import Expectations, Tolerances, verdict
from .pins import Cache, CorpusUnavailable, Pin, PinMismatch, load_pins

DEFAULT_TIMEOUT_S = 120.0
PIN_KEY = "(corpus)"  # the key of a pin's own error entry: opset28/(corpus)


@dataclass
class TestResult:
    id: str
    opset: int
    key: str
    kind: str
    outcome: str  # pass, fail, error, timeout, crash, unavailable
    message: str = ""
    seconds: float = 0.0
    verdict: str = ""
    reason: str = ""  # the expectation's reason, when listed
    anchor_outcome: str = ""  # with --compare-with
    anchor_message: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class RunConfig:
    backend: str
    backend_options: dict = field(default_factory=dict)
    cache_root: str | None = None
    compare_with: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    pins_file: str | None = None  # another pins.toml (tests use synthetic corpora)


def run_test(corpus: Corpus, test: CorpusTest, backend, tolerances: Tolerances) -> tuple[str, str]:
    """(outcome, message) of one test on one backend, in this process."""
    if test.unavailable:
        return "unavailable", test.unavailable
    try:
        case = corpus.load(test)
        tol = tolerances.for_test(test.opset, test.key, backend.name, Tolerance(test.rtol, test.atol))
        prepared = backend.prepare(case.model)
        names = [o.name for o in case.model.graph.output]
        for feeds, expected in case.data_sets:
            compare_outputs(expected, prepared.run(feeds), tol, names)
        return "pass", ""
    except Mismatch as e:
        return "fail", str(e)
    except Exception as e:  # noqa: BLE001 - every failure is reported, the run goes on
        return "error", f"{type(e).__name__}: {e}"[:2000]


# worker processes ---------------------------------------------------------------------------
class TestHandler:
    """Runs corpus tests in a worker: made there, once, from the run's config."""

    def __init__(self, config: RunConfig):
        self.cache = Cache(config.cache_root)
        self.pins = load_pins(config.pins_file) if config.pins_file else load_pins()
        self.corpora: dict[int, Corpus] = {}
        self.backend = make_backend(config.backend, **config.backend_options)
        self.anchor = make_backend(config.compare_with) if config.compare_with else None
        self.tolerances = Tolerances.load()

    def __call__(self, test: CorpusTest) -> TestResult:
        start = time.perf_counter()
        try:
            if test.opset not in self.corpora:
                self.corpora[test.opset] = open_corpus(self.pins[test.opset], self.cache, fetch=False)
            corpus = self.corpora[test.opset]
            outcome, message = run_test(corpus, test, self.backend, self.tolerances)
            anchor_result = (run_test(corpus, test, self.anchor, self.tolerances)
                             if self.anchor else ("", ""))
        except Exception:  # noqa: BLE001
            outcome, message = "error", traceback.format_exc()[-2000:]
            anchor_result = ("", "")
        return TestResult(test.id, test.opset, test.key, test.kind, outcome, message,
                          time.perf_counter() - start, anchor_outcome=anchor_result[0],
                          anchor_message=anchor_result[1])


def _serve(conn, make_handler, arg) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    handle = make_handler(arg)
    while True:
        task = conn.recv()
        if task is None:
            return
        conn.send(handle(task))


class _Worker:
    def __init__(self, ctx, make_handler, arg):
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, make_handler, arg), daemon=True)
        self.process.start()
        child.close()
        self.task = None
        self.started = 0.0

    def give(self, item: tuple) -> None:
        """`item` is (index, task); the worker gets the task."""
        self.task, self.started = item, time.monotonic()
        self.conn.send(item[1])

    def kill(self) -> None:
        self.process.kill()
        self.process.join(5)
        self.conn.close()


def run_pool(tasks: list, make_handler, arg, lost, jobs: int = 1, timeout_s: float = DEFAULT_TIMEOUT_S,
             on_result=None, spawn: bool = False) -> list:
    """Run each task on one of `jobs` worker processes; results come back in the order of
    `tasks`. Each worker calls `make_handler(arg)` once, then `handler(task)` per task (both
    must pickle). A task whose worker dies, or that runs past `timeout_s`, gets
    `lost(task, "crash" | "timeout", message, seconds)`, and the worker is replaced."""
    ctx = mp.get_context("fork" if hasattr(os, "fork") and not spawn else "spawn")
    pending = list(reversed(list(enumerate(tasks))))
    results: dict[int, object] = {}
    workers = [_Worker(ctx, make_handler, arg) for _ in range(max(1, min(jobs, len(pending))))]
    try:
        for w in workers:
            if pending:
                w.give(pending.pop())
        while any(w.task for w in workers):
            busy = [w for w in workers if w.task]
            ready = wait([w.conn for w in busy] + [w.process.sentinel for w in busy], timeout=1.0)
            now = time.monotonic()
            for i, w in enumerate(workers):
                if not w.task:
                    continue
                index, task = w.task
                result, replace_worker = None, False
                if w.conn in ready and w.conn.poll():
                    try:
                        result = w.conn.recv()
                    except (EOFError, OSError):
                        pass
                if result is None and not w.process.is_alive():
                    code = w.process.exitcode
                    result = lost(task, "crash", f"worker died (exit code {code})", now - w.started)
                    replace_worker = True
                elif result is None and now - w.started > timeout_s:
                    result = lost(task, "timeout", f"no result after {timeout_s:.0f} s",
                                  now - w.started)
                    replace_worker = True
                if result is None:
                    continue
                results[index] = result
                if on_result:
                    on_result(result)
                if replace_worker:
                    w.kill()
                    workers[i] = w = _Worker(ctx, make_handler, arg)
                w.task = None
                if pending:
                    w.give(pending.pop())
    finally:
        for w in workers:
            try:
                w.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
            w.process.join(2)
            if w.process.is_alive():
                w.kill()
    return [results[i] for i in range(len(tasks))]


def run_tests(tests: list[CorpusTest], config: RunConfig, jobs: int = 1, on_result=None):
    """Run `tests` on `jobs` worker processes; returns TestResults in the order of `tests`."""
    results: dict[str, TestResult] = {}
    for t in tests:
        if t.unavailable:
            results[t.id] = TestResult(t.id, t.opset, t.key, t.kind, "unavailable", t.unavailable)
            if on_result:
                on_result(results[t.id])
    pending = [t for t in tests if not t.unavailable]
    # CUDA cannot be used in a child forked after the parent touched it (cudaErrorInitializationError)
    cuda = config.backend_options.get("provider") == "cuda"
    if pending:
        for r in run_pool(pending, TestHandler, config, _lost, jobs, config.timeout_s, on_result,
                          spawn=cuda):
            results[r.id] = r
    return [results[t.id] for t in tests]


def _lost(test: CorpusTest, outcome: str, message: str, seconds: float) -> TestResult:
    return TestResult(test.id, test.opset, test.key, test.kind, outcome, message, seconds)


def apply_expectations(results: list[TestResult], expectations: Expectations, strict: bool = True):
    for r in results:
        expectation = expectations.lookup(r.opset, r.key)
        r.reason = expectation.reason if expectation else ""
        r.verdict = verdict(r.outcome, expectation if strict else None)
        if not strict and r.outcome not in ("pass", "unavailable"):
            r.verdict = "expected-fail" if expectation else r.verdict
    return results


def collect_tests(pins: list[Pin], cache: Cache, pattern=None, progress=None, announce=None):
    """(tests of every pin that opens, one error result for each pin that does not).

    A pin that cannot be fetched, generated or verified never stops the others.
    `announce(pin, what)` is called before a download or a generation starts."""
    tests, unusable = [], []
    for pin in pins:
        try:
            corpus = open_corpus(pin, cache, fetch=True, progress=progress,
                                 announce=announce and functools.partial(announce, pin))
        except (CorpusUnavailable, PinMismatch) as e:
            unusable.append(pin_error(pin, str(e)))
            continue
        tests += [t for t in corpus.tests if pattern is None or pattern.search(t.id)]
    return tests, unusable


def pin_error(pin: Pin, message: str) -> TestResult:
    """A pin whose corpus cannot be used, reported as one erroring entry of that pin."""
    return TestResult(f"{pin.label}/{PIN_KEY}", pin.opset, PIN_KEY, "pin", "error", message)
