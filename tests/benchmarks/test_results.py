"""benchmarks/results.py: the tables it writes from a hand-made --benchmark-json."""
import json

import pytest

from benchmarks import results


def bench(model, threads, process="isolated", **medians_and_creations):
    runtimes = {}
    for runtime, (median, creation) in medians_and_creations.items():
        runtimes[runtime.replace("_", "-")] = {"median": median, "creation_seconds": creation}
    return {"extra_info": {"model": model, "threads": threads, "process": process,
                           "runtimes": runtimes, "onnxruntime_version": "9.9"}}


def report(*benchmarks, commit="abcdef1234567890"):
    return {"datetime": "2026-01-01T00:00:00", "commit_info": {"id": commit, "dirty": False},
            "machine_info": {"cpu": {"brand_raw": "Test CPU", "count": 2}},
            "benchmarks": list(benchmarks)}


def test_ratios_flags_and_geometric_means():
    text = results.markdown(report(
        bench("a", 1, optimized=(2e-3, 0.010), onnxruntime=(1e-3, 0.010)),
        bench("b", 1, optimized=(0.5e-3, 0.020), onnxruntime=(1e-3, 0.010)),
        bench("a", 2, optimized=(1.1e-3, 0.030), onnxruntime=(1e-3, 0.010))))
    assert "| a | 1 | 2.00 ms | 1.00 ms | 2.00 ⚠ | 10.00 ms | 10.00 ms | 1.00 |" in text
    assert "| b | 1 | 500.0 µs | 1.00 ms | 0.50 | 20.00 ms | 10.00 ms | 2.00 ⚠ |" in text
    assert "| a | 2 | 1.10 ms | 1.00 ms | 1.10 | 30.00 ms | 10.00 ms | 3.00 ⚠ |" in text
    # sqrt(2.0 * 0.5) = 1.00 at 1 thread; 1.10 at 2; (2 * 0.5 * 1.1) ** (1/3) = 1.03 overall
    assert "**1.00** at 1 thread (2 models); **1.10** at 2 threads (1 models); 1.03" in text
    assert "Rows above 1.15: 1 of 3: a t1 (2.00)." in text
    assert "above 1.5: 2 of 3: a t2 (3.0), b t1 (2.0)." in text


def test_chain_per_node_and_shared_process_tables():
    text = results.markdown(report(
        bench("chain100", 1, optimized=(20e-6, 0.0), optimized_level1=(300e-6, 0.0),
              onnxruntime=(50e-6, 0.0)),
        bench("chain100", 1, process="shared", optimized=(40e-6, 0.0),
              onnxruntime=(60e-6, 0.0))))
    assert "| 1 | 0.2 µs | 3.0 µs | 0.5 µs | 0.40 | 6.00 ⚠ |" in text
    assert "| chain100 | 1 | 20.0 µs | 40.0 µs | 50.0 µs | 60.0 µs | 0.67 |" in text


def test_merge_keeps_every_file_and_refuses_a_row_measured_twice(tmp_path):
    first = report(bench("a", 1, optimized=(1, 1), onnxruntime=(1, 1)), commit="1" * 40)
    second = report(bench("b", 1, optimized=(1, 1), onnxruntime=(1, 1)), commit="2" * 40)
    merged = results.merge([first, second])
    assert sorted(results.rows(merged, "isolated")) == [("a", 1), ("b", 1)]
    assert "Commit: 111111111111, 222222222222" in results.header(merged, "cmd")
    with pytest.raises(ValueError, match=r"\('a', 1, 'isolated'\) is in file 1 and in file 2"):
        results.merge([first, first])


def test_main_names_what_is_wrong(tmp_path, capsys):
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps(report()))
    assert results.main([str(empty)]) == 1
    assert "hold no benchmark of test_optimized_vs_ort.py" in capsys.readouterr().err
    assert results.main([str(tmp_path / "missing.json")]) == 1
    assert "cannot read the benchmark JSON" in capsys.readouterr().err
