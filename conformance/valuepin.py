"""The pin of a generated corpus: exact bytes where they are machine-independent, float values
within a stated bound where they are not.

onnx's generators compute expected outputs (and a few inputs) with NumPy on the user's machine,
so their float bytes depend on NumPy's SIMD paths, the BLAS kernel and the NumPy version (a few
ulps). A pin data file (conformance/pinned/opsetN.json) therefore records, per generated file:

- model.onnx, data.json, and every value file without a float tensor of 16 bits or more:
  the sha256 of the file's bytes;
- a value file with such float tensors: the structure of the value (tensor, sequence, map,
  optional), and per tensor its dtype, shape, the positions of NaN, +Inf and -Inf (a hash of the
  masks), and per block of BLOCK elements the L1 norm and PROJECTIONS fixed pseudo-random
  projections sum(w_i * x_i) with weights in [-1, 1) that depend only on the element's index.
  Other tensors in such a file (integers, 8-bit floats, strings) are pinned by their bytes.

A float block verifies when its L1 norm and every projection differ from the pinned ones by at
most tol * max(pinned L1, current L1), tol being the dtype's entry in the file's "tolerance".
Every element within relative error tol of the block's mean magnitude keeps a block inside this
bound; a permutation, a truncation or an element moved by more than about 2 * tol * L1 is caught.
"""
from __future__ import annotations

import hashlib
import json
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from reference.values import EMPTY

from .generate import NODE_DIR

FORMAT = 1
BLOCK = 1024
PROJECTIONS = 3
# Relative bound per dtype (of a block's L1 norm). float32/float64 differ across machines by a
# few ulps (measured at most 4.2e-7 of a tensor's L1 norm); 2**-14 leaves a margin of over 100.
# float16 and bfloat16 may flip one rounding of an element computed in float32: one ulp.
TOLERANCE = {
    "float64": 2.0 ** -14,
    "float32": 2.0 ** -14,
    "complex128": 2.0 ** -14,
    "complex64": 2.0 ** -14,
    "float16": 2.0 ** -10,
    "bfloat16": 2.0 ** -7,
}
_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


@dataclass(frozen=True)
class Difference:
    """One generated file that does not match its pin."""

    file: str
    what: str
    size: float = 0.0  # relative difference of float values (0 where not a float difference)
    limit: float = 0.0

    def __str__(self) -> str:
        if self.limit:
            return (f"{self.file}: {self.what} differ by {self.size:.3g} of their L1 norm "
                    f"(the pin allows {self.limit:.3g})")
        return f"{self.file}: {self.what}"


# weights and summaries ---------------------------------------------------------------------
def weights(n: int, k: int) -> np.ndarray:
    """Projection k's weights for elements 0..n-1: splitmix64 of the index, mapped to [-1, 1)."""
    z = np.arange(n, dtype=np.uint64) * np.uint64(_GOLDEN)
    z += np.uint64(((k + 1) * 0xD1B54A32D192ED03) & _MASK64)
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return (z >> np.uint64(11)).astype(np.float64) * 2.0 ** -52 - 1.0


def is_tolerant(dtype) -> bool:
    return str(dtype) in TOLERANCE


