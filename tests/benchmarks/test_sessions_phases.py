"""benchmarks.sessions' creation phases: median CPU time by phase without a profiler."""
import gc
import sys

from benchmarks.sessions import creation_phases, format_phases


def _spin(n):
    return sum(i * i for i in range(n))


def _unused():
    raise AssertionError("never called")


def _create():
    _spin(200_000)
    cycle = []
    cycle.append(cycle)
    del cycle
    gc.collect()  # a collection inside the creation, reported as its own phase


PHASES = ((__name__, "_spin", "spin"), (__name__, "_unused", "unused"))


def test_phases_split_the_creation_and_name_its_garbage_collections():
    phases = creation_phases(_create, 3, PHASES)
    assert list(phases) == ["all", "spin", "unused", "garbage collection"]
    assert 0 < phases["spin"] <= phases["all"] * 1.01
    assert phases["unused"] == 0
    assert 0 < phases["garbage collection"] <= phases["all"] * 1.01
    assert "garbage collection" in format_phases(phases)


def test_the_timed_functions_are_put_back():
    module = sys.modules[__name__]
    before = module._spin, len(gc.callbacks)
    creation_phases(_create, 1, PHASES)
    assert (module._spin, len(gc.callbacks)) == before
