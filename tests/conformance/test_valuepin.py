"""The value pin of a generated corpus: a few ulps of float noise verify; a reordered, edited,
truncated, reshaped or missing file does not, and the difference names the file and its size."""
import numpy as np
import pytest
from onnx import TensorProto, numpy_helper

from conformance import valuepin
from conformance.generate import NODE_DIR

from .synthetic_generated import SHAPE, write_small_corpus


def _differences(tmp_path, **changes):
    pinned_root, now_root = tmp_path / "pinned", tmp_path / "now"
    write_small_corpus(pinned_root)
    write_small_corpus(now_root, **changes)
    pinned = valuepin.fingerprint(pinned_root)
    return valuepin.compare(pinned, valuepin.fingerprint(now_root), valuepin.TOLERANCE)


def _tanh_output():
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    y = np.tanh(x)
    y[0, 1, 2] = np.nan
    return y


def test_identical_files_verify(tmp_path):
    assert _differences(tmp_path) == []


def test_a_few_ulps_of_float_noise_verify(tmp_path):
    y = _tanh_output()
    noisy = np.nextafter(np.nextafter(y, np.float32(np.inf)), np.float32(np.inf))  # 2 ulps up
    assert not np.array_equal(noisy[~np.isnan(y)], y[~np.isnan(y)])
    assert _differences(tmp_path, y=noisy) == []


def test_reordered_values_fail_and_name_the_file_with_the_size(tmp_path):
    y = _tanh_output()
    flipped = y[:, :, ::-1].copy()
    flipped[0, 1, 2], flipped[0, 1, 4] = np.nan, flipped[0, 1, 2]  # keep the NaN where it was
    (d,) = _differences(tmp_path, y=flipped)
    assert d.file == "test_tanh/test_data_set_0/output_0.pb"
    assert d.limit == valuepin.TOLERANCE["float32"] and d.size > 100 * d.limit
    assert "differ by" in str(d) and "the pin allows 6.1e-05" in str(d)


def test_one_edited_element_in_a_large_tensor_fails(tmp_path):
    pinned_root, now_root = tmp_path / "pinned", tmp_path / "now"
    write_small_corpus(pinned_root)
    write_small_corpus(now_root)
    path = now_root / NODE_DIR / "test_big/test_data_set_0/output_0.pb"
    t = TensorProto()
    t.ParseFromString(path.read_bytes())
    a = numpy_helper.to_array(t).copy()
    a[4321] += 1.0  # one element of 5000, about one mean magnitude
    path.write_bytes(numpy_helper.from_array(a, "y").SerializeToString())
    diffs = valuepin.compare(valuepin.fingerprint(pinned_root), valuepin.fingerprint(now_root),
                             valuepin.TOLERANCE)
    assert [d.file for d in diffs] == ["test_big/test_data_set_0/output_0.pb"]


def test_nan_positions_shape_and_integers_are_exact(tmp_path):
    y = _tanh_output()
    moved = y.copy()
    moved[0, 1, 2], moved[2, 4, 6] = 0.5, np.nan
    (d,) = _differences(tmp_path, y=moved)
    assert "NaN/Inf positions differ (1 NaN" in str(d)
    (d,) = _differences(tmp_path / "shape", y=y.reshape(5, 3, 7))
    assert "float32[5, 3, 7] where the pin has float32[3, 5, 7]" in str(d)
    (d,) = _differences(tmp_path / "int", labels=np.array([0, 1, 2, 4], np.int64))
    assert d.file == "test_tanh/test_data_set_0/output_1.pb" and "bytes differ" in str(d)


def test_missing_extra_and_truncated_files(tmp_path):
    pinned_root, now_root = tmp_path / "pinned", tmp_path / "now"
    write_small_corpus(pinned_root)
    write_small_corpus(now_root)
    (now_root / NODE_DIR / "test_big/test_data_set_0/input_0.pb").unlink()
    (now_root / NODE_DIR / "test_tanh/test_data_set_0/input_1.pb").write_bytes(b"")
    path = now_root / NODE_DIR / "test_tanh/test_data_set_0/output_0.pb"
    path.write_bytes(path.read_bytes()[:-7])
    diffs = {d.file: d.what for d in valuepin.compare(
        valuepin.fingerprint(pinned_root), valuepin.fingerprint(now_root), valuepin.TOLERANCE)}
    assert diffs["test_big/test_data_set_0/input_0.pb"] == "missing"
    assert diffs["test_tanh/test_data_set_0/input_1.pb"] == "not in the pin"
    assert "test_tanh/test_data_set_0/output_0.pb" in diffs


def _splitmix64_weight(i: int, k: int) -> float:
    """The weight in plain Python integers, as the module docstring describes it."""
    mask = (1 << 64) - 1
    z = (i * 0x9E3779B97F4A7C15 + (k + 1) * 0xD1B54A32D192ED03) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    z ^= z >> 31
    return (z >> 11) / 2.0 ** 52 - 1.0


@pytest.mark.parametrize("k", range(valuepin.PROJECTIONS))
def test_weights_are_splitmix64_of_the_index(k):
    w = valuepin.weights(3000, k)
    for i in (0, 1, 2, 1023, 1024, 2999):
        assert w[i] == _splitmix64_weight(i, k)
    assert w.min() >= -1.0 and w.max() < 1.0 and abs(w.mean()) < 0.05


def test_pin_data_round_trips_through_its_file(tmp_path):
    write_small_corpus(tmp_path / "c")
    data = valuepin.make_pin_data(tmp_path / "c", "0.0.2")
    valuepin.write_pin_data(data, tmp_path / "pin.json")
    loaded = valuepin.load_pin_data(tmp_path / "pin.json")
    assert valuepin.compare(loaded["files"], valuepin.fingerprint(tmp_path / "c"),
                            loaded["tolerance"]) == []
    assert loaded["onnx"] == "0.0.2" and loaded["block"] == valuepin.BLOCK
