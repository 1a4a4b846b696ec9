"""The bad-input catalogue: every entry is one bad input on one surface, with the error it must
give. The CLI exits 2 for a usage error (bad arguments, a file that is not a usable model,
inputs that do not fit the model, an op we cannot run) and 1 for a run that started and failed
or diverged; it never prints a traceback. The API raises an error whose message names what is
wrong. NaN, Inf and 0-sized inputs are not errors: they run, and the values must be right.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import optimized
from conformance.cli import main as cli_main
from conformance.diff.api import diff_models
from reference import (
    InvalidFeedError,
    InvalidModelError,
    NodeError,
    ReferenceEvaluator,
    UnsupportedOpError,
)

pytestmark = pytest.mark.timeout(120)

F, I64 = TensorProto.FLOAT, TensorProto.INT64
LEVELS = (0, 1, 2, 99)


# model builders ------------------------------------------------------------------------------
def _model(nodes, inputs, outputs, initializers=(), opsets=(("", 21),)) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "bad_input_case", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])


def _vi(name, shape, elem=F):
    return helper.make_tensor_value_info(name, elem, shape)


def add_model() -> onnx.ModelProto:
    """y = x + w, x of shape [batch, 3, 5] (non-square so an axis mix-up shows)."""
    w = numpy_helper.from_array(np.linspace(-1, 1, 15, dtype=np.float32).reshape(3, 5), "w")
    return _model([helper.make_node("Add", ["x", "w"], ["y"], name="add")],
                  [_vi("x", ["batch", 3, 5])], [_vi("y", ["batch", 3, 5])], [w])


def conv_model() -> onnx.ModelProto:
    """A rank-4 model whose input is also called x: unrelated to add_model."""
    w = numpy_helper.from_array(np.ones((4, 2, 3, 3), np.float32), "w")
    return _model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv")],
                  [_vi("x", [1, 2, 6, 7])], [_vi("y", [1, 4, 4, 5])], [w])


def custom_op_model(imported=True) -> onnx.ModelProto:
    opsets = (("", 21), ("my.domain", 1)) if imported else (("", 21),)
    return _model([helper.make_node("Frobnicate", ["x"], ["y"], domain="my.domain", name="frob")],
                  [_vi("x", [2, 3])], [_vi("y", [2, 3])], opsets=opsets)


def unknown_onnx_op_model() -> onnx.ModelProto:
    return _model([helper.make_node("Frobnicate", ["x"], ["y"], name="frob")],
                  [_vi("x", [2, 3])], [_vi("y", [2, 3])])


def op_above_opset_model() -> onnx.ModelProto:
    """Gelu exists from opset 20; this model imports opset 18."""
    return _model([helper.make_node("Gelu", ["x"], ["y"])], [_vi("x", [2, 3])], [_vi("y", [2, 3])],
                  opsets=(("", 18),))


def custom_op_in_subgraph_model() -> onnx.ModelProto:
    branch = helper.make_graph([helper.make_node("Frobnicate", ["x"], ["t"], domain="my.domain")],
                               "then", [], [_vi("t", [2, 3])])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [], [_vi("e", [2, 3])])
    node = helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=other)
    return _model([node], [_vi("c", [], TensorProto.BOOL), _vi("x", [2, 3])], [_vi("y", [2, 3])],
                  opsets=(("", 21), ("my.domain", 1)))


def cycle_model() -> onnx.ModelProto:
    return _model([helper.make_node("Relu", ["b"], ["a"], name="first"),
                   helper.make_node("Add", ["a", "x"], ["b"], name="second"),
                   helper.make_node("Identity", ["b"], ["y"])],
                  [_vi("x", [2, 3])], [_vi("y", [2, 3])])


def unsorted_model() -> onnx.ModelProto:
    """Acyclic, but a node comes before the node that makes its input."""
    return _model([helper.make_node("Relu", ["a"], ["y"], name="late_reader"),
                   helper.make_node("Abs", ["x"], ["a"], name="maker")],
                  [_vi("x", [2, 3])], [_vi("y", [2, 3])])


def duplicate_output_model() -> onnx.ModelProto:
    return _model([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Abs", ["x"], ["y"])],
                  [_vi("x", [2, 3])], [_vi("y", [2, 3])])


def undefined_input_model() -> onnx.ModelProto:
    return _model([helper.make_node("Add", ["x", "nowhere"], ["y"], name="adder")],
                  [_vi("x", [2, 3])], [_vi("y", [2, 3])])


def unproduced_output_model() -> onnx.ModelProto:
    return _model([helper.make_node("Relu", ["x"], ["t"])], [_vi("x", [2, 3])], [_vi("y", [2, 3])])


def duplicate_input_model() -> onnx.ModelProto:
    return _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [2, 3]), _vi("x", [2, 3])],
                  [_vi("y", [2, 3])])


def node_shape_mismatch_model() -> onnx.ModelProto:
    """Valid, but the two symbolic inputs cannot broadcast when fed [2,3] and [4,5]: a run error."""
    return _model([helper.make_node("Add", ["a", "b"], ["y"], name="add_ab")],
                  [_vi("a", ["n", "m"]), _vi("b", ["p", "q"])], [_vi("y", ["r", "s"])])


# files -----------------------------------------------------------------------------------------
def save(model, folder, name="model.onnx") -> str:
    path = os.path.join(folder, name)
    onnx.save(model, path)
    return path


def write(folder, name, data: bytes) -> str:
    path = os.path.join(folder, name)
    with open(path, "wb") as f:
        f.write(data)
    return path


def truncated_file(folder) -> str:
    data = add_model().SerializeToString()
    return write(folder, "truncated.onnx", data[: len(data) // 2])


def external_model(folder, location, data: bytes | None = None, length=None) -> str:
    """add_model with w stored outside the model file at `location` (relative to `folder`)."""
    model = add_model()
    w = model.graph.initializer[0]
    raw = w.raw_data
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    entries = [("location", location), ("offset", "0")]
    entries += [("length", str(length))] if length is not None else []
    for key, value in entries:
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    os.makedirs(folder, exist_ok=True)
    if data is not None:
        target = location if os.path.isabs(location) else os.path.join(folder, location)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as f:
            f.write(raw if data is FULL else data)
    return write(folder, "model.onnx", model.SerializeToString())


FULL = b"<the tensor's bytes>"


def ext_missing(tmp):
    return external_model(os.path.join(tmp, "m"), "w.bin")


def ext_truncated(tmp):
    return external_model(os.path.join(tmp, "m"), "w.bin", data=b"\0" * 10)


def ext_length_past_end(tmp):
    return external_model(os.path.join(tmp, "m"), "w.bin", data=b"\0" * 10, length=60)


def ext_dotdot(tmp):
    return external_model(os.path.join(tmp, "m"), "../outside/w.bin", data=FULL)


def ext_absolute(tmp):
    return external_model(os.path.join(tmp, "m"), os.path.join(tmp, "outside", "w.bin"), data=FULL)


def ext_symlink_outside(tmp):
    outside = os.path.join(tmp, "outside")
    os.makedirs(outside)
    path = external_model(os.path.join(tmp, "m"), "w.bin")
    write(outside, "w.bin", numpy_helper.from_array(np.zeros((3, 5), np.float32)).raw_data)
    os.symlink(os.path.join(outside, "w.bin"), os.path.join(tmp, "m", "w.bin"))
    return path


def ext_as_bytes(tmp):
    path = external_model(os.path.join(tmp, "m"), "w.bin", data=FULL)
    with open(path, "rb") as f:
        return f.read()


# feeds -----------------------------------------------------------------------------------------
def x_feed(shape=(2, 3, 5), dtype=np.float32, name="x"):
    return {name: np.arange(np.prod(shape), dtype=np.float64).reshape(shape).astype(dtype)}


def add_with(feeds):
    return lambda tmp: (add_model(), feeds)


# the catalogue ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    id: str
    surface: str  # ref-load, ref-run, sess-load, sess-run, diff, cli
    build: Callable[[str], Any]  # tmp folder -> the input (see run_surface)
    expect: Any  # an exception type, or the CLI's exit code
    message: str  # a regex the error message must match


def _argv(*parts):
    """CLI argv; a callable part is called with the tmp folder (a file it makes)."""
    return lambda tmp: [p(tmp) if callable(p) else p for p in parts]


def _text_file(tmp):
    return write(tmp, "notes.onnx", b"this is a text file, not an ONNX model\n")


def _empty_file(tmp):
    return write(tmp, "empty.onnx", b"")


def _npz_file(tmp):
    path = os.path.join(tmp, "arrays.onnx")
    with open(path, "wb") as f:
        np.savez(f, x=np.zeros(3))
    return path


def _saved(build):
    return lambda tmp: save(build(), tmp, f"{build.__name__}.onnx")


def _npz_inputs(tmp, **arrays):
    path = os.path.join(tmp, "inputs.npz")
    np.savez(path, **arrays)
    return path


CASES = [
    # files that are not usable models
    Case("empty-file", "ref-load", _empty_file, InvalidModelError, r"empty\.onnx.*(is empty|0 bytes)"),
    Case("truncated-file", "ref-load", truncated_file, InvalidModelError, r"truncated\.onnx.*(cannot parse|not an ONNX model)"),
    Case("text-file", "ref-load", _text_file, InvalidModelError, r"notes\.onnx.*(cannot parse|not an ONNX model)"),
    Case("npz-as-model", "ref-load", _npz_file, InvalidModelError, r"arrays\.onnx.*(cannot parse|not an ONNX model)"),
    Case("garbage-bytes", "ref-load", lambda tmp: b"\x08\x07garbage\xff\xff", InvalidModelError, r"cannot parse model bytes"),
    Case("directory-as-model", "ref-load", lambda tmp: tmp, InvalidModelError, r"is a directory"),
    Case("missing-file", "ref-load", lambda tmp: os.path.join(tmp, "nope.onnx"), FileNotFoundError, r"nope\.onnx"),
    Case("wrong-python-type", "ref-load", lambda tmp: 42, TypeError, r"ModelProto, a path or bytes.*int"),
    Case("sess-empty-file", "sess-load", _empty_file, InvalidModelError, r"empty\.onnx.*(is empty|0 bytes)"),
    Case("sess-truncated-file", "sess-load", truncated_file, InvalidModelError, r"truncated\.onnx"),
    Case("sess-text-file", "sess-load", _text_file, InvalidModelError, r"notes\.onnx"),
    Case("cli-run-empty-file", "cli", _argv("run", _empty_file), 2, r"empty\.onnx.*(is empty|0 bytes)"),
    Case("cli-run-text-file", "cli", _argv("run", _text_file), 2, r"notes\.onnx"),
    Case("cli-run-missing-file", "cli", _argv("run", "no/such/model.onnx"), 2, r"no/such/model\.onnx"),
    Case("cli-diff-truncated-file", "cli", _argv("diff", truncated_file), 2, r"truncated\.onnx"),
    # unknown operators
    Case("unknown-onnx-op", "ref-load", lambda tmp: unknown_onnx_op_model(), InvalidModelError, r"Frobnicate.*21"),
    Case("op-above-opset", "ref-load", lambda tmp: op_above_opset_model(), InvalidModelError, r"Gelu.*18"),
    Case("custom-domain-op", "ref-load", lambda tmp: custom_op_model(), UnsupportedOpError, r"my\.domain::Frobnicate.*frob"),
    Case("custom-domain-not-imported", "ref-load", lambda tmp: custom_op_model(imported=False), InvalidModelError, r"my\.domain"),
    Case("custom-op-in-subgraph", "ref-load", lambda tmp: custom_op_in_subgraph_model(), UnsupportedOpError, r"my\.domain::Frobnicate"),
    Case("sess-unknown-onnx-op", "sess-load", lambda tmp: unknown_onnx_op_model(), InvalidModelError, r"Frobnicate"),
    Case("sess-custom-domain-op-at-load", "sess-load", lambda tmp: custom_op_model(), UnsupportedOpError, r"my\.domain::Frobnicate.*frob"),
    Case("sess-custom-op-in-subgraph", "sess-load", lambda tmp: custom_op_in_subgraph_model(), UnsupportedOpError, r"my\.domain::Frobnicate"),
    Case("cli-run-custom-op", "cli", _argv("run", _saved(custom_op_model)), 2, r"my\.domain::Frobnicate"),
    Case("cli-diff-custom-op", "cli", _argv("diff", _saved(custom_op_model)), 2, r"my\.domain::Frobnicate"),
    Case("diff-api-custom-op", "diff", lambda tmp: {"a": custom_op_model()}, UnsupportedOpError, r"my\.domain::Frobnicate"),
    # feeds that do not fit the model
    Case("unknown-input-name", "ref-run", add_with(x_feed(name="X")), InvalidFeedError, r"unknown input 'X'.*\['x'\]"),
    Case("missing-input", "ref-run", add_with({}), InvalidFeedError, r"missing input 'x'"),
    Case("wrong-dtype", "ref-run", add_with(x_feed(dtype=np.float64)), InvalidFeedError, r"input 'x'.*tensor\(float\).*float64"),
    Case("int-for-float", "ref-run", add_with(x_feed(dtype=np.int64)), InvalidFeedError, r"input 'x'.*tensor\(float\).*int64"),
    Case("wrong-rank", "ref-run", add_with(x_feed(shape=(3, 5))), InvalidFeedError, r"input 'x'.*rank 3.*\[3, 5\]"),
    Case("wrong-shape", "ref-run", add_with(x_feed(shape=(2, 5, 3))), InvalidFeedError, r"input 'x'.*dimension 1 must be 3.*\[2, 5, 3\]"),
    Case("list-for-tensor", "ref-run", add_with({"x": [[1.0] * 5] * 3}), InvalidFeedError, r"input 'x'.*tensor\(float\).*list"),
    Case("unknown-output-name", "ref-run", lambda tmp: (add_model(), {**x_feed(), "__outputs__": ["z"]}), InvalidFeedError, r"unknown output 'z'.*\['y'\]"),
    Case("sess-unknown-input-name", "sess-run", add_with(x_feed(name="X")), ValueError, r"unknown input 'X'"),
    Case("sess-missing-input", "sess-run", add_with({}), ValueError, r"missing input 'x'"),
    Case("sess-wrong-dtype", "sess-run", add_with(x_feed(dtype=np.float64)), InvalidFeedError, r"input 'x'.*tensor\(float\).*float64"),
    Case("sess-wrong-rank", "sess-run", add_with(x_feed(shape=(1, 2, 3, 5))), InvalidFeedError, r"input 'x'.*rank 3"),
    Case("sess-wrong-shape", "sess-run", add_with(x_feed(shape=(2, 3, 4))), InvalidFeedError, r"input 'x'.*dimension 2 must be 5"),
    Case("sess-string-for-tensor", "sess-run", add_with({"x": "1.0"}), TypeError, r"input 'x'.*numpy array.*str"),
    Case("sess-unknown-output-name", "sess-run", lambda tmp: (add_model(), {**x_feed(), "__outputs__": ["z"]}), ValueError, r"unknown output 'z'"),
    Case("node-cannot-broadcast", "ref-run", lambda tmp: (node_shape_mismatch_model(), {"a": np.ones((2, 3), np.float32), "b": np.ones((4, 5), np.float32)}), NodeError, r"node 'add_ab' \(ai\.onnx::Add, opset 21\)"),
    Case("sess-node-cannot-broadcast", "sess-run", lambda tmp: (node_shape_mismatch_model(), {"a": np.ones((2, 3), np.float32), "b": np.ones((4, 5), np.float32)}), NodeError, r"node 'add_ab'"),
    Case("cli-run-inputs-wrong-name", "cli", _argv("run", _saved(add_model), "--inputs", lambda tmp: _npz_inputs(tmp, X=np.ones((1, 3, 5), np.float32))), 2, r"unknown input 'X'"),
    Case("cli-run-inputs-missing", "cli", _argv("run", _saved(add_model), "--inputs", "no/inputs.npz"), 2, r"no/inputs\.npz"),
    Case("cli-run-inputs-not-npz", "cli", _argv("run", _saved(add_model), "--inputs", _text_file), 2, r"notes\.onnx"),
    Case("cli-run-node-fails", "cli", _argv("run", _saved(node_shape_mismatch_model), "--inputs", lambda tmp: _npz_inputs(tmp, a=np.ones((2, 3), np.float32), b=np.ones((4, 5), np.float32))), 1, r"node 'add_ab'"),
    # external data
    Case("ext-missing", "ref-load", ext_missing, InvalidModelError, r"'w'.*w\.bin.*(not found|does not exist)"),
    Case("ext-truncated", "ref-load", ext_truncated, InvalidModelError, r"'w'.*w\.bin.*10 bytes.*60"),
    Case("ext-length-past-end", "ref-load", ext_length_past_end, InvalidModelError, r"'w'.*w\.bin.*length 60.*10 bytes"),
    Case("ext-dotdot", "ref-load", ext_dotdot, InvalidModelError, r"'w'.*\.\./outside/w\.bin.*outside the directory"),
    Case("ext-absolute", "ref-load", ext_absolute, InvalidModelError, r"'w'.*outside/w\.bin.*absolute"),
    Case("ext-symlink-outside", "ref-load", ext_symlink_outside, InvalidModelError, r"'w'.*w\.bin.*outside the directory"),
    Case("ext-model-as-bytes", "ref-load", ext_as_bytes, InvalidModelError, r"'w'.*w\.bin.*(path|folder)"),
    Case("sess-ext-dotdot", "sess-load", ext_dotdot, InvalidModelError, r"\.\./outside/w\.bin.*outside the directory"),
    Case("sess-ext-missing", "sess-load", ext_missing, InvalidModelError, r"w\.bin.*(not found|does not exist)"),
    Case("cli-run-ext-symlink", "cli", _argv("run", ext_symlink_outside), 2, r"w\.bin.*outside the directory"),
    # broken graphs
    Case("cycle", "ref-load", lambda tmp: cycle_model(), InvalidModelError, r"cycle.*'(first|second)'"),
    Case("unsorted-nodes", "ref-load", lambda tmp: unsorted_model(), InvalidModelError, r"'late_reader'.*'a'.*before.*'maker'"),
    Case("duplicate-output-name", "ref-load", lambda tmp: duplicate_output_model(), InvalidModelError, r"'y'.*(more than once|multiple times)"),
    Case("undefined-input", "ref-load", lambda tmp: undefined_input_model(), InvalidModelError, r"'nowhere'.*'adder'.*not (defined|a graph input)"),
    Case("unproduced-output", "ref-load", lambda tmp: unproduced_output_model(), InvalidModelError, r"output 'y'"),
    Case("duplicate-input-name", "ref-load", lambda tmp: duplicate_input_model(), InvalidModelError, r"'x'"),
    Case("sess-cycle", "sess-load", lambda tmp: cycle_model(), InvalidModelError, r"cycle"),
    Case("sess-undefined-input", "sess-load", lambda tmp: undefined_input_model(), InvalidModelError, r"'nowhere'"),
    Case("cli-diff-cycle", "cli", _argv("diff", _saved(cycle_model)), 2, r"cycle"),
    # command-line arguments
    Case("cli-test-opset-abc", "cli", _argv("test", "--opset", "abc"), 2, r"--opset.*'abc'"),
    Case("cli-corpus-opset-abc", "cli", _argv("corpus", "list", "--opset", "abc"), 2, r"--opset.*'abc'"),
    Case("cli-opset-backwards-range", "cli", _argv("test", "--opset", "28-18"), 2, r"--opset.*'28-18'"),
    Case("cli-opset-unpinned", "cli", _argv("test", "--opset", "99"), 2, r"no pin for opset 99"),
    Case("cli-run-dim-not-int", "cli", _argv("run", _saved(add_model), "--dim", "batch=x"), 2, r"--dim.*'batch=x'"),
    Case("cli-run-dim-no-equals", "cli", _argv("run", _saved(add_model), "--dim", "batch"), 2, r"--dim.*'batch'"),
    Case("cli-run-dim-negative", "cli", _argv("run", _saved(add_model), "--dim", "batch=-2"), 2, r"--dim.*'batch=-2'"),
    Case("cli-diff-dim-not-int", "cli", _argv("diff", _saved(add_model), "--dim", "batch=x"), 2, r"--dim.*'batch=x'"),
    Case("cli-run-seed-not-int", "cli", _argv("run", _saved(add_model), "--seed", "abc"), 2, r"--seed.*'abc'"),
    Case("cli-test-unknown-backend", "cli", _argv("test", "--backend", "nope", "--opset", "21"), 2, r"nope"),
    Case("cli-test-bad-filter", "cli", _argv("test", "--opset", "21", "--filter", "test_(abs"), 2, r"missing \)"),
    Case("cli-no-subcommand", "cli", _argv(), 2, r"required: command"),
    Case("cli-diff-three-models", "cli", _argv("diff", _saved(add_model), _saved(add_model), _saved(add_model)), 2, r"one or two models, got 3"),
    Case("cli-diff-unrelated-models", "cli", _argv("diff", _saved(add_model), _saved(conv_model)), 2, r"conv_model\.onnx.*input 'x'.*rank 4"),
    Case("diff-api-unrelated-models", "diff", lambda tmp: {"a": _saved(add_model)(tmp), "b": _saved(conv_model)(tmp)}, InvalidFeedError, r"conv_model\.onnx.*input 'x'.*rank 4"),
    Case("cli-fuzz-zero-examples", "cli", _argv("fuzz", "--examples", "0"), 2, r"--examples.*'0'"),
    Case("cli-fuzz-zero-jobs", "cli", _argv("fuzz", "--jobs", "0"), 2, r"--jobs.*'0'"),
]


def run_surface(case: Case, tmp: str):
    arg = case.build(tmp)
    if case.surface == "ref-load":
        return ReferenceEvaluator(arg)
    if case.surface == "sess-load":
        return optimized.InferenceSession(arg)
    if case.surface in ("ref-run", "sess-run"):
        model, feeds = arg
        wanted = feeds.pop("__outputs__", None)
        if case.surface == "ref-run":
            return ReferenceEvaluator(model).run(wanted, feeds)
        return optimized.InferenceSession(model.SerializeToString()).run(wanted, feeds)
    if case.surface == "diff":
        return diff_models(**arg)
    raise AssertionError(f"unknown surface {case.surface}")


def run_cli(argv) -> tuple[int, str]:
    """(exit code, everything printed); an uncaught exception fails the test (a traceback)."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli_main(argv)
        except SystemExit as e:  # argparse's usage errors
            code = e.code
    return code, out.getvalue() + err.getvalue()


