"""cffi builder for optimized._kernels (out-of-line API mode); run by setup.py at install."""
import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = ["elementwise.c"]


def _declarations() -> str:
    with open(os.path.join(HERE, "kernels.h")) as f:
        return "".join(line for line in f if not line.startswith("#"))


ffibuilder = FFI()
ffibuilder.cdef(_declarations())
ffibuilder.set_source(
    "optimized._kernels",
    '#include "kernels.h"',
    sources=[os.path.relpath(os.path.join(HERE, s)) for s in SOURCES],
    include_dirs=[os.path.relpath(HERE)],
    extra_compile_args=["-O3", "-std=c11"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
