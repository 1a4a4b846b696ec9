"""The corpus of one pin: its tests, read straight from the pinned wheel's zip (or generated)."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import ModelProto, numpy_helper

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no cross-process lock
    fcntl = None

from reference.dtypes import np_dtype
from reference.values import EMPTY, normalize

from .compare import DEFAULT_ATOL, DEFAULT_RTOL
from .generate import MANIFEST, NODE_DIR
from .pins import (
    Cache,
    CorpusUnavailable,
    Pin,
    PinMismatch,
    compatible_generator_wheel,
    sha256_file,
)

DATA = "onnx/backend/test/data"
FOLDER_KINDS = ("node", "simple", "pytorch-converted", "pytorch-operator")
LIGHT_PREFIX = "onnx/backend/test/data/light/"


class Source:
    """Files of the onnx/backend/test/data tree, from a wheel's zip and/or a folder."""

    def __init__(self, wheel: Path | None = None, folder: Path | None = None):
        self._zip = zipfile.ZipFile(wheel) if wheel else None
        self._folder = folder
        names = set()
        if self._zip is not None:
            names.update(n for n in self._zip.namelist() if n.startswith(DATA))
        if folder is not None:
            names.update(
                p.relative_to(folder).as_posix() for p in (folder / DATA).rglob("*") if p.is_file()
            )
        self.names = sorted(names)

    def read(self, name: str) -> bytes:
        if self._folder is not None and (self._folder / name).is_file():
            return (self._folder / name).read_bytes()
        if self._zip is not None:
            return self._zip.read(name)
        raise FileNotFoundError(name)

    def exists(self, name: str) -> bool:
        return name in set(self.names)


@dataclass(frozen=True)
class CorpusTest:
    opset: int
    kind: str  # node, simple, pytorch-converted, pytorch-operator, light, real
    name: str
    folder: str  # path of its folder (or model file, for light) inside the data tree
    rtol: float = DEFAULT_RTOL
    atol: float = DEFAULT_ATOL
    unavailable: str = ""  # why it cannot run here (e.g. a model that needs a download)

    @property
    def key(self) -> str:
        """Name within a pin, as expectations write it: 'test_abs' or 'simple/test_x'."""
        return self.name if self.kind == "node" else f"{self.kind}/{self.name}"

    @property
    def id(self) -> str:
        return f"opset{self.opset}/{self.key}"


@dataclass
class Case:
    """A loaded test: the model and its data sets of (feeds, expected outputs)."""

    test: CorpusTest
    model: ModelProto
    data_sets: list


