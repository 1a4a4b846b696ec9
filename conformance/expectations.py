"""Expected failures per backend and per-test tolerance overrides, each entry with its reason.

conformance/expectations/<backend>.toml:

    [all]                       # every pin that has the test
    "test_bernoulli" = "why it cannot pass"
    ["opset7-12"]               # a range of pins
    "pytorch-converted/test_X" = "why"
    [opset21]                   # one pin
    "test_y" = "why"

Strict both ways: a failure that is not listed is unexpected, and a listed test that passes is a
stale expectation.  conformance/tolerances.toml holds tolerance overrides in the same spirit.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from .compare import Tolerance

EXPECTATIONS_DIR = Path(__file__).with_name("expectations")
TOLERANCES_FILE = Path(__file__).with_name("tolerances.toml")
_SECTION = re.compile(r"^(all|opset(\d+)(?:-(\d+))?)$")


class ExpectationFileError(ValueError):
    """An expectation or tolerance file is malformed; the message says where."""


@dataclass(frozen=True)
class Expectation:
    key: str
    reason: str
    section: str


class Expectations:
    def __init__(self, entries: dict[str, list[tuple[range, Expectation]]] | None = None,
                 source: str = ""):
        self._entries = entries or {}
        self.source = source

    @classmethod
    def load(cls, backend: str, directory: Path = EXPECTATIONS_DIR) -> Expectations:
        """The backend's file; optimized-<provider> also inherits reference.toml, since test
        data that contradicts the spec fails every correct backend alike."""
        names = ["reference", backend] if backend.startswith("optimized") else [backend]
        merged = cls(source="")
        for name in names:
            path = directory / f"{name}.toml"
            if path.is_file():
                part = cls.parse(path.read_text(), str(path))
                for key, entries in part._entries.items():
                    merged._entries.setdefault(key, []).extend(entries)
                merged.source = ", ".join(filter(None, [merged.source, str(path)]))
        return merged

    @classmethod
    def parse(cls, text: str, source: str = "<text>") -> Expectations:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ExpectationFileError(f"{source}: {e}") from e
        entries: dict[str, list[tuple[range, Expectation]]] = {}
        for section, table in data.items():
            m = _SECTION.match(section)
            if not m or not isinstance(table, dict):
                raise ExpectationFileError(
                    f"{source}: section [{section}] must be [all], [opsetN] or [\"opsetA-B\"]"
                )
            if m.group(1) == "all":
                opsets = range(10_000)
            else:
                lo = int(m.group(2))
                opsets = range(lo, int(m.group(3) or lo) + 1)
            for key, reason in table.items():
                if not isinstance(reason, str) or not reason.strip():
                    raise ExpectationFileError(f"{source}: [{section}] {key!r} needs a reason")
                entries.setdefault(key, []).append((opsets, Expectation(key, reason, section)))
        return cls(entries, source)

    def lookup(self, opset: int, key: str) -> Expectation | None:
        for opsets, expectation in self._entries.get(key, []):
            if opset in opsets:
                return expectation
        return None

    def __len__(self) -> int:
        return sum(len(v) for v in self._entries.values())


@dataclass(frozen=True)
class ToleranceOverride:
    key: str
    rtol: float | None
    atol: float | None
    reason: str
    opsets: range
    backends: tuple[str, ...]


class Tolerances:
    """Overrides from conformance/tolerances.toml ([[override]] tables with a reason each)."""

    def __init__(self, overrides: list[ToleranceOverride] | None = None):
        self.overrides = overrides or []

    @classmethod
    def load(cls, path: Path = TOLERANCES_FILE) -> Tolerances:
        if not path.is_file():
            return cls()
        data = tomllib.loads(path.read_text())
        overrides = []
        for entry in data.get("override", []):
            if not entry.get("reason", "").strip() or "test" not in entry:
                raise ExpectationFileError(f"{path}: every override needs a test and a reason")
            lo, hi = entry.get("opsets", [0, 9_999])
            overrides.append(ToleranceOverride(
                entry["test"], entry.get("rtol"), entry.get("atol"), entry["reason"],
                range(lo, hi + 1), tuple(entry.get("backends", ())),
            ))
        return cls(overrides)

    def for_test(self, opset: int, key: str, backend: str, base: Tolerance) -> Tolerance:
        tol = base
        for o in self.overrides:
            if o.key == key and opset in o.opsets and (not o.backends or backend in o.backends):
                tol = Tolerance(o.rtol if o.rtol is not None else tol.rtol,
                                o.atol if o.atol is not None else tol.atol)
        return tol


# verdicts -----------------------------------------------------------------------------------
PASS, EXPECTED_FAIL, UNEXPECTED_FAIL, STALE, ERROR, UNAVAILABLE = (
    "pass", "expected-fail", "unexpected-fail", "stale-expectation", "error", "unavailable",
)
VERDICTS = (PASS, EXPECTED_FAIL, UNEXPECTED_FAIL, STALE, ERROR, UNAVAILABLE)
FAILING_VERDICTS = (UNEXPECTED_FAIL, STALE, ERROR)


def verdict(outcome: str, expectation: Expectation | None) -> str:
    """Combine a raw outcome (pass/fail/error/timeout/crash/unavailable) with the expectation."""
    if outcome == "unavailable":
        return UNAVAILABLE
    if outcome == "pass":
        return STALE if expectation else PASS
    if expectation:
        return EXPECTED_FAIL
    return UNEXPECTED_FAIL if outcome == "fail" else ERROR
