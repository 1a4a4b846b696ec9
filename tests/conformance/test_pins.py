"""Pins and the cache: hashes verified, partial or corrupt files never kept, offline reuse,
a clear message when a pin is missing and the registry cannot be reached; a generated pin that
verifies under another numpy CPU-feature setting, and its mismatch kept, named and recorded."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from conformance.cli import main
from conformance.corpus import (
    forget_mismatch,
    generate_corpus,
    open_corpus,
    recorded_mismatch,
    verify_cached,
)
from conformance.generate import MANIFEST, NODE_DIR
from conformance.pins import (
    Cache,
    CorpusUnavailable,
    PinMismatch,
    Wheel,
    compatible_generator_wheel,
    load_pins,
    select_pins,
    sha256_file,
)
from conformance.runner import collect_tests
from reference.values import EMPTY

from .synthetic import build_wheel, write_pins
from .synthetic_generated import write_generated_pins

ISSUE_MAPPING = {7: "1.2", 8: "1.3", 9: "1.4.1", 10: "1.5", 11: "1.6", 12: "1.7", 13: "1.8",
                 14: "1.9", 15: "1.10", 16: "1.11", 17: "1.12", 18: "1.13", 19: "1.14",
                 20: "1.15", 21: "1.16", 22: "1.17", 23: "1.18", 24: "1.19", 25: "1.20",
                 26: "1.21", 27: "1.22", 28: "1.23"}


def test_shipped_pins_cover_opsets_7_to_28_with_their_releases():
    pins = load_pins()
    assert sorted(pins) == list(range(7, 29))
    for opset, release in ISSUE_MAPPING.items():
        assert pins[opset].onnx == release or pins[opset].onnx.startswith(release + "."), opset
        if opset < 28:
            assert pins[opset].wheel.sha256 and len(pins[opset].wheel.sha256) == 64
            assert pins[opset].wheel.file.startswith(f"onnx-{pins[opset].onnx}-")
    assert pins[27].node_tests == 1765
    assert pins[28].generated and pins[28].values_sha256 and pins[28].generator_wheels
    assert sha256_file(Path(pins[28].values)) == pins[28].values_sha256


def test_select_pins_forms():
    pins = load_pins()
    assert [p.opset for p in select_pins(pins, "all")] == list(range(7, 29))
    assert [p.opset for p in select_pins(pins, "21")] == [21]
    assert [p.opset for p in select_pins(pins, "7,13")] == [7, 13]
    assert [p.opset for p in select_pins(pins, "26-28")] == [26, 27, 28]
    with pytest.raises(ValueError, match="no pin for opset 5"):
        select_pins(pins, "5")


@pytest.fixture
def synthetic(tmp_path):
    wheel = build_wheel(tmp_path / "onnx-0.0.1-py3-none-any.whl")
    return wheel, load_pins(write_pins(tmp_path, wheel))[13]


def test_fetch_verifies_hash_and_reuses_the_cache_offline(tmp_path, synthetic):
    wheel, pin = synthetic
    cache = Cache(tmp_path / "cache")
    path = cache.fetch_wheel(pin.wheel)
    assert sha256_file(path) == pin.wheel.sha256
    wheel.unlink()  # the "registry" is gone; the cache still serves the pin
    corpus = open_corpus(pin, cache, fetch=False)
    assert corpus.node_count == 3


def test_wrong_hash_download_leaves_nothing_behind(tmp_path, synthetic):
    wheel, _ = synthetic
    cache = Cache(tmp_path / "cache")
    bad = Wheel(wheel.name, wheel.as_uri(), "0" * 64)
    with pytest.raises(PinMismatch, match="pin says 0000"):
        cache.fetch_wheel(bad)
    assert list((tmp_path / "cache" / "wheels").iterdir()) == []


def test_corrupt_cached_file_is_detected(tmp_path, synthetic):
    _, pin = synthetic
    cache = Cache(tmp_path / "cache")
    path = cache.fetch_wheel(pin.wheel)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(PinMismatch, match="delete it"):
        cache.fetch_wheel(pin.wheel)


def test_missing_pin_with_unreachable_registry_says_what_to_do(tmp_path):
    cache = Cache(tmp_path / "cache")
    unreachable = Wheel("onnx-9.9.9-py3-none-any.whl", "http://127.0.0.1:9/onnx.whl", "0" * 64)
    with pytest.raises(CorpusUnavailable) as info:
        cache.fetch_wheel(unreachable)
    message = str(info.value)
    assert "cannot be reached" in message and str(tmp_path / "cache") in message
    assert "ONNX_PARITY_CACHE" in message


def test_missing_pin_without_fetch_names_the_command(tmp_path, synthetic):
    _, pin = synthetic
    with pytest.raises(CorpusUnavailable, match="onnx-parity corpus fetch --opset 13"):
        open_corpus(pin, Cache(tmp_path / "empty"), fetch=False)


def test_cache_dir_env_override(monkeypatch, tmp_path):
    monkeypatch.setenv("ONNX_PARITY_CACHE", str(tmp_path / "elsewhere"))
    assert Cache().root == tmp_path / "elsewhere"


def test_corpus_enumerates_kinds_and_loads_values(tmp_path, synthetic):
    _, pin = synthetic
    corpus = open_corpus(pin, Cache(tmp_path / "cache"))
    ids = [t.id for t in corpus.tests]
    assert ids[:3] == ["opset13/test_crash", "opset13/test_hang", "opset13/test_relu_tiny"]
    assert "opset13/simple/test_sequence_identity" in ids
    real = corpus.get("real/test_big")
    assert "example.invalid" in real.unavailable
    case = corpus.load(corpus.get("test_relu_tiny"))
    (feeds, expected), = case.data_sets
    np.testing.assert_array_equal(feeds["x"], np.array([-1.0, 0.5, 2.0], np.float32))
    assert expected[0].dtype == np.float32
    seq_case = corpus.load(corpus.get("simple/test_sequence_identity"))
    (feeds, expected), = seq_case.data_sets
    assert isinstance(feeds["s"], list) and len(feeds["s"]) == 2
    assert EMPTY is not None


# generated pins: value pin, quarantine, recorded mismatch --------------------------------------
@pytest.fixture
def generated(tmp_path, monkeypatch):
    pins_file, fake = write_generated_pins(tmp_path, monkeypatch)
    return load_pins(pins_file), fake, pins_file


def test_generated_pin_verifies_once_then_opens_offline(tmp_path, generated):
    pins, fake, _ = generated
    cache = Cache(tmp_path / "cache")
    assert open_corpus(pins[28], cache).node_count == 2
    assert fake.calls == 1 and (cache.generated_dir(pins[28]) / "verified.json").is_file()
    assert open_corpus(pins[28], cache, fetch=False).node_count == 2
    assert fake.calls == 1
    assert verify_cached(pins[28], cache) == "ok"


def test_generated_mismatch_names_the_file_keeps_it_and_is_not_retried(tmp_path, generated,
                                                                       monkeypatch, capsys):
    pins, fake, pins_file = generated
    fake.tampered = True
    cache = Cache(tmp_path / "cache")
    with pytest.raises(PinMismatch) as info:
        open_corpus(pins[28], cache)
    message = str(info.value)
    assert message.startswith("mismatch: the opset 28 corpus generated here")
    assert "test_tanh/test_data_set_0/output_0.pb: float32 values differ by" in message
    assert "the pin allows 6.1e-05" in message
    (kept,) = (tmp_path / "cache" / "quarantine").iterdir()
    assert str(kept) in message
    assert (kept / NODE_DIR / "test_tanh/test_data_set_0/output_0.pb").is_file()
    assert "output_0.pb" in (kept / "mismatch.txt").read_text()
    assert not cache.generated_dir(pins[28]).exists()
    with pytest.raises(PinMismatch, match="recorded at an earlier run"):
        open_corpus(pins[28], cache)
    assert fake.calls == 1  # not generated again on every command
    assert "mismatch" in recorded_mismatch(pins[28], cache)
    monkeypatch.setattr("conformance.cli.load_pins", lambda: load_pins(pins_file))
    assert main(["corpus", "list", "--opset", "28", "--cache-dir", str(cache.root)]) == 1
    assert "│ mismatch" in capsys.readouterr().out and fake.calls == 1
    fake.tampered = False
    forget_mismatch(pins[28], cache)  # what `corpus fetch` does
    assert open_corpus(pins[28], cache).node_count == 2 and fake.calls == 2


def test_corpus_verify_fetches_nothing_and_quarantines_a_damaged_cache(tmp_path, generated,
                                                                       monkeypatch, capsys):
    pins, fake, pins_file = generated
    monkeypatch.setattr("conformance.cli.load_pins", lambda: load_pins(pins_file))
    cache_dir = tmp_path / "cache"
    assert main(["corpus", "verify", "--opset", "13,28", "--cache-dir", str(cache_dir)]) == 1
    out = capsys.readouterr().out
    assert out.count("not cached") >= 2 and fake.calls == 0
    assert not (cache_dir / "wheels").exists()
    assert main(["corpus", "fetch", "--opset", "28", "--cache-dir", str(cache_dir)]) == 0
    output = Cache(cache_dir).generated_dir(pins[28]) / NODE_DIR / "test_big/test_data_set_0/output_0.pb"
    output.write_bytes(output.read_bytes()[:-16])  # damaged after generation
    assert main(["corpus", "verify", "--opset", "28", "--cache-dir", str(cache_dir)]) == 1
    out = capsys.readouterr().out
    assert "│ mismatch" in out and "test_big/test_data_set_0/output_0.pb: cannot be read" in out
    assert fake.calls == 1 and len(list((cache_dir / "quarantine").iterdir())) == 1


def test_one_bad_pin_never_stops_the_others(tmp_path, generated):
    pins, fake, _ = generated
    fake.tampered = True
    tests, unusable = collect_tests([pins[13], pins[28]], Cache(tmp_path / "cache"))
    assert {t.opset for t in tests} == {13} and len(tests) == 5
    (bad,) = unusable
    assert bad.id == "opset28/(corpus)" and bad.outcome == "error"
    assert "mismatch" in bad.message and "output_0.pb" in bad.message


# the real opset-28 pin under a second numpy CPU-feature setting ---------------------------------
def _dispatched_features() -> list[str]:
    """numpy's dispatch targets above its baseline on this CPU (numpy >= 2.0 names them)."""
    introspect = pytest.importorskip(
        "numpy.lib.introspect", reason="numpy >= 2.0 names its dispatched CPU features")
    targets = {t["current"] for sigs in introspect.opt_func_info().values() for t in sigs.values()}
    return sorted(t for t in targets if not t.startswith("baseline"))


@pytest.mark.slow
def test_opset28_regenerated_under_other_numpy_cpu_features_verifies(tmp_path, monkeypatch):
    features = _dispatched_features()
    if not features:
        pytest.skip("numpy dispatches nothing above its baseline on this CPU: no second setting")
    pin = load_pins()[28]
    wheel = compatible_generator_wheel(pin)
    source = Cache().fetch_wheel(wheel)  # the session's cache has it after the corpus fetch
    cache = Cache(tmp_path / "cache")
    cache.wheel_path(wheel).parent.mkdir(parents=True)
    shutil.copyfile(source, cache.wheel_path(wheel))
    monkeypatch.setenv("NPY_DISABLE_CPU_FEATURES", " ".join(features))
    folder = generate_corpus(pin, cache.wheel_path(wheel), cache)  # PinMismatch on a mismatch
    environment = json.loads((folder / MANIFEST).read_text())["environment"]
    assert environment["NPY_DISABLE_CPU_FEATURES"] == " ".join(features)
    assert all(t.startswith("baseline") for t in environment["cpu_dispatch"]), environment
    assert open_corpus(pin, cache, fetch=False).node_count == pin.node_tests