class Corpus:
    def __init__(self, pin: Pin, source: Source):
        self.pin = pin
        self.source = source
        self.tests = self._enumerate()
        self._by_key = {t.key: t for t in self.tests}

    def _enumerate(self) -> list[CorpusTest]:
        tests = []
        pattern = re.compile(rf"^{DATA}/([^/]+)/([^/]+)/(model\.onnx|data\.json)$")
        seen = set()
        for name in self.source.names:
            m = pattern.match(name)
            if not m or (m.group(1), m.group(2)) in seen:
                continue
            kind, test_name, file = m.groups()
            folder = f"{DATA}/{kind}/{test_name}"
            if kind in FOLDER_KINDS and file == "model.onnx":
                seen.add((kind, test_name))
                rtol, atol = self._tolerance(folder)
                tests.append(CorpusTest(self.pin.opset, kind, test_name, folder, rtol, atol))
            elif kind == "real" and file == "data.json":
                seen.add((kind, test_name))
                tests.append(self._real_test(test_name, folder))
        return sorted(tests, key=lambda t: (t.kind != "node", t.kind, t.name))

    def _tolerance(self, folder: str) -> tuple[float, float]:
        path = f"{folder}/data.json"
        if self.source.exists(path):
            data = json.loads(self.source.read(path))
            return data.get("rtol", DEFAULT_RTOL), data.get("atol", DEFAULT_ATOL)
        return DEFAULT_RTOL, DEFAULT_ATOL

    def _real_test(self, name: str, folder: str) -> CorpusTest:
        data = json.loads(self.source.read(f"{folder}/data.json"))
        url = data.get("url", "")
        rtol, atol = data.get("rtol", DEFAULT_RTOL), data.get("atol", DEFAULT_ATOL)
        if url.startswith(LIGHT_PREFIX):
            return CorpusTest(self.pin.opset, "light", name, url, rtol, atol)
        return CorpusTest(
            self.pin.opset, "real", name, folder, rtol, atol,
            unavailable=f"the model is downloaded from {url} at test time; only package "
            f"registries are reachable here",
        )

    def get(self, key: str) -> CorpusTest:
        return self._by_key[key]

    @property
    def node_count(self) -> int:
        return sum(t.kind == "node" for t in self.tests)

    # loading ---------------------------------------------------------------------------
    def load(self, test: CorpusTest) -> Case:
        if test.kind == "light":
            return self._load_light(test)
        model = onnx.load_model_from_string(self.source.read(f"{test.folder}/model.onnx"))
        data_sets = []
        prefix = f"{test.folder}/"
        sets = sorted(
            {n[len(prefix):].split("/")[0] for n in self.source.names
             if n.startswith(prefix + "test_data_set_")},
            key=lambda s: int(s.rsplit("_", 1)[1]),
        )
        for data_set in sets:
            base = f"{test.folder}/{data_set}"
            inputs = self._read_values(base, "input", model.graph.input)
            outputs = self._read_values(base, "output", model.graph.output)
            feeds = {model.graph.input[j].name: v for j, v in enumerate(inputs)}
            data_sets.append((feeds, outputs))
        return Case(test, model, data_sets)

    def _read_values(self, base: str, prefix: str, infos) -> list:
        values = []
        j = 0
        while self.source.exists(f"{base}/{prefix}_{j}.pb"):
            raw = self.source.read(f"{base}/{prefix}_{j}.pb")
            values.append(parse_value(raw, infos[j].type if j < len(infos) else None))
            j += 1
        return values

    def _load_light(self, test: CorpusTest) -> Case:
        model = onnx.load_model_from_string(self.source.read(test.folder))
        stem = test.folder[: -len(".onnx")]
        expected = [
            parse_value(self.source.read(f"{stem}_output_{i}.pb"), out.type)
            for i, out in enumerate(model.graph.output)
        ]
        initializers = {i.name for i in model.graph.initializer}
        feeds = {
            vi.name: light_input(vi) for vi in model.graph.input if vi.name not in initializers
        }
        return Case(test, model, [(feeds, expected)])


def light_input(value_info) -> np.ndarray:
    """The fixed input onnx's runner feeds to light models: arange(n) / n in float32."""
    dims = value_info.type.tensor_type.shape.dim
    shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in dims)
    n = int(np.prod(shape))
    return (np.arange(n).reshape(shape) / n).astype(np.float32)


_OPTIONAL_FIELDS = ("tensor_value", "sparse_tensor_value", "sequence_value", "map_value",
                    "optional_value")


def parse_value(raw: bytes, type_proto):
    """Decode a .pb file as the value kind that `type_proto` declares (tensor by default)."""
    kind = type_proto.WhichOneof("value") if type_proto is not None else "tensor_type"
    if kind == "sequence_type":
        proto = onnx.SequenceProto()
        proto.ParseFromString(raw)
        return _strings_to_str(normalize(numpy_helper.to_list(proto)))
    if kind == "optional_type":
        proto = onnx.OptionalProto()
        proto.ParseFromString(raw)
        if not any(proto.HasField(f) for f in _OPTIONAL_FIELDS):
            return EMPTY
        value = numpy_helper.to_optional(proto)
        return EMPTY if value is None else _strings_to_str(normalize(value))
    if kind == "map_type":
        proto = onnx.MapProto()
        proto.ParseFromString(raw)
        return _strings_to_str(normalize(numpy_helper.to_dict(proto)))
    proto = onnx.TensorProto()
    proto.ParseFromString(raw)
    if proto.data_type == onnx.TensorProto.STRING:
        return _string_tensor(proto)
    array = normalize(numpy_helper.to_array(proto))
    declared = type_proto.tensor_type.elem_type if type_proto is not None else 0
    if declared and declared != proto.data_type:
        array = _reinterpret(array, declared)
    return array


