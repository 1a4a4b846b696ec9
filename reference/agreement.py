"""When two results agree: the one module that the conformance runner, check mode and the diff
use, so that nothing above reference/ imports a comparison from a layer beside it.

Two named policies:

- **corpus** (`compare_values`, `compare_outputs`): the onnx backend runner's rule, which
  defines what passing the corpus means. Same number of outputs, exact dtype and shape, floats
  allclose(rtol=1e-3, atol=1e-7) with NaN == NaN, strings and integers exact, sequences, maps
  and optionals recursively.
- **bound** (`judge`, `check_node`): a fast kernel's result is judged by its error from an
  exact-enough truth (the reference op run on float64 inputs), against the error the op's
  arithmetic allows for the dtype (reference/bounds.py holds one bound per op, each with its
  reason). A report says how much of the allowed error was used, and where.

`measure` gives the diff's error statistics (max abs/rel error with its index, ulps, cosine)
under a plain rtol/atol screen.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import ml_dtypes
import numpy as np

from . import bounds
from .dtypes import is_float
from .values import EMPTY, describe

CORPUS, BOUND = "corpus", "bound"

# ----------------------------------------------------------------------------------------------
# dtypes: unit roundoff, the smallest subnormal, and where a kernel of each type accumulates
# ----------------------------------------------------------------------------------------------
# float16, bfloat16 and the float8 types accumulate in float32: every GEMM, convolution and
# reduction kernel of onnxruntime, cuBLAS (CUBLAS_COMPUTE_32F), oneDNN and tensor cores does;
# their results are then rounded once to the narrow type.
ACCUMULATION = {
    np.dtype(np.float16): np.dtype(np.float32),
    np.dtype(ml_dtypes.bfloat16): np.dtype(np.float32),
    np.dtype(ml_dtypes.float8_e4m3fn): np.dtype(np.float32),
    np.dtype(ml_dtypes.float8_e4m3fnuz): np.dtype(np.float32),
    np.dtype(ml_dtypes.float8_e5m2): np.dtype(np.float32),
    np.dtype(ml_dtypes.float8_e5m2fnuz): np.dtype(np.float32),
}


def _finfo(dtype):
    dtype = np.dtype(dtype)
    return np.finfo(dtype) if dtype.kind == "f" else ml_dtypes.finfo(dtype)


def unit_roundoff(dtype) -> float:
    """u = 2**-p for a p-bit significand: the largest relative error of one rounding."""
    return float(_finfo(dtype).eps) / 2


def smallest_subnormal(dtype) -> float:
    info = _finfo(dtype)
    return float(getattr(info, "smallest_subnormal", info.tiny))


def accumulation_dtype(dtype) -> np.dtype:
    return ACCUMULATION.get(np.dtype(dtype), np.dtype(dtype))


def widen(value):
    """Float tensors as float64 (the truth is computed there); everything else unchanged."""
    if isinstance(value, np.ndarray) and is_float(value.dtype) and value.dtype != np.float64:
        return value.astype(np.float64)
    if isinstance(value, list):
        return [widen(v) for v in value]
    return value


def narrow_like(reference, actual):
    """A wider float reference rounded to a narrow kernel's type, to compare there: a float16
    kernel is judged against the float32 reference cast to float16, not against float32."""
    if (isinstance(reference, np.ndarray) and isinstance(actual, np.ndarray)
            and is_float(reference.dtype) and is_float(actual.dtype)
            and reference.dtype.itemsize > actual.dtype.itemsize):
        return reference.astype(actual.dtype)
    return reference


# ----------------------------------------------------------------------------------------------
# the corpus policy
# ----------------------------------------------------------------------------------------------
DEFAULT_RTOL = 1e-3
DEFAULT_ATOL = 1e-7


@dataclass(frozen=True)
class Tolerance:
    rtol: float = DEFAULT_RTOL
    atol: float = DEFAULT_ATOL


class Mismatch(AssertionError):
    """Expected and actual differ; the message says where and how."""


def _as_text(s):
    return s.decode("utf-8", errors="surrogateescape") if isinstance(s, bytes) else str(s)


def compare_tensor(expected: np.ndarray, actual, tol: Tolerance, where: str) -> None:
    if not isinstance(actual, np.ndarray):
        raise Mismatch(f"{where}: expected a tensor {describe(expected)}, got {describe(actual)}")
    if expected.dtype != actual.dtype:
        same_strings = expected.dtype.kind in "OUS" and actual.dtype.kind in "OUS"
        if not same_strings:
            raise Mismatch(f"{where}: dtype {actual.dtype} != expected {expected.dtype}")
    if expected.shape != actual.shape:
        raise Mismatch(f"{where}: shape {list(actual.shape)} != expected {list(expected.shape)}")
    if expected.dtype.kind in "OUS":
        exp = np.vectorize(_as_text, otypes=[object])(expected) if expected.size else expected
        act = np.vectorize(_as_text, otypes=[object])(actual) if actual.size else actual
        bad = np.argwhere(exp != act) if exp.size else []
        if len(bad):
            idx = tuple(int(i) for i in bad[0])
            raise Mismatch(f"{where}: strings differ at {list(idx)}: {act[idx]!r} != {exp[idx]!r}")
        return
    if is_float(expected.dtype) or expected.dtype.kind == "c":
        exp, act = _wide(expected), _wide(actual)
        close = np.isclose(act, exp, rtol=tol.rtol, atol=tol.atol, equal_nan=True)
        if not close.all():
            bad = np.argwhere(~close)
            idx = tuple(int(i) for i in bad[0])
            err = np.abs(act - exp)
            raise Mismatch(
                f"{where}: {len(bad)} of {exp.size} values differ beyond rtol={tol.rtol}, "
                f"atol={tol.atol}; first at {list(idx)}: {act[idx]} != {exp[idx]}; "
                f"max abs error {np.nanmax(err) if err.size else 0}"
            )
        return
    exp, act = expected, actual
    if expected.dtype.kind == "V":  # int4/uint4 from ml_dtypes compare as integers
        exp, act = expected.astype(np.int16), actual.astype(np.int16)
    if not np.array_equal(exp, act):
        bad = np.argwhere(exp != act)
        idx = tuple(int(i) for i in bad[0])
        raise Mismatch(f"{where}: {len(bad)} values differ; first at {list(idx)}: "
                       f"{act[idx]} != {exp[idx]}")


def compare_values(expected, actual, tol: Tolerance = Tolerance(), where: str = "output") -> None:
    """Raise Mismatch unless `actual` matches `expected` under the corpus policy."""
    if expected is None or expected is EMPTY:
        if actual is not None and actual is not EMPTY:
            raise Mismatch(f"{where}: expected an empty optional, got {describe(actual)}")
        return
    if isinstance(expected, np.generic):
        expected = np.asarray(expected)
    if isinstance(expected, np.ndarray):
        compare_tensor(expected, actual, tol, where)
    elif isinstance(expected, list):
        if not isinstance(actual, list):
            raise Mismatch(f"{where}: expected a sequence, got {describe(actual)}")
        if len(expected) != len(actual):
            raise Mismatch(f"{where}: sequence length {len(actual)} != expected {len(expected)}")
        for i, (e, a) in enumerate(zip(expected, actual)):
            compare_values(e, a, tol, f"{where}[{i}]")
    elif isinstance(expected, dict):
        if not isinstance(actual, dict):
            raise Mismatch(f"{where}: expected a map, got {describe(actual)}")
        if set(expected) != set(actual):
            raise Mismatch(f"{where}: map keys {sorted(actual)} != expected {sorted(expected)}")
        for k in expected:
            compare_values(np.asarray(expected[k]), np.asarray(actual[k]), tol, f"{where}[{k!r}]")
    else:
        raise Mismatch(f"{where}: cannot compare a {type(expected).__name__}")


def compare_outputs(expected: list, actual: list, tol: Tolerance = Tolerance(), names=None) -> None:
    if len(expected) != len(actual):
        raise Mismatch(f"{len(actual)} outputs != expected {len(expected)}")
    names = names or [f"output {i}" for i in range(len(expected))]
    for name, e, a in zip(names, expected, actual):
        compare_values(e, a, tol, name)


# ----------------------------------------------------------------------------------------------
# the bound policy
# ----------------------------------------------------------------------------------------------
@dataclass
class OutputVerdict:
    """How one output of a node compares with its truth."""

    name: str
    ok: bool
    policy: str  # "bound", "exact", "equal", "corpus" (no bound registered) or "structure"
    used: float = 0.0  # largest error / allowed error (0: equal; inf: error where none is allowed)
    index: tuple | None = None  # where `used` is largest
    error: float = 0.0
    allowed: float = 0.0
    actual: float | None = None
    truth: float | None = None
    detail: str = ""

    def describe(self) -> str:
        if self.detail:
            return f"{self.name}: {self.detail}"
        if self.policy == "equal":
            return f"{self.name}: equal to the reference op"
        share = "an error where none is allowed" if math.isinf(self.used) else \
            f"{self.used:.0%} of the allowed error"
        where = f"; worst at {list(self.index)}" if self.index is not None else ""
        values = (f": {self.actual:.9g} vs exact {self.truth:.9g} (error {self.error:.3g}, "
                  f"allowed {self.allowed:.3g})" if self.actual is not None else "")
        return f"{self.name}: {share}{where}{values}"


@dataclass
class Judgement:
    """Every declared output of one node, judged."""

    op: str
    outputs: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)

    @property
    def used(self) -> float:
        return max((o.used for o in self.outputs), default=0.0)

    @property
    def worst(self) -> OutputVerdict | None:
        return max(self.outputs, key=lambda o: (not o.ok, o.used), default=None)

    def message(self) -> str:
        return "; ".join(o.describe() for o in self.outputs if not o.ok) or \
            (self.worst.describe() if self.worst else "no outputs")


def declared_outputs(node) -> list[int]:
    """Positions of the outputs the node declares: an omitted optional output is never compared."""
    return [i for i, name in enumerate(node.output) if name]


def check_node(node, opset: int, inputs: list, actual: list, reference_fn) -> Judgement:
    """Judge a fast kernel's outputs for `node` with the bound policy.

    `reference_fn(*inputs)` runs the reference op (attributes bound). It is run once on the
    inputs as given (structure, dtypes, NaN/Inf, exact ops) and, where a float output is not
    equal, once more on float64 inputs for the truth."""
    expected = list(reference_fn(*inputs))
    rule = bounds.rule_for(node)
    truth_cache: list = []

    def truth():
        if not truth_cache:
            truth_cache.append(_truth(reference_fn, inputs, expected))
        return truth_cache[0]

    judgement = Judgement(op=f"{node.op_type} {node.name!r}")
    for i in declared_outputs(node):
        name = node.output[i]
        if i >= len(actual) or i >= len(expected):
            judgement.outputs.append(OutputVerdict(
                name, False, "structure", math.inf,
                detail=f"the kernel gave {len(actual)} outputs, the reference op {len(expected)}"))
            continue
        judgement.outputs.append(_judge_output(node, opset, rule, i, inputs, actual[i],
                                               expected[i], truth))
    return judgement


def judge(node, opset: int, inputs: list, actual: list, truth: list, *, expected=None,
          truth_dtype=None) -> Judgement:
    """Judge `actual` against a given float64 `truth` (one value per declared output).
    `expected` (the reference op in the inputs' own types) defaults to the truth rounded to
    each actual's type; `truth_dtype` says how precisely the truth was computed (float64)."""
    rule = bounds.rule_for(node)
    expected = expected if expected is not None else [
        narrow_like(t, a) for t, a in zip(truth, actual)]
    judgement = Judgement(op=f"{node.op_type} {node.name!r}")
    given = (truth, [np.dtype(truth_dtype or np.float64)] * len(truth))
    for i in declared_outputs(node):
        judgement.outputs.append(_judge_output(node, opset, rule, i, inputs, actual[i],
                                               expected[i], lambda: given))
    return judgement


def _truth(reference_fn, inputs, expected) -> tuple[list, list]:
    """The reference op on float64 inputs, and per output the type it was computed in. An op
    that refuses float64 inputs gives its own-typed result, judged with its own error added."""
    wide = [widen(v) for v in inputs]
    if all(w is v for w, v in zip(wide, inputs)):
        return expected, [_dtype_of(e) for e in expected]
    try:
        values = list(reference_fn(*wide))
    except Exception:  # noqa: BLE001 - an op without a float64 path: its own result is the truth
        return expected, [_dtype_of(e) for e in expected]
    if len(values) != len(expected):
        return expected, [_dtype_of(e) for e in expected]
    return values, [_dtype_of(v) for v in values]


def _dtype_of(value):
    return value.dtype if isinstance(value, np.ndarray) else None


def _judge_output(node, opset, rule, i, inputs, actual, expected, truth) -> OutputVerdict:
    name = node.output[i]
    float_tensor = (isinstance(expected, np.ndarray) and is_float(expected.dtype)
                    and isinstance(actual, np.ndarray))
    if not float_tensor:
        return _corpus_verdict(name, expected, actual, Tolerance(0.0, 0.0), "exact")
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        return _corpus_verdict(name, expected, actual, Tolerance(), "structure")
    if _same_values(expected, actual):
        return OutputVerdict(name, True, "equal")
    if rule is None:
        verdict = _corpus_verdict(name, expected, actual, Tolerance(), CORPUS)
        verdict.detail = (verdict.detail or "within the corpus tolerance") + \
            f" (no error bound is written for {node.op_type}; judged by the corpus policy)"
        return verdict
    if rule.exact:
        return _exact_verdict(name, expected, actual)
    values, dtypes = truth()
    if i >= len(values) or not rule.covers(i):
        return _corpus_verdict(name, expected, actual, Tolerance(), CORPUS)
    return _bound_verdict(node, opset, rule, name, inputs, actual, expected, values[i],
                          dtypes[i])


def _corpus_verdict(name, expected, actual, tol, policy) -> OutputVerdict:
    try:
        compare_values(expected, actual, tol, name)
    except Mismatch as e:
        return OutputVerdict(name, False, policy, math.inf, detail=str(e).removeprefix(f"{name}: "))
    return OutputVerdict(name, True, policy)


def _same_values(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal values, NaN equal to NaN and -0 to +0."""
    x, y = _wide(a), _wide(b)
    return bool(np.all((x == y) | (np.isnan(x) & np.isnan(y))))


def _exact_verdict(name, expected, actual) -> OutputVerdict:
    x, y = _wide(expected), _wide(actual)
    differ = ~((x == y) | (np.isnan(x) & np.isnan(y)))
    idx = tuple(int(k) for k in np.argwhere(differ)[0])
    return OutputVerdict(name, False, "exact", math.inf, idx, float(abs(y[idx] - x[idx])), 0.0,
                         float(y[idx]), float(x[idx]))


def _bound_verdict(node, opset, rule, name, inputs, actual, expected, truth, truth_dtype):
    a, e = _wide(actual), _wide(expected)
    exact_enough = isinstance(truth, np.ndarray) and truth.shape == a.shape
    t = truth.astype(np.float64) if exact_enough else e
    # Inf and NaN: where the op in the kernel's own type gives one, the kernel must give the
    # same (NaN equal to NaN); where it gives a finite value, so must the kernel.
    special = ~np.isfinite(e) | ~np.isfinite(a)
    if special.any():
        same = (a == e) | (np.isnan(a) & np.isnan(e))
        bad = special & ~same
        if bad.any():
            idx = tuple(int(k) for k in np.argwhere(bad)[0])
            return OutputVerdict(name, False, BOUND, math.inf, idx, math.inf, 0.0, float(a[idx]),
                                 float(e[idx]), detail=(
                                     f"{a[idx]} where the reference op gives {e[idx]} at "
                                     f"{list(idx)}"))
    t = np.where(np.isfinite(t), t, e)
    wide_inputs = [widen(v) for v in inputs]
    acc = accumulation_dtype(actual.dtype)
    attrs = bounds.node_attributes(node)
    try:
        allowed = rule.allowed(wide_inputs, t, attrs, opset, unit_roundoff(acc))
    except (NotImplementedError, ValueError, TypeError, IndexError, KeyError) as why:
        verdict = _corpus_verdict(name, expected, actual, Tolerance(), CORPUS)
        verdict.detail = (verdict.detail or "within the corpus tolerance") + \
            f" (the {node.op_type} bound does not cover this case: {why}; judged by the corpus policy)"
        return verdict
    # the type the truth was computed in: the reference op's own when no float64 truth came
    truth_dt = np.dtype(truth_dtype or np.float64) if exact_enough else np.dtype(expected.dtype)
    truth_acc = rule.truth_dtype(attrs) or truth_dt
    if truth_dt != np.float64 or truth_acc != np.float64 or acc == np.float64:
        # the truth itself carries the error of the type it was computed in
        u_truth = unit_roundoff(truth_acc if truth_dt == np.float64 else accumulation_dtype(truth_dt))
        allowed = allowed + rule.allowed(wide_inputs, t, attrs, opset, u_truth) \
            + unit_roundoff(truth_dt) * np.abs(t)
    allowed = allowed + unit_roundoff(actual.dtype) * np.abs(t) + 2 * smallest_subnormal(actual.dtype)
    allowed = np.broadcast_to(allowed, a.shape)
    err = np.where(special, 0.0, np.abs(a - t))
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(err > 0, err / allowed, 0.0)
    k = int(np.argmax(share)) if share.size else 0
    idx = tuple(int(j) for j in np.unravel_index(k, a.shape)) if share.size else None
    used = float(share.reshape(-1)[k]) if share.size else 0.0
    if idx is None:
        return OutputVerdict(name, True, BOUND)
    return OutputVerdict(name, used <= 1.0, BOUND, used, idx, float(err[idx]), float(allowed[idx]),
                         float(a[idx]), float(t[idx]))


# ----------------------------------------------------------------------------------------------
# measurement: the diff's error statistics under an rtol/atol screen
# ----------------------------------------------------------------------------------------------
@dataclass
class Metrics:
    """The comparison of value A (taken as expected) with value B.

    status: "equal", "close" (within tolerance), "diverged" (values out of tolerance) or
    "mismatch" (type, dtype or shape differ; `detail` says how)."""

    status: str
    detail: str = ""
    size: int = 0
    max_abs: float = 0.0
    max_abs_index: tuple | None = None
    max_rel: float = 0.0
    mean_abs: float = 0.0
    median_abs: float = 0.0
    p99_abs: float = 0.0
    out_of_tolerance: int = 0
    nan_mismatch: int = 0
    inf_mismatch: int = 0
    cosine: float | None = None
    max_ulp: int | None = None
    atol_to_pass: float = 0.0
    rtol_to_pass: float = 0.0

    @property
    def within_tolerance(self) -> bool:
        return self.status in ("equal", "close")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["max_abs_index"] = list(self.max_abs_index) if self.max_abs_index is not None else None
        return d


def measure(a, b, rtol: float, atol: float) -> Metrics:
    """Metrics of `b` against `a`; sequences are compared element by element (worst one kept)."""
    if a is EMPTY or b is EMPTY or a is None or b is None:
        return Metrics("equal") if a is b else Metrics(
            "mismatch", f"{describe(a)} vs {describe(b)}")
    if isinstance(a, list) or isinstance(b, list):
        return _measure_sequences(a, b, rtol, atol)
    if isinstance(a, dict) or isinstance(b, dict):
        if not (isinstance(a, dict) and isinstance(b, dict)) or a.keys() != b.keys():
            return Metrics("mismatch", f"{describe(a)} vs {describe(b)}")
        return _worst([measure(a[k], b[k], rtol, atol) for k in a])
    if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
        return Metrics("mismatch", f"{describe(a)} vs {describe(b)}")
    if a.dtype != b.dtype and not (a.dtype.kind in "OUS" and b.dtype.kind in "OUS"):
        return Metrics("mismatch", f"dtype {a.dtype} vs {b.dtype}", size=a.size)
    if a.shape != b.shape:
        return Metrics("mismatch", f"shape {list(a.shape)} vs {list(b.shape)}", size=a.size)
    if is_float(a.dtype) or a.dtype.kind == "c":
        if _bitwise_equal(a, b):
            return Metrics("equal", size=a.size, cosine=1.0 if a.size else None,
                           max_ulp=0 if a.size else None)
        return _measure_floats(a, b, rtol, atol)
    return _measure_exact(a, b)


def _bitwise_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """The common case, answered cheaply: the same bits everywhere."""
    if a.dtype.itemsize not in (1, 2, 4, 8):
        return False
    unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    return bool(np.array_equal(np.ascontiguousarray(a).view(unsigned),
                               np.ascontiguousarray(b).view(unsigned)))


def _measure_sequences(a, b, rtol, atol) -> Metrics:
    if not (isinstance(a, list) and isinstance(b, list)):
        return Metrics("mismatch", f"{describe(a)} vs {describe(b)}")
    if len(a) != len(b):
        return Metrics("mismatch", f"sequence length {len(a)} vs {len(b)}")
    return _worst([measure(x, y, rtol, atol) for x, y in zip(a, b)])


def _worst(parts: list[Metrics]) -> Metrics:
    if not parts:
        return Metrics("equal")
    order = {"equal": 0, "close": 1, "diverged": 2, "mismatch": 3}
    return max(parts, key=lambda m: (order[m.status], m.max_abs))


def _measure_exact(a: np.ndarray, b: np.ndarray) -> Metrics:
    if a.dtype.kind in "OUS":
        a, b = a.astype(str), b.astype(str)
    elif a.dtype.kind == "V":  # int4/uint4
        a, b = a.astype(np.int16), b.astype(np.int16)
    differ = a != b
    n = int(np.count_nonzero(differ))
    if n == 0:
        return Metrics("equal", size=a.size)
    first = tuple(int(i) for i in np.argwhere(differ)[0])
    detail = f"{n} of {a.size} values differ; first at {list(first)}: {b[first]!r} vs {a[first]!r}"
    m = Metrics("diverged", detail, size=a.size, out_of_tolerance=n, max_abs_index=first)
    if a.dtype.kind in "iub":
        err = np.abs(a.astype(np.float64) - b.astype(np.float64))
        m.max_abs = float(err.max())
        m.max_abs_index = tuple(int(i) for i in np.unravel_index(int(err.argmax()), a.shape))
    return m


def _measure_floats(a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> Metrics:
    x, y = _wide(a).reshape(-1), _wide(b).reshape(-1)
    nan_x, nan_y = np.isnan(x), np.isnan(y)
    inf_x, inf_y = np.isinf(x), np.isinf(y)
    nan_mismatch = int(np.count_nonzero(nan_x != nan_y))
    # An infinity matches only the same infinity.
    inf_mismatch = int(np.count_nonzero((inf_x | inf_y) & ~(nan_x | nan_y) & (x != y)))
    finite = ~(nan_x | nan_y | inf_x | inf_y)
    all_finite = bool(finite.all())
    err = np.abs(x - y) if all_finite else np.where(finite, np.abs(x - y), 0.0)
    scale = np.abs(x)
    out = int(np.count_nonzero(err > atol + rtol * scale)) + nan_mismatch + inf_mismatch
    m = Metrics("close" if out == 0 else "diverged", size=a.size, out_of_tolerance=out,
                nan_mismatch=nan_mismatch, inf_mismatch=inf_mismatch)
    if a.size == 0:
        return m
    i = int(np.argmax(err))
    m.max_abs = float(err[i])
    m.max_abs_index = tuple(int(k) for k in np.unravel_index(i, a.shape))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        rel = np.where(err > 0, err / scale, 0.0)
    m.max_rel = float(rel.max())
    finite_err = err if all_finite else err[finite]
    if finite_err.size:
        m.mean_abs = float(finite_err.mean())
        m.median_abs, m.p99_abs = (float(v) for v in np.percentile(finite_err, [50, 99]))
    m.cosine = _cosine(x if all_finite else x[finite], y if all_finite else y[finite])
    m.max_ulp = _max_ulp(a.reshape(-1), b.reshape(-1), finite)
    m.atol_to_pass = float(max(0.0, np.max(err - rtol * scale)))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        m.rtol_to_pass = float(np.max(np.where(err > atol, (err - atol) / scale, 0.0)))
    if out:
        m.detail = (f"{out} of {a.size} values out of tolerance; max abs error {m.max_abs:.3g} "
                    f"at {list(m.max_abs_index)}")
    return m


def _wide(a: np.ndarray) -> np.ndarray:
    return a.astype(np.complex128) if a.dtype.kind == "c" else a.astype(np.float64)


def _cosine(x: np.ndarray, y: np.ndarray) -> float | None:
    if x.size == 0 or x.dtype.kind == "c":
        return None
    nx, ny = np.sqrt(np.einsum("i,i->", x, x)), np.sqrt(np.einsum("i,i->", y, y))
    if nx == 0 or ny == 0:
        return 1.0 if nx == ny else 0.0
    return float(np.clip(np.einsum("i,i->", x, y) / (nx * ny), -1.0, 1.0))


def _max_ulp(a: np.ndarray, b: np.ndarray, finite: np.ndarray) -> int | None:
    """Largest number of representable values between a and b, over finite pairs."""
    if a.dtype.kind == "c" or not finite.any():
        return None
    return int(np.max(np.abs(ordered_bits(a)[finite] - ordered_bits(b)[finite])))


def ordered_bits(a: np.ndarray) -> np.ndarray:
    """Integers in the order of the float values they encode (sign-magnitude to two's complement)."""
    bits = _finfo(a.dtype).bits
    unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    raw = a.view(unsigned).astype(np.int64) if bits < 64 else a.view(np.int64)
    if bits == 64:
        return np.where(raw < 0, -(raw & 0x7FFFFFFFFFFFFFFF), raw)
    raw &= (1 << bits) - 1
    sign = raw >> (bits - 1)
    magnitude = raw & ((1 << (bits - 1)) - 1)
    return np.where(sign == 1, -magnitude, magnitude)
