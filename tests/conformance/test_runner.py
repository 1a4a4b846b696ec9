"""The runner: a hung test times out and a crashing backend kills one worker; the run goes on.
Strictness of expectations end to end through the CLI."""
import ctypes
import json
import os
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from conformance import backends
from conformance.cli import main
from conformance.expectations import Expectations
from conformance.pins import Cache, load_pins
from conformance.reports import write_markdown
from conformance.runner import RunConfig, apply_expectations, collect_tests, run_tests
from conformance.runner import TestResult as Result

from .synthetic import build_wheel, write_pins
from .synthetic_generated import write_generated_pins


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
    tests, unusable = collect_tests(list(load_pins(pins_file).values()), Cache(cache))
    assert unusable == []
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


def test_cli_test_reports_a_bad_pin_and_runs_every_other(tmp_path, monkeypatch, capsys):
    pins_file, fake = write_generated_pins(tmp_path, monkeypatch)
    fake.tampered = True
    monkeypatch.setattr("conformance.cli.load_pins", lambda: load_pins(pins_file))
    monkeypatch.setattr("conformance.runner.load_pins", lambda path=None: load_pins(pins_file))
    out = tmp_path / "r.json"
    code = main(["test", "--opset", "13,28", "--filter", "relu_tiny", "--cache-dir",
                 str(tmp_path / "c"), "--json", str(out), "-j", "1"])
    assert code == 1
    printed = capsys.readouterr().out
    assert "opset 28 cannot run: mismatch" in printed and "output_0.pb" in printed
    results = {r["id"]: r for r in json.loads(out.read_text())["results"]}
    assert results["opset13/test_relu_tiny"]["verdict"] == "pass"
    assert results["opset28/(corpus)"]["verdict"] == "error"
    assert "differ by" in results["opset28/(corpus)"]["message"]


def test_markdown_lists_the_tests_that_differ_from_the_anchor(tmp_path):
    results = [
        Result("opset21/test_a", 21, "test_a", "node", "pass", anchor_outcome="pass"),
        Result("opset21/test_b", 21, "test_b", "node", "pass", anchor_outcome="error",
                   anchor_message="NOT_IMPLEMENTED: Foo"),
        Result("opset21/test_c", 21, "test_c", "node", "fail", "values differ",
                   anchor_outcome="pass"),
        Result("opset21/test_d", 21, "test_d", "node", "error", "boom", anchor_outcome="fail"),
    ]
    apply_expectations(results, Expectations.parse(""))
    write_markdown(results, str(tmp_path / "r.md"), "reference", "onnxruntime")
    text = (tmp_path / "r.md").read_text()
    section = text.split("## Tests where reference and onnxruntime differ (2)")[1]
    assert "| opset21/test_b | pass | error | NOT_IMPLEMENTED: Foo |" in section
    assert "| opset21/test_c | fail | pass | values differ |" in section
    assert "test_a" not in section and "test_d" not in section
    assert "*node pass*" in text


def _experimental_op_model():
    # ConstantFill (opset 1..) is experimental in onnx's schemas; opset 7's corpus uses it
    graph = helper.make_graph(
        [helper.make_node("ConstantFill", ["x"], ["y"], value=1.0)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 2, 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 6)])


def test_experimental_ops_notice_is_dropped_and_other_output_kept(capfd):
    libc = ctypes.CDLL(None)
    onnx.checker.check_model(_experimental_op_model())
    libc.fflush(None)
    assert backends.EXPERIMENTAL_OPS_NOTICE.decode() in capfd.readouterr().out  # onnx prints it
    with backends.without_experimental_ops_notice():
        onnx.checker.check_model(_experimental_op_model())
        os.write(1, b"other output\n")
    out = capfd.readouterr().out
    assert "experimental" not in out and "other output" in out
    bad = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["missing"], ["y"])], "g", [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])]))
    # errors still raise through it
    with pytest.raises(onnx.checker.ValidationError), backends.without_experimental_ops_notice():
        onnx.checker.check_model(bad)


def test_onnxruntime_anchor_keeps_failed_runs_out_of_the_log(capfd):
    pytest.importorskip("onnxruntime", reason="the onnxruntime anchor is an optional extra")
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "s"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None]),
         helper.make_tensor_value_info("s", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    prepared = backends.OnnxruntimeBackend().prepare(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    with pytest.raises(Exception, match="cannot be reshaped"):
        prepared.run({"x": np.zeros(6, np.float32), "s": np.array([4], np.int64)})
    assert "onnxruntime" not in capfd.readouterr().err