def _reinterpret(array: np.ndarray, declared: int) -> np.ndarray:
    """Older releases stored bfloat16 data as its raw uint16 bits; view it as declared."""
    dtype = np_dtype(declared)
    if array.dtype.itemsize == dtype.itemsize and array.dtype.kind == "u":
        return array.view(dtype)
    return array


def _string_tensor(proto) -> np.ndarray:
    # Decoded by hand: some old corpora hold bytes that are not UTF-8.
    items = [s.decode("utf-8", errors="surrogateescape") for s in proto.string_data]
    out = np.empty(len(items), dtype=object)
    out[:] = items
    shape = tuple(proto.dims)
    if int(np.prod(shape)) != len(items):
        raise ValueError(f"corrupt test data: {len(items)} strings for a tensor of shape {list(shape)}")
    return out.reshape(shape)


def _strings_to_str(value):
    if isinstance(value, np.ndarray) and value.dtype.kind in "OSU":
        flat = [v.decode("utf-8", errors="surrogateescape") if isinstance(v, bytes) else str(v)
                for v in value.reshape(-1)]
        out = np.empty(len(flat), dtype=object)
        out[:] = flat
        return out.reshape(value.shape)
    if isinstance(value, list):
        return [_strings_to_str(v) for v in value]
    if isinstance(value, dict):
        return {(k.decode() if isinstance(k, bytes) else k): _strings_to_str(v) for k, v in value.items()}
    return value


# opening pins ---------------------------------------------------------------------------
VERIFIED = "verified.json"  # in a generated folder: the pin data it was checked against
SHOWN_DIFFERENCES = 12


@contextlib.contextmanager
def _cache_lock(cache: Cache):
    """Serialise fetching and generating across processes (pytest-xdist workers, parallel runs)."""
    cache.root.mkdir(parents=True, exist_ok=True)
    with open(cache.root / ".lock", "w") as handle:
        if fcntl is not None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(handle, fcntl.LOCK_UN)


def open_corpus(pin: Pin, cache: Cache, fetch: bool = True, progress=None,
                announce=None) -> Corpus:
    """The pin's corpus from the cache, fetching (or generating) what is missing if allowed.

    `progress(bytes, total)` follows a download; `announce(what)` is called before a download or
    a generation starts. A generated corpus that did not match its pin is not generated again on
    every call: the mismatch is recorded and raised again until the pin data, numpy, Python or
    the CPU-feature/BLAS settings change, or until forget_mismatch (corpus fetch) asks for it."""
    if fetch and not is_cached(pin, cache):
        with _cache_lock(cache):
            return _open_corpus(pin, cache, fetch, progress, announce or (lambda what: None))
    return _open_corpus(pin, cache, fetch, progress, announce or (lambda what: None))


def is_cached(pin: Pin, cache: Cache) -> bool:
    """True when the pin opens without a download or a generation."""
    if not pin.generated:
        return cache.has_wheel(pin.wheel)
    return _stamp_matches(pin, cache.generated_dir(pin)) and any(
        cache.has_wheel(w) for w in pin.generator_wheels)


def _open_corpus(pin: Pin, cache: Cache, fetch: bool, progress, announce) -> Corpus:
    if not pin.generated:
        if not cache.has_wheel(pin.wheel):
            if not fetch:
                raise CorpusUnavailable(
                    f"opset {pin.opset} (onnx {pin.onnx}) is not cached in {cache.root}; "
                    f"run `onnx-parity corpus fetch --opset {pin.opset}`"
                )
            announce(f"downloading {pin.wheel.file}")
            cache.fetch_wheel(pin.wheel, progress)
        return Corpus(pin, Source(wheel=cache.wheel_path(pin.wheel)))
    wheel = compatible_generator_wheel(pin)
    if not cache.has_wheel(wheel) and not fetch:
        raise CorpusUnavailable(
            f"opset {pin.opset} (onnx {pin.onnx}, generated) is not cached in {cache.root}; "
            f"run `onnx-parity corpus fetch --opset {pin.opset}`"
        )
    if not cache.has_wheel(wheel):
        announce(f"downloading {wheel.file}")
    wheel_path = cache.fetch_wheel(wheel, progress)
    folder = cache.generated_dir(pin)
    if not _stamp_matches(pin, folder):
        if (folder / MANIFEST).is_file():
            _adopt_or_quarantine(pin, cache)  # made before this pin data: check it once
        if not _stamp_matches(pin, folder):
            if not fetch:
                raise CorpusUnavailable(
                    f"opset {pin.opset}'s node corpus has not been generated in {folder}; "
                    f"run `onnx-parity corpus fetch --opset {pin.opset}`"
                )
            _raise_recorded_mismatch(pin, cache)
            announce(f"generating the node corpus with onnx {pin.onnx}'s test-case generators "
                     f"(about half a minute, once)")
            generate_corpus(pin, wheel_path, cache)
    return Corpus(pin, Source(wheel=wheel_path, folder=folder))


