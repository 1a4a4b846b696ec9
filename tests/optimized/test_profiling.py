"""With enable_profiling, a session's runs go through the same compiled step table as without
(csrc/plan.c plan_run_timed reads the clock after each step), and the trace has one
onnxruntime-style node event per node that ran, in order, whose durations add up to about the
run's; with profiling off the table runs without a clock (plan_run)."""
import itertools
import json

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import optimized as ort
from optimized import kernels

F = TensorProto.FLOAT
X_SHAPE = (2, 3, 24, 40)
# graph order of the nodes that run every compiled run; relu2 is fused into conv2 (FusedConv)
RUN_NODES = ["conv1", "mul1", "add1", "tanh1", "erf1", "conv2"]
CHAIN = ["mul1", "add1", "tanh1"]  # one fused elementwise step, its time split evenly
WARM_UPS = 2  # a signature's first two runs go step by step in Python (seen, then recorded)


def _model():
    rng = np.random.default_rng(0)

    def init(name, shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Mul", ["c1", "scale"], ["m1"], name="mul1"),
             helper.make_node("Add", ["m1", "shift"], ["a1"], name="add1"),
             helper.make_node("Tanh", ["a1"], ["t1"], name="tanh1"),
             helper.make_node("Erf", ["t1"], ["e1"], name="erf1"),  # no C step: runs in Python
             helper.make_node("Conv", ["e1", "w2"], ["c2"], name="conv2"),
             helper.make_node("Relu", ["c2"], ["y"], name="relu2")]
    graph = helper.make_graph(
        nodes, "profiled", [helper.make_tensor_value_info("x", F, list(X_SHAPE))],
        [helper.make_tensor_value_info("y", F, None)],
        [init("w1", [16, 3, 3, 3]), init("scale", [1, 16, 24, 40]), init("shift", [1, 16, 24, 40]),
         init("w2", [8, 16, 1, 1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _session(tmp_path=None):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    if tmp_path is not None:
        options.enable_profiling = True
        options.profile_file_prefix = str(tmp_path / "profile")
    return ort.InferenceSession(_model().SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def _feed():
    return {"x": np.random.default_rng(1).standard_normal(X_SHAPE).astype(np.float32)}


@pytest.fixture
def table_calls(monkeypatch):
    """The `times` argument of every StepTable.run call: None where the table ran unclocked."""
    calls = []
    run = kernels.StepTable.run

    def spy(self, start, stop, times=None):
        calls.append(times)
        return run(self, start, stop, times)

    monkeypatch.setattr(kernels.StepTable, "run", spy)
    return calls


def _profiled_runs(tmp_path, runs, after_warm_ups=lambda: None):
    """The trace of WARM_UPS + runs runs, split by its model_run events: [(run, node events)]."""
    session = _session(tmp_path)
    for _ in range(WARM_UPS):
        session.run(None, _feed())
    after_warm_ups()
    for _ in range(runs):
        session.run(None, _feed())
    with open(session.end_profiling()) as f:
        events = json.load(f)
    model_runs = sorted((e for e in events if e["cat"] == "Session"), key=lambda e: e["ts"])
    nodes = sorted((e for e in events if e["cat"] == "Node"), key=lambda e: e["ts"])
    assert len(model_runs) == WARM_UPS + runs
    return [(r, [e for e in nodes if r["ts"] <= e["ts"] < r["ts"] + r["dur"]]) for r in model_runs]


def test_compiled_runs_have_one_event_per_node_in_order_back_to_back(tmp_path, table_calls):
    for run, events in _profiled_runs(tmp_path, 3, table_calls.clear)[WARM_UPS:]:
        assert [e["name"] for e in events] == [f"{n}_kernel_time" for n in RUN_NODES]
        assert [e["args"]["op_name"] for e in events] == ["Conv", "Mul", "Add", "Tanh", "Erf",
                                                          "FusedConv"]
        assert all(e["dur"] > 0 for e in events)
        for before, after in itertools.pairwise(events):
            assert after["ts"] >= before["ts"] + before["dur"] - 1e-3  # µs, float rounding
        assert events[0]["ts"] >= run["ts"]
        assert events[-1]["ts"] + events[-1]["dur"] <= run["ts"] + run["dur"] + 1e-3
    # the compiled runs' table ran, clocked: conv1 and the chain, then conv2 after Erf
    assert len(table_calls) == 2 * 3 and all(times is not None for times in table_calls)


def test_node_durations_add_up_to_most_of_the_run(tmp_path):
    shares = []
    for run, events in _profiled_runs(tmp_path, 7)[WARM_UPS:]:
        total = sum(e["dur"] for e in events)
        assert total <= run["dur"] + 1e-3
        shares.append(total / run["dur"])
    # most runs 0.9-0.97 of the run; the median, as now and then a run has a pause of some ms
    # between steps, outside every node (seen on a loaded machine with gc off too)
    assert sorted(shares)[len(shares) // 2] > 0.7, shares


def test_a_fused_chain_is_split_evenly_among_its_nodes(tmp_path):
    for _, events in _profiled_runs(tmp_path, 2)[WARM_UPS:]:
        chain = [e for e in events if e["name"] in {f"{n}_kernel_time" for n in CHAIN}]
        assert len(chain) == len(CHAIN)
        assert max(e["dur"] for e in chain) == pytest.approx(min(e["dur"] for e in chain))
        assert chain[0]["args"]["input_type_shape"] == [{"float32": [2, 16, 24, 40]},
                                                        {"float32": [1, 16, 24, 40]}]


def test_input_shapes_of_compiled_and_python_steps(tmp_path):
    _, events = _profiled_runs(tmp_path, 1)[-1]
    shapes = {e["args"]["op_name"]: e["args"]["input_type_shape"] for e in events}
    assert shapes["Conv"] == [{"float32": [2, 3, 24, 40]}, {"float32": [16, 3, 3, 3]}]
    assert shapes["Erf"] == [{"float32": [2, 16, 24, 40]}]
    assert shapes["FusedConv"][1] == {"float32": [8, 16, 1, 1]}


def test_outputs_are_the_same_with_profiling_on_and_off(tmp_path):
    plain, profiled = _session(), _session(tmp_path)
    for _ in range(WARM_UPS + 2):
        expected, got = plain.run(None, _feed()), profiled.run(None, _feed())
        assert len(expected) == len(got) == 1
        np.testing.assert_array_equal(got[0], expected[0])


def test_without_profiling_the_table_runs_without_a_clock(table_calls):
    session = _session()
    for _ in range(WARM_UPS):
        session.run(None, _feed())
    table_calls.clear()
    for _ in range(2):
        session.run(None, _feed())
    assert len(table_calls) == 2 * 2 and all(times is None for times in table_calls)


def test_a_step_table_refuses_a_times_buffer_it_cannot_fill():
    table = kernels.StepTable([], 1)
    with pytest.raises(ValueError, match="times must be"):
        table.run(0, 1, np.zeros(1, np.int64))
    with pytest.raises(ValueError, match="times must be"):
        table.run(0, 1, np.zeros(2, np.int32))


def test_event_format_matches_onnxruntimes_trace(tmp_path):
    onnxruntime = pytest.importorskip("onnxruntime", reason="the anchor runtime (extra: anchors)")
    options = onnxruntime.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "anchor")
    anchor = onnxruntime.InferenceSession(_model().SerializeToString(), options,
                                          providers=["CPUExecutionProvider"])
    anchor.run(None, _feed())
    with open(anchor.end_profiling()) as f:
        theirs = json.load(f)
    _, ours = _profiled_runs(tmp_path, 1)[-1]
    their_node = next(e for e in theirs if e["cat"] == "Node"
                      and e["name"].endswith("_kernel_time"))
    their_run = next(e for e in theirs if e["cat"] == "Session" and e["name"] == "model_run")
    for event in ours:
        assert set(their_node) <= set(event)
        assert {"op_name", "provider", "input_type_shape"} <= set(their_node["args"]) \
            & set(event["args"])
        assert event["args"]["provider"] == their_node["args"]["provider"]
    assert {"cat", "name", "ph", "ts", "dur"} <= set(their_run)


def test_profile_summary_keeps_the_last_runs_by_their_model_run_events(tmp_path):
    from benchmarks.sessions import profile_summary

    def node(op, ts, dur):
        return {"cat": "Node", "name": f"{op}_kernel_time", "ts": ts, "dur": dur, "ph": "X",
                "args": {"op_name": op, "input_type_shape": [{"float32": [2, 3]}]}}

    def model_run(ts, dur):
        return {"cat": "Session", "name": "model_run", "ts": ts, "dur": dur, "ph": "X"}

    # warm-ups with one more node (a step worked out once later), then two runs without it
    trace = [model_run(0, 10), node("Shape", 1, 2), node("Relu", 4, 5),
             model_run(20, 10), node("Shape", 21, 2), node("Relu", 24, 5),
             model_run(40, 10), node("Relu", 41, 3),
             model_run(60, 10), node("Relu", 61, 5)]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    assert profile_summary(str(path), 2) == {"Relu": {"nodes": 1.0, "us": 4.0}}


def test_a_growing_cache_s_shared_program_is_profiled_with_each_run_s_shapes(tmp_path,
                                                                              monkeypatch):
    from benchmarks.decoders import SIZES, build_llama, empty_past, step_feeds
    from optimized.plan_shapes import GrowingRun

    profiled_runs = []
    real = GrowingRun.run

    def spy(self, feeds, profiler=None):
        profiled_runs.append(profiler is not None)
        return real(self, feeds, profiler)

    monkeypatch.setattr(GrowingRun, "run", spy)
    model = build_llama(SIZES["tiny"])
    options = ort.SessionOptions()
    options.enable_profiling, options.profile_file_prefix = True, str(tmp_path / "decode")
    profiled = ort.InferenceSession(model.SerializeToString(), options)
    plain = ort.InferenceSession(model.SerializeToString())
    names = [o.name for o in model.graph.output]
    prompt = [1, 17, 42, 99, 7]
    feeds = {**step_feeds(np.array([prompt], np.int64), 0), **empty_past(model)}
    for i in range(8):
        got, want = profiled.run(None, feeds), plain.run(None, feeds)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
        past = {n.replace("present.", "past_key_values."): v for n, v in zip(names, got)
                if n.startswith("present.")}
        feeds = {**step_feeds(np.array([[3 + i]], np.int64), len(prompt) + i), **past}
    # the last runs of both sessions went through their shared programs, the profiled one's
    # with its profiler
    assert profiled_runs.count(True) == profiled_runs.count(False) >= 3
    with open(profiled.end_profiling()) as f:
        events = json.load(f)
    model_runs = sorted((e for e in events if e["cat"] == "Session"), key=lambda e: e["ts"])
    nodes = [e for e in events if e["cat"] == "Node"]

    def shapes_in(run):
        inside = [e for e in nodes if run["ts"] <= e["ts"] < run["ts"] + run["dur"]]
        assert inside and sum(e["dur"] for e in inside) <= run["dur"] + 1e-3
        return [(e["name"], e["args"]["op_name"], e["args"]["input_type_shape"]) for e in inside]

    before, last = shapes_in(model_runs[-2]), shapes_in(model_runs[-1])
    assert [name for name, *_ in before] == [name for name, *_ in last]
    grown = [(op, a, b) for (_, op, a), (*_, b) in zip(before, last) if a != b]
    assert "Concat" in {op for op, *_ in grown}  # the caches' Concat, a C step of the program
    for _, a, b in grown:
        sizes = [(next(iter(x.values())), next(iter(y.values()))) for x, y in zip(a, b) if x != y]
        assert all(sum(q) - sum(p) == 1 for p, q in sizes), sizes
