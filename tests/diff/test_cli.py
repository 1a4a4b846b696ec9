"""`onnx-parity diff`: exit codes, JSON, HTML, saved runs, inputs from files."""
import json
import shutil
import subprocess

import onnx
import pytest

from conformance.diff.cli import main

from .faults import scale_initializer
from .gpt2_block import gpt2_model

DIM = ["--dim", "batch=1", "--dim", "seq=8"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    a = gpt2_model(d=32, heads=2, layers=1)
    b = scale_initializer(a, "h0.mlp.c_fc.weight", 1.001)
    paths = folder / "a.onnx", folder / "b.onnx"
    onnx.save(a, paths[0])
    onnx.save(b, paths[1])
    return [str(p) for p in paths]


def _reject(constant):
    raise AssertionError(f"{constant} is not JSON")


def test_same_model_exits_0(models, capsys):
    assert main(["diff", models[0], "--b", "reference", *DIM]) == 0
    assert "agree on all" in capsys.readouterr().out


def test_divergent_models_exit_1_and_write_json(models, tmp_path, capsys):
    out = tmp_path / "report.json"
    assert main(["diff", *models, *DIM, "--json", str(out)]) == 1
    printed = capsys.readouterr().out
    assert "h0.mlp.c_fc.weight" in printed and "made here" in printed
    report = json.loads(out.read_text(), parse_constant=_reject)
    assert report["exit_code"] == 1
    assert report["first_divergence"]["name"] == "h0.mlp.c_fc.weight"
    assert report["made_here"] == ["h0.mlp.c_fc.weight (initializer)"]
    row = next(r for r in report["rows"] if r["name"] == "h0.mlp.c_fc/matmul")
    assert row["verdict"] == "inherited" and row["metrics"]["max_abs"] > 0
    assert set(row["metrics"]) >= {"max_abs_index", "max_rel", "mean_abs", "median_abs",
                                   "p99_abs", "out_of_tolerance", "nan_mismatch", "inf_mismatch",
                                   "cosine", "max_ulp", "atol_to_pass", "rtol_to_pass"}


@pytest.mark.parametrize("argv, message", [
    (["MODEL", "--dim", "batch=two"], "--dim wants name=integer"),
    (["missing.onnx"], "model not found"),
    (["MODEL", "--inputs", "missing.npz"], "inputs not found"),
    (["MODEL", "--against-run", "MODEL"], "not a run saved by"),
])
def test_usage_errors_exit_2(models, capsys, argv, message):
    argv = [models[0] if a == "MODEL" else a for a in argv]
    assert main(["diff", *argv]) == 2
    assert message in capsys.readouterr().out


def test_three_models_is_a_usage_error(models, capsys):
    assert main(["diff", models[0], models[1], models[0]]) == 2
    assert "one or two models" in capsys.readouterr().out


def test_a_saved_run_is_compared_with_a_live_one(models, tmp_path, capsys):
    run = tmp_path / "run.npz"
    assert main(["diff", models[0], "--b", "reference", *DIM, "--save-run", str(run)]) == 0
    out = tmp_path / "against.json"
    # Live model B against the saved run of model A: B's own run is side A here.
    assert main(["diff", models[1], "--against-run", str(run), *DIM, "--json", str(out)]) == 1
    report = json.loads(out.read_text())
    assert report["made_here"] == ["h0.mlp.c_fc.weight (initializer)"]
    row = next(r for r in report["rows"] if r["name"] == "h0.mlp.c_fc/matmul")
    assert row["verdict"] == "inherited"  # A's MatMul on the saved inputs gives the saved value


def test_extracted_repro_runs_again_from_pb_files(models, tmp_path, capsys):
    repro = tmp_path / "repro"
    assert main(["diff", *models, *DIM, "--extract", str(repro)]) == 1
    info = json.loads((repro / "repro.json").read_text())
    assert info["op_type"] == "MatMul" and (repro / "model_b.onnx").exists()
    assert (repro / "input_0.pb").exists()
    assert info["command"][:2] == ["onnx-parity", "diff"]
    assert main(info["command"][1:]) == 1  # the command it records reproduces the divergence
    assert main(["diff", str(repro / "model.onnx"), str(repro / "model_b.onnx"),
                 "--inputs", str(repro)]) == 1
    assert main(["diff", str(repro / "model.onnx"), "--b", "reference",
                 "--inputs", str(repro / "inputs.npz")]) == 0


def test_the_python_report_renders_in_a_notebook(models):
    from conformance.diff import diff_models

    report = diff_models(*models, dims={"batch": 1, "seq": 8})
    html = report._repr_html_()
    assert html.startswith("<div>") and "<svg" in html and "made here" in html
    assert "h0.mlp.c_fc.weight" in repr(report)


def test_html_report_is_self_contained(models, tmp_path):
    page = tmp_path / "report.html"
    assert main(["diff", *models, *DIM, "--html", str(page)]) == 1
    text = page.read_text()
    assert "<svg" in text and "<table class=\"diff\"" in text and "<script>" in text
    assert "made here" in text and "h0.mlp.c_fc.weight" in text
    for external in ("<link", "src=\"http", "@import", "url("):
        assert external not in text
    browser = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome")
                    if shutil.which(b)), None)
    if browser is None:
        pytest.skip("no chromium here: the page was checked as text only")
    dom = subprocess.run([browser, "--headless", "--disable-gpu", "--no-sandbox", "--dump-dom",
                          page.as_uri()], capture_output=True, text=True, timeout=60,
                         check=False).stdout
    assert "error-plot" in dom and "h0.mlp.c_fc.weight" in dom
