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

Where every differing shape is a line in one length t (the first varying feed dimension: a KV
cache's length) across the three runs seen, the program is a GrowingRun instead: steps of
GROWING_OPS over those values (the cache Concats, grouped attention) run in C too, their sizes
and strides written into the step table for each run's t, their results allocated per run.
"""
from __future__ import annotations

import copy
import logging
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from reference.registry import canonical_domain

from . import kernels
from .passes.gqa_fusion import CAUSAL_PADDING_MASK, GROUPED_ATTENTION, GROUPED_ATTENTION_MASKED
from .passes.silu_mlp_fusion import FUSED_DOMAIN
from .plan import ABSENT, ALIAS, PY, CompiledRun, Recorder, describe_step

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
    other: dict  # the other run's
    program: CompiledRun | None = None
    dead: bool = False  # its program could not be built, or broke


class ShapePatterns:
    """The patterns a plan learned and their programs (see the module's docstring)."""

    def __init__(self, plan):
        self.plan = plan
        self._seen: dict[tuple, list[tuple[tuple, dict]]] = {}
        self._patterns: list[Pattern] = []
        self._lock = threading.Lock()
        self._touches: list[set[int]] | None = None  # per step, the slots it reads or writes

    def _slots_touched(self) -> list[set[int]]:
        """Worked out when a second signature of a family is first seen (a fixed-shape model
        never needs it), not when the session is made."""
        if self._touches is None:
            self._touches = [set(self.plan.reads(step)) | {s for s in step.outputs if s != ABSENT}
                             for step in self.plan.steps]
        return self._touches

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
                touched = sum(1 for slots in self._slots_touched() if slots & varying)
                if best is None or touched < best[0]:
                    best = (touched, other, varying, shapes)
            siblings.append((key, notes.shapes))
            del siblings[:-SIBLINGS]
            if best is None or not best[2] or best[0] > TOUCHED_SHARE * len(self.plan.steps):
                return
            _, other, varying, other_shapes = best
            self._patterns.append(Pattern(pattern_of(key, other), varying, notes.shapes,
                                          other_shapes))
            del self._patterns[:-PATTERNS]

    def build(self, key: tuple, recorder: Recorder) -> None:
        """The program of key's pattern, from a recorded run of key."""
        pattern = self._find(key)
        if pattern is None or pattern.program is not None:
            return
        varying = pattern.varying | {s for s, spec in recorder.specs.items()
                                     if pattern.notes.get(s, spec) != spec}
        program = None
        try:
            program = growing_run(self.plan, recorder, pattern, varying)
        except Exception as e:  # noqa: BLE001 - a planning gap must not fail a run that worked
            log.debug("plan: pattern %s not grown: %s: %s", pattern.dims, type(e).__name__, e)
        try:
            if program is None:
                program = CompiledRun(self.plan, shared_recorder(self.plan, recorder, varying))
        except Exception as e:  # noqa: BLE001 - a planning gap must not fail a run that worked
            log.debug("plan: pattern %s not compiled: %s: %s", pattern.dims, type(e).__name__, e)
            program = None
        with self._lock:
            pattern.program = program
            pattern.dead = program is None


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
        if folded and any(s in tainted for s in plan.reads(step)):
            tainted.update(made)
            for s in made:
                shared.static.pop(s, None)
    return shared


# programs whose C steps follow the varying length -------------------------------------------
INT32_MAX = (1 << 31) - 1  # kernels take sizes as C ints: patched fields stay below this
# ops whose output shape is a line in t wherever their inputs' shapes are (elementwise ops and
# Concat: broadcasts and sums of lines) or does not depend on the keys' length (attention): only
# these run in C over values that grow.  Others (Slice: min(t, end)) could leave the line
# between the lengths their descriptions were compared at, so they run in Python, guarded.
# CausalPaddingMask's shape follows its start and end values: its step checks them against
# the sizes written for t at run time and fails (the run goes on in Python) where they differ.
GROWING_OPS = {("", op) for op in ("Concat", "Add", "Sub", "Mul", "Div", "Cast", "Where", "And",
                                   "Or", "Xor")} | {
    (FUSED_DOMAIN, GROUPED_ATTENTION), (FUSED_DOMAIN, GROUPED_ATTENTION_MASKED),
    (FUSED_DOMAIN, CAUSAL_PADDING_MASK)}


def affine(ts, values) -> tuple[int, int] | None:
    """(base, slope) with values[j] == base + slope * ts[j] for every j, integers, or None."""
    (t0, v0), rest = (ts[0], values[0]), list(zip(ts[1:], values[1:]))
    other = next(((t, v) for t, v in rest if t != t0), None)
    if other is None or any(not isinstance(v, (int, np.integer)) for v in values):
        return None
    rise, run = int(other[1]) - int(v0), other[0] - t0
    if rise % run:
        return None
    slope = rise // run
    base = int(v0) - slope * t0
    if any(base + slope * t != v for t, v in zip(ts, values)):
        return None
    return base, slope


def _bounds(base: int, slope: int, at: int) -> tuple[float, float] | None:
    """The lengths t over which base + slope * t stays in [1, INT32_MAX], as it is at `at`
    (None where it is not)."""
    value = base + slope * at
    if not 1 <= value <= INT32_MAX:
        return None
    if slope == 0:
        return float("-inf"), float("inf")
    low, high = -(-(1 - base) // slope), (INT32_MAX - base) // slope
    return (low, high) if slope > 0 else (-(-(INT32_MAX - base) // slope), (1 - base) // slope)


def growing_run(plan, recorder: Recorder, pattern: Pattern, varying: set[int]):
    """A GrowingRun for the pattern, or None where the varying shapes do not follow one length
    (the first varying feed dimension) on a line in all three runs seen."""
    feed_dims = [(name, axis) for name, dims, _ in pattern.dims
                 for axis, d in enumerate(dims) if d is None]
    if not feed_dims:
        return None
    name, axis = feed_dims[0]
    line = plan.index[name]
    runs = [recorder.specs, pattern.notes, pattern.other]
    if any(not isinstance(run.get(line), tuple) for run in runs):
        return None
    ts = [run[line][0][axis] for run in runs]
    sizes: dict[int, tuple] = {}
    for s in varying:
        noted = [run.get(s) for run in runs]
        if any(not isinstance(n, tuple) for n in noted):
            continue
        (shape, dtype), ranks = noted[0], {len(n[0]) for n in noted}
        if len(ranks) != 1 or any(n[1] != dtype for n in noted):
            continue
        fits = [affine(ts, [n[0][d] for n in noted]) for d in range(len(shape))]
        if all(f is not None and _bounds(*f, ts[0]) for f in fits):
            sizes[s] = (tuple(b for b, _ in fits), tuple(m for _, m in fits), dtype)
    fed = {plan.index[n] for n, _, _ in pattern.dims}
    if not sizes or any(s in fed and s not in sizes for s in varying):
        return None  # a feed whose shape is not on the line: nothing to check runs against
    rec = shared_recorder(plan, recorder, varying)
    for s in sizes:
        rec.specs[s] = recorder.specs[s]
    return GrowingRun(plan, rec, (name, axis, ts[0]), sizes, fed & set(sizes))


class GrowingRun(CompiledRun):
    """A pattern's CompiledRun whose steps over values of varying shape run in C too, where
    each such value's shape is a line in one length t (the first varying feed dimension, a KV
    cache's length) and so is every size and stride its steps' descriptions hold.  Each run
    writes the sizes for its t into the step table (StepTable.words), allocates those values
    anew, and checks the values Python makes against their shapes for that t.  A run whose
    feeds are not on the line, or whose t takes a size out of [1, 2**31), runs in Python."""

    def __init__(self, plan, rec: Recorder, line: tuple, sizes: dict, fed: set):
        self.line_feed, self.line_axis, at = line
        self.sizes, self.fed_sizes = sizes, sorted(fed)
        self.resized = frozenset(sizes)
        self._at, self._lengths = at, (at, at + 1, at + 3)  # where descriptions are compared
        self._step_of = {id(step): i for i, step in enumerate(plan.steps)}
        self._patches: list[tuple] = []
        self._recorders = {at: rec}
        self.low, self.high = float("-inf"), float("inf")
        for base, slope, _ in sizes.values():
            for b, m in zip(base, slope):
                self._limit(b, m)
        super().__init__(plan, rec)
        first: dict[int, int] = {}
        for j, i in enumerate(self.entry_step):
            first.setdefault(i, j)
        self.words = self.table.words()
        self.word_index = np.array([(first[i] + k) * kernels.STEP_WORDS + kernels.FIELD_WORD[f] + m
                                    for i, k, f, m, _, _ in self._patches], np.intp)
        self.word_base = np.array([p[4] for p in self._patches], np.int64)
        self.word_slope = np.array([p[5] for p in self._patches], np.int64)
        self.fixed_fresh = [f for f in self.fresh if f[0] not in sizes]
        self.grown_fresh = [(s, dtype) for s, _, dtype in self.fresh if s in sizes]
        self.grown_guards = [(op[2], k, guard[0], guard[2], guard[3])
                             for op in self.ops if op[0] == PY
                             for k, guard in enumerate(op[2]) if guard[0] in sizes]
        self.c_steps_grown = len({i for i, *_ in self._patches})
        # every grown slot's dimensions in one line of numbers: a run works them all out at once
        self._spans, at = [], 0
        for s, (base, _, _) in sizes.items():
            self._spans.append((s, at, at + len(base)))
            at += len(base)
        self._dims_base = np.array([b for base, _, _ in sizes.values() for b in base], np.int64)
        self._dims_slope = np.array([m for _, slope, _ in sizes.values() for m in slope], np.int64)

    def _limit(self, base: int, slope: int) -> None:
        bounds = _bounds(base, slope, self._at)
        if bounds is None:
            raise ValueError("a size out of range at the recorded length")
        self.low, self.high = max(self.low, bounds[0]), min(self.high, bounds[1])

    def shape(self, s: int, t: int) -> tuple:
        base, slope, _ = self.sizes[s]
        return tuple(b + m * t for b, m in zip(base, slope))

    def shapes(self, t: int) -> dict[int, tuple]:
        """Every grown slot's shape at length t (as shape(s, t) for each)."""
        flat = (self._dims_base + self._dims_slope * t).tolist()
        return {s: tuple(flat[a:b]) for s, a, b in self._spans}

    def _recorder_at(self, t: int):
        rec = self._recorders.get(t)
        if rec is None:
            rec = copy.copy(self._recorders[self._at])
            rec.specs = {**rec.specs, **{s: (self.shape(s, t), dtype)
                                         for s, (_, _, dtype) in self.sizes.items()}}
            self._recorders[t] = rec
        return rec

    def _describe(self, step, rec: Recorder):
        touched = set(self.plan.reads(step)) | {s for s in step.outputs if s != ABSENT}
        if not touched & self.resized:
            return describe_step(self.plan, step, rec)
        if (canonical_domain(step.node.domain), step.node.op_type) not in GROWING_OPS:
            return None
        described = [describe_step(self.plan, step, self._recorder_at(t)) for t in self._lengths]
        if any(d is None or d == ALIAS or len(d) != len(described[0]) for d in described):
            return None  # a view of a value that grows runs in Python
        patches = []
        for k, entries in enumerate(zip(*described)):
            fields = _entry_lines(entries, self._lengths)
            if fields is None:
                return None
            patches += [(self._step_of[id(step)], k, *field) for field in fields]
        if any(_bounds(base, slope, self._at) is None for *_, base, slope in patches):
            return None
        for *_, base, slope in patches:
            self._limit(base, slope)
        self._patches += patches
        return described[0]

    def run(self, feeds: dict, profiler=None) -> list:
        on_line = self._length(feeds)
        if on_line is None:
            plan = self.plan
            slots = plan.slots_for(feeds)
            plan.run_steps(slots, plan.steps, 0, profiler=profiler)
            return [slots[s] for s in plan.output_slots]
        t, shapes = on_line
        self.grown_shapes = shapes
        self.words[self.word_index] = self.word_base + self.word_slope * t
        self.fresh = self.fixed_fresh + [(s, shapes[s], dtype) for s, dtype in self.grown_fresh]
        for guards, k, s, dtype, bind in self.grown_guards:
            guards[k] = (s, shapes[s], dtype, bind)
        return super().run(feeds) if profiler is None else super().run(feeds, profiler)

    def _length(self, feeds: dict) -> tuple[int, dict] | None:
        """t for these feeds and the grown slots' shapes at t, or None where a feed is off the
        line or t out of range."""
        value = feeds.get(self.line_feed)
        if not isinstance(value, np.ndarray) or value.ndim <= self.line_axis:
            return None
        t = value.shape[self.line_axis]
        if not self.low <= t <= self.high:
            return None
        shapes, names = self.shapes(t), self.plan.names
        for s in self.fed_sizes:
            fed = feeds.get(names[s])
            if not isinstance(fed, np.ndarray) or fed.shape != shapes[s]:
                return None
        return t, shapes


def _entry_lines(entries: tuple, lengths: tuple) -> list[tuple] | None:
    """(field, k, base, slope) for each n/g field of one step entry, described at three lengths,
    that changes with the length on a line; None where anything else differs, or a field is
    not on a line."""
    first = entries[0]
    if any(e.keys() != first.keys() for e in entries):
        return None
    lines = []
    for key, value in first.items():
        values = [e[key] for e in entries]
        if key in kernels.FIELD_WORD:
            if len({len(v) for v in values}) != 1:
                return None
            for k, column in enumerate(zip(*values)):
                if len(set(column)) == 1:
                    continue
                fit = affine(list(lengths), list(column))
                if fit is None:
                    return None
                lines.append((key, k, *fit))
        elif isinstance(value, kernels.ffi.CData):
            contents = {bytes(kernels.ffi.buffer(v)) for v in values}
            if len(contents) != 1:
                return None
        elif any(v != value for v in values):
            return None
    return lines