def test_catalogue_has_at_least_40_cases_with_unique_ids():
    ids = [c.id for c in CASES]
    assert len(set(ids)) == len(ids) and len(ids) >= 40


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case: Case, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a relative path in a case never finds a stray file
    monkeypatch.setenv("ONNX_PARITY_CACHE", str(tmp_path / "cache"))
    tmp = str(tmp_path)
    if case.surface == "cli":
        code, printed = run_cli(case.build(tmp))
        assert code == case.expect, printed
        assert "Traceback" not in printed
        assert re.search(case.message, " ".join(printed.split()), re.DOTALL), printed
        return
    with pytest.raises(case.expect) as info:
        run_surface(case, tmp)
    assert re.search(case.message, str(info.value), re.DOTALL), str(info.value)


def test_cli_subprocess_prints_no_traceback(tmp_path):
    """The installed entry point, as a user runs it: one usage error and one failed load."""
    empty = _empty_file(str(tmp_path))
    for argv in (["test", "--opset", "abc"], ["run", empty], ["run", empty, "--dim", "batch=x"]):
        proc = subprocess.run([sys.executable, "-m", "conformance.cli", *argv], capture_output=True,
                              text=True, timeout=120, cwd=tmp_path, check=False)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stdout + proc.stderr
        assert re.search(r"--opset|empty\.onnx|--dim", proc.stdout + proc.stderr)


