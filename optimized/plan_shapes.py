"""Compiled runs shared by input signatures that differ only in some dimensions.

A decoder's KV cache and attention mask grow by one position with every generated token, so
each step of a generation is a signature the plan has never seen: without this module every
step runs node by node in Python (plan.py compiles a signature on its second sighting).

Each first sighting of a signature notes every value's shape (ShapeNotes). When a signature of
the same family (feed names, ranks and dtypes) was seen before and few steps touch a value whose
shape differed between the two runs, the feed dimensions in which the two differ become a
pattern. The next signature of the pattern is recorded, and its CompiledRun is built with each
value whose shape differed left unknown: the steps that read or write one run in Python, and
values worked out once from one are worked out again every run. That CompiledRun then serves
every signature of the pattern, because

- each C step reads and writes only values whose shapes are the recorded ones in every such
  signature: feeds of the same shape (the pattern fixes them), values worked out once that do
  not depend on a differing shape, outputs of other such C steps, and values made by Python
  steps, which CompiledRun checks against the recorded shape before C reads them;
- a value made in Python whose shape turns out to differ from the recorded one ends the
  program (`broken`): that run goes on in Python, and the pattern is never built again.
"""
from __future__ import annotations

import copy
import logging
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from .plan import ABSENT, CompiledRun, Recorder, outer_names

log = logging.getLogger(__name__)

SIBLINGS = 4  # first sightings remembered per family, to compare a new signature with
PATTERNS = 4  # patterns kept (least recently learned go)
TOUCHED_SHARE = 0.5  # a pattern is learned only if at most this share of steps touch a value
#                      whose shape differs (a prompt against a decode step: nearly all do)


def canonical(key: tuple) -> tuple:
    """A signature ((name, shape, dtype) per feed, plan._signature) in name order: the same
    feeds given in another order are the same signature here."""
    return tuple(sorted(key, key=lambda feed: feed[0]))


def family(key: tuple) -> tuple:
    """A signature's feed names, ranks and dtypes."""
    return tuple((name, len(shape), dtype) for name, shape, dtype in key)


def pattern_of(key: tuple, other: tuple) -> tuple:
    """key with None for each dimension in which other differs (same family)."""
    return tuple((name, tuple(d if d == e else None for d, e in zip(shape, other_shape)), dtype)
                 for (name, shape, dtype), (_, other_shape, _) in zip(key, other))


def matches(pattern: tuple, key: tuple) -> bool:
    if len(pattern) != len(key):
        return False
    for (name, dims, dtype), (k_name, shape, k_dtype) in zip(pattern, key):
        if name != k_name or dtype != k_dtype or len(dims) != len(shape):
            return False
        if any(d is not None and d != s for d, s in zip(dims, shape)):
            return False
    return True


def _note(value) -> Any:
    if isinstance(value, np.ndarray):
        return value.shape, value.dtype
    return type(value)


class ShapeNotes:
    """Each value's shape and dtype (or type, for a value that is not an array) in one run, by
    slot: `record` is the plan's per-step hook."""

    def __init__(self, plan, feeds: dict):
        self.shapes = {plan.index[name]: _note(value) for name, value in feeds.items()}

    def record(self, i: int, step, values: list, outputs: list) -> None:
        for s, value in zip(step.outputs, outputs):
            if s != ABSENT:
                self.shapes[s] = _note(value)


def differing(a: dict, b: dict) -> set[int]:
    """Slots noted with another shape (or in one run only)."""
    return {s for s in a.keys() | b.keys() if a.get(s) != b.get(s)}


@dataclass
class Pattern:
    dims: tuple  # a signature with None for the dimensions that vary
    varying: set  # slots whose shape differed between the runs that taught the pattern
    notes: dict  # one of those runs' ShapeNotes.shapes
    program: CompiledRun | None = None
    dead: bool = False  # its program could not be built, or broke


