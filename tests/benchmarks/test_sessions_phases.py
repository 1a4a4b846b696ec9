"""benchmarks.sessions' creation phases: median CPU time by phase without a profiler."""
import gc
import sys
from typing import NamedTuple

from benchmarks.sessions import creation_phases, format_phases


def _spin(n):
    return sum(i * i for i in range(n))


def _unused():
    raise AssertionError("never called")


class Step(NamedTuple):
    name: str
    function: object


STEPS = [Step("short", lambda: _spin(20_000)), Step("long", lambda: _spin(400_000)),
         Step("never", _unused)]


def _run_steps():
    for step in STEPS[:2]:
        step.function()


def _create():
    _spin(200_000)
    _run_steps()
    cycle = []
    cycle.append(cycle)
    del cycle
    gc.collect()  # a collection inside the creation, reported as its own phase


PHASES = ((__name__, "_spin", "spin"), (__name__, "_unused", "unused"),
          (__name__, "_run_steps", "passes"))


def test_phases_split_the_creation_and_name_its_garbage_collections():
    phases = creation_phases(_create, 3, PHASES)
    assert list(phases) == ["all", "all, creating thread", "spin", "unused", "passes",
                            "garbage collection"]
    assert 0 < phases["spin"] <= phases["all"] * 1.01
    assert 0 < phases["all, creating thread"] <= phases["all"] * 1.01
    assert phases["unused"] == 0
    assert 0 < phases["garbage collection"] <= phases["all"] * 1.01
    assert "garbage collection" in format_phases(phases)


def test_other_threads_count_in_all_only():
    """CPU that another thread of the process burns meanwhile (a pool left spinning) is in
    "all", not in the creating thread's share."""
    import threading

    busy = threading.Event()

    def _create_beside_a_spinning_thread():
        busy.clear()
        other = threading.Thread(target=lambda: [_spin(50_000) for _ in iter(busy.is_set, True)])
        other.start()
        try:
            _spin(300_000)
        finally:
            busy.set()
            other.join()

    phases = creation_phases(_create_beside_a_spinning_thread, 3, ())
    assert phases["all, creating thread"] < phases["all"]


def test_the_timed_functions_are_put_back():
    module = sys.modules[__name__]
    before = module._spin, len(gc.callbacks)
    creation_phases(_create, 1, PHASES)
    assert (module._spin, len(gc.callbacks)) == before


def test_each_listed_step_that_ran_is_timed_slowest_first():
    phases = creation_phases(_create, 3, PHASES, (__name__, "STEPS"))
    assert list(phases)[-3:] == ["passes: between", "pass long", "pass short"]
    assert phases["pass long"] > phases["pass short"] > 0
    assert 0 <= phases["passes: between"] < phases["passes"]
    assert [step.function for step in STEPS][2] is _unused  # the list is put back
