"""The vector-instruction cap: kernels.limit_isa and ONNX_PARITY_MAX_ISA choose which code
paths run, so that a machine with AVX-512 tests its AVX2 and portable paths too."""
import os
import subprocess
import sys

import pytest

from optimized import kernels


@pytest.fixture
def restore_isa():
    before = kernels.isa()
    yield
    kernels.limit_isa(before)


def test_limit_never_rises_above_the_cpu(restore_isa):
    best = kernels.limit_isa("avx512")
    assert best in kernels.ISAS
    order = list(kernels.ISAS)  # portable, avx2, avx512
    for name in order:
        now = kernels.limit_isa(name)
        assert order.index(now) == min(order.index(name), order.index(best))
        assert kernels.isa() == now


def test_unknown_level_is_refused(restore_isa):
    with pytest.raises(ValueError, match="avx1024"):
        kernels.limit_isa("avx1024")


@pytest.mark.parametrize("setting, expected", [("avx2", "avx2"), ("portable", "portable"),
                                               ("sse9", "portable")])
def test_environment_caps_at_load(setting, expected):
    best = kernels.limit_isa(kernels.isa())
    order = list(kernels.ISAS)
    expected = order[min(order.index(expected), order.index(best))]
    env = dict(os.environ, ONNX_PARITY_MAX_ISA=setting)
    out = subprocess.run([sys.executable, "-c", "from optimized import kernels; print(kernels.isa())"],
                         env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert out == expected
