"""The pinned corpus as pytest cases (ids like opset21/test_abs), under the same expectations
as `onnx-parity test`.  Choose the backend and pins with --corpus-backend / --corpus-opset."""
from __future__ import annotations

import functools
import re

import pytest

from conformance.backends import make_backend
from conformance.corpus import open_corpus
from conformance.expectations import Expectations, Tolerances, verdict
from conformance.pins import Cache, CorpusUnavailable, CorruptPin, load_pins, select_pins
from conformance.runner import run_test


def _settings(config):
    return (config.getoption("--corpus-backend"), config.getoption("--corpus-opset"),
            config.getoption("--corpus-filter"))


def pytest_generate_tests(metafunc):
    if "corpus_test" not in metafunc.fixturenames:
        return
    backend, opset, pattern = _settings(metafunc.config)
    regex = re.compile(pattern) if pattern else None
    tests = []
    for pin in select_pins(load_pins(), opset):
        try:
            corpus = _corpus(pin.opset)
        except (CorpusUnavailable, CorruptPin) as e:
            raise pytest.UsageError(f"conformance corpus for opset {pin.opset}: {e}") from e
        tests += [t for t in corpus.tests if regex is None or regex.search(t.id)]
    metafunc.parametrize("corpus_test", tests, ids=[t.id for t in tests])


@functools.lru_cache(maxsize=None)
def _corpus(opset: int):
    return open_corpus(load_pins()[opset], Cache(), fetch=True)


@functools.lru_cache(maxsize=None)
def _backend(name: str):
    return make_backend(name)


@functools.lru_cache(maxsize=None)
def _expectations(name: str):
    return Expectations.load(name)


@pytest.mark.conformance
@pytest.mark.timeout(300)
def test_corpus(corpus_test, request):
    name = request.config.getoption("--corpus-backend")
    backend = _backend(name)
    outcome, message = run_test(_corpus(corpus_test.opset), corpus_test, backend, Tolerances.load())
    expectation = _expectations(name).lookup(corpus_test.opset, corpus_test.key)
    result = verdict(outcome, None if backend.anchor else expectation)
    if result == "unavailable":
        pytest.skip(message)
    if result == "expected-fail":
        pytest.xfail(expectation.reason)
    if result == "stale-expectation":
        pytest.fail(f"stale expectation: the test passes, but {name}.toml lists it: "
                    f"{expectation.reason}", pytrace=False)
    if result != "pass":
        pytest.fail(f"{outcome}: {message}", pytrace=False)
