"""Time several runtimes on one workload, each in its own process, rounds alternated.

Each runtime runs in a long-lived worker process of its own, started with the `spawn` method,
so no two runtimes ever share a process: their thread pools cannot take each other's cores
while one of them waits for work, and neither inherits the other's imported state. The worker
builds its workload once (for a model: the session, from the model's bytes) and then serves
rounds. The parent asks for rounds in turn: round 1 of the first runtime, round 1 of the
second, round 2 of the first, ... so that a machine whose load drifts during the run slows both
alike.

A round is `iterations` consecutive calls of the workload's step, timed inside the worker with
`time.perf_counter` around the loop, so the messages between the processes are not timed.

A worker is described by a `WorkerSpec`: a label, the dotted path of a module-level factory
("package.module:function"), its arguments, and environment variables set in the worker before
the factory's module is imported. The factory returns a `Workload`: `step()` runs one call
(a session run, a decode step, a whole generation loop) and returns its outputs; `info` holds
whatever the factory measured while building (the session-creation time, for example);
`commands` names extra callables the parent may call by name (a profile, say).

    with IsolatedPair([WorkerSpec("optimized", "benchmarks.sessions:optimized", (name, 2)),
                       WorkerSpec("onnxruntime", "benchmarks.sessions:onnxruntime", (name, 2))]
                      ) as pair:
        outputs = pair.outputs("optimized")
        times = pair.alternate(rounds=7, iterations=1, warmup_rounds=1)
        # times["onnxruntime"] = [seconds per call, one per round]

pytest-benchmark (benchmarks/test_optimized_vs_ort.py): a test calls `benchmark.pedantic` on
`pair.alternation_step`, one round of every runtime in turn. pytest-benchmark's own statistics
of that benchmark are the wall time of a whole step (every runtime and the messages); the
comparison is in `extra_info`, where `round_stats` gives, per runtime, pytest-benchmark's
`Stats` over the worker-measured seconds per call.
"""
from __future__ import annotations

import importlib
import multiprocessing
import os
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

# long enough for building light_vgg19 twice on a busy 2-core machine
START_TIMEOUT = 600.0
REQUEST_TIMEOUT = 600.0
# pause between rounds, so that threads still spinning after one runtime's round do not take
# the cores of the next runtime's round: onnxruntime's pool (gpt2_seq128, 2 threads) spent
# 8 ms of CPU in the 10 ms after a run and 40-46 ms within 0.1 s and 1 s (process_time while
# sleeping); with a 10 ms pause the next runtime's round ran beside that spinning thread
SETTLE_SECONDS = 0.1


class WorkerError(RuntimeError):
    """A worker failed: its factory, a step, a command, or the process itself."""


@dataclass(frozen=True)
class WorkerSpec:
    name: str
    factory: str  # "package.module:function", importable in a fresh interpreter
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)


@dataclass
class Workload:
    step: Callable[[], Any]
    info: dict = field(default_factory=dict)
    commands: dict = field(default_factory=dict)


def resolve(path: str) -> Callable:
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"factory {path!r} is not 'package.module:function'")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ValueError(f"module {module_name!r} has no {attribute!r}") from None


def timed_round(step: Callable[[], Any], iterations: int) -> float:
    start = time.perf_counter()
    for _ in range(iterations):
        step()
    return time.perf_counter() - start


def answer(request: tuple, workload: Workload) -> Any:
    kind = request[0]
    if kind == "round":
        return timed_round(workload.step, request[1])
    if kind == "outputs":
        return workload.step()
    if kind == "command":
        name, args = request[1], request[2]
        if name not in workload.commands:
            raise KeyError(f"no command {name!r}; this workload has {sorted(workload.commands)}")
        return workload.commands[name](*args)
    raise ValueError(f"unknown request {kind!r}")


def serve(connection, spec: WorkerSpec) -> None:
    """The worker's main loop: build the workload, then answer requests until 'stop'."""
    os.environ.update({k: str(v) for k, v in spec.env.items()})
    try:
        workload = resolve(spec.factory)(*spec.args, **spec.kwargs)
        if not isinstance(workload, Workload):
            raise TypeError(f"factory {spec.factory} returned {type(workload).__name__}, "
                            "not a Workload")
        connection.send(("ok", dict(workload.info)))
    except Exception:  # noqa: BLE001 - any failure goes back to the parent, named
        connection.send(("error", traceback.format_exc()))
        return
    while True:
        try:
            request = connection.recv()
        except EOFError:  # the parent is gone
            return
        if request[0] == "stop":
            return
        try:
            connection.send(("ok", answer(request, workload)))
        except Exception:  # noqa: BLE001 - any failure goes back to the parent, named
            connection.send(("error", traceback.format_exc()))