class ShapePatterns:
    """The patterns a plan learned and their programs (see the module's docstring)."""

    def __init__(self, plan):
        self.plan = plan
        self._seen: dict[tuple, list[tuple[tuple, dict]]] = {}
        self._patterns: list[Pattern] = []
        self._lock = threading.Lock()
        self._touches = [set(_reads(plan, step)) | {s for s in step.outputs if s != ABSENT}
                         for step in plan.steps]

    def notes(self, feeds: dict) -> ShapeNotes:
        return ShapeNotes(self.plan, feeds)

    def _find(self, key: tuple) -> Pattern | None:
        key = canonical(key)
        for pattern in list(self._patterns):
            if not pattern.dead and matches(pattern.dims, key):
                return pattern
        return None

    def program(self, key: tuple) -> CompiledRun | None:
        """The built, unbroken program of a pattern that key matches."""
        pattern = self._find(key)
        if pattern is None or pattern.program is None:
            return None
        if pattern.program.broken:
            pattern.dead = True
            return None
        return pattern.program

    def wants_recording(self, key: tuple) -> bool:
        """Whether key matches a pattern with no program yet: its run is to be recorded."""
        pattern = self._find(key)
        return pattern is not None and pattern.program is None

    def seen(self, key: tuple, notes: ShapeNotes) -> None:
        """A first sighting's shapes: learns a pattern from the family's earlier sighting whose
        shapes differ in the fewest steps, where those are few enough."""
        steps = len(self._touches)
        if self._find(key) is not None:  # its pattern's program was busy in another thread
            return
        key = canonical(key)
        with self._lock:
            siblings = self._seen.setdefault(family(key), [])
            best = None
            for other, shapes in siblings:
                if other == key:
                    continue
                varying = differing(notes.shapes, shapes)
                touched = sum(1 for slots in self._touches if slots & varying)
                if best is None or touched < best[0]:
                    best = (touched, other, varying)
            siblings.append((key, notes.shapes))
            del siblings[:-SIBLINGS]
            if best is None or not best[2] or best[0] > TOUCHED_SHARE * steps:
                return
            _, other, varying = best
            self._patterns.append(Pattern(pattern_of(key, other), varying, notes.shapes))
            del self._patterns[:-PATTERNS]

    def build(self, key: tuple, recorder: Recorder) -> None:
        """The program of key's pattern, from a recorded run of key."""
        pattern = self._find(key)
        if pattern is None or pattern.program is not None:
            return
        varying = pattern.varying | {s for s, spec in recorder.specs.items()
                                     if pattern.notes.get(s, spec) != spec}
        try:
            program = CompiledRun(self.plan, shared_recorder(self.plan, recorder, varying))
        except Exception as e:  # noqa: BLE001 - a planning gap must not fail a run that worked
            log.debug("plan: pattern %s not compiled: %s: %s", pattern.dims, type(e).__name__, e)
            program = None
        with self._lock:
            pattern.program = program
            pattern.dead = program is None


def _reads(plan, step) -> list[int]:
    used = [s for s in step.inputs if s != ABSENT]
    return used + [plan.index[n] for n in outer_names(step.node) if n in plan.index]


def shared_recorder(plan, recorder: Recorder, varying: set[int]) -> Recorder:
    """recorder as a run of the whole pattern: no shape for a slot in varying, and no value
    worked out once from one (directly or through other such values)."""
    shared = copy.copy(recorder)
    shared.specs = {s: spec for s, spec in recorder.specs.items() if s not in varying}
    shared.static = dict(recorder.static)
    shared.shape_reads = recorder.shape_reads - varying
    tainted = set(varying)
    for i, step in enumerate(plan.steps):
        made = [s for s in step.outputs if s != ABSENT]
        folded = made and all(recorder.producer.get(s) == i and s in recorder.static for s in made)
        if folded and any(s in tainted for s in _reads(plan, step)):
            tainted.update(made)
            for s in made:
                shared.static.pop(s, None)
    return shared
