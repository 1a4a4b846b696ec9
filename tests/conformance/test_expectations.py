"""Expectations are strict both ways, and every entry needs a reason."""
import pytest

from conformance.compare import Tolerance
from conformance.expectations import (
    ERROR,
    EXPECTED_FAIL,
    PASS,
    STALE,
    UNAVAILABLE,
    UNEXPECTED_FAIL,
    ExpectationFileError,
    Expectations,
    Tolerances,
    verdict,
)

TEXT = """
[all]
"test_bernoulli" = "random values: no implementation can match the stored draw"
["opset7-12"]
"pytorch-converted/test_X" = "old exporter wrote a bad shape"
[opset21]
"test_y" = "data fixed in onnx 1.17"
"""


def test_lookup_by_section():
    ex = Expectations.parse(TEXT)
    assert ex.lookup(7, "test_bernoulli").section == "all"
    assert ex.lookup(28, "test_bernoulli") is not None
    assert ex.lookup(12, "pytorch-converted/test_X") is not None
    assert ex.lookup(13, "pytorch-converted/test_X") is None
    assert ex.lookup(21, "test_y") is not None
    assert ex.lookup(22, "test_y") is None
    assert ex.lookup(21, "test_z") is None
    assert len(ex) == 3


def test_unlisted_failure_is_unexpected():
    assert verdict("fail", None) == UNEXPECTED_FAIL
    assert verdict("error", None) == ERROR
    assert verdict("timeout", None) == ERROR
    assert verdict("crash", None) == ERROR


def test_listed_failure_is_expected_and_listed_pass_is_stale():
    ex = Expectations.parse(TEXT).lookup(21, "test_y")
    assert verdict("fail", ex) == EXPECTED_FAIL
    assert verdict("error", ex) == EXPECTED_FAIL
    assert verdict("pass", ex) == STALE
    assert verdict("pass", None) == PASS
    assert verdict("unavailable", None) == UNAVAILABLE


def test_entry_without_reason_is_rejected():
    with pytest.raises(ExpectationFileError, match="needs a reason"):
        Expectations.parse('[all]\n"test_a" = ""\n')


def test_bad_section_is_rejected():
    with pytest.raises(ExpectationFileError, match="section"):
        Expectations.parse('[opsetX]\n"test_a" = "r"\n')


def test_malformed_toml_names_the_file():
    with pytest.raises(ExpectationFileError, match="reference.toml"):
        Expectations.parse('[all\n', "reference.toml")


def test_shipped_expectation_files_parse():
    from conformance.expectations import EXPECTATIONS_DIR

    for path in EXPECTATIONS_DIR.glob("*.toml"):
        Expectations.parse(path.read_text(), str(path))


def test_tolerance_override_applies_only_where_scoped(tmp_path):
    path = tmp_path / "tol.toml"
    path.write_text(
        '[[override]]\ntest = "test_a"\nopsets = [20, 22]\nbackends = ["optimized"]\n'
        'atol = 1e-4\nreason = "fused kernel accumulates in another order"\n'
    )
    tols = Tolerances.load(path)
    base = Tolerance()
    assert tols.for_test(21, "test_a", "optimized", base).atol == 1e-4
    assert tols.for_test(21, "test_a", "optimized", base).rtol == base.rtol
    assert tols.for_test(23, "test_a", "optimized", base) == base
    assert tols.for_test(21, "test_a", "reference", base) == base
    assert tols.for_test(21, "test_b", "optimized", base) == base


def test_tolerance_override_without_reason_is_rejected(tmp_path):
    path = tmp_path / "tol.toml"
    path.write_text('[[override]]\ntest = "test_a"\natol = 1e-4\n')
    with pytest.raises(ExpectationFileError, match="reason"):
        Tolerances.load(path)
