#!/bin/sh
# Build the kernels with AddressSanitizer in a scratch copy of the tree and run their tests
# there (the installed extension is left alone).  Usage: sh csrc/asan_check.sh [pytest args]
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${ASAN_WORKDIR:-$(mktemp -d /tmp/onnx-parity-asan.XXXXXX)}
mkdir -p "$WORK"
(cd "$ROOT" && tar cf - --exclude=.git --exclude='*.so' --exclude=.hypothesis --exclude=.benchmarks .) \
    | (cd "$WORK" && tar xf -)
cd "$WORK"
ONNX_PARITY_SANITIZE=address python csrc/build.py > build.log 2>&1 || { cat build.log; exit 1; }
# Python's own allocations are never freed at exit: leak reports would be noise
LD_PRELOAD=$(gcc -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
    python -m pytest tests/optimized/test_kernels.py -p no:cacheprovider -q "$@"
