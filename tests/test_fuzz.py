"""Differential fuzzing of the optimized runtime against the reference (conformance/fuzz.py):
a bounded hypothesis run, a replay of every saved regression, and checks that the fuzzer
itself finds, shrinks and saves a planted fault."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conformance import fuzz
from conformance.cli import main as cli_main

REGRESSIONS = Path(__file__).parent / "fuzz" / "regressions"
# a hang guard, not a speed target: a campaign runs each optimized session three times, and on
# a 2-core machine loaded ~10 (three test sessions at once) two of them passed 300 s
CAMPAIGN_TIMEOUT = 900


def _regressions():
    folders = sorted(p for p in REGRESSIONS.iterdir() if (p / "case.json").is_file()) if REGRESSIONS.is_dir() else []
    params = []
    for folder in folders:
        meta = json.loads((folder / "case.json").read_text())
        marks = [pytest.mark.xfail(strict=True, reason=meta["xfail"])] if meta.get("xfail") else []
        params.append(pytest.param(folder, id=folder.name, marks=marks))
    return params


@pytest.mark.timeout(120)
@pytest.mark.parametrize("folder", _regressions())
def test_saved_regression_agrees_now(folder):
    case, meta = fuzz.load_case(str(folder))
    assert fuzz.check_case(case) == [], meta.get("note", meta["problems"])


@pytest.mark.timeout(CAMPAIGN_TIMEOUT)
@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(fuzz.cases())
def test_random_graphs_agree_with_the_reference(case):
    problems = fuzz.check_case(case)
    assert not problems, f"{case.describe()}\n" + "\n".join(problems)


# the fuzzer's own parts --------------------------------------------------------------------------
@given(st.sampled_from(fuzz.LAYOUTS), st.lists(st.integers(1, 4), min_size=1, max_size=4),
       st.integers(0, 2**32 - 1))
def test_layouts_keep_the_values_and_are_views(layout, shape, seed):
    rng = np.random.default_rng(seed)
    data = fuzz.random_array(rng, "float32", tuple(shape))
    if layout == "broadcast":
        data = np.broadcast_to(data[:1], data.shape).copy()
    view = fuzz.as_layout(data, layout)
    np.testing.assert_array_equal(view, data)
    if layout != "contiguous" and data.size > 1 and max(shape) > 1:
        assert not view.flags.c_contiguous or view.base is not None


@given(st.integers(0, 6), st.integers(-10, 10), st.sampled_from([-10, 10, 2**63 - 1, -(2**63) + 1]),
       st.sampled_from([1, 2, 3, -1, -2, -3]))
def test_slice_length_is_the_spec_count(d, start, end, step):
    """Hand-walked spec semantics (clamp, then step) against the builder's formula."""
    s = start + d if start < 0 else start
    e = end + d if end < 0 else end
    lo, hi = (0, d) if step > 0 else (0, d - 1)
    s = min(max(s, lo), hi)
    e = min(max(e, 0 if step > 0 else -1), d if step > 0 else d - 1)
    count, i = 0, s
    while (i < e) if step > 0 else (i > e):
        count, i = count + 1, i + step
    assert fuzz.slice_length(d, start, end, step) == count


def _planted(monkeypatch):
    """The optimized runtime at level 99 adds 1 to every float32 output: a wrong answer."""
    real = fuzz.run_optimized

    def wrong(model_bytes, feeds, level):
        outputs = real(model_bytes, feeds, level)
        if level == 99:
            outputs = [o + np.float32(1) if o.dtype == np.float32 and o.size else o for o in outputs]
        return outputs

    monkeypatch.setattr(fuzz, "run_optimized", wrong)


