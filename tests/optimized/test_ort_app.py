"""examples/ort_app.py, written for onnxruntime, runs unchanged on optimized (through
optimized.register_as_onnxruntime, the documented alias) and prints what onnxruntime prints."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parents[2] / "examples" / "ort_app.py"
ALIAS = ("import optimized, runpy; optimized.register_as_onnxruntime(); "
         f"runpy.run_path({str(APP)!r}, run_name='__main__')")


def _run(argv: list[str]) -> str:
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_example_app_runs_unchanged_on_optimized():
    lines = _run(["-c", ALIAS]).splitlines()
    assert lines[0] == "input x tensor(float) ['batch', 5]"
    assert "caught InvalidArgument InvalidArgument" in lines
    assert "iobinding True True" in lines and "run options True" in lines


def test_example_app_prints_the_same_on_both_runtimes():
    pytest.importorskip("onnxruntime", reason="onnxruntime (anchors extra) is the side-by-side anchor")
    assert _run(["-c", ALIAS]) == _run([str(APP)])


def test_alias_covers_onnxruntimes_submodules():
    code = ("import optimized; optimized.register_as_onnxruntime()\n"
            "import onnxruntime, onnxruntime.backend\n"
            "from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument, Fail\n"
            "from onnxruntime.capi.onnxruntime_inference_collection import OrtValue, IOBinding\n"
            "import optimized.backend\n"
            "assert OrtValue is optimized.OrtValue and IOBinding is optimized.IOBinding\n"
            "assert onnxruntime is optimized and onnxruntime.backend is optimized.backend\n"
            "assert InvalidArgument is optimized.InvalidArgument and Fail is optimized.Fail\n"
            "print('ok')")
    assert _run(["-c", code]).strip() == "ok"