class Worker:
    def __init__(self, spec: WorkerSpec, context):
        self.spec = spec
        self.connection, child = context.Pipe()
        self.process = context.Process(target=serve, args=(child, spec), daemon=True,
                                       name=f"isolated-{spec.name}")
        self.process.start()
        child.close()
        self.info = self.receive(START_TIMEOUT, "building its workload")

    def receive(self, timeout: float, doing: str) -> Any:
        if not self.connection.poll(timeout):
            raise WorkerError(f"worker {self.spec.name!r} gave no answer within {timeout:.0f} s "
                              f"while {doing}")
        try:
            status, payload = self.connection.recv()
        except EOFError:
            self.process.join(5)
            raise WorkerError(f"worker {self.spec.name!r} died while {doing} "
                              f"(exit code {self.process.exitcode})") from None
        if status == "error":
            raise WorkerError(f"worker {self.spec.name!r} failed while {doing}:\n{payload}")
        return payload

    def request(self, message: tuple, doing: str, timeout: float = REQUEST_TIMEOUT) -> Any:
        try:
            self.connection.send(message)
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.process.join(5)
            raise WorkerError(f"worker {self.spec.name!r} is gone (exit code "
                              f"{self.process.exitcode}) before {doing}") from None
        return self.receive(timeout, doing)

    def stop(self) -> None:
        try:
            self.connection.send(("stop",))
        except OSError:
            pass
        self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
        self.connection.close()


class InProcessWorker:
    """A workload built and run in this process, answering as a Worker does; for measuring
    what sharing one process costs, never the default."""

    def __init__(self, spec: WorkerSpec):
        self.spec = spec
        try:
            self.workload = resolve(spec.factory)(*spec.args, **spec.kwargs)
        except Exception as e:
            raise WorkerError(f"in-process {spec.name!r} failed while building its workload:\n"
                              f"{traceback.format_exc()}") from e
        if not isinstance(self.workload, Workload):
            raise WorkerError(f"factory {spec.factory} returned "
                              f"{type(self.workload).__name__}, not a Workload")
        self.info = dict(self.workload.info)

    def request(self, message: tuple, doing: str, timeout: float = REQUEST_TIMEOUT) -> Any:
        try:
            return answer(message, self.workload)
        except Exception as e:
            raise WorkerError(f"in-process {self.spec.name!r} failed while {doing}:\n"
                              f"{traceback.format_exc()}") from e

    def stop(self) -> None:
        self.workload = None


class IsolatedPair:
    """Workers for every spec (two or more), started one after another so that their build
    times are not measured against each other; stopped on exit. With in_process=True every
    workload is built in this process instead (spec.env is then not applied), so that the
    same rounds measure runtimes sharing one process."""

    def __init__(self, specs: Sequence[WorkerSpec], settle_seconds: float = SETTLE_SECONDS,
                 in_process: bool = False):
        names = [s.name for s in specs]
        if len(set(names)) != len(names) or not names:
            raise ValueError(f"worker names must be distinct and at least one: {names}")
        self.specs = list(specs)
        self.settle_seconds = settle_seconds
        self.in_process = in_process
        self.workers: dict[str, Worker | InProcessWorker] = {}
        self.history: list[str] = []  # runtime of every timed round, in the order run

    def __enter__(self) -> Self:
        context = multiprocessing.get_context("spawn")
        try:
            for spec in self.specs:
                self.workers[spec.name] = (InProcessWorker(spec) if self.in_process
                                           else Worker(spec, context))
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for worker in self.workers.values():
            worker.stop()
        self.workers.clear()

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.specs]

    def worker(self, name: str) -> Worker | InProcessWorker:
        if name not in self.workers:
            raise KeyError(f"no running worker {name!r}; running: {sorted(self.workers)}")
        return self.workers[name]

    def info(self, name: str) -> dict:
        return self.worker(name).info

    def outputs(self, name: str) -> Any:
        return self.worker(name).request(("outputs",), "computing outputs")

    def command(self, name: str, command: str, *args) -> Any:
        return self.worker(name).request(("command", command, args), f"running {command!r}")

    def round(self, name: str, iterations: int = 1) -> float:
        """Seconds for `iterations` consecutive steps, measured inside the worker."""
        if not isinstance(iterations, int) or iterations < 1:
            raise ValueError(f"iterations must be a positive int, got {iterations!r}")
        seconds = self.worker(name).request(("round", iterations), f"a round of {iterations}")
        self.history.append(name)
        if self.settle_seconds:
            time.sleep(self.settle_seconds)
        return seconds

    def alternation_step(self, iterations: int = 1,
                         into: dict[str, list[float]] | None = None) -> dict[str, float]:
        """One round of every runtime, in spec order; seconds per call for each. With `into`,
        each runtime's seconds per call is appended to into[name]."""
        step = {name: self.round(name, iterations) / iterations for name in self.names}
        if into is not None:
            for name, seconds in step.items():
                into.setdefault(name, []).append(seconds)
        return step

    def alternate(self, rounds: int, iterations: int = 1,
                  warmup_rounds: int = 1) -> dict[str, list[float]]:
        """Warm-up rounds (not kept), then `rounds` alternation steps; seconds per call."""
        for _ in range(warmup_rounds):
            self.alternation_step(iterations)
        times: dict[str, list[float]] = {}
        for _ in range(rounds):
            self.alternation_step(iterations, into=times)
        return times
