#!/bin/sh
# Build the kernels with AddressSanitizer in a scratch copy of the tree and run a command there
# (the installed extension is left alone).  With no command: the kernel tests.
#   sh csrc/asan_check.sh                      # tests/optimized/test_kernels.py
#   sh csrc/asan_check.sh python -m conformance.cli test --backend optimized --level 99 --opset all
#   sh csrc/asan_check.sh python -m pytest -q -p no:randomly tests/optimized/test_view_inputs.py \
#       tests/optimized/test_chains.py tests/optimized/test_kernels.py   # views, exporter models
# Run as `python -m ...` so that the scratch copy's packages come first on sys.path.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${ASAN_WORKDIR:-$(mktemp -d /tmp/onnx-parity-asan.XXXXXX)}
mkdir -p "$WORK"
(cd "$ROOT" && tar cf - --exclude=.git --exclude=.venv --exclude='*.so' --exclude=.hypothesis --exclude=.benchmarks .) \
    | (cd "$WORK" && tar xf -)
cd "$WORK"
ONNX_PARITY_SANITIZE=address python csrc/build.py > build.log 2>&1 || { cat build.log; exit 1; }
if [ $# -eq 0 ]; then
    set -- python -m pytest tests/optimized/test_kernels.py -p no:cacheprovider -q
fi
# libstdc++ preloaded too: ASan must find the real __cxa_throw when onnx's C++ code throws.
# Python's own allocations are never freed at exit: leak reports would be noise.
export LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)"
# Reports go to files: pytest's output capture would swallow a report on stderr when the
# process aborts.  They are printed at the end, and any report fails the run.
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:log_path=$WORK/asan-report
python -c "import optimized._kernels as k, sys; assert k.__file__.startswith('$WORK'), k.__file__; print('ASan build:', k.__file__, file=sys.stderr)"
status=0
"$@" || status=$?
for report in "$WORK"/asan-report.*; do
    [ -e "$report" ] || continue
    cat "$report" >&2
    [ "$status" -ne 0 ] || status=1
done
exit "$status"