def test_misspelled_session_option_is_refused():
    options = optimized.SessionOptions()
    with pytest.raises(AttributeError, match="graph_optimisation_level"):
        options.graph_optimisation_level = 1


# values that are not errors ----------------------------------------------------------------------
def nan_inf_model() -> onnx.ModelProto:
    """Ops whose NaN/Inf behaviour the spec fixes by IEEE arithmetic: elementwise, MatMul,
    a reduction and Softmax over the last axis."""
    nodes = [helper.make_node("Add", ["x", "x"], ["twice"]),
             helper.make_node("Exp", ["x"], ["exp"]),
             helper.make_node("Mul", ["x", "zero"], ["times_zero"]),
             helper.make_node("MatMul", ["x", "w"], ["mm"]),
             helper.make_node("ReduceSum", ["x", "axis1"], ["rowsum"], keepdims=0),
             helper.make_node("Softmax", ["x"], ["soft"], axis=-1)]
    inits = [numpy_helper.from_array(np.zeros((), np.float32), "zero"),
             numpy_helper.from_array(np.arange(20, dtype=np.float32).reshape(5, 4) / 10, "w"),
             numpy_helper.from_array(np.array([1], np.int64), "axis1")]
    outs = [_vi(n, shape) for n, shape in (("twice", [3, 5]), ("exp", [3, 5]), ("times_zero", [3, 5]),
                                         ("mm", [3, 4]), ("rowsum", [3]), ("soft", [3, 5]))]
    return _model(nodes, [_vi("x", [3, 5])], outs, inits)