def float_summary(a: np.ndarray) -> dict:
    x = a.reshape(-1)
    if x.dtype.kind == "c":
        x = x.view(x.real.dtype)
    x = x.astype(np.float64)
    nan, posinf, neginf = np.isnan(x), np.isposinf(x), np.isneginf(x)
    summary = {"dtype": str(a.dtype), "shape": list(a.shape)}
    if nan.any() or posinf.any() or neginf.any():
        masks = b"".join(np.packbits(m).tobytes() for m in (nan, posinf, neginf))
        summary["nonfinite"] = [int(nan.sum()), int(posinf.sum()), int(neginf.sum()),
                                hashlib.sha256(masks).hexdigest()]
        x = np.where(nan | posinf | neginf, 0.0, x)
    n = x.size
    blocks = -(-n // BLOCK)
    padded = np.zeros(blocks * BLOCK)
    padded[:n] = x
    padded = padded.reshape(blocks, BLOCK)
    rows = [np.abs(padded).sum(axis=1)]
    for k in range(PROJECTIONS):
        w = np.zeros(blocks * BLOCK)
        w[:n] = weights(n, k)
        rows.append((padded * w.reshape(blocks, BLOCK)).sum(axis=1))
    summary["blocks"] = [[float(f"{v:.7g}") for v in col] for col in zip(*rows)]
    return summary


def exact_summary(a: np.ndarray) -> dict:
    if a.dtype == object:
        data = b"\x00".join(str(s).encode("utf-8", "surrogateescape") for s in a.reshape(-1))
    else:
        data = np.ascontiguousarray(a).tobytes()
    return {"dtype": str(a.dtype), "shape": list(a.shape), "sha256": hashlib.sha256(data).hexdigest()}


def _tensors(value, out: list) -> str:
    """Flatten `value` into `out` (its arrays, in order); returns its structure as text."""
    if isinstance(value, np.ndarray):
        out.append(value)
        return "T"
    if isinstance(value, list):
        return "[" + ",".join(_tensors(v, out) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k!r}:{_tensors(v, out)}" for k, v in sorted(value.items())) + "}"
    if value is EMPTY:
        return "E"
    return type(value).__name__


def file_entry(raw: bytes, type_proto) -> dict:
    from .corpus import parse_value

    arrays: list = []
    structure = _tensors(parse_value(raw, type_proto), arrays)
    if not any(is_tolerant(a.dtype) for a in arrays):
        return {"sha256": hashlib.sha256(raw).hexdigest()}
    return {"structure": structure,
            "tensors": [float_summary(a) if is_tolerant(a.dtype) else exact_summary(a)
                        for a in arrays]}


def fingerprint(root: Path) -> dict:
    """Entries for every file under root's node folder, keyed by path relative to that folder."""
    base = root / NODE_DIR
    entries = {}
    for test in sorted(p for p in base.iterdir() if p.is_dir()):
        model_path = test / "model.onnx"
        graph = onnx.load_model_from_string(model_path.read_bytes()).graph if model_path.is_file() else None
        for path in sorted(p for p in test.rglob("*") if p.is_file()):
            name = path.relative_to(base).as_posix()
            raw = path.read_bytes()
            type_proto = _declared_type(graph, path.name)
            if type_proto is None:
                entries[name] = {"sha256": hashlib.sha256(raw).hexdigest()}
                continue
            try:
                entries[name] = file_entry(raw, type_proto)
            except Exception as e:  # noqa: BLE001 - a file that does not parse is a difference
                entries[name] = {"unreadable": f"{type(e).__name__}: {e}"}
    return entries


def _declared_type(graph, file_name: str):
    """The type that model.onnx declares for input_N.pb / output_N.pb (None for other files)."""
    stem, _, ext = file_name.partition(".")
    kind, _, index = stem.rpartition("_")
    if graph is None or ext != "pb" or kind not in ("input", "output") or not index.isdigit():
        return None
    infos = graph.input if kind == "input" else graph.output
    j = int(index)
    return infos[j].type if j < len(infos) else onnx.TypeProto()


# comparison --------------------------------------------------------------------------------
def compare(pinned: dict, current: dict, tolerance: dict) -> list[Difference]:
    """Every difference between the pinned entries and the current ones, in file order."""
    out = []
    for name in sorted(set(pinned) | set(current)):
        if name not in current:
            out.append(Difference(name, "missing"))
        elif name not in pinned:
            out.append(Difference(name, "not in the pin"))
        else:
            out += _compare_entry(name, pinned[name], current[name], tolerance)
    return out


def _compare_entry(name: str, pin: dict, now: dict, tolerance: dict) -> list[Difference]:
    if "unreadable" in now:
        return [Difference(name, f"cannot be read ({now['unreadable']})")]
    if "sha256" in pin or "sha256" in now:
        if pin.get("sha256") != now.get("sha256"):
            return [Difference(name, f"bytes differ (sha256 {now.get('sha256', 'n/a')[:12]}..., "
                                     f"pin {pin.get('sha256', 'n/a')[:12]}...)")]
        return []
    if pin["structure"] != now["structure"]:
        return [Difference(name, f"value structure {now['structure'][:60]} differs from the "
                                 f"pin's {pin['structure'][:60]}")]
    out = []
    for i, (p, c) in enumerate(zip(pin["tensors"], now["tensors"])):
        label = name if len(pin["tensors"]) == 1 else f"{name}[{i}]"
        out += _compare_tensor(label, p, c, tolerance)
    return out


