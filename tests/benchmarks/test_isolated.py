"""benchmarks/isolated.py: workers in their own processes, rounds alternated, failures named.

No runtime is timed here: the workloads are tiny module-level functions below, which the
spawned workers import by their dotted path."""
import os
import time

import pytest

from benchmarks.isolated import IsolatedPair, WorkerError, WorkerSpec, Workload

HERE = __name__


def echo(label: str, pause: float = 0.0) -> Workload:
    calls = []

    def step():
        calls.append(1)
        if pause:
            time.sleep(pause)
        return label

    return Workload(step=step, info={"label": label, "pid": os.getpid()},
                    commands={"calls": lambda: len(calls),
                              "env": lambda key: os.environ.get(key)})


def broken_factory(message: str) -> Workload:
    raise ValueError(message)


def broken_step(message: str) -> Workload:
    def step():
        raise RuntimeError(message)
    return Workload(step=step)


def dying_step(code: int) -> Workload:
    return Workload(step=lambda: os._exit(code))


def not_a_workload(_unused: str) -> str:
    return "a string"


def spec(name: str, factory: str = "echo", *args, **kwargs) -> WorkerSpec:
    return WorkerSpec(name, f"{HERE}:{factory}", args or (name,), **kwargs)


def test_rounds_alternate_in_spec_order_warmups_included():
    with IsolatedPair([spec("first"), spec("second"), spec("third")], settle_seconds=0) as pair:
        times = pair.alternate(rounds=3, iterations=2, warmup_rounds=1)
        assert pair.history == ["first", "second", "third"] * 4
        assert sorted(times) == ["first", "second", "third"]
        assert all(len(t) == 3 for t in times.values())
        # 1 warm-up + 3 rounds of 2 calls each, all in the worker's own step
        assert [pair.command(n, "calls") for n in pair.names] == [8, 8, 8]


def test_each_runtime_runs_in_its_own_process_with_its_own_environment():
    specs = [spec("a", env={"ISOLATED_TEST_VALUE": "1"}),
             spec("b", env={"ISOLATED_TEST_VALUE": "2"})]
    with IsolatedPair(specs, settle_seconds=0) as pair:
        pids = {pair.info(n)["pid"] for n in pair.names}
        assert len(pids) == 2 and os.getpid() not in pids
        assert pair.command("a", "env", "ISOLATED_TEST_VALUE") == "1"
        assert pair.command("b", "env", "ISOLATED_TEST_VALUE") == "2"
        assert pair.outputs("b") == "b"


def test_round_is_timed_inside_the_worker_per_call():
    with IsolatedPair([spec("slow", "echo", "slow", 0.02)], settle_seconds=0) as pair:
        seconds = pair.round("slow", iterations=3)
        assert seconds >= 0.06  # three calls of 20 ms each, timed inside the worker
        per_call = pair.alternation_step(iterations=2)["slow"]
        assert per_call >= 0.02  # no upper bound: this machine is shared, and that would flake


def test_a_failing_factory_surfaces_its_message_and_stops_the_others():
    pair = IsolatedPair([spec("fine"), spec("broken", "broken_factory", "no weights here")])
    with pytest.raises(WorkerError, match="(?s)'broken' failed while building.*no weights here"):
        pair.__enter__()
    assert pair.workers == {}


def test_a_failing_step_surfaces_its_message_and_the_worker_keeps_serving():
    with IsolatedPair([spec("bad", "broken_step", "kernel exploded")]) as pair:
        with pytest.raises(WorkerError, match="(?s)'bad' failed.*RuntimeError: kernel exploded"):
            pair.round("bad")
        with pytest.raises(WorkerError, match="kernel exploded"):
            pair.outputs("bad")
        with pytest.raises(WorkerError, match="no command 'missing'"):
            pair.command("bad", "missing")


def test_a_worker_that_dies_is_reported_with_its_exit_code():
    with (IsolatedPair([spec("dies", "dying_step", 3)]) as pair,
          pytest.raises(WorkerError, match=r"'dies' died .*exit code 3")):
        pair.round("dies")


def test_bad_specs_are_named():
    with (pytest.raises(WorkerError, match="returned str, not a Workload"),
          IsolatedPair([spec("x", "not_a_workload", "unused")])):
        pass
    with (pytest.raises(WorkerError, match="is not 'package.module:function'"),
          IsolatedPair([WorkerSpec("x", "no_colon_here")])):
        pass
    with pytest.raises(ValueError, match="distinct"):
        IsolatedPair([spec("same"), spec("same")])
    with IsolatedPair([spec("one")]) as pair:
        with pytest.raises(ValueError, match="positive int"):
            pair.round("one", iterations=0)
        with pytest.raises(KeyError, match="no running worker 'other'"):
            pair.round("other")


def test_in_process_mode_runs_the_same_rounds_here():
    with IsolatedPair([spec("a"), spec("b")], settle_seconds=0, in_process=True) as pair:
        assert {pair.info(n)["pid"] for n in pair.names} == {os.getpid()}
        times = pair.alternate(rounds=2, warmup_rounds=0)
        assert pair.history == ["a", "b", "a", "b"] and len(times["b"]) == 2
    with (pytest.raises(WorkerError, match="(?s)in-process 'bad' failed while a round.*boom"),
          IsolatedPair([spec("bad", "broken_step", "boom")], in_process=True) as pair):
        pair.round("bad")