def _stamp_matches(pin: Pin, folder: Path) -> bool:
    try:
        stamp = json.loads((folder / VERIFIED).read_text())
    except (OSError, ValueError):
        return False
    return stamp.get("values_sha256") == pin.values_sha256


def _adopt_or_quarantine(pin: Pin, cache: Cache) -> None:
    """A folder generated before this pin data: keep it if it matches, else set it aside."""
    folder = cache.generated_dir(pin)
    differences = check_generated(pin, folder)
    if differences:
        _keep_for_inspection(pin, cache, folder, differences)
    else:
        _write_stamp(pin, folder)


def generate_corpus(pin: Pin, wheel_path: Path, cache: Cache) -> Path:
    """Run the pinned release's generators in a subprocess and check the result against the pin.

    Returns the folder on a match. On a mismatch the files move to the cache's quarantine
    folder, the mismatch is recorded (see open_corpus) and PinMismatch names the files."""
    folder = cache.generated_dir(pin)
    folder.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".gen-", dir=folder.parent))
    try:
        site = work / "site"
        with zipfile.ZipFile(wheel_path) as z:
            z.extractall(site)
        out = work / "out"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), _package_root()]),
                   PYTHONHASHSEED="0")
        proc = subprocess.run(
            [sys.executable, "-m", "conformance.generate", str(out)],
            env=env, capture_output=True, text=True, check=False,
        )
        if proc.returncode != 0:
            raise CorpusUnavailable(
                f"generating opset {pin.opset}'s corpus with onnx {pin.onnx} failed:\n"
                f"{proc.stderr[-3000:]}"
            )
        differences = check_generated(pin, out)
        if differences:
            _quarantine(pin, cache, out, differences, generated=True)
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(out, folder)
        _write_stamp(pin, folder)
        cache.mismatch_record(pin).unlink(missing_ok=True)
        return folder
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _package_root() -> str:
    return str(Path(__file__).resolve().parent.parent)


def pin_data(pin: Pin) -> dict:
    """The pin's data file, checked against the sha256 that pins.toml gives for it."""
    from .valuepin import load_pin_data

    path = Path(pin.values)
    if not path.is_file():
        raise PinMismatch(f"opset {pin.opset}'s pin data {path} is missing from this installation")
    actual = sha256_file(path)
    if actual != pin.values_sha256:
        raise PinMismatch(f"{path} has sha256 {actual}, but pins.toml says {pin.values_sha256}")
    return load_pin_data(path)


def check_generated(pin: Pin, root: Path) -> list:
    """Every difference between the generated files under root and the pin (empty: a match)."""
    from .valuepin import compare, fingerprint

    data = pin_data(pin)
    return compare(data["files"], fingerprint(root), data["tolerance"])


def _write_stamp(pin: Pin, folder: Path) -> None:
    (folder / VERIFIED).write_text(json.dumps({"values_sha256": pin.values_sha256,
                                               "checked": time.strftime("%Y-%m-%dT%H:%M:%S")}))


def _environment(root: Path) -> dict:
    from .valuepin import environment

    try:
        generated = json.loads((root / MANIFEST).read_text()).get("environment", {})
    except (OSError, ValueError):
        generated = {}
    return {**environment(), **generated}