def nan_inf_expected(x: np.ndarray) -> list[np.ndarray]:
    """The same computations in float64 numpy, rounded to float32 at the end."""
    x64 = x.astype(np.float64)
    w = np.arange(20, dtype=np.float64).reshape(5, 4) / 10
    with np.errstate(all="ignore"):
        shifted = np.exp(x64 - np.max(x64, axis=-1, keepdims=True))
        soft = shifted / shifted.sum(axis=-1, keepdims=True)
        values = [x64 + x64, np.exp(x64), x64 * 0, x64 @ w, x64.sum(axis=1), soft]
    return [v.astype(np.float32) for v in values]


NAN_INF_FEEDS = {
    "nan": np.array([[np.nan, 1, 2, 3, 4], [0, 1, 2, 3, 4], [-1, -2, -3, -4, -5]], np.float32),
    "inf": np.array([[np.inf, 1, 2, 3, 4], [0, -np.inf, 2, 3, 4], [np.inf, -np.inf, 0, 1, 2]], np.float32),
}


def _same_nonfinite_and_close(actual, expected, what):
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, what
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected), err_msg=f"{what}: NaN positions")
    np.testing.assert_array_equal(np.isposinf(actual), np.isposinf(expected), err_msg=f"{what}: +Inf positions")
    np.testing.assert_array_equal(np.isneginf(actual), np.isneginf(expected), err_msg=f"{what}: -Inf positions")
    finite = np.isfinite(expected)
    np.testing.assert_allclose(actual[finite], expected[finite], rtol=1e-5, atol=1e-6, err_msg=what)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NumPy warns on inf - inf; that is the point
