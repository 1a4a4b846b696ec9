"""Shared pytest options: which backend and pins the conformance corpus tests run."""
import os


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
    if hasattr(config, "workerinput") or config.getoption("--collect-only", False):
        return
    args = " ".join(str(a) for a in config.args)
    if "conformance" not in args and args not in ("", "tests", "tests/"):
        return
    from conformance.corpus import open_corpus
    from conformance.pins import Cache, CorpusUnavailable, CorruptPin, load_pins, select_pins

    cache = Cache()
    for pin in select_pins(load_pins(), config.getoption("--corpus-opset")):
        try:
            open_corpus(pin, cache, fetch=True)
        except (CorpusUnavailable, CorruptPin) as e:
            import pytest

            raise pytest.UsageError(f"conformance corpus for opset {pin.opset}: {e}") from e
