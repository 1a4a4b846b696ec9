"""NumPy-facing wrappers over the C kernels in csrc/ (the cffi extension optimized._kernels).

Every wrapper takes float32 arrays (NCHW for images), checks dtypes, ranks and shapes, makes
inputs C-contiguous, and raises TypeError/ValueError naming the bad argument before any C code
runs.  Results go to a new array, or to `out` (float32, C-contiguous, the result's shape).

Fused activations are named like the ONNX ops they stand for, with their attributes in
`activation_params`, as com.microsoft FusedConv/FusedGemm spell them:
"Relu", "LeakyRelu" (alpha=0.01), "Sigmoid", "Tanh", "Clip" (min=-inf, max=inf), "Gelu" (erf
form) and "GeluTanh" (the tanh approximation).

Threads: one OpenMP pool of `set_num_threads(n)` threads (default: the CPUs this process may
use).  GEMMs are split into independent blocks across that pool, each block a single-threaded
BLAS call, so BLAS never starts threads of its own: no oversubscription, no nesting.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import os

import numpy as np
import scipy_openblas32

from reference.ops.conv import out_geometry


def _load_blas() -> None:
    # Load the runtime dependency's BLAS under its soname first, so the extension links to it
    # even when the rpath recorded at build time (an isolated build env) no longer exists.
    path = os.path.join(scipy_openblas32.get_lib_dir(), scipy_openblas32.get_library(True))
    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


_load_blas()

# How long an idle OpenMP thread spins before it sleeps, in libgomp's spin rounds (one `pause`
# each; libgomp reckons 100 a microsecond, a few times fewer on this AMD EPYC).  libgomp reads
# OMP_WAIT_POLICY / GOMP_SPINCOUNT once, when the extension below loads it (GNU OpenMP has no
# call to change them later); without them it spins 300000 rounds, milliseconds after every
# parallel region.  On a busy machine, or beside onnxruntime's pool in one process, those
# spinning threads take the cores the working threads wait for.  Too few rounds cost as much on
# a quiet machine: with 1000, a run that follows an idle pause (an app between requests) took
# 55 ms instead of 26 (gpt2_seq128, 2 threads, 0.3 s between runs), because the sleeping thread
# is woken for every parallel region; 30000 rounds (well under a millisecond) gave 33 ms.
# On the same machine with three busy processes beside it: gpt2_seq1 at 2 threads 8.3-9.3 ms
# at 1000 rounds, 11.5 at 30000, 23 at 300000 (README, Performance, has the older busy sweep);
# such a machine now runs kernels on the calling thread (threads.c), so nothing spins there.
# 30000 was still too few on this virtual machine: a sleeping thread's virtual CPU, once idle
# for about 100 ms, takes about 12 ms to be scheduled again, and a run after such a pause paid
# that at a parallel region in one run of two or three (medians of 20 runs, 0.1 s apart, at 2
# threads: gpt2_seq1 9.7 ms, against 3.0 with 0.01 s apart; vit 4.8 against 1.4 in a loop).
# CPU burnt by the spinning thread in the 0.5 s after a run / median with 0.1 s pauses:
# 30000 rounds 1 ms / 9.7 ms (gpt2_seq1); 300000 8 ms / 3.8, vit 3.9 with spikes in 9 of 20;
# 1000000 25 ms / 3.6, vit 6.0; 1500000 38 ms / 3.0, vit 2.3, spikes in 2 of 20; 2000000 50 ms
# / 3.2, vit 2.3; 3000000 76 ms.  1500000 spins about as long as onnxruntime's pool does after
# a run (40-46 ms of CPU, benchmarks/isolated.py), which does not stall there because its
# calling thread can finish a loop alone.
# A user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT wins; ours is set for the load only, so the
# process's environment (and its children's) stays as the user left it.  A libgomp that another
# library loaded first keeps the settings it loaded with.
OPENMP_SPIN_COUNT = 1500000


def _import_extension():
    default = "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ
    if default:
        os.environ["GOMP_SPINCOUNT"] = str(OPENMP_SPIN_COUNT)
    try:
        from . import _kernels
    finally:
        if default:
            del os.environ["GOMP_SPINCOUNT"]
    return _kernels


try:
    _extension = _import_extension()
except ImportError as e:  # pragma: no cover - only without a built extension
    raise ImportError(
        "optimized._kernels is not built; install the package with `pip install .` "
        "(it compiles csrc/ with cffi)"
    ) from e
ffi, lib = _extension.ffi, _extension.lib

_INT_MAX = 2**31 - 1

ACTIVATIONS = {
    # name: (C code, default parameters)
    "Relu": (lib.ACT_RELU, ()),
    "LeakyRelu": (lib.ACT_LEAKY_RELU, (0.01,)),
    "Sigmoid": (lib.ACT_SIGMOID, ()),
    "Tanh": (lib.ACT_TANH, ()),
    "Clip": (lib.ACT_CLIP, (-math.inf, math.inf)),
    "Gelu": (lib.ACT_GELU, ()),
    "GeluTanh": (lib.ACT_GELU_TANH, ()),
    "HardSigmoid": (lib.ACT_HARD_SIGMOID, (0.2, 0.5)),
    "HardSwish": (lib.ACT_HARD_SWISH, ()),
}

BINARY_OPS = {
    "Add": lib.BIN_ADD, "Sub": lib.BIN_SUB, "Mul": lib.BIN_MUL, "Div": lib.BIN_DIV,
    "Max": lib.BIN_MAX, "Min": lib.BIN_MIN,
}

REDUCTIONS = {"sum": lib.RED_SUM, "mean": lib.RED_MEAN, "max": lib.RED_MAX}


# --- threads -------------------------------------------------------------------------------

def set_num_threads(n: int) -> None:
    """Use n threads for every kernel (GEMM blocks and the OpenMP loops alike)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"set_num_threads needs a positive integer, got {n!r}")
    lib.kernels_set_num_threads(int(n))


def get_num_threads() -> int:
    return lib.kernels_configured_threads()


ISAS = {"portable": lib.ISA_PORTABLE, "avx2": lib.ISA_AVX2, "avx512": lib.ISA_AVX512}


def isa() -> str:
    """The widest vector instructions the kernels use now: "avx512", "avx2" or "portable"
    (the best the CPU runs, capped by limit_isa or at load by ONNX_PARITY_MAX_ISA)."""
    level = lib.kernels_isa()
    return next(name for name, value in ISAS.items() if value == level)


def limit_isa(name: str) -> str:
    """Cap the kernels at the named instructions (never above what the CPU runs), so that one
    machine can run every path; returns the level now in force.  Plans already built keep the
    kernels they chose."""
    if name not in ISAS:
        raise ValueError(f"limit_isa takes one of {sorted(ISAS)}, got {name!r}")
    lib.kernels_limit_isa(ISAS[name])
    return isa()


def cpu_isa() -> str:
    """The widest vector instructions this CPU runs (above ONNX_PARITY_MAX_ISA too); the cap
    in force is left as it was."""
    before = isa()
    try:
        return limit_isa("avx512")
    finally:
        limit_isa(before)


@contextlib.contextmanager
def isa_limit(name: str):
    """limit_isa(name) for the body of a with statement (as the level now in force), and the
    level before it back on leaving, also on an error."""
    before = isa()
    now = limit_isa(name)
    try:
        yield now
    finally:
        limit_isa(before)


def busy_fallbacks() -> int:
    """Kernel calls since the extension loaded that ran on the calling thread alone, at a
    configured thread count above 1, because the machine counted as oversubscribed (the
    load-average check in csrc/threads.c; ONNX_PARITY_BUSY_MACHINE)."""
    return lib.kernels_busy_fallbacks()


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


set_num_threads(available_cpus())


# --- argument checks -----------------------------------------------------------------------

def _f32(name: str, a) -> np.ndarray:
    """A C-contiguous float32 array, or TypeError naming the argument."""
    if isinstance(a, np.generic):  # a numpy scalar: a 0-d array
        a = np.asarray(a)
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(a).__name__}")
    if a.dtype != np.float32:
        raise TypeError(f"{name} must be float32, got {a.dtype}")
    # not np.ascontiguousarray: it turns a 0-d array into shape (1,)
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def _rank(name: str, a: np.ndarray, ndim: int) -> None:
    if a.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {list(a.shape)}")


def _c_int(name: str, value: int) -> int:
    """value as a C int argument, or ValueError naming it: the kernels index with 64 bits, but
    the BLAS they call (scipy-openblas32) takes 32-bit dimensions."""
    if not -_INT_MAX - 1 <= value <= _INT_MAX:
        raise ValueError(f"{name}={value} exceeds the C kernels' 32-bit int limit "
                         f"({_INT_MAX}): a BLAS dimension, or an int argument of the kernel")
    return int(value)


def _output(out, shape: tuple, *inputs: np.ndarray, may_alias: tuple = (),
            dtype=np.float32) -> np.ndarray:
    """A new result array, or `out` once checked; `out` may be one of `may_alias` only."""
    if out is None:
        return np.empty(shape, dtype=dtype)
    if not isinstance(out, np.ndarray) or out.dtype != dtype:
        raise TypeError(f"out must be a {np.dtype(dtype)} numpy array, got "
                        f"{getattr(out, 'dtype', type(out))}")
    if out.shape != tuple(shape):
        raise ValueError(f"out has shape {list(out.shape)}, the result has {list(shape)}")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError("out must be C-contiguous and writeable")
    for a in inputs:
        if any(out is m for m in may_alias) and a is out:
            continue
        if np.may_share_memory(out, a):
            raise ValueError("out overlaps an input that this kernel reads while writing")
    return out


def _broadcasts_to(shape: tuple, target: tuple) -> bool:
    """Whether `shape` broadcasts to `target` without changing it (ONNX unidirectional)."""
    if len(shape) > len(target):
        return False
    return all(s in (1, t) for s, t in zip(shape[::-1], target[::-1]))


# Pointer lifetime: C never receives a bare address.  _ptr gives a cdata made by
# ffi.from_buffer, which holds a reference to its array for as long as the cdata lives, and it
# is only ever passed straight into a call; pointers stored in a C table (PointerTable) are kept
# with the cdatas that own them.  ffi.cast to a pointer type would keep nothing alive.

def _ptr(a: np.ndarray):
    """A float[] cdata over a C-contiguous float32 array; it keeps the array alive."""
    if not a.flags.c_contiguous:  # from_buffer refuses these too; the message names why
        raise ValueError(f"a C kernel needs a C-contiguous array, got strides {a.strides}")
    return ffi.from_buffer("float[]", a)


class PointerTable:
    """A C table of float pointers (float *[size]) into float32 arrays, NULL where no array is
    given.  The object owns what its pointers point into: each array (through its from_buffer
    cdata) lives as long as the table does, so keep the PointerTable, not only `.table`, for as
    long as C may read through it."""

    __slots__ = ("_buffers", "arrays", "table")

    def __init__(self, size: int, arrays: dict[int, np.ndarray]):
        self.arrays = dict(arrays)
        self._buffers = tuple(_ptr(a) for a in self.arrays.values())
        self.table = ffi.new("float *[]", max(size, 1))
        for k, buffer in zip(self.arrays, self._buffers):
            self.table[k] = buffer


def _int64x4(values):
    return ffi.new("int64_t[4]", list(values))


@functools.lru_cache(maxsize=256)
def _activation(name, params) -> tuple[int, float, float]:
    """(C code, alpha, beta) for an activation name and its parameters."""
    if name is None:
        if params:
            raise ValueError(f"activation_params {params!r} given without an activation")
        return lib.ACT_NONE, 0.0, 0.0
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; expected one of {sorted(ACTIVATIONS)}")
    code, defaults = ACTIVATIONS[name]
    params = tuple(params)
    if len(params) > len(defaults):
        raise ValueError(f"{name} takes {len(defaults)} parameters, got {len(params)}: {params}")
    values = [float(p) for p in params] + list(defaults[len(params):]) + [0.0, 0.0]
    alpha, beta = values[0], values[1]
    if name == "Clip" and alpha > beta:
        alpha = beta  # ONNX Clip: min > max sets every value to max
    return code, alpha, beta


# --- elementwise ---------------------------------------------------------------------------

