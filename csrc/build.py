"""cffi builder for optimized._kernels (out-of-line API mode); run by setup.py at install.

GEMM goes through scipy-openblas32's CBLAS (symbols prefixed `scipy_`); the non-BLAS loops use
OpenMP.  onednn_conv.c opens oneDNN at run time and needs only its header here, from
onednn-devel-cpu-gomp; without that header it is built as a stub that reports so.
ONNX_PARITY_SANITIZE=address builds with AddressSanitizer (see tests/optimized).
`python csrc/build.py` builds in a temporary folder and puts the extension in optimized/ under
the name `pip install -e .` gives it.
"""
import importlib.metadata
import os
import shutil
import sys
import tempfile

import scipy_openblas32
from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SOURCES = ["threads.c", "elementwise.c", "gemm.c", "gemm_packed.c", "conv.c", "conv_pointwise.c", "depthwise.c", "pool.c", "rowwise.c", "attention.c",
           "matmul_nbits.c", "rmsnorm.c",
           "gated.c", "rotary.c", "gqa.c", "plan.c", "onednn_conv.c", "onednn_region.c", "gemv.c",
           "causal_mask.c", "nbits_pack.c"]


def _onednn_include_dir() -> str | None:
    """The folder holding oneapi/dnnl/dnnl.h from onednn-devel-cpu-gomp (a wheel of data files
    installed under the environment's prefix), or None when it is not installed."""
    try:
        dist = importlib.metadata.distribution("onednn-devel-cpu-gomp")
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in dist.files or ():
        if str(f).replace(os.sep, "/").endswith("include/oneapi/dnnl/dnnl.h"):
            header = os.path.normpath(str(dist.locate_file(f)))
            if os.path.exists(header):
                return os.path.dirname(os.path.dirname(os.path.dirname(header)))
    return None


def _declarations() -> str:
    with open(os.path.join(HERE, "kernels.h")) as f:
        return "".join(line for line in f if not line.startswith("#"))


def _sanitizer_flags() -> list[str]:
    kind = os.environ.get("ONNX_PARITY_SANITIZE", "")
    return [f"-fsanitize={kind}", "-fno-omit-frame-pointer", "-g"] if kind else []


def make_builder(csrc: str) -> FFI:
    """The builder, with csrc/ spelled as given: setuptools wants it relative to setup.py's
    folder (the repository root), cffi's own compile() absolute."""
    blas_lib_dir = scipy_openblas32.get_lib_dir()
    onednn = _onednn_include_dir()
    builder = FFI()
    builder.cdef(_declarations())
    builder.set_source(
        "optimized._kernels",
        '#include "kernels.h"',
        sources=[os.path.join(csrc, s) for s in SOURCES],
        include_dirs=[csrc, scipy_openblas32.get_include_dir()] + ([onednn] if onednn else []),
        define_macros=[] if onednn else [("ONNX_PARITY_NO_ONEDNN", "1")],
        library_dirs=[blas_lib_dir],
        libraries=[scipy_openblas32.get_library()]
        + (["dl"] if sys.platform.startswith("linux") else []),
        # The rpath serves builds against an installed scipy-openblas32; optimized/kernels.py
        # also loads the library from the runtime dependency before importing the extension.
        # no FP traps or errno are ever read: without these, branches in the math loops
        # (vmath.h) block vectorisation; unlike -ffast-math they change no result
        extra_compile_args=["-O3", "-std=c11", "-fopenmp", "-fno-trapping-math", "-fno-math-errno"] + _sanitizer_flags(),
        extra_link_args=["-fopenmp", f"-Wl,-rpath,{blas_lib_dir}"] + _sanitizer_flags(),
    )
    return builder


ffibuilder = make_builder("csrc")

if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        built = make_builder(HERE).compile(tmpdir=tmp, verbose=True)
        target = os.path.join(ROOT, "optimized", "_kernels.abi3.so")
        # a new file renamed over the old one: processes that loaded the old one keep it intact
        shutil.copyfile(built, target + ".tmp")
        os.replace(target + ".tmp", target)
