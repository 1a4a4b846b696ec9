"""Pins and the cache: hashes verified, partial or corrupt files never kept, offline reuse,
and a clear message when a pin is missing and the registry cannot be reached."""
import numpy as np
import pytest

from conformance.corpus import open_corpus
from conformance.pins import (
    Cache,
    CorpusUnavailable,
    CorruptPin,
    Wheel,
    load_pins,
    select_pins,
    sha256_file,
)
from reference.values import EMPTY

from .synthetic import build_wheel, write_pins

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
    assert pins[28].generated and pins[28].manifest_sha256 and pins[28].generator_wheels


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
    with pytest.raises(CorruptPin, match="pin says 0000"):
        cache.fetch_wheel(bad)
    assert list((tmp_path / "cache" / "wheels").iterdir()) == []


def test_corrupt_cached_file_is_detected(tmp_path, synthetic):
    _, pin = synthetic
    cache = Cache(tmp_path / "cache")
    path = cache.fetch_wheel(pin.wheel)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(CorruptPin, match="delete it"):
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