@pytest.mark.timeout(CAMPAIGN_TIMEOUT)
def test_a_planted_fault_is_found_shrunk_and_saved(tmp_path, monkeypatch):
    _planted(monkeypatch)
    result = fuzz.run_batch(seed=1, examples=100, out_dir=str(tmp_path), onnxruntime=False, max_ops=4)
    assert result.outcome == "mismatch" and "optimized level 99" in result.problems[0]
    case, _ = fuzz.load_case(result.saved)
    assert len(case.model.graph.node) <= 2, case.describe()  # shrunk to (nearly) one node
    assert fuzz.check_case(case, onnxruntime=False)  # the saved case still shows the fault
    monkeypatch.undo()
    assert fuzz.check_case(case, onnxruntime=False) == []


@pytest.mark.timeout(CAMPAIGN_TIMEOUT)
def test_cli_campaign_over_workers_exits_1_on_a_planted_fault(tmp_path, monkeypatch, capsys):
    assert cli_main(["fuzz", "--examples", "8", "--jobs", "2", "--out", str(tmp_path / "ok")]) == 0
    assert "fuzz campaign" in capsys.readouterr().out
    _planted(monkeypatch)  # forked workers inherit the patch
    out = tmp_path / "bad"
    assert cli_main(["fuzz", "--examples", "30", "--jobs", "2", "--seed", "3", "--out", str(out),
                     "--no-onnxruntime"]) == 1
    printed = capsys.readouterr().out
    assert "mismatch" in printed and "optimized level 99" in printed
    saved = [p for p in os.listdir(out) if not p.startswith(".")]
    assert saved and all((out / p / "model.onnx").is_file() for p in saved)


@pytest.mark.timeout(CAMPAIGN_TIMEOUT)
def test_a_worker_that_dies_keeps_the_graph_it_was_running(tmp_path, monkeypatch):
    """A kernel that kills its process (a segfault, say) ends one batch as a crash, and the
    graph it was running is saved as a regression; the other batches still run."""
    def die(model_bytes, feeds, level):
        if level == 99 and any(n.op_type == "Conv" for n in onnx.load_from_string(model_bytes).graph.node):
            os._exit(3)
        return real(model_bytes, feeds, level)

    real = fuzz.run_optimized
    monkeypatch.setattr(fuzz, "run_optimized", die)  # forked workers inherit the patch
    results = fuzz.campaign(60, seed=5, jobs=2, out_dir=str(tmp_path), onnxruntime=False)
    crashed = [r for r in results if r.outcome == "crash"]
    assert crashed and all("exit code 3" in r.problems[0] for r in crashed)
    for r in crashed:
        case, _ = fuzz.load_case(r.saved)
        assert any(n.op_type == "Conv" for n in case.model.graph.node)
    assert not (tmp_path / ".running").exists()


def _relu_case() -> fuzz.FuzzCase:
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Relu", ["x"], ["y"])], "relu",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3])])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 21)])
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    return fuzz.FuzzCase(model, {"x": x}, {"x": "contiguous"})


@pytest.mark.parametrize("fault, message", [
    ("second run differs", "differs from run 1 at output 0: 6 elements differ"),
    ("second run writes into the first's output", "run 1's outputs were changed by a later run"),
])
def test_each_session_runs_again_and_must_agree_with_its_first_run(monkeypatch, fault, message):
    """The plan runs a signature's steps in C from its second run on: a fault there, or an
    output array a later run reuses, shows only on a repeat."""
    import optimized

    assert fuzz.check_case(_relu_case(), onnxruntime=False) == []
    real = optimized.InferenceSession.run
    returned = []

    def faulty(self, names, feeds, *args, **kwargs):
        outputs = real(self, names, feeds, *args, **kwargs)
        if len(returned) % fuzz.REPEATS == 1:
            if fault == "second run differs":
                outputs = [o + np.float32(1) for o in outputs]
            else:
                returned[-1][0][...] = 7
        returned.append(outputs)
        return outputs

    monkeypatch.setattr(optimized.InferenceSession, "run", faulty)
    problems = fuzz.check_case(_relu_case(), onnxruntime=False)
    assert len(problems) == len(fuzz.LEVELS)
    assert all(message in p for p in problems), problems