def _keep_for_inspection(pin: Pin, cache: Cache, root: Path, differences: list) -> tuple:
    """Move the files to the cache's quarantine folder with a list of their differences."""
    place = cache.quarantine_dir(pin, time.strftime("%Y%m%d-%H%M%S"))
    place.parent.mkdir(parents=True, exist_ok=True)
    os.replace(root, place)
    env = _environment(place)
    (place / "mismatch.txt").write_text(
        "".join(f"{d}\n" for d in differences) + f"environment: {json.dumps(env)}\n")
    return place, env


def _quarantine(pin: Pin, cache: Cache, root: Path, differences: list, generated: bool = False):
    """Keep the files for inspection, record a generation's mismatch, raise PinMismatch."""
    place, env = _keep_for_inspection(pin, cache, root, differences)
    where = "generated here" if generated else f"cached in {cache.generated_dir(pin)}"
    shown = "".join(f"\n  {d}" for d in differences[:SHOWN_DIFFERENCES])
    more = len(differences) - SHOWN_DIFFERENCES
    message = (
        f"mismatch: the opset {pin.opset} corpus {where} (onnx {pin.onnx}, numpy "
        f"{env.get('numpy')}, {env.get('machine')}) differs from its pin {pin.values} in "
        f"{len(differences)} file(s):{shown}" + (f"\n  ... and {more} more" if more > 0 else "")
        + f"\nThe files are kept in {place} (all differences in mismatch.txt)."
    )
    if generated:
        message += (f"\nIt is not generated again until numpy, Python, the CPU-feature and BLAS "
                    f"settings or the pin change; `onnx-parity corpus fetch --opset {pin.opset}` "
                    f"tries again now.")
        record = {"values_sha256": pin.values_sha256, "environment": _environment_key(),
                  "message": message}
        cache.mismatch_record(pin).write_text(json.dumps(record))
    else:
        message += f"\n`onnx-parity corpus fetch --opset {pin.opset}` generates it again."
    raise PinMismatch(message)


def _environment_key() -> str:
    from .valuepin import environment

    settings = {k: os.environ.get(k, "") for k in ("NPY_DISABLE_CPU_FEATURES", "OPENBLAS_CORETYPE")}
    key = json.dumps({**environment(), **settings}, sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()


def recorded_mismatch(pin: Pin, cache: Cache) -> str | None:
    """The message of a mismatch recorded for this pin data and environment, if any."""
    try:
        record = json.loads(cache.mismatch_record(pin).read_text())
    except (OSError, ValueError):
        return None
    if (record.get("values_sha256") == pin.values_sha256
            and record.get("environment") == _environment_key()):
        return f"{record['message']}\n(recorded at an earlier run)"
    return None


def _raise_recorded_mismatch(pin: Pin, cache: Cache) -> None:
    message = recorded_mismatch(pin, cache)
    if message:
        raise PinMismatch(message)


def forget_mismatch(pin: Pin, cache: Cache) -> None:
    """Let the next open generate again (`corpus fetch` asks for this explicitly)."""
    cache.mismatch_record(pin).unlink(missing_ok=True)


def verify_cached(pin: Pin, cache: Cache) -> str:
    """Re-check what is cached for `pin`, without downloading or generating anything.

    Returns a short state; raises CorpusUnavailable when nothing is cached and PinMismatch
    (after moving the files to quarantine) when cached generated files differ from the pin."""
    if not pin.generated:
        if not cache.has_wheel(pin.wheel):
            raise CorpusUnavailable(f"opset {pin.opset} (onnx {pin.onnx}) is not cached in "
                                    f"{cache.root}; run `onnx-parity corpus fetch --opset {pin.opset}`")
        cache.verified_wheel(pin.wheel)
        return "ok"
    folder = cache.generated_dir(pin)
    wheel = compatible_generator_wheel(pin)
    if not (folder / MANIFEST).is_file() or not cache.has_wheel(wheel):
        _raise_recorded_mismatch(pin, cache)
        raise CorpusUnavailable(f"opset {pin.opset}'s node corpus is not generated in {folder}; "
                                f"run `onnx-parity corpus fetch --opset {pin.opset}`")
    cache.verified_wheel(wheel)
    differences = check_generated(pin, folder)
    if differences:
        _quarantine(pin, cache, folder, differences)
    _write_stamp(pin, folder)
    return "ok"


__all__ = ["NODE_DIR", "Case", "Corpus", "CorpusTest", "open_corpus", "parse_value"]
