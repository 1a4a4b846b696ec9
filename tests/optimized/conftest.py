"""Fixtures for the kernel tests.

`threads`: kernels.set_num_threads for the test, and the kernels' thread count restored after it.

Vector-instruction levels: ISA_NAMES in order (portable, avx2, avx512), CPU_LEVELS the ones this
CPU runs, ISA_LEVELS the names as pytest parameters that skip a level above the CPU's (for
`@pytest.mark.parametrize("level", ISA_LEVELS)` with `kernels.isa_limit(level)` in the test,
which hypothesis tests need), and the fixture `isa_level` that runs a test at each level with
the kernels capped there (`pytest.mark.usefixtures("isa_level")` runs a whole file so).
"""
import pytest

from optimized import kernels

ISA_NAMES = tuple(kernels.ISAS)  # portable, avx2, avx512
CPU_ISA = kernels.cpu_isa()
CPU_LEVELS = ISA_NAMES[:ISA_NAMES.index(CPU_ISA) + 1]
ISA_LEVELS = [pytest.param(level, marks=pytest.mark.skipif(
    level not in CPU_LEVELS, reason=f"this CPU runs at most {CPU_ISA}")) for level in ISA_NAMES]


@pytest.fixture
def threads():
    before = kernels.get_num_threads()
    yield kernels.set_num_threads
    kernels.set_num_threads(before)


@pytest.fixture(params=ISA_LEVELS)
def isa_level(request):
    """The test at one vector level (its name), the level before restored after."""
    with kernels.isa_limit(request.param):
        yield request.param


@pytest.fixture
def restore_isa():
    """The vector level as it was before the test, whatever the test caps it at."""
    with kernels.isa_limit(kernels.isa()):
        yield
