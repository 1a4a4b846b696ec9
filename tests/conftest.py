"""Shared pytest options: which backend and pins the conformance corpus tests run.

The controlling process fetches (or generates) the selected pins once, before pytest-xdist
starts its workers, and tells the workers which pins could not be opened, so that they neither
retry them nor stop: each such pin becomes one failing item, `opset28/(corpus)`."""
import json
import os
import sys
import time

import pytest

# Tests that run kernels at 2 threads must get a team of two even while the machine is busy
# (optimized runs its kernels on one thread when the load is high; csrc/threads.c).
os.environ.setdefault("ONNX_PARITY_BUSY_MACHINE", "ignore")

UNUSABLE_PINS = pytest.StashKey[dict]()
WORKER_KEY = "onnx_parity_unusable_pins"


def pytest_addoption(parser):
    group = parser.getgroup("onnx-parity conformance")
    group.addoption("--corpus-backend",
                    default=os.environ.get("ONNX_PARITY_BACKEND", "reference,optimized:0,optimized:99"),
                    help="comma list of backends the corpus tests run "
                         "(default: reference,optimized:0,optimized:99)")
    group.addoption("--corpus-opset", default=os.environ.get("ONNX_PARITY_OPSET", "all"),
                    help="pins the corpus tests cover: N, '7,13', '18-28' or 'all' (default)")
    group.addoption("--corpus-filter", default=os.environ.get("ONNX_PARITY_FILTER"),
                    help="regex on corpus test ids")


def pytest_configure(config):
    """Fetch the selected pins once, in the controlling process, before xdist starts workers."""
    if hasattr(config, "workerinput"):
        config.stash[UNUSABLE_PINS] = {int(k): v for k, v in
                                       json.loads(config.workerinput.get(WORKER_KEY, "{}")).items()}
        return
    config.stash[UNUSABLE_PINS] = {}
    if config.getoption("--collect-only", False):
        return
    args = " ".join(str(a) for a in config.args)
    if "conformance" not in args and args not in ("", "tests", "tests/"):
        return
    from conformance.corpus import open_corpus
    from conformance.pins import Cache, CorpusUnavailable, PinMismatch, load_pins, select_pins

    cache = Cache()
    for pin in select_pins(load_pins(), config.getoption("--corpus-opset")):
        start = time.monotonic()
        worked = []

        def announce(what, pin=pin, worked=worked):
            worked.append(what)
            _say(f"onnx-parity: opset {pin.opset}: {what} (cache: {cache.root}) ...")

        try:
            open_corpus(pin, cache, fetch=True, announce=announce)
        except (CorpusUnavailable, PinMismatch) as e:
            config.stash[UNUSABLE_PINS][pin.opset] = str(e)
            _say(f"onnx-parity: opset {pin.opset} cannot be used; its tests fail as "
                 f"opset{pin.opset}/(corpus):\n{e}")
            continue
        if worked:
            _say(f"onnx-parity: opset {pin.opset}: ready ({time.monotonic() - start:.1f} s)")


def _say(line: str) -> None:
    # Global capture is suspended during pytest_configure; stderr reaches the terminal or CI log.
    print(line, file=sys.stderr, flush=True)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """pytest-xdist: hand the controller's unusable pins to each worker."""
    node.workerinput[WORKER_KEY] = json.dumps(node.config.stash.get(UNUSABLE_PINS, {}))
