"""The `threads` fixture: kernels.set_num_threads for the test, and the kernels' thread count
restored after it."""
import pytest

from optimized import kernels


@pytest.fixture
def threads():
    before = kernels.get_num_threads()
    yield kernels.set_num_threads
    kernels.set_num_threads(before)
