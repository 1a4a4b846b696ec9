"""benchmarks.sessions' creation profile: where one creation spends its CPU time."""
from benchmarks.sessions import creation_summary, format_creation


def _spin(n):
    return sum(i * i for i in range(n))


def _create():
    return [_spin(20000) for _ in range(3)]


def test_creation_summary_names_the_functions_a_creation_calls_by_cumulative_time():
    summary = creation_summary(_create, top=5)
    rows = summary["rows"]
    assert summary["seconds"] > 0 and len(rows) <= 5
    assert [r[3] for r in rows] == sorted((r[3] for r in rows), reverse=True)
    spin = next(r for r in rows if r[0].endswith("(_spin)"))
    assert spin[0].startswith("benchmarks/test_sessions_creation.py:")
    assert spin[1] == 3 and 0 <= spin[2] <= spin[3] <= summary["seconds"] * 1.01
    assert "(_spin)" in format_creation(summary)
