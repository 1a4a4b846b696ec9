"""The pinned corpus as pytest cases, under the same expectations as `onnx-parity test`.

Ids are `opset21/test_abs` for the reference and `optimized:99/opset21/test_abs` for others.
Choose backends and pins with --corpus-backend (a comma list: reference, optimized:0,
optimized:99, onnxruntime, ...) and --corpus-opset.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import pytest

from conformance.backends import make_backend
from conformance.corpus import open_corpus
from conformance.expectations import Expectations, Tolerances, verdict
from conformance.pins import Cache, CorpusUnavailable, PinMismatch, load_pins, select_pins
from conformance.runner import PIN_KEY, run_test
from tests.conftest import UNUSABLE_PINS


@dataclass(frozen=True)
class UnusablePin:
    """A pin whose corpus cannot be opened here: one failing item carries its message."""

    opset: int
    message: str


def pytest_generate_tests(metafunc):
    if "corpus_test" not in metafunc.fixturenames:
        return
    config = metafunc.config
    backends = [b.strip() for b in config.getoption("--corpus-backend").split(",") if b.strip()]
    pattern = config.getoption("--corpus-filter")
    regex = re.compile(pattern) if pattern else None
    unusable = config.stash.get(UNUSABLE_PINS, {})
    cases, ids = [], []
    for pin in select_pins(load_pins(), config.getoption("--corpus-opset")):
        message = unusable.get(pin.opset)
        if message is None:
            try:
                corpus = _corpus(pin.opset)
            except (CorpusUnavailable, PinMismatch) as e:
                message = str(e)
        if message is not None:  # one bad pin never stops the others
            cases.append(("", UnusablePin(pin.opset, message)))
            ids.append(f"opset{pin.opset}/{PIN_KEY}")
            continue
        tests = [t for t in corpus.tests if regex is None or regex.search(t.id)]
        cases += [(b, t) for b in backends for t in tests]
        ids += [t.id if b == "reference" else f"{b}/{t.id}" for b in backends for t in tests]
    metafunc.parametrize("backend_spec, corpus_test", cases, ids=ids)


@functools.cache
def _corpus(opset: int):
    return open_corpus(load_pins()[opset], Cache(), fetch=True)


@functools.cache
def _backend(spec: str):
    name, _, level = spec.partition(":")
    return make_backend(name, level=int(level)) if name == "optimized" else make_backend(name)


@functools.cache
def _expectations(spec: str):
    name = spec.partition(":")[0]
    return Expectations.load("optimized-cpu" if name == "optimized" else name)


@pytest.mark.conformance
@pytest.mark.timeout(300)
def test_corpus(backend_spec, corpus_test):
    if isinstance(corpus_test, UnusablePin):
        pytest.fail(f"opset {corpus_test.opset}'s corpus cannot be used: {corpus_test.message}",
                    pytrace=False)
    backend = _backend(backend_spec)
    outcome, message = run_test(_corpus(corpus_test.opset), corpus_test, backend, Tolerances.load())
    expectation = _expectations(backend_spec).lookup(corpus_test.opset, corpus_test.key)
    result = verdict(outcome, None if backend.anchor else expectation)
    if result == "unavailable":
        pytest.skip(message)
    if result == "expected-fail":
        pytest.xfail(expectation.reason)
    if result == "stale-expectation":
        pytest.fail(f"stale expectation: the test passes on {backend_spec}, but it is listed: "
                    f"{expectation.reason}", pytrace=False)
    if result != "pass":
        pytest.fail(f"{outcome}: {message}", pytrace=False)
