"""benchmarks.sessions' profile with --pause: a sleep before each profiled run."""
import pytest

from benchmarks import sessions


def test_the_profile_sleeps_the_pause_before_every_run(monkeypatch):
    slept = []
    monkeypatch.setattr(sessions.time, "sleep", slept.append)
    workload = sessions.optimized("chain100", 1)
    summary = workload.commands["profile"](3, False, 0.25)
    assert slept == [0.25] * (3 + sessions.WARM_UPS)  # the warm-ups pause too, as the suite does
    assert summary  # node events were summarised


def test_no_pause_sleeps_nothing(monkeypatch):
    slept = []
    monkeypatch.setattr(sessions.time, "sleep", slept.append)
    sessions.optimized("chain100", 1).commands["profile"](2)
    assert slept == []


@pytest.mark.parametrize("tail", [["--pause"], ["--pause", "soon"], ["--pause", "-1"]])
def test_a_pause_that_is_not_seconds_is_refused(tail, capsys):
    assert sessions.main(["chain100", "1", *tail]) == 2
    assert "--pause" in capsys.readouterr().err