def relu_f32(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Relu of a float32 array through the C kernel."""
    x = _f32("x", x)
    out = _output(out, x.shape, x, may_alias=(x,))
    lib.relu_f32(_ptr(x), _ptr(out), x.size)
    return out


def activation(x: np.ndarray, name: str, params=(), out: np.ndarray | None = None) -> np.ndarray:
    """One of ACTIVATIONS applied to every element; out may be x itself."""
    code, alpha, beta = _activation(name, tuple(params))
    x = _f32("x", x)
    out = _output(out, x.shape, x, may_alias=(x,))
    lib.activation_f32(_ptr(x), _ptr(out), x.size, code, alpha, beta)
    return out


def chain(x: np.ndarray, out: np.ndarray, ops, params, sides: PointerTable, geometry) -> None:
    """csrc chain_f32 over x into out (both C-contiguous float32 of one size; out may be x):
    ops, params and geometry are the cdata arrays chain_f32 documents, sides the table of side
    operands, which stays alive, with its arrays, for the whole call."""
    for name, a in (("x", x), ("out", out)):
        if not isinstance(a, np.ndarray) or a.dtype != np.float32:
            raise TypeError(f"chain {name} must be a float32 numpy array, got "
                            f"{getattr(a, 'dtype', type(a).__name__)}")
    if out.size != x.size:
        raise ValueError(f"chain output {list(out.shape)} does not match input {list(x.shape)}")
    if out.size:
        lib.chain_f32(_ptr(x), _ptr(out), out.size, len(ops) // 3, ops, params, sides.table,
                      geometry)


def gelu(x: np.ndarray, approximate: str = "none", out: np.ndarray | None = None) -> np.ndarray:
    """ONNX Gelu: approximate "none" (erf) or "tanh"."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"Gelu approximate must be 'none' or 'tanh', got {approximate!r}")
    return activation(x, "Gelu" if approximate == "none" else "GeluTanh", out=out)


def _collapsed_broadcast(shape: tuple, *strides: tuple) -> tuple[list[int], list[list[int]]]:
    """Merge adjacent axes that every operand walks as one; drop axes of length 1."""
    dims: list[int] = []
    merged: list[list[int]] = [[] for _ in strides]
    for axis, size in enumerate(shape):
        if size == 1:
            continue
        if dims and all(m[-1] == s[axis] * size for m, s in zip(merged, strides)):
            dims[-1] *= size
            for m, s in zip(merged, strides):
                m[-1] = s[axis]
            continue
        dims.append(size)
        for m, s in zip(merged, strides):
            m.append(s[axis])
    return dims, merged


def binary(op: str, a: np.ndarray, b: np.ndarray, *, activation: str | None = None,
           activation_params=(), out: np.ndarray | None = None) -> np.ndarray:
    """act(a op b) with numpy broadcasting, op one of BINARY_OPS (Add, Sub, Mul, Div, Max, Min).

    Any broadcast that collapses to 4 axes or fewer runs in C (same shape, scalar, per-channel,
    row and column vectors); others raise ValueError so a caller can fall back.
    """
    if op not in BINARY_OPS:
        raise ValueError(f"unknown binary op {op!r}; expected one of {sorted(BINARY_OPS)}")
    code, alpha, beta = _activation(activation, tuple(activation_params))
    a, b = _f32("a", a), _f32("b", b)
    shape, dims, sa, sb = _binary_geometry(op, a.shape, b.shape)
    aliasable = tuple(v for v in (a, b) if v.shape == shape)
    out = _output(out, shape, a, b, may_alias=aliasable)
    if out.size:
        lib.binary_f32(BINARY_OPS[op], _ptr(a), sa, _ptr(b), sb, _ptr(out), dims, code, alpha,
                       beta)
    return out


@functools.lru_cache(maxsize=4096)
def _binary_geometry(op: str, a_shape: tuple, b_shape: tuple):
    """(result shape, and the C loop's 4 dims with each operand's element strides), worked out
    once per pair of shapes: a run of a static-shape model sees the same pairs every time."""
    try:
        shape = np.broadcast_shapes(a_shape, b_shape)
    except ValueError:
        raise ValueError(f"{op}: shapes {list(a_shape)} and {list(b_shape)} do not broadcast") from None
    strides = [_broadcast_strides(a_shape, shape), _broadcast_strides(b_shape, shape),
               _broadcast_strides(shape, shape)]
    dims, (sa, sb, _) = _collapsed_broadcast(shape, *strides)
    if len(dims) > 4:
        raise ValueError(
            f"{op}: broadcasting {list(a_shape)} with {list(b_shape)} needs {len(dims)} loop "
            "axes; the C kernel handles 4")
    pad = 4 - len(dims)
    return shape, _int64x4([1] * pad + dims), _int64x4([0] * pad + sa), _int64x4([0] * pad + sb)


def _broadcast_strides(shape: tuple, target: tuple) -> list[int]:
    """Element strides of a C-contiguous `shape` walked over `target` (0 where broadcast)."""
    strides, step = [0] * len(target), 1
    for axis in range(1, len(shape) + 1):
        size = shape[-axis]
        strides[-axis] = step if size == target[-axis] and size != 1 else 0
        step *= size
    return strides


def add(a, b, **kw):
    return binary("Add", a, b, **kw)


def sub(a, b, **kw):
    return binary("Sub", a, b, **kw)


def mul(a, b, **kw):
    return binary("Mul", a, b, **kw)


def div(a, b, **kw):
    return binary("Div", a, b, **kw)


# --- GEMM and convolution ------------------------------------------------------------------

def gemm(a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None, *, alpha: float = 1.0,
         beta: float = 1.0, trans_a: bool = False, trans_b: bool = False,
         activation: str | None = None, activation_params=(),
         out: np.ndarray | None = None) -> np.ndarray:
    """act(alpha * A' @ B' + beta * C) as ONNX Gemm (C broadcast to (M, N)); M=1 or N=1 run GEMV."""
    code, act_alpha, act_beta = _activation(activation, tuple(activation_params))
    a, b = _f32("A", a), _f32("B", b)
    _rank("A", a, 2)
    _rank("B", b, 2)
    m, k = a.shape[::-1] if trans_a else a.shape
    kb, n = b.shape[::-1] if trans_b else b.shape
    if k != kb:
        raise ValueError(f"Gemm inner dimensions differ: A' is {[m, k]}, B' is {[kb, n]}")
    for name, v in (("M", m), ("N", n), ("K", k)):
        _c_int(name, v)
    c, c_strides = _addend("Gemm", c, m, n)
    inputs = (a, b) if c is None else (a, b, c)
    out = _output(out, (m, n), *inputs)
    lib.gemm_f32(int(bool(trans_a)), int(bool(trans_b)), m, n, k, float(alpha), _ptr(a), _ptr(b),
                 float(beta), ffi.NULL if c is None else _ptr(c), c_strides[0], c_strides[1],
                 _ptr(out), code, act_alpha, act_beta)
    return out


def _addend(kernel: str, c, m: int, n: int):
    """C as float32 and its element strides once broadcast to (m, n); (None, (0, 0)) without C."""
    if c is None:
        return None, (0, 0)
    c = _f32("C", c)
    if not _broadcasts_to(c.shape, (m, n)):
        raise ValueError(f"{kernel} C of shape {list(c.shape)} does not broadcast to {[m, n]}")
    return c, tuple(s // 4 for s in np.broadcast_to(c, (m, n)).strides)


def matmul(a: np.ndarray, b: np.ndarray, *, alpha: float = 1.0, trans_a: bool = False,
           trans_b: bool = False, out: np.ndarray | None = None) -> np.ndarray:
    """alpha * op(a) @ op(b) with numpy's batch broadcasting, for inputs of rank 2 or more; op
    swaps the last two axes when asked.  An operand whose batch axes broadcast only in part
    (neither the whole batch nor a single matrix) is copied out to the whole batch first."""
    a, b = _f32("A", a), _f32("B", b)
    if a.ndim < 2 or b.ndim < 2:
        raise ValueError(f"MatMul kernel takes inputs of rank >= 2, got {list(a.shape)} and "
                         f"{list(b.shape)}")
    m, k = a.shape[-1:-3:-1] if trans_a else a.shape[-2:]
    kb, n = b.shape[-1:-3:-1] if trans_b else b.shape[-2:]
    if k != kb:
        raise ValueError(f"MatMul inner dimensions differ: {list(a.shape)} and {list(b.shape)}")
    try:
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        raise ValueError(f"MatMul batch axes of {list(a.shape)} and {list(b.shape)} do not "
                         "broadcast") from None
    shape = batch + (m, n)
    count = math.prod(batch)
    if b.ndim == 2 and not trans_a:  # one GEMM over every row of a
        m, count = m * math.prod(a.shape[:-2]), 1
    for name, v in (("M", m), ("N", n), ("K", k), ("batch", count)):
        _c_int(name, v)
    out = _output(out, shape, a, b)
    a, b = (_whole_batch(x, batch) for x in (a, b))
    strides = [0 if x.ndim == 2 or math.prod(x.shape[:-2]) == 1 else x.shape[-1] * x.shape[-2]
               for x in (a, b)]
    lib.gemm_batched_f32(int(bool(trans_a)), int(bool(trans_b)), count, m, n, k, float(alpha),
                         _ptr(a), strides[0], _ptr(b), strides[1], _ptr(out))
    return out


GEMV_MAX_ROWS = lib.GEMV_F32_MAX_ROWS  # the most rows of A that gemv() takes


def gemv(a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None, *, alpha: float = 1.0,
         beta: float = 1.0, trans_b: bool = False, activation: str | None = None,
         activation_params=(), out: np.ndarray | None = None,
         allow_simd: bool = True) -> np.ndarray:
    """act(alpha * a @ op(b) + beta * c) for a (m, k) with 1 <= m <= GEMV_MAX_ROWS and b
    (k, n), or (n, k) with trans_b, read where it lies; C broadcast to (m, n).  Bound by
    streaming b, split across the threads by output column (csrc/gemv.c)."""
    code, act_alpha, act_beta = _activation(activation, tuple(activation_params))
    a, b = _f32("A", a), _f32("B", b)
    _rank("A", a, 2)
    _rank("B", b, 2)
    m, k = a.shape
    kb, n = b.shape[::-1] if trans_b else b.shape
    if k != kb:
        raise ValueError(f"GEMV inner dimensions differ: A is {[m, k]}, op(B) is {[kb, n]}")
    if not 1 <= m <= GEMV_MAX_ROWS:
        raise ValueError(f"GEMV takes 1 to {GEMV_MAX_ROWS} rows of A, got {m}")
    c, c_strides = _addend("GEMV", c, m, n)
    inputs = (a, b) if c is None else (a, b, c)
    out = _output(out, (m, n), *inputs)
    status = lib.gemv_f32(int(bool(trans_b)), m, n, k, float(alpha), _ptr(a), k, _ptr(b),
                          float(beta), ffi.NULL if c is None else _ptr(c), c_strides[0],
                          c_strides[1], _ptr(out), code, act_alpha, act_beta,
                          int(bool(allow_simd)))
    if status != 0:
        raise ValueError(f"GEMV refused {m} rows of A (it takes 1 to {GEMV_MAX_ROWS})")
    return out


class PackedWeights:
    """A constant B of a GEMM copied once into the panels csrc/gemm_packed.c reads: 16 columns
    a panel, each K rows of 16 floats, the last panel padded with zeros.  Packed from b (k, n),
    or (n, k) with trans_b; independent of M and of the thread count."""

    __slots__ = ("data", "k", "n")

    def __init__(self, b: np.ndarray, *, trans_b: bool = False):
        panels = pack_b_panels(b, trans_b=trans_b)
        self.k, self.n = panels.shape[1], (b.shape[0] if trans_b else b.shape[1])
        self.data = panels.reshape(-1)

    @classmethod
    def from_panels(cls, panels: np.ndarray, n: int | None = None) -> PackedWeights:
        """A view of panels that pack_b_panels made (shape (panels, k, 16), float32,
        C-contiguous); n columns of B (all 16 * panels when None)."""
        panels = _f32("packed panels", panels)
        _rank("packed panels", panels, 3)
        count, k, cols = panels.shape
        n = count * PANEL_COLS if n is None else int(n)
        if cols != PANEL_COLS or not panels.flags.c_contiguous or not (
                (count - 1) * PANEL_COLS < n <= count * PANEL_COLS):
            raise ValueError(f"packed panels of shape {list(panels.shape)} for {n} columns: "
                             f"expected ({-(-n // PANEL_COLS)}, k, {PANEL_COLS}), C-contiguous")
        weights = cls.__new__(cls)
        weights.k, weights.n, weights.data = k, n, panels.reshape(-1)
        return weights


# columns of one panel of csrc/gemm_packed.c
PANEL_COLS = 16


def pack_b_panels(b: np.ndarray, *, trans_b: bool = False) -> np.ndarray:
    """B (k, n), or (n, k) with trans_b, as the packed GEMM's panels: shape
    (ceil(n / 16), k, 16), panel p holding columns 16p .. 16p + 15 row after row, the last
    panel padded with zeros.  unpack_b_panels gives B back bit for bit."""
    b = _f32("B", b)
    _rank("B", b, 2)
    k, n = (int(d) for d in (b.shape[::-1] if trans_b else b.shape))
    panels = np.empty((-(-n // PANEL_COLS), k, PANEL_COLS), np.float32)
    lib.gemm_pack_b(_ptr(b), int(bool(trans_b)), k, n, _ptr(panels))
    return panels


def unpack_b_panels(panels: np.ndarray, n: int, *, trans_b: bool = False) -> np.ndarray:
    """The B that pack_b_panels packed into `panels` (n columns): a new array, bit for bit."""
    count, k, cols = panels.shape
    b = panels.transpose(1, 0, 2).reshape(k, count * cols)[:, :n]
    return np.array(b.T if trans_b else b, order="C")


def gemm_packed(a: np.ndarray, b: PackedWeights, c: np.ndarray | None = None, *,
                alpha: float = 1.0, beta: float = 1.0, activation: str | None = None,
                activation_params=(), out: np.ndarray | None = None,
                allow_simd: bool = True) -> np.ndarray:
    """act(alpha * a @ B + beta * c) for a (m, k) and B packed once (PackedWeights); C
    broadcast to (m, n).  The same sums whatever the thread count (threads split columns)."""
    code, act_alpha, act_beta = _activation(activation, tuple(activation_params))
    a = _f32("A", a)
    _rank("A", a, 2)
    m, k = a.shape
    if k != b.k:
        raise ValueError(f"packed GEMM inner dimensions differ: A is {[m, k]}, B is {[b.k, b.n]}")
    c, c_strides = _addend("packed GEMM", c, m, b.n)
    out = _output(out, (m, b.n), *((a,) if c is None else (a, c)))
    lib.gemm_packed_f32(m, b.n, k, float(alpha), _ptr(a), k, _ptr(b.data), float(beta),
                        ffi.NULL if c is None else _ptr(c), c_strides[0], c_strides[1],
                        _ptr(out), code, act_alpha, act_beta, int(bool(allow_simd)))
    return out


def _whole_batch(x: np.ndarray, batch: tuple) -> np.ndarray:
    """x itself when its matrices step one by one over `batch` or it holds one matrix; else a
    contiguous copy broadcast to the whole batch."""
    if math.prod(x.shape[:-2]) == 1 or (1,) * (len(batch) - x.ndim + 2) + x.shape[:-2] == batch:
        return x
    return np.ascontiguousarray(np.broadcast_to(x, batch + x.shape[-2:]))


def window_geometry(in_shape, kernel, strides, dilations, pads, auto_pad="NOTSET",
                    ceil_mode=False) -> tuple[list[int], list[int], list[int]]:
    """(pads_begin, pads_end, out_shape) of a sliding window: the reference's geometry (ONNX's
    Conv/Pool rules), refused when the output would be empty.  The C kernels take every value
    (ONNX's int64 attributes) as int64_t and work their sums and products in 64 bits."""
    begin, end, out = out_geometry(in_shape, kernel, strides, dilations, pads, auto_pad,
                                   ceil_mode)
    if min(out, default=1) < 1:
        raise ValueError(
            f"window of kernel {list(kernel)}, dilations {list(dilations)} does not fit "
            f"input {list(in_shape)} with pads {list(pads)} ({auto_pad})")
    return begin, end, out


def _pair(name: str, v, default: int, minimum: int) -> tuple[int, int]:
    v = (default, default) if v is None else tuple(int(i) for i in v)
    if len(v) != 2 or min(v) < minimum:
        raise ValueError(f"{name} must be two integers >= {minimum}, got {list(v)}")
    return v


def _pads(pads) -> tuple[int, int, int, int]:
    pads = (0, 0, 0, 0) if pads is None else tuple(int(p) for p in pads)
    if len(pads) != 4 or min(pads) < 0:
        raise ValueError(f"pads must be 4 non-negative integers [top, left, bottom, right], got {list(pads)}")
    return pads


def _conv_geometry(x_shape, w, group, strides, dilations, pads, auto_pad):
    """A 2-D convolution's sizes, checked: N, C, H, W of x; M, C/group, kH, kW of w; strides,
    dilations, the window's begin and end padding, and the output's height and width."""
    _rank("W", w, 4)
    batch, channels, in_h, in_w = x_shape
    out_c, per_group, k_h, k_w = w.shape
    if group < 1 or channels % group or out_c % group:
        raise ValueError(f"group {group} must divide X's channels {channels} and W's outputs {out_c}")
    if per_group * group != channels:
        raise ValueError(f"W has {per_group} input channels per group; X has {channels} channels "
                         f"in {group} groups")
    strides = _pair("strides", strides, 1, 1)
    dilations = _pair("dilations", dilations, 1, 1)
    begin, end, (out_h, out_w) = window_geometry(
        (in_h, in_w), (k_h, k_w), strides, dilations, _pads(pads), auto_pad)
    return (batch, channels, in_h, in_w, out_c, per_group, k_h, k_w, strides, dilations, begin,
            end, out_h, out_w)


def conv2d(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None, *, strides=None,
           pads=None, dilations=None, group: int = 1, auto_pad: str = "NOTSET",
           residual: np.ndarray | None = None, activation: str | None = None,
           activation_params=(), out: np.ndarray | None = None) -> np.ndarray:
    """act(Conv(x, w) + bias + residual) for NCHW x and w of shape (M, C/group, kH, kW).

    1x1 stride-1 unpadded convolutions are one GEMM per image and group; others im2col first.
    """
    code, act_alpha, act_beta = _activation(activation, tuple(activation_params))
    x, w = _f32("X", x), _f32("W", w)
    _rank("X", x, 4)
    (batch, channels, in_h, in_w, out_c, per_group, k_h, k_w, strides, dilations, begin, _end,
     out_h, out_w) = _conv_geometry(x.shape, w, group, strides, dilations, pads, auto_pad)
    shape = (batch, out_c, out_h, out_w)
    # the GEMMs' dimensions (the rest of the geometry is int64_t in C)
    for name, v in (("kernel depth", per_group * k_h * k_w), ("output plane", out_h * out_w),
                    ("output channels per group", out_c // group)):
        _c_int(name, v)
    if bias is not None:
        bias = _f32("B", bias)
        if bias.shape != (out_c,):
            raise ValueError(f"bias must have shape {[out_c]}, got {list(bias.shape)}")
    if residual is not None:
        residual = _f32("residual", residual)
        if residual.shape != shape:
            raise ValueError(f"residual must have the output's shape {list(shape)}, got {list(residual.shape)}")
    inputs = [v for v in (x, w, bias) if v is not None]
    out = _output(out, shape, *inputs, *([residual] if residual is not None else []),
                  may_alias=(residual,) if residual is not None else ())
    if out.size == 0:
        return out
    if residual is out:  # C writes the convolution into y before it adds the residual
        residual = residual.copy()
    status = lib.conv2d_f32(
        _ptr(x), batch, channels, in_h, in_w, _ptr(w), out_c, k_h, k_w, group,
        strides[0], strides[1], begin[0], begin[1], dilations[0], dilations[1],
        ffi.NULL if bias is None else _ptr(bias),
        ffi.NULL if residual is None else _ptr(residual),
        _ptr(out), out_h, out_w, code, act_alpha, act_beta)
    if status != 0:
        raise MemoryError("conv2d could not allocate its im2col buffer")
    return out


# --- convolution through oneDNN ------------------------------------------------------------

ONEDNN_LAYOUTS = {"blocked": 0, "plain": 1}  # csrc enum onednn_layout


def _onednn_library_path() -> str | None:
    """libdnnl from the onednn-cpu-gomp wheel, or the path in ONNX_PARITY_ONEDNN (0: none)."""
    setting = os.environ.get("ONNX_PARITY_ONEDNN", "")
    if setting in ("0", "off"):
        return None
    if setting:
        return setting
    import importlib.metadata

    try:
        dist = importlib.metadata.distribution("onednn-cpu-gomp")
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in dist.files or ():
        if str(f).endswith("libdnnl.so.3"):
            return os.path.normpath(str(dist.locate_file(f)))
    return None


@functools.cache
def onednn_unavailable() -> str | None:
    """None when oneDNN convolutions can run, else the reason they cannot."""
    path = _onednn_library_path()
    if path is None:
        return "onednn-cpu-gomp is not installed (or ONNX_PARITY_ONEDNN=0 turned it off)"
    if lib.onednn_open(path.encode()) != 0:
        return ffi.string(lib.onednn_last_error()).decode(errors="replace")
    return None


class OneDNNConv:
    """act(Conv(x, w) + bias + residual) through oneDNN, planned once for one NCHW input shape
    and the current thread count: the primitive with its post-ops, and w and bias copied into
    the layout it reads.  layout "blocked" lets oneDNN pick its layouts (nChw8c on AVX2) and
    reorders x, the residual and y per call; "plain" keeps NCHW.  Raises RuntimeError when
    oneDNN is unavailable or refuses the convolution, ValueError for a bad argument."""

    def __init__(self, x_shape, w: np.ndarray, bias: np.ndarray | None = None, *, strides=None,
                 pads=None, dilations=None, group: int = 1, auto_pad: str = "NOTSET",
                 residual: bool = False, activation: str | None = None, activation_params=(),
                 layout: str = "blocked", borrow_weights: bool = False):
        reason = onednn_unavailable()
        if reason is not None:
            raise RuntimeError(f"oneDNN convolution unavailable: {reason}")
        if layout not in ONEDNN_LAYOUTS:
            raise ValueError(f"layout must be one of {sorted(ONEDNN_LAYOUTS)}, got {layout!r}")
        code, act_alpha, act_beta = _activation(activation, tuple(activation_params))
        w = _f32("W", w)
        if len(x_shape) != 4:
            raise ValueError(f"X must be 4-D, got shape {list(x_shape)}")
        (batch, channels, in_h, in_w, out_c, _per_group, k_h, k_w, strides, dilations, begin,
         end, out_h, out_w) = _conv_geometry(tuple(int(d) for d in x_shape), w, group, strides,
                                             dilations, pads, auto_pad)
        if bias is not None:
            bias = _f32("B", bias)
            if bias.shape != (out_c,):
                raise ValueError(f"bias must have shape {[out_c]}, got {list(bias.shape)}")
        self.in_shape = (batch, channels, in_h, in_w)
        self.out_shape = (batch, out_c, out_h, out_w)
        self.residual = bool(residual)
        self.threads = get_num_threads()
        geometry = ffi.new("int64_t[18]", [batch, channels, in_h, in_w, out_c, k_h, k_w, group,
                                           *strides, *begin, *end, *dilations, out_h, out_w])
        handle = lib.onednn_conv_create(geometry, _ptr(w), ffi.NULL if bias is None else _ptr(bias),
                                        int(self.residual), code, act_alpha, act_beta,
                                        ONEDNN_LAYOUTS[layout])
        if handle == ffi.NULL:
            raise RuntimeError("oneDNN refused the convolution: "
                               + ffi.string(lib.onednn_last_error()).decode(errors="replace"))
        self._handle = ffi.gc(handle, lib.onednn_conv_destroy)
        # on a busy machine the C plan runs our kernel over w and bias instead (onednn_conv.c);
        # borrow_weights: the caller keeps w alive for as long as the plan (the CPU provider's
        # cache, keyed by w, drops the plan when w is freed, which a reference here would stop)
        self._plain_weights = (None if borrow_weights else w, bias)
        self.implementation = ffi.string(lib.onednn_conv_implementation(handle)).decode()

    def __call__(self, x: np.ndarray, residual: np.ndarray | None = None,
                 out: np.ndarray | None = None) -> np.ndarray:
        x = _f32("X", x)
        if x.shape != self.in_shape:
            raise ValueError(f"X has shape {list(x.shape)}; this convolution was planned for "
                             f"{list(self.in_shape)}")
        if (residual is not None) != self.residual:
            raise ValueError("the residual must be given exactly when the plan has one")
        if residual is not None:
            residual = _f32("residual", residual)
            if residual.shape != self.out_shape:
                raise ValueError(f"residual must have the output's shape {list(self.out_shape)}, "
                                 f"got {list(residual.shape)}")
        out = _output(out, self.out_shape, x, *([residual] if residual is not None else []),
                      may_alias=(residual,) if residual is not None else ())
        status = lib.onednn_conv_run(self._handle, _ptr(x),
                                     ffi.NULL if residual is None else _ptr(residual), _ptr(out))
        if status != 0:
            raise RuntimeError("oneDNN convolution failed")
        return out

    def native_size(self, which: str) -> int:
        """Floats of the source ("src") or destination ("dst") in the primitive's layout."""
        return lib.onednn_conv_native_bytes(self._handle, 0 if which == "src" else 1) // 4

    def run_native(self, x: np.ndarray, y: np.ndarray) -> None:
        """The convolution alone on buffers already in the primitive's layout (native_size
        floats each); a residual is what y holds before the call."""
        for name, a, which in (("x", x, "src"), ("y", y, "dst")):
            if a.dtype != np.float32 or not a.flags.c_contiguous or a.size < self.native_size(which):
                raise ValueError(f"{name} must be C-contiguous float32 of at least "
                                 f"{self.native_size(which)} elements")
        if lib.onednn_conv_run_native(self._handle, _ptr(x), _ptr(y)) != 0:
            raise RuntimeError("oneDNN convolution failed")


# --- blocked regions through oneDNN (csrc/onednn_region.c) ---------------------------------

REGION_POOLS = {"max": 0, "average": 1, "average_with_pads": 2}  # csrc onednn_region_pool kinds


class OneDNNRegion:
    """Several convolutions, activations, adds, channel concats and pools run by oneDNN's
    primitives back to back in its blocked layout, reordered from and to NCHW only at the
    region's entries and exits.  Described op by op over numbered values (0..values-1), then
    finish(); planned for the shapes given and the current thread count.  Raises RuntimeError
    when oneDNN is unavailable or refuses an op, ValueError for a bad argument."""

    def __init__(self, values: int, threads: int | None = None):
        """threads: at most the configured count (the default), 1 for a single-thread twin."""
        reason = onednn_unavailable()
        if reason is not None:
            raise RuntimeError(f"oneDNN region unavailable: {reason}")
        handle = lib.onednn_region_create(values)
        self._check(handle != ffi.NULL)
        self._handle = ffi.gc(handle, lib.onednn_region_destroy)
        if threads is not None:
            self._check(lib.onednn_region_set_threads(self._handle, threads) == 0)
        self.shapes: dict[int, tuple] = {}
        self.inputs: list[int] = []
        self.outputs: list[int] = []
        self.threads = get_num_threads() if threads is None else threads

    def attach_single(self, twin: OneDNNRegion) -> None:
        """twin (the same ops, finished, planned for one thread) runs in this region's place
        when the kernels fall back to the calling thread on a busy machine; the region owns
        it from here (twin's handle is not to be used again)."""
        self._check(lib.onednn_region_attach_single(self._handle, twin._handle) == 0)
        ffi.gc(twin._handle, None)  # freed with this region's
        twin._handle = None

    @property
    def single_runs(self) -> int:
        """How often the single-thread twin ran in this region's place; -1 without one."""
        return lib.onednn_region_single_runs(self._handle)

    @staticmethod
    def _check(ok: bool) -> None:
        if not ok:
            raise RuntimeError("oneDNN region: "
                               + ffi.string(lib.onednn_region_last_error()).decode(errors="replace"))

    def entry(self, value: int, shape) -> None:
        shape = tuple(int(d) for d in shape)
        if len(shape) != 4:
            raise ValueError(f"a region's values are 4-D, got shape {list(shape)}")
        _nonempty(shape)
        self._check(lib.onednn_region_entry(self._handle, value, ffi.new("int64_t[4]", shape)) == 0)
        self.shapes[value] = shape
        self.inputs.append(value)

    def conv(self, src: int, residual: int, dst: int, w: np.ndarray, bias=None, *, strides=None,
             pads=None, dilations=None, group: int = 1, auto_pad: str = "NOTSET",
             activation: str | None = None, activation_params=(), ties=None) -> tuple:
        """dst = act(Conv(src, w) + bias + residual); residual -1 where absent.  ties: None,
        or per output channel the channel it copies afterwards (no residual then)."""
        code, act_alpha, act_beta = _activation(activation, tuple(activation_params))
        w = _f32("W", w)
        (batch, channels, in_h, in_w, out_c, _per_group, k_h, k_w, strides, dilations, begin,
         end, out_h, out_w) = _conv_geometry(self.shapes[src], w, group, strides, dilations,
                                             pads, auto_pad)
        if bias is not None:
            bias = _f32("B", bias)
            if bias.shape != (out_c,):
                raise ValueError(f"bias must have shape {[out_c]}, got {list(bias.shape)}")
        _nonempty((batch, out_c, out_h, out_w))
        geometry = ffi.new("int64_t[18]", [batch, channels, in_h, in_w, out_c, k_h, k_w, group,
                                           *strides, *begin, *end, *dilations, out_h, out_w])
        tie_table = ffi.NULL
        if ties is not None:
            ties = [int(t) for t in ties]
            if len(ties) != out_c or any(not 0 <= t < out_c or ties[t] != t for t in ties):
                raise ValueError(f"ties must name, per output channel, a channel among {out_c} "
                                 "that is its own source")
            tie_table = ffi.new("int64_t[]", ties)
        self._check(lib.onednn_region_conv(self._handle, src, residual, dst, geometry, _ptr(w),
                                           ffi.NULL if bias is None else _ptr(bias), code,
                                           act_alpha, act_beta, tie_table) == 0)
        self.shapes[dst] = (batch, out_c, out_h, out_w)
        return self.shapes[dst]

    def activation(self, src: int, dst: int, name: str, params=()) -> None:
        code, alpha, beta = _activation(name, tuple(params))
        self._check(lib.onednn_region_activation(self._handle, src, dst, code, alpha, beta) == 0)
        self.shapes[dst] = self.shapes[src]

    def add(self, a: int, b: int, dst: int) -> None:
        if self.shapes[a] != self.shapes[b]:
            raise ValueError(f"a region adds equal shapes, got {self.shapes[a]} and {self.shapes[b]}")
        self._check(lib.onednn_region_add(self._handle, a, b, dst) == 0)
        self.shapes[dst] = self.shapes[a]

    def concat(self, srcs: list[int], dst: int) -> None:
        self._check(lib.onednn_region_concat(self._handle, ffi.new("int64_t[]", srcs), len(srcs),
                                             dst) == 0)
        first = self.shapes[srcs[0]]
        self.shapes[dst] = (first[0], sum(self.shapes[s][1] for s in srcs), *first[2:])

    def pool(self, src: int, dst: int, kind: str, kernel_shape, strides, pads) -> tuple:
        """kernel_shape, strides (2 each), pads (top, left, bottom, right); windows lie inside
        the padded input (no ceil mode, no dilation)."""
        batch, channels, in_h, in_w = self.shapes[src]
        (k_h, k_w), (s_h, s_w), (top, left, bottom, right) = kernel_shape, strides, pads
        out_h, out_w = (in_h + top + bottom - k_h) // s_h + 1, (in_w + left + right - k_w) // s_w + 1
        if min(k_h, k_w, s_h, s_w, out_h, out_w) < 1 or min(pads) < 0:
            raise ValueError(f"pool geometry {kernel_shape}, {strides}, {pads} gives no output")
        geometry = ffi.new("int64_t[8]", [k_h, k_w, s_h, s_w, top, left, out_h, out_w])
        self._check(lib.onednn_region_pool(self._handle, src, dst, REGION_POOLS[kind],
                                           geometry) == 0)
        self.shapes[dst] = (batch, channels, out_h, out_w)
        return self.shapes[dst]

    def exit(self, value: int) -> None:
        self._check(lib.onednn_region_exit(self._handle, value) == 0)
        self.outputs.append(value)

    def finish(self) -> None:
        self._check(lib.onednn_region_finish(self._handle) == 0)

    def __call__(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """The exits' values (NCHW float32) for the entries' values, in the order added."""
        if len(inputs) != len(self.inputs):
            raise ValueError(f"the region takes {len(self.inputs)} inputs, got {len(inputs)}")
        arrays = []
        for value, x in zip(self.inputs, inputs):
            x = _f32("X", x)
            if x.shape != self.shapes[value]:
                raise ValueError(f"the region was planned for {self.shapes[value]}, got {x.shape}")
            arrays.append(np.ascontiguousarray(x))
        outs = [np.empty(self.shapes[v], np.float32) for v in self.outputs]
        ins = PointerTable(len(arrays), dict(enumerate(arrays)))
        results = PointerTable(len(outs), dict(enumerate(outs)))
        self._check(lib.onednn_region_run(self._handle, ins.table, results.table) == 0)
        return outs

    def step(self, in_slots: list[int], out_slots: list[int]) -> dict:
        """The region run by slot (inputs then outputs); the step keeps the region alive."""
        slots = ffi.new("int32_t[]", list(in_slots) + list(out_slots))
        return _step(lib.PLAN_ONEDNN_REGION, handle=self._handle, side_slots=slots)


# --- pooling -------------------------------------------------------------------------------

def _pool_setup(x, kernel_shape, strides, pads, dilations, ceil_mode, auto_pad):
    x = _f32("X", x)
    _rank("X", x, 4)
    return (x,) + _pool_window(x.shape, kernel_shape, strides, pads, dilations, ceil_mode,
                               auto_pad)


def _pool_window(shape, kernel_shape, strides, pads, dilations, ceil_mode, auto_pad):
    """(kernel, strides, dilations, pads_begin, pads_end, (out_h, out_w)) of a 2-D pool."""
    kernel = _pair("kernel_shape", kernel_shape, 0, 1) if kernel_shape is not None else None
    if kernel is None:
        raise ValueError("kernel_shape is required")
    strides = _pair("strides", strides, 1, 1)
    dilations = _pair("dilations", dilations, 1, 1)
    pads = _pads(pads)
    begin, end, out_hw = window_geometry(shape[2:], kernel, strides, dilations, pads, auto_pad,
                                         bool(ceil_mode))
    return kernel, strides, dilations, begin, end, out_hw


def max_pool2d(x: np.ndarray, kernel_shape, *, strides=None, pads=None, dilations=None,
               ceil_mode: bool = False, auto_pad: str = "NOTSET",
               out: np.ndarray | None = None) -> np.ndarray:
    """ONNX MaxPool (first output) on NCHW; padding never wins, NaN propagates."""
    x, kernel, strides, dilations, begin, _, (oh, ow) = _pool_setup(
        x, kernel_shape, strides, pads, dilations, ceil_mode, auto_pad)
    n, c, h, w = x.shape
    out = _output(out, (n, c, oh, ow), x)
    if out.size:
        status = lib.maxpool2d_f32(_ptr(x), n * c, h, w, _ptr(out), oh, ow, *kernel, *strides,
                                   *begin, *dilations)
        if status != 0:
            raise MemoryError("max_pool2d could not allocate its window tables")
    return out


def average_pool2d(x: np.ndarray, kernel_shape, *, strides=None, pads=None, dilations=None,
                   ceil_mode: bool = False, count_include_pad: bool = False,
                   auto_pad: str = "NOTSET", out: np.ndarray | None = None) -> np.ndarray:
    """ONNX AveragePool on NCHW."""
    x, kernel, strides, dilations, begin, end, (oh, ow) = _pool_setup(
        x, kernel_shape, strides, pads, dilations, ceil_mode, auto_pad)
    n, c, h, w = x.shape
    out = _output(out, (n, c, oh, ow), x)
    if out.size:
        status = lib.avgpool2d_f32(_ptr(x), n * c, h, w, _ptr(out), oh, ow, *kernel, *strides,
                                   begin[0], begin[1], end[0], end[1], *dilations,
                                   int(bool(count_include_pad)))
        if status != 0:
            raise MemoryError("average_pool2d could not allocate its window tables")
    return out


def global_average_pool(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """ONNX GlobalAveragePool: the mean over every spatial axis of (N, C, ...)."""
    x = _f32("X", x)
    if x.ndim < 3:
        raise ValueError(f"X must be (N, C, spatial...), got shape {list(x.shape)}")
    shape = x.shape[:2] + (1,) * (x.ndim - 2)
    if math.prod(x.shape[2:]) == 0:
        raise ValueError(f"GlobalAveragePool of an empty spatial extent {list(x.shape[2:])}")
    out = _output(out, shape, x)
    lib.reduce_last_f32(lib.RED_MEAN, _ptr(x), _ptr(out), x.shape[0] * x.shape[1],
                        math.prod(x.shape[2:]))
    return out


# --- row-wise kernels over the last axis ---------------------------------------------------

def _rows(name: str, x: np.ndarray) -> tuple[int, int]:
    if x.ndim < 1:
        raise ValueError(f"{name} needs at least one axis, got a scalar")
    cols = x.shape[-1]
    return (x.size // cols if cols else math.prod(x.shape[:-1])), cols


def reduce_last(x: np.ndarray, kind: str, *, keepdims: bool = True,
                out: np.ndarray | None = None) -> np.ndarray:
    """ReduceSum / ReduceMean / ReduceMax over the last axis (kind "sum", "mean" or "max")."""
    if kind not in REDUCTIONS:
        raise ValueError(f"unknown reduction {kind!r}; expected one of {sorted(REDUCTIONS)}")
    x = _f32("x", x)
    rows, cols = _rows("reduce_last", x)
    if cols == 0 and kind != "sum":
        raise ValueError(f"reduce {kind} over an empty last axis of shape {list(x.shape)}")
    shape = x.shape[:-1] + ((1,) if keepdims else ())
    out = _output(out, shape, x)
    if rows:
        lib.reduce_last_f32(REDUCTIONS[kind], _ptr(x), _ptr(out), rows, cols)
    return out


def softmax(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Softmax over the last axis (ONNX Softmax-13 with axis=-1); out may be x."""
    x = _f32("x", x)
    rows, cols = _rows("softmax", x)
    out = _output(out, x.shape, x, may_alias=(x,))
    if rows and cols:
        lib.softmax_last_f32(_ptr(x), _ptr(out), rows, cols)
    return out


def layer_norm(x: np.ndarray, scale: np.ndarray, bias: np.ndarray | None = None, *,
               epsilon: float = 1e-5, return_stats: bool = False,
               out: np.ndarray | None = None):
    """LayerNormalization over the last axis; with return_stats also (mean, inv_std), each
    shaped x.shape[:-1] + (1,) as ONNX's optional outputs."""
    x = _f32("X", x)
    rows, cols = _rows("layer_norm", x)
    if cols == 0:
        raise ValueError(f"LayerNormalization over an empty last axis of shape {list(x.shape)}")
    scale = _f32("Scale", scale)
    if scale.size != cols or (scale.ndim and scale.shape[-1] != cols):
        raise ValueError(f"Scale must hold {cols} values along the last axis, got {list(scale.shape)}")
    if bias is not None:
        bias = _f32("B", bias)
        if bias.size != cols or (bias.ndim and bias.shape[-1] != cols):
            raise ValueError(f"B must hold {cols} values along the last axis, got {list(bias.shape)}")
    if not epsilon >= 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    inputs = [v for v in (scale, bias) if v is not None]
    out = _output(out, x.shape, x, *inputs, may_alias=(x,))
    stats_shape = x.shape[:-1] + (1,)
    mean = np.empty(stats_shape, np.float32) if return_stats else None
    inv_std = np.empty(stats_shape, np.float32) if return_stats else None
    if rows:
        lib.layernorm_last_f32(
            _ptr(x), _ptr(scale), ffi.NULL if bias is None else _ptr(bias), _ptr(out),
            _ptr(mean) if return_stats else ffi.NULL, _ptr(inv_std) if return_stats else ffi.NULL,
            rows, cols, float(epsilon))
    return (out, mean, inv_std) if return_stats else out


# --- attention -----------------------------------------------------------------------------

def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None, *,
              scale: float | None = None, causal: bool = False, causal_offset: int = 0,
              out: np.ndarray | None = None) -> np.ndarray:
    """softmax(Q K^T * scale + mask) V per (batch, head), Q (B, H, Sq, D), K (B, H, Sk, D),
    V (B, H, Sk, Dv).

    mask: float32 added to the scores, or bool (False = masked), broadcast to (B, H, Sq, Sk).
    causal: query i sees keys j <= i + causal_offset (causal_offset = past length when
    decoding).  scale defaults to 1/sqrt(D).  A query that sees no key gets zeros.
    """
    q, k, v = _f32("Q", q), _f32("K", k), _f32("V", v)
    for name, a in (("Q", q), ("K", k), ("V", v)):
        _rank(name, a, 4)
    batch, heads, q_len, head_size = q.shape
    kv_len, v_head_size = k.shape[2], v.shape[3]
    if k.shape != (batch, heads, kv_len, head_size):
        raise ValueError(f"K must be {[batch, heads, 'Sk', head_size]}, got {list(k.shape)}")
    if v.shape[:3] != (batch, heads, kv_len):
        raise ValueError(f"V must be {[batch, heads, kv_len, 'Dv']}, got {list(v.shape)}")
    for name, a in (("Q", q), ("K", k), ("V", v)):
        _c_int(f"{name} size", a.size)
    scores_shape = (batch, heads, q_len, kv_len)
    mask_strides = (0, 0, 0, 0)
    if mask is not None:
        if isinstance(mask, np.ndarray) and mask.dtype == np.bool_:
            mask = np.where(mask, np.float32(0), np.float32(-np.inf))
        mask = _f32("mask", mask)
        if not _broadcasts_to(mask.shape, scores_shape):
            raise ValueError(f"mask of shape {list(mask.shape)} does not broadcast to "
                             f"{list(scores_shape)}")
        mask_strides = tuple(s // 4 for s in np.broadcast_to(mask, scores_shape).strides)
    if scale is None:
        scale = 1.0 / math.sqrt(head_size) if head_size else 1.0
    shape = (batch, heads, q_len, v_head_size)
    inputs = [a for a in (q, k, v, mask) if a is not None]
    out = _output(out, shape, *inputs)
    if out.size == 0:
        return out
    status = lib.attention_f32(
        _ptr(q), _ptr(k), _ptr(v), _ptr(out), batch, heads, q_len, kv_len, head_size,
        v_head_size, float(scale), ffi.NULL if mask is None else _ptr(mask),
        _int64x4(mask_strides), int(bool(causal)), _c_int("causal_offset", causal_offset))
    if status != 0:
        raise MemoryError("attention could not allocate its score buffer")
    return out


# --- com.microsoft MatMulNBits -------------------------------------------------------------

def matmul_nbits(a: np.ndarray, b: np.ndarray, scales: np.ndarray,
                 zero_points: np.ndarray | None = None, bias: np.ndarray | None = None, *,
                 k: int, n: int, bits: int = 4, block_size: int, simd: bool = True,
                 out: np.ndarray | None = None) -> np.ndarray:
    """a (..., k) @ dequant(b)^T + bias -> (..., n), com.microsoft MatMulNBits's layout: b holds
    n * ceil(k / block_size) blocks of block_size * bits / 8 bytes, scales one float32 per
    block, zero_points packed uint8 (like b, each row padded to whole bytes) or float32 per
    block, or None (2^(bits-1)).  simd=False runs the portable code (for tests)."""
    if bits not in (2, 4, 8):
        raise ValueError(f"MatMulNBits bits must be 2, 4 or 8, got {bits}")
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"MatMulNBits block_size must be a power of 2 >= 16, got {block_size}")
    a = _f32("A", a)
    if a.ndim < 1 or a.shape[-1] != k:
        raise ValueError(f"A's last axis must be K={k}, got shape {list(a.shape)}")
    blocks = (k + block_size - 1) // block_size
    b = _uint8("B", b, n * blocks * (block_size * bits // 8))
    scales = _f32("scales", scales)
    if scales.size != n * blocks:
        raise ValueError(f"scales must hold N * blocks = {n * blocks} values, got {scales.size}")
    zp_packed = zp_float = ffi.NULL
    if zero_points is not None:
        if isinstance(zero_points, np.ndarray) and zero_points.dtype == np.uint8:
            zero_points = _uint8("zero_points", zero_points, n * ((blocks * bits + 7) // 8))
            zp_packed = ffi.from_buffer("uint8_t[]", zero_points)
        else:
            zero_points = _f32("zero_points", zero_points)
            if zero_points.size != n * blocks:
                raise ValueError(f"float zero_points must hold N * blocks = {n * blocks} values, "
                                 f"got {zero_points.size}")
            zp_float = _ptr(zero_points)
    if bias is not None:
        bias = _f32("bias", bias)
        if bias.shape != (n,):
            raise ValueError(f"bias must have shape {[n]}, got {list(bias.shape)}")
    m = a.size // k if k else math.prod(a.shape[:-1])
    for name, v in (("M", m), ("N", n), ("K", k), ("K in whole blocks", blocks * block_size),
                    ("B size", b.size), ("A size", a.size)):
        _c_int(name, v)
    out = _output(out, a.shape[:-1] + (n,), a, scales, *(x for x in (bias,) if x is not None))
    status = lib.matmul_nbits_f32(
        _ptr(a), ffi.from_buffer("uint8_t[]", b), _ptr(scales), zp_packed, zp_float,
        ffi.NULL if bias is None else _ptr(bias), _ptr(out), m, n, k, bits, block_size,
        int(bool(simd)))
    if status != 0:
        raise MemoryError("matmul_nbits could not allocate its dequantization buffers")
    return out


def _uint8(name: str, a, size: int) -> np.ndarray:
    """A C-contiguous uint8 array of `size` elements, or TypeError/ValueError naming it."""
    if not isinstance(a, np.ndarray) or a.dtype != np.uint8:
        raise TypeError(f"{name} must be a uint8 numpy array, got {getattr(a, 'dtype', type(a))}")
    if a.size != size:
        raise ValueError(f"{name} must hold {size} bytes, got {a.size} (shape {list(a.shape)})")
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def matmul_nbits_pack(codes, *, k: int, n: int, bits: int, block_size: int,
                      transposed: bool = False, signed: bool = False, out=None) -> np.ndarray:
    """A DequantizeLinear weight's codes as MatMulNBits's B, (n, blocks, block_size * bits / 8)
    uint8, without any wider copy: `codes` (bytes or uint8) holds k x n codes (n x k when
    transposed) as a 4- or 8-bit tensor's raw data stores them (4-bit two a byte, the first in
    the low nibble).  signed: the codes are int4/int8, stored as c + 2^(bits-1).  out: a
    writable C-contiguous uint8 array of exactly B's size to write B into (memory already
    touched, where a fresh array's pages fault in one by one); it must not overlap codes."""
    if bits not in (4, 8):
        raise ValueError(f"matmul_nbits_pack: bits must be 4 or 8, got {bits}")
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"matmul_nbits_pack: block_size must be a power of 2 >= 16, got {block_size}")
    if isinstance(codes, (bytes, bytearray, memoryview)):
        codes = np.frombuffer(codes, np.uint8)
    codes = _uint8("codes", codes, (k * n * bits + 7) // 8)
    blocks = (k + block_size - 1) // block_size
    for name, v in (("K", k), ("N", n), ("K in whole blocks", blocks * block_size)):
        _c_int(name, v)
    shape = (n, blocks, block_size * bits // 8)
    if (isinstance(out, np.ndarray) and out.flags.c_contiguous
            and out.size == math.prod(shape)):  # any shape of B's size (a released array's)
        out = out.reshape(shape)
    out = _output(out, shape, codes, dtype=np.uint8)
    if out.size:
        lib.matmul_nbits_pack(ffi.from_buffer("uint8_t[]", codes),
                              ffi.from_buffer("uint8_t[]", out), k, n, bits, block_size,
                              int(bool(transposed)), int(bool(signed)))
    return out


def matmul_nbits_scales(scales, out=None) -> np.ndarray:
    """A DequantizeLinear's float32 scales [blocks, N] as MatMulNBits's, [N, blocks] (into `out`,
    a writable C-contiguous float32 array of that shape not overlapping scales, if given)."""
    if not isinstance(scales, np.ndarray) or scales.dtype != np.float32 or scales.ndim != 2:
        raise TypeError("scales must be a 2-D float32 numpy array, got "
                        f"{getattr(scales, 'dtype', type(scales))} {list(getattr(scales, 'shape', []))}")
    scales = np.ascontiguousarray(scales)
    blocks, n = scales.shape
    for name, v in (("blocks", blocks), ("N", n)):
        _c_int(name, v)
    out = _output(out, (n, blocks), scales)
    if out.size:
        lib.matmul_nbits_scales(ffi.from_buffer("float[]", scales), ffi.from_buffer("float[]", out),
                                blocks, n)
    return out


# --- RMS normalization ---------------------------------------------------------------------

def rms_norm(x: np.ndarray, scale: np.ndarray, *, skip: np.ndarray | None = None,
             bias: np.ndarray | None = None, epsilon: float = 1e-5,
             return_inv_rms: bool = False, return_sum: bool = False):
    """s / sqrt(mean(s^2) + epsilon) * scale over the last axis, s = x or x + skip (+ bias).

    Returns y, then (when asked) the inverse RMS shaped x.shape[:-1] + (1,) and the sum s."""
    x = _f32("X", x)
    rows, cols = _rows("rms_norm", x)
    if cols == 0:
        raise ValueError(f"RMS normalization over an empty last axis of shape {list(x.shape)}")
    scale = _f32("scale", scale)
    if scale.size != cols or (scale.ndim and scale.shape[-1] != cols):
        raise ValueError(f"scale must hold {cols} values along the last axis, got {list(scale.shape)}")
    if skip is not None:
        skip = _f32("skip", skip)
        if skip.size != x.size or skip.shape[-1] != cols:
            raise ValueError(f"skip must have the input's shape {list(x.shape)}, got {list(skip.shape)}")
    elif bias is not None or return_sum:
        raise ValueError("bias and the sum output belong to the skip form: give skip")
    if bias is not None:
        bias = _f32("bias", bias)
        if bias.size != cols or (bias.ndim and bias.shape[-1] != cols):
            raise ValueError(f"bias must hold {cols} values along the last axis, got {list(bias.shape)}")
    if not epsilon >= 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    y = np.empty(x.shape, np.float32)
    total = np.empty(x.shape, np.float32) if return_sum else None
    inv_rms = np.empty(x.shape[:-1] + (1,), np.float32) if return_inv_rms else None
    if rows:
        lib.rmsnorm_last_f32(
            _ptr(x), ffi.NULL if skip is None else _ptr(skip),
            ffi.NULL if bias is None else _ptr(bias), _ptr(scale), _ptr(y),
            ffi.NULL if total is None else _ptr(total),
            ffi.NULL if inv_rms is None else _ptr(inv_rms), rows, cols, float(epsilon))
    results = [y] + ([inv_rms] if return_inv_rms else []) + ([total] if return_sum else [])
    return results[0] if len(results) == 1 else tuple(results)


# --- SiLU-gated product --------------------------------------------------------------------

def silu_mul(gate: np.ndarray, up: np.ndarray | None = None) -> np.ndarray:
    """gate * sigmoid(gate) * up; without `up`, gate holds [gate | up] as the two halves of its
    last axis (a fused gate_up projection) and the result has half its width."""
    gate = _f32("gate", gate)
    if gate.ndim < 1:
        raise ValueError("silu_mul needs at least one axis, got a scalar")
    if up is None:
        if gate.shape[-1] % 2:
            raise ValueError(f"gate_up's last axis must be even to split in halves, got "
                             f"{list(gate.shape)}")
        cols, stride = gate.shape[-1] // 2, gate.shape[-1]
        shape, up_ptr = gate.shape[:-1] + (cols,), None
    else:
        up = _f32("up", up)
        if up.shape != gate.shape:
            raise ValueError(f"up must have gate's shape {list(gate.shape)}, got {list(up.shape)}")
        cols, stride, shape = gate.shape[-1], gate.shape[-1], gate.shape
    rows = math.prod(shape[:-1])
    y = np.empty(shape, np.float32)
    if rows and cols:
        gate_ptr = _ptr(gate)
        up_ptr = _ptr(up) if up is not None else gate_ptr + cols
        lib.silu_mul_f32(gate_ptr, up_ptr, _ptr(y), rows, cols, stride)
    return y


# --- rotary embedding and grouped-query attention --------------------------------------------

def rotary(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, *, interleaved: bool = False,
           out: np.ndarray | None = None) -> np.ndarray:
    """x rotated by position: x (..., head) of rank 2 to 4; cos and sin broadcast to
    x.shape[:-1] + (width,), width = rot (one value per rotated element, as exporters compute
    them) or rot / 2 (one per pair, the com.microsoft RotaryEmbedding caches), where rot is the
    full width: pairs (j, j + rot/2), or (2j, 2j + 1) when interleaved.  A full-width cos and
    sin rotate every value (rot = head); half-width ones rotate the first 2 * width values."""
    x, cos, sin = _f32("x", x), _f32("cos", cos), _f32("sin", sin)
    if not 1 <= x.ndim <= 4:
        raise ValueError(f"rotary: x must have rank 1 to 4, got shape {list(x.shape)}")
    if cos.shape != sin.shape:
        raise ValueError(f"rotary: cos {list(cos.shape)} and sin {list(sin.shape)} differ")
    head, width = x.shape[-1], cos.shape[-1] if cos.ndim else 0
    full_width = width == head
    rot = head if full_width else 2 * width
    if rot % 2 or rot > head or width == 0:
        raise ValueError(f"rotary: cos/sin width {width} fits no rotation of head size {head}")
    rows = (1,) * (4 - x.ndim) + x.shape[:-1]  # three leading axes
    lead = cos.shape[:-1]
    if not _broadcasts_to(lead, rows):
        raise ValueError(f"rotary: cos/sin of shape {list(cos.shape)} do not broadcast to "
                         f"{list(x.shape[:-1]) + [width]}")
    strides = [s // 4 for s in np.broadcast_to(cos, rows + (width,)).strides[:3]]
    d0, d1, d2 = rows
    out = _output(out, x.shape, x, cos, sin, may_alias=(x,))
    if out.size:
        lib.rotary_f32(_ptr(x), _ptr(cos), _ptr(sin), _ptr(out), d0, d1, d2, head, rot,
                       ffi.new("int64_t[3]", strides), int(full_width), int(bool(interleaved)))
    return out


@functools.lru_cache(maxsize=64)
def _kv_head_table(dtype, shape, raw: bytes, heads: int, kv_heads: int) -> np.ndarray:
    """grouped_attention's kv_head_of (given as its dtype, shape and bytes, so that a model's
    constant table is checked and converted once) as a read-only C-contiguous int32 array."""
    table = np.frombuffer(raw, dtype).reshape(shape)
    if table.shape != (heads,) or table.dtype.kind not in "iu" or (
            heads and not (0 <= table.min() and table.max() < kv_heads)):
        raise ValueError(f"kv_head_of must hold one KV head in [0, {kv_heads}) per query head "
                         f"({heads}), got {table!r}")
    table = np.ascontiguousarray(table, np.int32)
    table.flags.writeable = False
    return table


def grouped_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, kv_head_of=None,
                      mask: np.ndarray | None = None, *, scale: float | None = None,
                      q_layout: str = "bnsh", kv_valid=None, q_pos=None, causal: bool = False,
                      window: int = -1, empty_nan: bool = False) -> np.ndarray:
    """softmax(Q K^T * scale + mask) V with query head h reading K/V head kv_head_of[h]
    (default h // (N / KV), torch's repeat_kv), K and V never repeated.

    q (B, N, S, D) ("bnsh") or (B, S, N, D) ("bsnh"); k (B, KV, T, D), v (B, KV, T, Dv).
    Returns y (B, S, N, Dv).  mask: additive float32, broadcast to (B, N, S, T).  Query i of
    batch b sees keys j < kv_valid[b] (every key when None), with causal only j <=
    q_pos[b] + i, with window > 0 only j > q_pos[b] + i - window.  scale defaults to
    1/sqrt(D).  A query that sees no key gets zeros, or NaN with empty_nan (what ONNX Softmax
    gives over a row of -inf)."""
    q, k, v = _f32("Q", q), _f32("K", k), _f32("V", v)
    for name, a in (("Q", q), ("K", k), ("V", v)):
        _rank(name, a, 4)
    if q_layout == "bnsh":
        batch, heads, q_len, head_size = q.shape
        q_strides = (heads * q_len * head_size, q_len * head_size, head_size)
    elif q_layout == "bsnh":
        batch, q_len, heads, head_size = q.shape
        q_strides = (heads * q_len * head_size, head_size, heads * head_size)
    else:
        raise ValueError(f"q_layout must be 'bnsh' or 'bsnh', got {q_layout!r}")
    kv_heads, kv_len, v_head_size = k.shape[1], k.shape[2], v.shape[3]
    if k.shape != (batch, kv_heads, kv_len, head_size):
        raise ValueError(f"K must be {[batch, 'KV', 'T', head_size]}, got {list(k.shape)}")
    if v.shape[:3] != (batch, kv_heads, kv_len):
        raise ValueError(f"V must be {[batch, kv_heads, kv_len, 'Dv']}, got {list(v.shape)}")
    if kv_head_of is None:
        if kv_heads == 0 or heads % kv_heads:
            raise ValueError(f"{heads} query heads do not group over {kv_heads} KV heads")
        kv_head_of = np.arange(heads) // (heads // kv_heads)
    kv_head_of = np.asarray(kv_head_of)
    if kv_head_of.dtype.kind not in "iu":
        raise ValueError(f"kv_head_of must hold integer KV heads, got {kv_head_of.dtype}")
    kv_head_of = _kv_head_table(kv_head_of.dtype, kv_head_of.shape, kv_head_of.tobytes(),
                                heads, kv_heads)
    for name, a in (("Q", q), ("K", k), ("V", v)):
        _c_int(f"{name} size", a.size)
    scores_shape = (batch, heads, q_len, kv_len)
    mask_strides = (0, 0, 0, 0)
    if mask is not None:
        mask = _f32("mask", mask)
        if not _broadcasts_to(mask.shape, scores_shape):
            raise ValueError(f"mask of shape {list(mask.shape)} does not broadcast to "
                             f"{list(scores_shape)}")
        mask_strides = _broadcast_strides(mask.shape, scores_shape)  # mask is C-contiguous
    per_batch = []
    for name, values in (("kv_valid", kv_valid), ("q_pos", q_pos)):
        if values is not None:
            values = np.ascontiguousarray(values, np.int64).reshape(-1)
            if values.shape != (batch,):
                raise ValueError(f"{name} must hold one value per batch ({batch}), got "
                                 f"{values.size}")
        per_batch.append(values)
    if scale is None:
        scale = 1.0 / math.sqrt(head_size) if head_size else 1.0
    y = np.empty((batch, q_len, heads, v_head_size), np.float32)
    if y.size == 0:
        return y
    kv_valid, q_pos = (ffi.NULL if a is None else ffi.from_buffer("int64_t[]", a)
                       for a in per_batch)
    status = lib.gqa_f32(
        _ptr(q), ffi.new("int64_t[3]", q_strides), _ptr(k), _ptr(v), _ptr(y), batch, heads,
        kv_heads, q_len, _c_int("kv_len", kv_len), head_size, v_head_size,
        ffi.from_buffer("int32_t[]", kv_head_of), float(scale),
        ffi.NULL if mask is None else _ptr(mask), _int64x4(mask_strides), kv_valid, q_pos,
        int(bool(causal)), int(window), int(bool(empty_nan)))
    if status != 0:
        raise MemoryError("grouped_attention could not allocate its score buffer")
    return y


# --- the plan's step table (csrc/plan.c) ---------------------------------------------------
# Each *_step function below returns one plan_step (a dict of its fields) that makes the same
# kernel call, with the same arguments, as the wrapper of the same name would for arrays of
# the given shapes, all float32 and C-contiguous; ValueError where that wrapper would refuse
# them, or would call no kernel at all (an empty result).  Buffers are named by slot numbers.

def _step(kind, ins=(), outs=(), **fields) -> dict:
    ins, outs = list(ins) + [-1] * (4 - len(ins)), list(outs) + [-1] * (3 - len(outs))
    return {"kind": kind, "in": ins, "out": outs, **fields}


def _nonempty(shape) -> None:
    if math.prod(shape) == 0:
        raise ValueError(f"an empty result {list(shape)} calls no kernel")


def activation_step(name: str, params, x: int, y: int, shape) -> dict:
    code, alpha, beta = _activation(name, tuple(params))
    _nonempty(shape)
    return _step(lib.PLAN_ACTIVATION, [x], [y], code=code, n=[math.prod(shape), 0, 0, 0],
                 f=[alpha, beta, 0.0, 0.0])


def binary_step(op: str, a: int, a_shape, b: int, b_shape, y: int) -> dict:
    if op not in BINARY_OPS:
        raise ValueError(f"unknown binary op {op!r}; expected one of {sorted(BINARY_OPS)}")
    shape, dims, sa, sb = _binary_geometry(op, tuple(a_shape), tuple(b_shape))
    _nonempty(shape)
    return _step(lib.PLAN_BINARY, [a, b], [y], code=BINARY_OPS[op], act=lib.ACT_NONE,
                 g=list(dims) + list(sa) + list(sb))


def gemm_step(a: int, a_shape, b: int, b_shape, c: int, c_shape, y: int, *, alpha=1.0,
              beta=1.0, trans_a=False, trans_b=False, activation=None,
              activation_params=()) -> dict:
    """As gemm(); c is -1 (and c_shape None) without a C input."""
    code, act_alpha, act_beta = _activation(activation, tuple(activation_params))
    if len(a_shape) != 2 or len(b_shape) != 2:
        raise ValueError(f"Gemm takes 2-D A and B, got {list(a_shape)} and {list(b_shape)}")
    m, k = a_shape[::-1] if trans_a else a_shape
    kb, n = b_shape[::-1] if trans_b else b_shape
    if k != kb:
        raise ValueError(f"Gemm inner dimensions differ: A' is {[m, k]}, B' is {[kb, n]}")
    for name, v in (("M", m), ("N", n), ("K", k)):
        _c_int(name, v)
    c_strides = (0, 0)
    if c_shape is not None:
        if not _broadcasts_to(tuple(c_shape), (m, n)):
            raise ValueError(f"Gemm C of shape {list(c_shape)} does not broadcast to {[m, n]}")
        c_strides = tuple(s // 4 for s in np.broadcast_to(
            np.empty(c_shape, np.float32), (m, n)).strides)
    return _step(lib.PLAN_GEMM, [a, b, c], [y], act=code,
                 flags=int(bool(trans_a)) | int(bool(trans_b)) << 1, n=[m, n, k, 0],
                 f=[float(alpha), float(beta), act_alpha, act_beta], g=list(c_strides) + [0] * 10)


def matmul_step(a: int, a_shape, b: int, b_shape, y: int, *, alpha=1.0, trans_a=False,
                trans_b=False) -> dict:
    """As matmul(), for operands that need no copy to the whole batch."""
    a_shape, b_shape = tuple(a_shape), tuple(b_shape)
    if len(a_shape) < 2 or len(b_shape) < 2:
        raise ValueError(f"MatMul kernel takes inputs of rank >= 2, got {list(a_shape)} and "
                         f"{list(b_shape)}")
    m, k = a_shape[-1:-3:-1] if trans_a else a_shape[-2:]
    kb, n = b_shape[-1:-3:-1] if trans_b else b_shape[-2:]
    if k != kb:
        raise ValueError(f"MatMul inner dimensions differ: {list(a_shape)} and {list(b_shape)}")
    batch = np.broadcast_shapes(a_shape[:-2], b_shape[:-2])
    _nonempty(batch + (m, n))
    count = math.prod(batch)
    if len(b_shape) == 2 and not trans_a:
        m, count = m * math.prod(a_shape[:-2]), 1
    for name, v in (("M", m), ("N", n), ("K", k), ("batch", count)):
        _c_int(name, v)
    for shape in (a_shape, b_shape):
        whole = math.prod(shape[:-2]) == 1 or (1,) * (len(batch) - len(shape) + 2) + shape[:-2] == batch
        if not whole:
            raise ValueError(f"MatMul operand {list(shape)} needs a copy to the batch {list(batch)}")
    strides = [0 if len(s) == 2 or math.prod(s[:-2]) == 1 else s[-1] * s[-2]
               for s in (a_shape, b_shape)]
    return _step(lib.PLAN_MATMUL, [a, b], [y], flags=int(bool(trans_a)) | int(bool(trans_b)) << 1,
                 n=[m, n, k, count], f=[float(alpha), 0.0, 0.0, 0.0], g=strides + [0] * 10)


def gemv_step(a: int, a_shape, b: int, b_shape, c: int, c_shape, y: int, *, alpha=1.0,
              beta=1.0, trans_b=False, activation=None, activation_params=()) -> dict:
    """As gemv(); a_shape is (m, k) (the rows of a MatMul's A taken together); c is -1 (and
    c_shape None) without a C input."""
    code, act_alpha, act_beta = _activation(activation, tuple(activation_params))
    if len(a_shape) != 2 or len(b_shape) != 2:
        raise ValueError(f"GEMV takes 2-D A and B, got {list(a_shape)} and {list(b_shape)}")
    m, k = a_shape
    kb, n = b_shape[::-1] if trans_b else b_shape
    if k != kb:
        raise ValueError(f"GEMV inner dimensions differ: A is {[m, k]}, op(B) is {[kb, n]}")
    if not 1 <= m <= GEMV_MAX_ROWS:
        raise ValueError(f"GEMV takes 1 to {GEMV_MAX_ROWS} rows of A, got {m}")
    _nonempty((m, n))
    c_strides = (0, 0)
    if c_shape is not None:
        if not _broadcasts_to(tuple(c_shape), (m, n)):
            raise ValueError(f"GEMV C of shape {list(c_shape)} does not broadcast to {[m, n]}")
        c_strides = tuple(s // 4 for s in np.broadcast_to(
            np.empty(c_shape, np.float32), (m, n)).strides)
    return _step(lib.PLAN_GEMV, [a, b, c], [y], act=code, flags=int(bool(trans_b)) << 1,
                 n=[m, n, k, 0], f=[float(alpha), float(beta), act_alpha, act_beta],
                 g=list(c_strides) + [0] * 10)


def gemm_packed_step(a: int, a_shape, b: PackedWeights, c: int, c_shape, y: int, *,
                     alpha=1.0, beta=1.0, activation=None, activation_params=()) -> dict:
    """As gemm_packed(); a_shape is (m, k) (the rows of a MatMul's A taken together); c is -1
    (and c_shape None) without a C input.  The step keeps b's panels alive."""
    code, act_alpha, act_beta = _activation(activation, tuple(activation_params))
    if len(a_shape) != 2:
        raise ValueError(f"packed GEMM takes 2-D A, got {list(a_shape)}")
    m, k = a_shape
    if k != b.k:
        raise ValueError(f"packed GEMM inner dimensions differ: A is {[m, k]}, B is {[b.k, b.n]}")
    _nonempty((m, b.n))
    c_strides = (0, 0)
    if c_shape is not None:
        if not _broadcasts_to(tuple(c_shape), (m, b.n)):
            raise ValueError(f"packed GEMM C of shape {list(c_shape)} does not broadcast to "
                             f"{[m, b.n]}")
        c_strides = tuple(s // 4 for s in np.broadcast_to(
            np.empty(c_shape, np.float32), (m, b.n)).strides)
    return _step(lib.PLAN_GEMM_PACKED, [a, -1, c], [y], act=code, n=[m, b.n, k, 0],
                 f=[float(alpha), float(beta), act_alpha, act_beta],
                 g=list(c_strides) + [k] + [0] * 9,
                 handle=ffi.from_buffer("float[]", b.data))


def softmax_step(x: int, y: int, shape) -> dict:
    rows, cols = _rows("softmax", _ShapeOnly(shape))
    _nonempty(shape)
    return _step(lib.PLAN_SOFTMAX, [x], [y], n=[rows, cols, 0, 0])


def layer_norm_step(x: int, shape, scale: int, scale_shape, bias: int, bias_shape, y: int, *,
                    epsilon=1e-5) -> dict:
    """As layer_norm() without its statistics; bias is -1 (bias_shape None) without B."""
    rows, cols = _rows("layer_norm", _ShapeOnly(shape))
    if cols == 0:
        raise ValueError(f"LayerNormalization over an empty last axis of shape {list(shape)}")
    for name, s in (("Scale", scale_shape), ("B", bias_shape)):
        if s is not None and (math.prod(s) != cols or (len(s) and s[-1] != cols)):
            raise ValueError(f"{name} must hold {cols} values along the last axis, got {list(s)}")
    if not epsilon >= 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    _nonempty(shape)
    return _step(lib.PLAN_LAYERNORM, [x, scale, bias], [y], n=[rows, cols, 0, 0],
                 f=[float(epsilon), 0.0, 0.0, 0.0])


def rms_norm_step(x: int, shape, scale: int, scale_shape, y: int, *, skip: int = -1,
                  skip_shape=None, bias: int = -1, bias_shape=None, epsilon=1e-5,
                  total: int = -1, inv_rms: int = -1) -> dict:
    """As rms_norm(); total (the sum of the skip form) and inv_rms (one value per row) are the
    slots of those results, -1 where they are not asked for."""
    rows, cols = _rows("rms_norm", _ShapeOnly(shape))
    if cols == 0:
        raise ValueError(f"RMS normalization over an empty last axis of shape {list(shape)}")
    for name, s in (("scale", scale_shape), ("bias", bias_shape)):
        if s is not None and (math.prod(s) != cols or (len(s) and s[-1] != cols)):
            raise ValueError(f"{name} must hold {cols} values along the last axis, got {list(s)}")
    if skip_shape is not None and (math.prod(skip_shape) != math.prod(shape)
                                   or skip_shape[-1] != cols):
        raise ValueError(f"skip must have the input's shape {list(shape)}, got {list(skip_shape)}")
    if skip_shape is None and (bias_shape is not None or total >= 0):
        raise ValueError("bias and the sum output belong to the skip form: give skip")
    if not epsilon >= 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    _nonempty(shape)
    return _step(lib.PLAN_RMSNORM, [x, skip, bias, scale], [y, total, inv_rms],
                 n=[rows, cols, 0, 0],
                 f=[float(epsilon), 0.0, 0.0, 0.0])


def silu_mul_step(gate: int, up: int, y: int, shape) -> dict:
    """As silu_mul(gate, up) for two arrays of one shape."""
    if len(shape) < 1:
        raise ValueError("silu_mul needs at least one axis, got a scalar")
    _nonempty(shape)
    return _step(lib.PLAN_SILU_MUL, [gate, up], [y], n=[math.prod(shape[:-1]), shape[-1], 0, 0])


def silu_mul_halves_step(gate_up: int, y: int, shape) -> dict:
    """As silu_mul(gate_up): the halves of gate_up (of `shape`) read where they lie."""
    if len(shape) < 1 or shape[-1] % 2:
        raise ValueError(f"gate_up's last axis must be even to split in halves, got {list(shape)}")
    _nonempty(shape)
    cols = shape[-1] // 2
    return _step(lib.PLAN_SILU_MUL, [gate_up, gate_up], [y],
                 n=[math.prod(shape[:-1]), cols, shape[-1], cols])


def copy_step(x: int, y: int, nbytes: int) -> dict:
    """y = x, nbytes of it (y does not overlap x)."""
    if nbytes <= 0:
        raise ValueError("an empty copy calls nothing")
    return _step(lib.PLAN_COPY, [x], [y], n=[nbytes, 0, 0, 0])


def _coalesced(shape, strides) -> tuple[list[int], list[int]]:
    """The same element walk over fewer axes: axes of one element dropped, and each axis
    merged into the one before it where that one steps over it exactly (a channel shuffle's
    H and W: one memcpy row instead of one per image row)."""
    dims: list[list[int]] = []
    for n, s in zip(shape, strides):
        if n == 1:
            continue
        if dims and dims[-1][1] == s * n:
            dims[-1] = [dims[-1][0] * n, s]
        else:
            dims.append([n, s])
    dims = dims or [[1, 0]]
    return [n for n, _ in dims], [s for _, s in dims]


def strided_copy_step(x: int, y: int, shape, strides, offset: int, itemsize: int) -> dict:
    """y (contiguous, `shape`) = x[offset + sum i_d * strides[d]], in elements of itemsize."""
    shape, strides = _coalesced([int(n) for n in shape], [int(s) for s in strides])
    if len(shape) > 6:
        raise ValueError(f"a strided copy takes 6 axes at most, got {len(shape)}")
    _nonempty(shape)
    pad = 6 - len(shape)
    return _step(lib.PLAN_STRIDED_COPY, [x], [y], n=[offset, itemsize, 0, 0],
                 g=[1] * pad + list(shape) + [0] * pad + list(strides))


def rows_copy_step(x: int, y: int, rows: int, row_bytes: int, offset: int, stride: int,
                   x_offset: int = 0, x_stride: int | None = None) -> dict:
    """rows rows of row_bytes from x at byte x_offset, rows x_stride bytes apart (row_bytes:
    contiguous), into y at byte `offset`, rows `stride` bytes apart: one input of a Concat, or
    one output of a Split."""
    if rows * row_bytes <= 0:
        raise ValueError("an empty copy calls nothing")
    return _step(lib.PLAN_ROWS_COPY, [x], [y], n=[rows, row_bytes, offset, stride],
                 g=[x_offset, row_bytes if x_stride is None else x_stride] + [0] * 10)


def pool_step(kind: str, x: int, shape, y: int, *, kernel_shape, strides=None, pads=None,
              dilations=None, ceil_mode=False, count_include_pad=False,
              auto_pad="NOTSET") -> dict:
    """max_pool2d (kind "max") or average_pool2d ("average") of an NCHW x of `shape`."""
    if len(shape) != 4:
        raise ValueError(f"a 2-D pool takes (N, C, H, W), got {list(shape)}")
    kernel, strides, dilations, begin, end, (oh, ow) = _pool_window(
        shape, kernel_shape, strides, pads, dilations, ceil_mode, auto_pad)
    n, c, h, w = shape
    _nonempty((n, c, oh, ow))
    code = {"max": lib.POOL_MAX, "average": lib.POOL_AVERAGE}[kind]
    return _step(lib.PLAN_POOL, [x], [y], code=code, flags=int(bool(count_include_pad)),
                 n=[n * c, h, w, oh], g=[ow, *kernel, *strides, begin[0], begin[1], end[0],
                                         end[1], *dilations, 0])


def gather_step(data: int, data_shape, itemsize: int, indices: int, index_count: int, y: int,
                axis: int) -> dict:
    """Gather of int64 indices along `axis`: C refuses an index out of range (-1 from
    plan_run at this step) before writing anything."""
    outer = math.prod(data_shape[:axis])
    row_bytes = math.prod(data_shape[axis + 1:]) * itemsize
    _nonempty((outer, index_count, row_bytes))
    return _step(lib.PLAN_GATHER, [data, indices], [y],
                 n=[outer, data_shape[axis], index_count, row_bytes])


def chain_step(x: int, y: int, size: int, ops, params, geometry, side_slots) -> dict:
    """As chain() over `size` elements: ops, params and geometry are the cdata arrays chain()
    takes (the StepTable keeps them alive), side_slots the slot of each op's side (-1 for an
    activation)."""
    count = len(side_slots)
    if size <= 0:
        raise ValueError("an empty chain calls nothing")
    if count > lib.PLAN_CHAIN_MAX_OPS:
        raise ValueError(f"a chain step takes {lib.PLAN_CHAIN_MAX_OPS} ops at most, got {count}")
    return _step(lib.PLAN_CHAIN, [x], [y], n=[size, count, 0, 0], ops=ops, params=params,
                 geometry=geometry, side_slots=ffi.new("int32_t[]", list(side_slots)))


def reduce_last_step(kind: str, x: int, y: int, rows: int, cols: int) -> dict:
    """reduce_last_f32 of (rows, cols) into rows values: GlobalAveragePool is "mean" over
    (N * C, spatial)."""
    codes = {"mean": lib.RED_MEAN}
    if kind not in codes:
        raise ValueError(f"unknown reduction {kind!r}; expected one of {sorted(codes)}")
    if cols <= 0:
        raise ValueError(f"a reduction over {cols} values")
    _nonempty((rows,))
    return _step(lib.PLAN_REDUCE_LAST, [x], [y], code=codes[kind], n=[rows, cols, 0, 0])


def conv_step(x: int, x_shape, w: int, w_shape, bias: int, residual: int, y: int, *,
              strides=None, pads=None, dilations=None, group: int = 1, auto_pad="NOTSET",
              activation=None, activation_params=()) -> dict:
    """As conv2d() for NCHW x of x_shape and w of w_shape; bias and residual are -1 where
    absent (a bias of shape (M,), a residual of the output's shape, as conv2d checks)."""
    code, act_alpha, act_beta = _activation(activation, tuple(activation_params))
    if len(x_shape) != 4:
        raise ValueError(f"X must be 4-D, got shape {list(x_shape)}")
    (batch, channels, in_h, in_w, out_c, per_group, k_h, k_w, strides, dilations, begin, _end,
     out_h, out_w) = _conv_geometry(tuple(x_shape), _ShapeOnly(w_shape), group, strides,
                                    dilations, pads, auto_pad)
    for name, v in (("kernel depth", per_group * k_h * k_w), ("output plane", out_h * out_w),
                    ("output channels per group", out_c // group)):
        _c_int(name, v)
    _nonempty((batch, out_c, out_h, out_w))
    return _step(lib.PLAN_CONV, [x, w, bias, residual], [y], act=code,
                 n=[batch, channels, in_h, in_w], f=[act_alpha, act_beta, 0.0, 0.0],
                 g=[out_c, k_h, k_w, group, *strides, *begin, *dilations, out_h, out_w])


def onednn_conv_step(conv: OneDNNConv, x: int, residual: int, y: int) -> dict:
    """conv (a planned OneDNNConv) run by slot; the step keeps its primitive alive."""
    if (residual >= 0) != conv.residual:
        raise ValueError("the residual must be given exactly when the plan has one")
    _nonempty(conv.out_shape)
    return _step(lib.PLAN_ONEDNN_CONV, [x, residual], [y], handle=conv._handle)


def rotary_step(x: int, x_shape, cos: int, sin: int, cos_shape, y: int, *,
                interleaved: bool = False) -> dict:
    """As rotary() for x of x_shape and cos, sin of cos_shape."""
    x_shape, cos_shape = tuple(x_shape), tuple(cos_shape)
    if not 1 <= len(x_shape) <= 4:
        raise ValueError(f"rotary: x must have rank 1 to 4, got shape {list(x_shape)}")
    head, width = x_shape[-1], cos_shape[-1] if cos_shape else 0
    full_width = width == head
    rot = head if full_width else 2 * width
    if rot % 2 or rot > head or width == 0:
        raise ValueError(f"rotary: cos/sin width {width} fits no rotation of head size {head}")
    rows = (1,) * (4 - len(x_shape)) + x_shape[:-1]
    if not _broadcasts_to(cos_shape[:-1], rows):
        raise ValueError(f"rotary: cos/sin of shape {list(cos_shape)} do not broadcast to "
                         f"{list(x_shape[:-1]) + [width]}")
    strides = [st // 4 for st in np.broadcast_to(np.empty(cos_shape, np.float32),
                                                 rows + (width,)).strides[:3]]
    _nonempty(x_shape)
    return _step(lib.PLAN_ROTARY, [x, cos, sin], [y], n=[*rows, head],
                 g=[rot, *strides] + [0] * 8,
                 flags=int(full_width) | int(bool(interleaved)) << 1)


def grouped_attention_step(q: int, q_shape, k: int, k_shape, v: int, v_shape, kv_head_of,
                           mask: int, mask_shape, y: int, *, scale: float | None = None,
                           empty_nan: bool = False) -> dict:
    """As grouped_attention() with q in "bnsh" and no kv_valid, q_pos, causal or window;
    mask is -1 (mask_shape None) without one."""
    batch, heads, q_len, head_size = _four("Q", q_shape)
    kv_heads, kv_len, v_head_size = k_shape[1], k_shape[2], v_shape[3]
    if tuple(k_shape) != (batch, kv_heads, kv_len, head_size):
        raise ValueError(f"K must be {[batch, 'KV', 'T', head_size]}, got {list(k_shape)}")
    if len(v_shape) != 4 or tuple(v_shape[:3]) != (batch, kv_heads, kv_len):
        raise ValueError(f"V must be {[batch, kv_heads, kv_len, 'Dv']}, got {list(v_shape)}")
    table = np.asarray(kv_head_of)
    if table.shape != (heads,) or table.dtype.kind not in "iu" or (
            heads and not (0 <= table.min() and table.max() < kv_heads)):
        raise ValueError(f"kv_head_of must hold one KV head in [0, {kv_heads}) per query head "
                         f"({heads}), got {table!r}")
    for name, shape in (("Q", q_shape), ("K", k_shape), ("V", v_shape)):
        _c_int(f"{name} size", math.prod(shape))
    _c_int("kv_len", kv_len)
    scores_shape = (batch, heads, q_len, kv_len)
    mask_strides = (0, 0, 0, 0)
    if mask_shape is not None:
        if not _broadcasts_to(tuple(mask_shape), scores_shape):
            raise ValueError(f"mask of shape {list(mask_shape)} does not broadcast to "
                             f"{list(scores_shape)}")
        mask_strides = tuple(st // 4 for st in np.broadcast_to(
            np.empty(mask_shape, np.float32), scores_shape).strides)
    if scale is None:
        scale = 1.0 / math.sqrt(head_size) if head_size else 1.0
    _nonempty((batch, q_len, heads, v_head_size))
    q_strides = (heads * q_len * head_size, q_len * head_size, head_size)
    return _step(lib.PLAN_GQA, [q, k, v, mask], [y], n=[batch, heads, kv_heads, q_len],
                 g=[*q_strides, kv_len, head_size, v_head_size, *mask_strides, 0, 0],
                 f=[float(scale), 0.0, 0.0, 0.0], flags=int(bool(empty_nan)),
                 kv_head_of=ffi.new("int32_t[]", [int(h) for h in table] or [0]))


CAST_TYPES = {np.dtype(np.bool_): 0, np.dtype(np.int32): 1, np.dtype(np.int64): 2,
              np.dtype(np.float32): 3, np.dtype(np.float64): 4}  # plan.c's cast codes


def matmul_nbits_step(a: int, a_shape, b: int, scales: int, zero_points: int, y: int, *, k: int,
                      n: int, bits: int, block_size: int, float_zero_points: bool = False) -> dict:
    """As matmul_nbits() with no bias, simd on: a (..., k) float32; b, scales and zero_points
    (-1 for none; float32 where float_zero_points, else packed uint8) of the sizes that
    matmul_nbits checks, which the caller has checked."""
    if bits not in (2, 4, 8) or block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"MatMulNBits bits {bits}, block_size {block_size}: not a kernel's")
    if not a_shape or a_shape[-1] != k:
        raise ValueError(f"A's last axis must be K={k}, got shape {list(a_shape)}")
    m = math.prod(a_shape[:-1])
    _nonempty((m, n))
    blocks = (k + block_size - 1) // block_size
    for name, v in (("M", m), ("N", n), ("K", k), ("K in whole blocks", blocks * block_size),
                    ("A size", m * k), ("B size", n * blocks * block_size * bits // 8)):
        _c_int(name, v)
    return _step(lib.PLAN_MATMUL_NBITS, [a, b, scales, zero_points], [y],
                 flags=int(bool(float_zero_points)), n=[m, n, k, bits],
                 g=[block_size] + [0] * 11)


def causal_padding_mask(mask: np.ndarray, start, end, fill: float) -> np.ndarray | None:
    """csrc/causal_mask.c's (B, 1, end - start, end) float32 mask: 0 where key j <= start + i
    and mask[b, j] != 0, else fill, for a 2-D mask of a CAST_TYPES dtype and int64 scalars;
    None where the kernel does not take them (end other than the mask's width, start > end)."""
    mask = np.ascontiguousarray(mask)
    if mask.ndim != 2 or mask.dtype not in CAST_TYPES:
        raise ValueError(f"causal_padding_mask: a 2-D mask of {sorted(map(str, CAST_TYPES))} "
                         f"expected, got {mask.dtype} of shape {list(mask.shape)}")
    start, end = np.array(start, np.int64), np.array(end, np.int64)
    batch, keys = mask.shape
    if int(end) != keys or int(start) > int(end):
        return None  # refused before its output is allocated
    q_len = int(end) - int(start)
    y = np.empty((batch, 1, q_len, keys), np.float32)
    done = lib.causal_padding_mask_f32(ffi.from_buffer("char[]", mask), CAST_TYPES[mask.dtype],
                                       ffi.from_buffer("int64_t[]", start),
                                       ffi.from_buffer("int64_t[]", end), _ptr(y), batch, q_len,
                                       keys, fill)
    return y if done == 0 else None


def causal_padding_mask_step(mask: int, mask_shape, mask_dtype, start: int, end: int, y: int,
                             y_shape, fill: float) -> dict:
    """As causal_padding_mask() into y of y_shape (B, 1, Q, K) for a mask of mask_shape (B, K);
    the step fails, at run time, where end != K or start != K - Q."""
    mask_dtype, (batch, keys), y_shape = np.dtype(mask_dtype), tuple(mask_shape), tuple(y_shape)
    if mask_dtype not in CAST_TYPES:
        raise ValueError(f"causal_padding_mask: a mask of {sorted(map(str, CAST_TYPES))} "
                         f"expected, got {mask_dtype}")
    if len(y_shape) != 4 or y_shape[:2] != (batch, 1) or y_shape[3] != keys:
        raise ValueError(f"causal_padding_mask: y of shape {list(y_shape)} does not follow the "
                         f"mask's {[batch, keys]}")
    _nonempty(y_shape)
    return _step(lib.PLAN_CAUSAL_MASK, [mask, start, end], [y], code=CAST_TYPES[mask_dtype],
                 n=[batch, y_shape[2], keys, 0], f=[fill, 0.0, 0.0, 0.0])


def cast_step(x: int, x_dtype, y: int, y_dtype, count: int) -> dict:
    """count elements of x converted to y_dtype by C's conversions: between bool, int32,
    int64, float32 and float64, never float to int (whose out-of-range rules C leaves open)."""
    x_dtype, y_dtype = np.dtype(x_dtype), np.dtype(y_dtype)
    if x_dtype not in CAST_TYPES or y_dtype not in CAST_TYPES:
        raise ValueError(f"the plan casts between {sorted(map(str, CAST_TYPES))}, got "
                         f"{x_dtype} to {y_dtype}")
    if x_dtype.kind == "f" and y_dtype.kind in "iu":
        raise ValueError(f"the plan does not cast float to int ({x_dtype} to {y_dtype})")
    _nonempty((count,))
    return _step(lib.PLAN_CAST, [x], [y], code=CAST_TYPES[x_dtype] << 4 | CAST_TYPES[y_dtype],
                 n=[count, 0, 0, 0])


SELECT_OPS = {"Where": 0, "And": 1, "Or": 2, "Xor": 3}  # plan.c's select codes


def select_step(op: str, inputs, shapes, y: int, itemsize: int = 1) -> dict:
    """Where (inputs cond, x, y; elements of itemsize bytes) or And/Or/Xor (two bool inputs),
    each input broadcast (ONNX multidirectional) to the output's shape, of rank 6 at most."""
    if op not in SELECT_OPS:
        raise ValueError(f"unknown select op {op!r}; expected one of {sorted(SELECT_OPS)}")
    if len(inputs) != len(shapes) or len(inputs) != (3 if op == "Where" else 2):
        raise ValueError(f"{op} takes {3 if op == 'Where' else 2} inputs, got {len(inputs)}")
    shape = np.broadcast_shapes(*[tuple(s) for s in shapes])
    if len(shape) > 6:
        raise ValueError(f"a select step takes 6 axes at most, got {len(shape)}")
    _nonempty(shape)
    geometry = [len(shape), *shape, *[1] * (6 - len(shape))]
    for k in range(3):
        if k < len(shapes):
            strides = np.broadcast_to(np.empty(shapes[k], np.uint8), shape).strides
            geometry += list(strides) + [0] * (6 - len(shape))
        else:
            geometry += [0] * 6
    return _step(lib.PLAN_SELECT, inputs, [y], code=SELECT_OPS[op], n=[itemsize, 0, 0, 0],
                 geometry=ffi.new("int64_t[]", geometry))


def tied_channels_step(y: int, shape, source) -> dict:
    """y[:, c] = y[:, source[c]] in place for NCHW float32 y of `shape`: what a Conv's
    y[:, source] gives where each source channel is its own source (reference tied_filters)."""
    source = [int(c) for c in source]
    if len(shape) < 2 or len(source) != shape[1]:
        raise ValueError(f"one source per channel of {list(shape)}, got {len(source)}")
    if any(not 0 <= c < len(source) or source[c] != c for c in source):
        raise ValueError("each source channel must be its own source")
    _nonempty(shape)
    return _step(lib.PLAN_TIED_CHANNELS, [], [y],
                 n=[shape[0], shape[1], math.prod(shape[2:]), 0],
                 geometry=ffi.new("int64_t[]", source))


def _four(name: str, shape) -> tuple:
    if len(shape) != 4:
        raise ValueError(f"{name} must be 4-D, got shape {list(shape)}")
    return tuple(shape)


class _ShapeOnly:
    """What _rows reads of an array: its shape, rank and size."""

    def __init__(self, shape):
        self.shape, self.ndim, self.size = tuple(shape), len(shape), math.prod(shape)


STEP_WORDS = ffi.sizeof("plan_step") // 8  # StepTable.words(): int64 words a step
FIELD_WORD = {name: ffi.offsetof("plan_step", name) // 8 for name in ("n", "g")}


class StepTable:
    """A plan_step[] table and the slot addresses its steps read and write (void *[slots]).

    The table owns what its addresses point into: bind() keeps a from_buffer cdata of the
    array, which keeps the array alive until the slot is bound again, so keep the StepTable
    for as long as C may run its steps."""

    __slots__ = ("_arrays", "_owners", "addresses", "count", "steps")

    def __init__(self, steps: list[dict], slots: int):
        self.count = len(steps)
        self.steps = ffi.new("plan_step[]", steps or [{}])
        # the C arrays the steps point to (a chain's ops, params, geometry, side slots)
        self._arrays = [v for step in steps for v in step.values() if isinstance(v, ffi.CData)]
        self.addresses = ffi.new("void *[]", max(slots, 1))
        self._owners: list = [None] * max(slots, 1)

    def bind(self, slot: int, array: np.ndarray) -> None:
        """Point `slot` at a C-contiguous array of any fixed-size dtype."""
        if not array.flags.c_contiguous:
            raise ValueError(f"a plan slot needs a C-contiguous array, got strides {array.strides}")
        owner = ffi.from_buffer("char[]", array)
        self._owners[slot] = owner
        self.addresses[slot] = owner

    def release(self, slots) -> None:
        """Lets go of the arrays bound to these slots (their addresses become NULL)."""
        for slot in slots:
            self._owners[slot] = None
            self.addresses[slot] = ffi.NULL

    def words(self) -> np.ndarray:
        """The steps' memory as int64 words, writable, for fields set per run in place: field
        k of a step's n or g is word `step * STEP_WORDS + FIELD_WORD[name] + k`."""
        return np.frombuffer(ffi.buffer(self.steps), np.int64)

    def run(self, start: int, stop: int, times: np.ndarray | None = None) -> int:
        """Runs steps [start, stop); -1, or the index of the step whose kernel failed.  With
        `times` (int64, stop - start + 1 or more, C-contiguous), plan_run_timed fills it:
        the clock before the first step, then after each step, in ns of CLOCK_MONOTONIC."""
        if stop <= start:
            return -1
        if times is None:
            failed = lib.plan_run(self.steps + start, stop - start, self.addresses)
        else:
            if times.dtype != np.int64 or not times.flags.c_contiguous or not times.flags.writeable \
                    or times.size < stop - start + 1:
                raise ValueError(f"times must be a writable C-contiguous int64 array of "
                                 f"{stop - start + 1} or more, got {times.dtype} {times.shape}")
            failed = lib.plan_run_timed(self.steps + start, stop - start, self.addresses,
                                        ffi.from_buffer("int64_t[]", times))
        return -1 if failed < 0 else start + failed