def _compare_tensor(label: str, pin: dict, now: dict, tolerance: dict) -> list[Difference]:
    if pin["dtype"] != now["dtype"] or pin["shape"] != now["shape"]:
        return [Difference(label, f"{now['dtype']}{now['shape']} where the pin has "
                                  f"{pin['dtype']}{pin['shape']}")]
    if "sha256" in pin:
        if pin["sha256"] != now.get("sha256"):
            return [Difference(label, f"{pin['dtype']} values differ")]
        return []
    if pin.get("nonfinite") != now.get("nonfinite"):
        counts = lambda s: "{} NaN, {} +Inf, {} -Inf".format(*(s.get("nonfinite") or [0, 0, 0])[:3])
        return [Difference(label, f"NaN/Inf positions differ ({counts(now)}; pin: {counts(pin)})")]
    tol = tolerance[pin["dtype"]]
    worst = 0.0
    for p, c in zip(pin["blocks"], now["blocks"]):
        scale = max(p[0], c[0])
        gap = max(abs(a - b) for a, b in zip(p, c))
        if gap:
            worst = max(worst, gap / scale if scale else float("inf"))
    if worst > tol:
        return [Difference(label, f"{pin['dtype']} values", worst, tol)]
    return []


def worst_ratio(pinned: dict, current: dict) -> float:
    """The largest float difference (relative to the L1 norm) between two fingerprints."""
    worst = 0.0
    for name, pin in pinned.items():
        now = current.get(name, {})
        for p, c in zip(pin.get("tensors", []), now.get("tensors", [])):
            for pb, cb in zip(p.get("blocks", []), c.get("blocks", [])):
                scale = max(pb[0], cb[0])
                gap = max(abs(a - b) for a, b in zip(pb, cb))
                if gap:
                    worst = max(worst, gap / scale if scale else float("inf"))
    return worst


# pin data files ----------------------------------------------------------------------------
def environment() -> dict:
    """What generated bytes depend on, as recorded beside a pin or a mismatch."""
    return {"python": sys.version.split()[0], "numpy": np.__version__,
            "machine": platform.machine(), "system": platform.system()}


def make_pin_data(root: Path, onnx_version: str) -> dict:
    return {"format": FORMAT, "onnx": onnx_version, "block": BLOCK, "projections": PROJECTIONS,
            "tolerance": TOLERANCE, "made_with": environment(), "files": fingerprint(root)}


def write_pin_data(data: dict, path: Path) -> None:
    """One line per file, so a change to the pin shows as a readable diff."""
    head = {k: v for k, v in data.items() if k != "files"}
    lines = ["{", *(f" {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()), ' "files": {']
    items = sorted(data["files"].items())
    lines += [f"  {json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}"
              + ("," if i < len(items) - 1 else "") for i, (k, v) in enumerate(items)]
    lines += [" }", "}"]
    path.write_text("\n".join(lines) + "\n")


def load_pin_data(path: Path) -> dict:
    data = json.loads(path.read_text())
    if data.get("format") != FORMAT or data.get("block") != BLOCK or data.get(
            "projections") != PROJECTIONS:
        raise ValueError(f"{path} is pin data of another format (format {data.get('format')}, "
                         f"block {data.get('block')}); this onnx-parity reads format {FORMAT}")
    return data


def main(argv=None) -> int:
    """python -m conformance.valuepin GENERATED_ROOT OUT.json ONNX_VERSION: write pin data."""
    argv = argv if argv is not None else sys.argv[1:]
    root, out, version = Path(argv[0]), Path(argv[1]), argv[2]
    write_pin_data(make_pin_data(root, version), out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
