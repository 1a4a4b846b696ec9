"""Pins (conformance/pins.toml) and the local cache of pinned wheels and generated corpora."""
from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PINS_FILE = Path(__file__).with_name("pins.toml")
CACHE_ENV = "ONNX_PARITY_CACHE"
DOWNLOAD_TIMEOUT_S = 60


class CorpusUnavailable(Exception):
    """A pin is not in the cache and cannot be fetched; the message says what to do."""


class PinMismatch(Exception):
    """A downloaded, cached or generated file does not match its pin; the message names it."""


@dataclass(frozen=True)
class Wheel:
    file: str
    url: str
    sha256: str


@dataclass(frozen=True)
class Pin:
    opset: int
    onnx: str
    node_tests: int
    wheel: Wheel | None = None  # the wheel whose zip holds the corpus (releases <= 1.22)
    generator_wheels: tuple[Wheel, ...] = field(default=())  # for generated node data
    values: str = ""  # generated pins: path of the pin data file (conformance/pinned/), see valuepin
    values_sha256: str = ""

    @property
    def generated(self) -> bool:
        return not self.wheel

    @property
    def label(self) -> str:
        return f"opset{self.opset}"


def load_pins(path: Path | str = PINS_FILE) -> dict[int, Pin]:
    path = Path(path)
    with open(path, "rb") as f:
        data = tomllib.load(f)
    pins = {}
    for entry in data["pin"]:
        wheel = None
        if "wheel" in entry:
            wheel = Wheel(entry["wheel"], entry["url"], entry["sha256"])
        generators = tuple(
            Wheel(g["wheel"], g["url"], g["sha256"]) for g in entry.get("generator_wheels", [])
        )
        pins[entry["opset"]] = Pin(
            opset=entry["opset"],
            onnx=entry["onnx"],
            node_tests=entry.get("node_tests", 0),
            wheel=wheel,
            generator_wheels=generators,
            values=str(path.parent / entry["values"]) if "values" in entry else "",
            values_sha256=entry.get("values_sha256", ""),
        )
    return pins


def select_pins(pins: dict[int, Pin], opset: str | int) -> list[Pin]:
    """`opset` is a number, 'all', or a comma list / range such as '7,13,21' or '18-28'."""
    if str(opset) == "all":
        return [pins[k] for k in sorted(pins)]
    chosen = []
    for part in str(opset).split(","):
        if "-" in part:
            lo, hi = (int(x) for x in part.split("-"))
            numbers = range(lo, hi + 1)
        else:
            numbers = [int(part)]
        for n in numbers:
            if n not in pins:
                raise ValueError(f"no pin for opset {n}; pinned opsets are {min(pins)}..{max(pins)}")
            chosen.append(pins[n])
    return chosen


def default_cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "onnx-parity"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class Cache:
    """Pinned wheels under <root>/wheels, generated corpora under <root>/generated."""

    def __init__(self, root: Path | str | None = None):
        self.root = Path(root).expanduser() if root else default_cache_dir()

    def wheel_path(self, wheel: Wheel) -> Path:
        return self.root / "wheels" / wheel.file

    def generated_dir(self, pin: Pin) -> Path:
        return self.root / "generated" / f"onnx-{pin.onnx}"

    def mismatch_record(self, pin: Pin) -> Path:
        """Written when a generated corpus did not match its pin, so it is not retried blindly."""
        return self.root / "generated" / f"onnx-{pin.onnx}.mismatch.json"

    def quarantine_dir(self, pin: Pin, stamp: str) -> Path:
        """Where files that did not match their pin are kept for inspection."""
        return self.root / "quarantine" / f"onnx-{pin.onnx}-{stamp}"

    def has_wheel(self, wheel: Wheel) -> bool:
        return self.wheel_path(wheel).is_file()

    def verified_wheel(self, wheel: Wheel) -> Path:
        """The cached wheel, checked against its pinned hash (PinMismatch if it differs)."""
        path = self.wheel_path(wheel)
        actual = sha256_file(path)
        if actual != wheel.sha256:
            raise PinMismatch(
                f"{path} has sha256 {actual}, but the pin says {wheel.sha256}; "
                f"delete it and run `onnx-parity corpus fetch` again"
            )
        return path

    def fetch_wheel(self, wheel: Wheel, progress=None) -> Path:
        """Download `wheel` unless cached; verify its hash; never leave a partial file."""
        path = self.wheel_path(wheel)
        if path.is_file():
            return self.verified_wheel(wheel)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            response = urllib.request.urlopen(wheel.url, timeout=DOWNLOAD_TIMEOUT_S)
        except (urllib.error.URLError, OSError) as e:
            raise CorpusUnavailable(
                f"{wheel.file} is not in the cache ({path.parent}) and the package registry "
                f"cannot be reached ({getattr(e, 'reason', e)}). Fetch it on a machine with "
                f"network access (`onnx-parity corpus fetch`), or point --cache-dir / "
                f"{CACHE_ENV} at a cache that has it."
            ) from e
        digest = hashlib.sha256()
        total = int(response.headers.get("Content-Length") or 0)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".part-", suffix=".whl")
        try:
            with os.fdopen(fd, "wb") as out, response:
                while block := response.read(1 << 20):
                    digest.update(block)
                    out.write(block)
                    if progress:
                        progress(len(block), total)
            if digest.hexdigest() != wheel.sha256:
                raise PinMismatch(
                    f"downloaded {wheel.file} has sha256 {digest.hexdigest()}, "
                    f"but the pin says {wheel.sha256}"
                )
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return path


def compatible_generator_wheel(pin: Pin) -> Wheel:
    """The pinned generator wheel that the running interpreter can import."""
    from packaging.tags import sys_tags
    from packaging.utils import parse_wheel_filename

    supported = {str(t): i for i, t in enumerate(sys_tags())}
    best = None
    for wheel in pin.generator_wheels:
        _, _, _, tags = parse_wheel_filename(wheel.file)
        rank = min((supported[str(t)] for t in tags if str(t) in supported), default=None)
        if rank is not None and (best is None or rank < best[0]):
            best = (rank, wheel)
    if best is None:
        raise CorpusUnavailable(
            f"none of the pinned onnx {pin.onnx} wheels fits this Python "
            f"({sys.version.split()[0]}, {sys.platform}); generating opset {pin.opset}'s corpus "
            f"needs one of: {', '.join(w.file for w in pin.generator_wheels)}"
        )
    return best[1]
