"""The `threads` fixture: the kernels' thread count restored after a test that changes it (a
test module that defines its own keeps that)."""
import pytest

from optimized import kernels


@pytest.fixture
def threads():
    before = kernels.get_num_threads()
    yield
    kernels.set_num_threads(before)
