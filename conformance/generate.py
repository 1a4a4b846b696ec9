"""Generate a node corpus from an onnx release's own test-case generators.

Run as a separate process whose `onnx` is the pinned release (the extracted wheel comes first on
PYTHONPATH), so the generators and the onnx they compute expected values with are that release's:

    python -m conformance.generate OUT_DIR

It writes OUT_DIR/onnx/backend/test/data/node/<test>/{model.onnx,test_data_set_0/*.pb} in the
layout the wheels use, plus data.json where a case carries its own tolerance, and
OUT_DIR/manifest.json: every file's sha256 and what the float bytes depend on (numpy version and
its CPU features, BLAS).

Pillow is hidden from the generators: without it, the ImageDecoder cases use the frozen images
that onnx ships (_image_decoder_data), where with it they encode images with whatever Pillow
version is installed (its JPEG 2000 bytes differ between versions).
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import warnings
from pathlib import Path

NODE_DIR = "onnx/backend/test/data/node"
MANIFEST = "manifest.json"


def _serialize(value, type_proto, name: str) -> bytes:
    from onnx import TensorProto, numpy_helper

    kind = type_proto.WhichOneof("value")
    if kind == "map_type":
        return numpy_helper.from_dict(value, name).SerializeToString()
    if kind == "sequence_type":
        return numpy_helper.from_list(value, name).SerializeToString()
    if kind == "optional_type":
        return numpy_helper.from_optional(value, name).SerializeToString()
    if isinstance(value, TensorProto):
        return value.SerializeToString()
    return numpy_helper.from_array(value, name).SerializeToString()


def write_case(case, root: Path) -> None:
    folder = root / NODE_DIR / case.name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.onnx").write_bytes(case.model.SerializeToString())
    graph = case.model.graph
    for i, (inputs, outputs) in enumerate(case.data_sets):
        data = folder / f"test_data_set_{i}"
        data.mkdir(exist_ok=True)
        for j, value in enumerate(inputs):
            vi = graph.input[j]
            (data / f"input_{j}.pb").write_bytes(_serialize(value, vi.type, vi.name))
        for j, value in enumerate(outputs):
            vi = graph.output[j]
            (data / f"output_{j}.pb").write_bytes(_serialize(value, vi.type, vi.name))
    if (case.rtol, case.atol) != (1e-3, 1e-7):
        (folder / "data.json").write_text(json.dumps({"rtol": case.rtol, "atol": case.atol}))


def manifest_of(root: Path) -> dict:
    """sha256 of every file under the node folder, keyed by relative path."""
    files = {}
    base = root / NODE_DIR
    for path in sorted(base.rglob("*")):
        if path.is_file():
            files[path.relative_to(root).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return files


def manifest_hash(files: dict) -> str:
    text = "".join(f"{name}\t{digest}\n" for name, digest in sorted(files.items()))
    return hashlib.sha256(text.encode()).hexdigest()


def numpy_environment() -> dict:
    """numpy's version, the CPU features its kernels dispatch to, and its BLAS."""
    import numpy as np

    info = {"numpy": np.__version__, "NPY_DISABLE_CPU_FEATURES":
            os.environ.get("NPY_DISABLE_CPU_FEATURES", ""),
            "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE", "")}
    try:
        from numpy.lib.introspect import opt_func_info  # numpy >= 2.0

        targets = {t["current"] for sigs in opt_func_info().values() for t in sigs.values()}
        info["cpu_dispatch"] = sorted(targets)
    except ImportError:
        pass
    try:
        from threadpoolctl import threadpool_info

        info["blas"] = sorted({f"{i.get('internal_api')} {i.get('version')} {i.get('architecture')}"
                               for i in threadpool_info() if i.get("user_api") == "blas"})
    except ImportError:
        pass
    return info


def main(argv=None) -> int:
    argv = argv if argv is not None else sys.argv[1:]
    root = Path(argv[0])
    warnings.simplefilter("ignore")
    sys.modules["PIL"] = None  # see the module docstring: frozen ImageDecoder data
    import onnx
    import onnx.backend.test.case.node as node_cases

    cases = node_cases.collect_testcases()
    for case in cases:
        write_case(case, root)
    files = manifest_of(root)
    (root / MANIFEST).write_text(
        json.dumps({"onnx": onnx.__version__, "sha256": manifest_hash(files),
                    "environment": numpy_environment(), "files": files})
    )
    print(f"generated {len({c.name for c in cases})} node tests with onnx {onnx.__version__}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