@pytest.mark.parametrize("kind", sorted(NAN_INF_FEEDS))
@pytest.mark.parametrize("backend", ["reference", *[f"optimized:{lv}" for lv in LEVELS]])
def test_nan_and_inf_inputs_run_and_propagate(kind, backend):
    x = NAN_INF_FEEDS[kind]
    model = nan_inf_model()
    outputs = _run(backend, model, {"x": x})
    names = [o.name for o in model.graph.output]
    for name, actual, expected in zip(names, outputs, nan_inf_expected(x)):
        _same_nonfinite_and_close(actual, expected, f"{backend} {name}")
    assert np.isnan(outputs[names.index("rowsum")][0 if kind == "nan" else 2])  # NaN, or inf + -inf


def _run(backend, model, feeds):
    if backend == "reference":
        return ReferenceEvaluator(model).run(None, feeds)
    options = optimized.SessionOptions()
    options.graph_optimization_level = optimized.GraphOptimizationLevel.from_level(int(backend.split(":")[1]))
    return optimized.InferenceSession(model.SerializeToString(), sess_options=options).run(None, feeds)


def zero_size_cases():
    """(id, model, feeds, expected outputs) with a 0-sized dimension somewhere."""
    w_conv = np.arange(4 * 2 * 3 * 3, dtype=np.float32).reshape(4, 2, 3, 3)
    yield ("add", _model([helper.make_node("Add", ["x", "x"], ["y"])], [_vi("x", ["n", 3])], [_vi("y", ["n", 3])]),
           {"x": np.zeros((0, 3), np.float32)}, [np.zeros((0, 3), np.float32)])
    yield ("matmul-inner-0", _model([helper.make_node("MatMul", ["a", "b"], ["y"])],
                                    [_vi("a", [2, "k"]), _vi("b", ["k", 3])], [_vi("y", [2, 3])]),
           {"a": np.ones((2, 0), np.float32), "b": np.ones((0, 3), np.float32)}, [np.zeros((2, 3), np.float32)])
    yield ("reducesum-over-0", _model([helper.make_node("ReduceSum", ["x", "ax"], ["y"], keepdims=0)],
                                      [_vi("x", [2, "k"])], [_vi("y", [2])],
                                      [numpy_helper.from_array(np.array([1], np.int64), "ax")]),
           {"x": np.ones((2, 0), np.float32)}, [np.zeros((2,), np.float32)])
    yield ("conv-batch-0", _model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
                                  [_vi("x", ["n", 2, 5, 6])], [_vi("y", ["n", 4, 5, 6])],
                                  [numpy_helper.from_array(w_conv, "w")]),
           {"x": np.zeros((0, 2, 5, 6), np.float32)}, [np.zeros((0, 4, 5, 6), np.float32)])
    yield ("concat-with-empty", _model([helper.make_node("Concat", ["a", "b"], ["y"], axis=0)],
                                       [_vi("a", ["n", 3]), _vi("b", ["m", 3])], [_vi("y", ["k", 3])]),
           {"a": np.zeros((0, 3), np.float32), "b": np.arange(6, dtype=np.float32).reshape(2, 3)},
           [np.arange(6, dtype=np.float32).reshape(2, 3)])
    yield ("relu-sigmoid-chain", _model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Sigmoid", ["r"], ["s"]),
                                         helper.make_node("Mul", ["s", "x"], ["y"])],
                                        [_vi("x", ["n", 4])], [_vi("y", ["n", 4])]),
           {"x": np.zeros((0, 4), np.float32)}, [np.zeros((0, 4), np.float32)])


