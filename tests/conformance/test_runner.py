"""The runner: a hung test times out and a crashing backend kills one worker; the run goes on.
Strictness of expectations end to end through the CLI."""
import json
import os
import time

import pytest

from conformance import backends
from conformance.cli import main
from conformance.expectations import Expectations
from conformance.pins import Cache, load_pins
from conformance.runner import RunConfig, apply_expectations, collect_tests, run_tests

from .synthetic import build_wheel, write_pins


class TroubleBackend:
    """Runs the reference, but hangs or crashes on the tests named for it."""

    name = "trouble"
    anchor = False

    def prepare(self, model):
        if model.graph.name == "test_hang":
            time.sleep(3600)
        if model.graph.name == "test_crash":
            os._exit(3)
        return backends.ReferenceBackend().prepare(model)


@pytest.fixture
def corpus_env(tmp_path, monkeypatch):
    wheel = build_wheel(tmp_path / "onnx-0.0.1-py3-none-any.whl")
    pins_file = write_pins(tmp_path, wheel)
    monkeypatch.setitem(backends.BACKENDS, "trouble", TroubleBackend)
    cache = tmp_path / "cache"
    tests = collect_tests(list(load_pins(pins_file).values()), Cache(cache))
    return tests, RunConfig("trouble", cache_root=str(cache), timeout_s=3, pins_file=str(pins_file))


def test_hang_times_out_crash_is_reported_and_the_rest_runs(corpus_env):
    tests, config = corpus_env
    start = time.monotonic()
    results = {r.key: r for r in run_tests(tests, config, jobs=2)}
    assert time.monotonic() - start < 60
    assert results["test_hang"].outcome == "timeout"
    assert results["test_crash"].outcome == "crash"
    assert "exit code 3" in results["test_crash"].message
    assert results["test_relu_tiny"].outcome == "pass"
    assert results["simple/test_sequence_identity"].outcome == "pass"
    assert results["real/test_big"].outcome == "unavailable"


def test_expectations_applied_to_results(corpus_env):
    tests, config = corpus_env
    results = run_tests(tests, config, jobs=1)
    ex = Expectations.parse('[all]\n"test_hang" = "sleeps forever by design"\n'
                            '"test_relu_tiny" = "listed although it passes"\n')
    verdicts = {r.key: r.verdict for r in apply_expectations(results, ex)}
    assert verdicts["test_hang"] == "expected-fail"
    assert verdicts["test_crash"] == "error"
    assert verdicts["test_relu_tiny"] == "stale-expectation"
    assert verdicts["simple/test_sequence_identity"] == "pass"


def test_cli_test_writes_reports_and_fails_on_a_wrong_answer(tmp_path, monkeypatch):
    wheel = build_wheel(tmp_path / "onnx-0.0.1-py3-none-any.whl", wrong_output=True)
    pins_file = write_pins(tmp_path, wheel)
    monkeypatch.setattr("conformance.pins.PINS_FILE", pins_file)
    monkeypatch.setattr("conformance.cli.load_pins", lambda: load_pins(pins_file))
    monkeypatch.setattr("conformance.runner.load_pins", lambda path=None: load_pins(pins_file))
    out = tmp_path / "r.json"
    code = main(["test", "--backend", "reference", "--opset", "13", "--filter", "relu_tiny",
                 "--cache-dir", str(tmp_path / "c"), "--json", str(out),
                 "--junit", str(tmp_path / "r.xml"), "--markdown", str(tmp_path / "r.md"), "-j", "1"])
    assert code == 1
    data = json.loads(out.read_text())
    assert data["results"][0]["verdict"] == "unexpected-fail"
    assert "differ" in data["results"][0]["message"]
    assert "<failure" in (tmp_path / "r.xml").read_text()
    assert "unexpected-fail" in (tmp_path / "r.md").read_text()


def test_cli_corpus_offline_missing_pin_is_a_message_not_a_traceback(tmp_path, capsys):
    code = main(["corpus", "verify", "--opset", "7", "--offline", "--cache-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 1
    assert "not cached" in out and "Traceback" not in out


def test_cli_unknown_backend_is_a_usage_error(capsys):
    assert main(["test", "--backend", "nope", "--opset", "7"]) == 2
    assert "unknown backend" in capsys.readouterr().out
