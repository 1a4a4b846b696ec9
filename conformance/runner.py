"""Score a backend against pinned corpora.

Tests run in worker processes, so a hung test is killed at its timeout and a crashing kernel
takes down one worker, not the run; both are reported and the run goes on.
"""
from __future__ import annotations

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
from .pins import Cache, Pin, load_pins

DEFAULT_TIMEOUT_S = 120.0


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
def _worker(conn, config: RunConfig) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    cache = Cache(config.cache_root)
    pins = load_pins(config.pins_file) if config.pins_file else load_pins()
    corpora: dict[int, Corpus] = {}
    backend = make_backend(config.backend, **config.backend_options)
    anchor = make_backend(config.compare_with) if config.compare_with else None
    tolerances = Tolerances.load()
    while True:
        task = conn.recv()
        if task is None:
            return
        test: CorpusTest = task
        start = time.perf_counter()
        try:
            if test.opset not in corpora:
                corpora[test.opset] = open_corpus(pins[test.opset], cache, fetch=False)
            corpus = corpora[test.opset]
            outcome, message = run_test(corpus, test, backend, tolerances)
            anchor_result = run_test(corpus, test, anchor, tolerances) if anchor else ("", "")
        except Exception:  # noqa: BLE001
            outcome, message = "error", traceback.format_exc()[-2000:]
            anchor_result = ("", "")
        conn.send((outcome, message, time.perf_counter() - start, *anchor_result))


class _Worker:
    def __init__(self, ctx, config: RunConfig):
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker, args=(child, config), daemon=True)
        self.process.start()
        child.close()
        self.test: CorpusTest | None = None
        self.started = 0.0

    def give(self, test: CorpusTest) -> None:
        self.test, self.started = test, time.monotonic()
        self.conn.send(test)

    def kill(self) -> None:
        self.process.kill()
        self.process.join(5)
        self.conn.close()


def run_tests(tests: list[CorpusTest], config: RunConfig, jobs: int = 1, on_result=None):
    """Run `tests` on `jobs` worker processes; returns TestResults in the order of `tests`."""
    # CUDA cannot be used in a child forked after the parent touched it (cudaErrorInitializationError)
    cuda = config.backend_options.get("provider") == "cuda"
    ctx = mp.get_context("fork" if hasattr(os, "fork") and not cuda else "spawn")
    pending = [t for t in tests if not t.unavailable]
    results: dict[str, TestResult] = {}
    for t in tests:
        if t.unavailable:
            results[t.id] = TestResult(t.id, t.opset, t.key, t.kind, "unavailable", t.unavailable)
            if on_result:
                on_result(results[t.id])
    pending.reverse()
    workers = [_Worker(ctx, config) for _ in range(max(1, min(jobs, len(pending))))]
    try:
        for w in workers:
            if pending:
                w.give(pending.pop())
        while any(w.test for w in workers):
            busy = [w for w in workers if w.test]
            ready = wait([w.conn for w in busy] + [w.process.sentinel for w in busy], timeout=1.0)
            now = time.monotonic()
            for i, w in enumerate(workers):
                if not w.test:
                    continue
                result = None
                if w.conn in ready and w.conn.poll():
                    try:
                        outcome, message, seconds, a_out, a_msg = w.conn.recv()
                        result = TestResult(w.test.id, w.test.opset, w.test.key, w.test.kind,
                                            outcome, message, seconds, anchor_outcome=a_out,
                                            anchor_message=a_msg)
                    except (EOFError, OSError):
                        pass
                if result is None and not w.process.is_alive():
                    code = w.process.exitcode
                    result = _lost(w.test, "crash", f"worker died (exit code {code})", now - w.started)
                elif result is None and now - w.started > config.timeout_s:
                    result = _lost(w.test, "timeout", f"no result after {config.timeout_s:.0f} s",
                                   now - w.started)
                if result is None:
                    continue
                results[result.id] = result
                if on_result:
                    on_result(result)
                if result.outcome in ("crash", "timeout"):
                    w.kill()
                    workers[i] = w = _Worker(ctx, config)
                w.test = None
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


def collect_tests(pins: list[Pin], cache: Cache, pattern=None, progress=None) -> list[CorpusTest]:
    tests = []
    for pin in pins:
        corpus = open_corpus(pin, cache, fetch=True, progress=progress)
        tests += [t for t in corpus.tests if pattern is None or pattern.search(t.id)]
    return tests