@pytest.mark.parametrize("backend", ["reference", *[f"optimized:{lv}" for lv in LEVELS]])
@pytest.mark.parametrize("case", list(zero_size_cases()), ids=lambda c: c[0])
def test_zero_sized_dimensions_run(case, backend):
    _, model, feeds, expected = case
    outputs = _run(backend, model, feeds)
    assert len(outputs) == len(expected)
    for actual, want in zip(outputs, expected):
        assert actual.dtype == want.dtype and actual.shape == want.shape
        np.testing.assert_array_equal(actual, want)


def test_external_data_inside_the_folder_loads(tmp_path):
    """The good twin of the ext-* cases: the checks refuse only what leaves the folder."""
    path = external_model(str(tmp_path / "m"), "weights/w.bin", data=FULL)
    x = x_feed(shape=(1, 3, 5))
    want = x["x"] + np.linspace(-1, 1, 15, dtype=np.float32).reshape(3, 5)
    np.testing.assert_array_equal(ReferenceEvaluator(path).run(None, x)[0], want)
    np.testing.assert_array_equal(optimized.InferenceSession(path).run(None, x)[0], want)


def catalogue_table() -> str:
    """The catalogue as a Markdown table of what each case gives today:
    `python -m tests.test_bad_inputs` (run from the repository root)."""
    import tempfile

    rows = ["| case | surface | result | message |", "|---|---|---|---|"]
    for case in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            cwd = os.getcwd()
            os.chdir(tmp)
            try:
                if case.surface == "cli":
                    code, printed = run_cli(case.build(tmp))
                    result, message = f"exit {code}", " ".join(printed.split())
                else:
                    try:
                        run_surface(case, tmp)
                        result, message = "no error", ""
                    except Exception as e:  # noqa: BLE001 - the table reports whatever happens
                        result, message = type(e).__name__, str(e)
            finally:
                os.chdir(cwd)
        message = " ".join(message.replace(tmp, "<tmp>").replace("|", "\\|").split())
        rows.append(f"| {case.id} | {case.surface} | {result} | {message[:160]} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(catalogue_table())
