"""The vector-instruction cap: kernels.limit_isa and ONNX_PARITY_MAX_ISA choose which code
paths run, so that a machine with AVX-512 tests its AVX2 and portable paths too."""
import os
import subprocess
import sys

import pytest

from optimized import kernels


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


ORDER = list(kernels.ISAS)  # portable, avx2, avx512


def lower(a: str, b: str) -> str:
    return ORDER[min(ORDER.index(a), ORDER.index(b))]


@pytest.mark.parametrize("setting, expected", [("avx2", "avx2"), ("portable", "portable"),
                                               ("sse9", "portable")])
def test_environment_caps_at_load(setting, expected):
    # the cap holds from the start; cpu_isa still tells what the CPU runs
    best = kernels.cpu_isa()
    env = dict(os.environ, ONNX_PARITY_MAX_ISA=setting)
    code = "from optimized import kernels; print(kernels.isa(), kernels.cpu_isa(), kernels.isa())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.split()
    assert out == [lower(expected, best), best, lower(expected, best)]


def test_cpu_isa_is_the_highest_cap_and_leaves_the_cap(restore_isa):
    best = kernels.cpu_isa()
    assert kernels.limit_isa("avx512") == best
    for name in ORDER:
        kernels.limit_isa(name)
        assert kernels.cpu_isa() == best
        assert kernels.isa() == lower(name, best)


@pytest.mark.parametrize("outer", ORDER)
@pytest.mark.parametrize("inner", ORDER)
def test_isa_limit_caps_inside_and_restores_after(restore_isa, outer, inner):
    best = kernels.cpu_isa()
    kernels.limit_isa(outer)
    with kernels.isa_limit(inner) as now:
        assert now == kernels.isa() == lower(inner, best)
        with kernels.isa_limit("portable"):
            assert kernels.isa() == "portable"
        assert kernels.isa() == now
    assert kernels.isa() == lower(outer, best)


def test_isa_limit_restores_after_an_error(restore_isa):
    kernels.limit_isa("avx512")
    before = kernels.isa()
    with pytest.raises(RuntimeError, match="in the body"), kernels.isa_limit("portable"):
        assert kernels.isa() == "portable"
        raise RuntimeError("in the body")
    assert kernels.isa() == before


def test_isa_limit_refuses_an_unknown_level_and_changes_nothing(restore_isa):
    kernels.limit_isa("avx2")
    before = kernels.isa()
    with pytest.raises(ValueError, match="avx1024"), kernels.isa_limit("avx1024"):
        pytest.fail("the body must not run")
    assert kernels.isa() == before


def test_isa_level_fixture_caps_the_kernels_for_the_test(isa_level):
    assert kernels.isa() == isa_level
