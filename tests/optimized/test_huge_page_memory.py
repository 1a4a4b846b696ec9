"""optimized.huge_page_memory: arena buffers advised for transparent huge pages."""
import mmap
import sys

import numpy as np
import pytest

from optimized.huge_page_memory import HUGE_PAGE, SMALLEST, huge_page_buffer


def _vm_flags(address: int) -> list[str]:
    """The VmFlags of the mapping that holds address (Linux /proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                start, end = (int(x, 16) for x in head.split("-"))
                inside = start <= address < end
            elif inside and head == "VmFlags:":
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


def test_small_buffers_are_plain_heap_arrays():
    small = huge_page_buffer(SMALLEST - 1)
    assert small.shape == (SMALLEST - 1,) and small.dtype == np.uint8
    assert small.base is None  # an np.empty of its own, no mapping


@pytest.mark.parametrize("nbytes", [SMALLEST, 3 * HUGE_PAGE + 12345])
def test_large_buffers_start_a_huge_page_and_are_writable(nbytes):
    buffer = huge_page_buffer(nbytes)
    assert buffer.shape == (nbytes,) and buffer.dtype == np.uint8
    assert buffer.ctypes.data % HUGE_PAGE == 0
    buffer[:] = 7
    buffer[-1] = 9
    assert int(buffer[0]) == 7 and int(buffer[-1]) == 9


@pytest.mark.skipif(not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"),
                    reason="MADV_HUGEPAGE and /proc/self/smaps are Linux's")
def test_large_buffers_are_advised_for_huge_pages():
    buffer = huge_page_buffer(SMALLEST + 1)
    assert "hg" in _vm_flags(buffer.ctypes.data)  # hg: MADV_HUGEPAGE (proc(5))


def test_a_negative_size_is_refused():
    with pytest.raises(ValueError, match="-1 bytes"):
        huge_page_buffer(-1)


@pytest.mark.skipif(not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"),
                    reason="MADV_HUGEPAGE and /proc/self/smaps are Linux's")
def test_a_compiled_runs_arena_of_two_mib_and_more_is_advised_for_huge_pages():
    from onnx import TensorProto, helper

    from optimized.cpu import C_STEPS, KERNELS
    from optimized.plan import Plan
    from tests.optimized.plan_models import make_model

    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Sigmoid", ["r"], ["s"]),
             helper.make_node("Tanh", ["s"], ["t"]), helper.make_node("Neg", ["t"], ["y"])]
    spec = helper.make_tensor_value_info
    model = make_model(nodes, [spec("x", TensorProto.FLOAT, [600, 700])],
                       [spec("y", TensorProto.FLOAT, None)])
    feeds = {"x": np.random.default_rng(3).standard_normal((600, 700)).astype(np.float32)}
    in_c = Plan(model, KERNELS, c_steps=C_STEPS)
    for _ in range(3):  # records, compiles, runs the step table over the arena
        got = in_c.run(dict(feeds))
    arena = in_c._programs[(("x", (600, 700), np.dtype(np.float32)),)].arena
    assert arena.nbytes >= SMALLEST  # r and s (1.6 MiB each) live at once
    assert arena.ctypes.data % HUGE_PAGE == 0 and "hg" in _vm_flags(arena.ctypes.data)
    want = -np.tanh(1 / (1 + np.exp(-np.maximum(feeds["x"], 0))))
    np.testing.assert_allclose(got[0], want, rtol=1e-6, atol=1e-6)
