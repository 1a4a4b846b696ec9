"""Memory of a compiled run's new outputs used again (optimized/output_memory.py): a block goes
out again only when no array the caller holds views it, so an output kept from an earlier run
never changes; a run that repeats one signature (a decode step) writes its outputs into the
memory of the outputs the caller dropped."""
from __future__ import annotations

import gc

import numpy as np
from onnx import TensorProto, helper

import optimized as ort
from optimized.output_memory import BLOCKS_PER_SIZE, LARGEST, OutputMemory


def address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_a_dropped_array_gives_its_memory_to_the_next():
    pool = OutputMemory()
    first = pool.empty("y", (3, 5), np.float32)
    held = address(first)
    del first
    taken = np.empty((3, 5), np.float32)  # the heap would give it first's memory, were it freed
    second = pool.empty("y", (3, 5), np.float32)
    assert address(second) == held and not np.may_share_memory(second, taken)
    assert second.shape == (3, 5) and second.dtype == np.float32 and second.flags.writeable


def test_an_array_or_a_view_still_held_keeps_its_memory():
    pool = OutputMemory()
    first = pool.empty("y", (4, 6), np.float32)
    first[...] = 1.0
    view = first[1:, ::2]
    del first
    second = pool.empty("y", (4, 6), np.float32)
    assert not np.may_share_memory(second, view)
    second[...] = 2.0
    assert np.all(view == 1.0)


def test_a_key_whose_size_changes_gets_new_memory():
    pool = OutputMemory()
    a = pool.empty("present", (1, 2, 7, 4), np.float32)
    del a
    b = pool.empty("present", (1, 2, 8, 4), np.float32)  # a cache one position longer
    assert b.shape == (1, 2, 8, 4)
    b[...] = 3.0
    c = pool.empty("other", (1, 2, 8, 4), np.float32)  # another key: not b's block
    assert not np.may_share_memory(b, c)


def test_past_the_kept_blocks_arrays_are_plain():
    pool = OutputMemory()
    held = [pool.empty("y", (2, 3), np.int64) for _ in range(BLOCKS_PER_SIZE + 2)]
    for i, a in enumerate(held):
        a[...] = i
    for i, a in enumerate(held):
        assert np.all(a == i)  # none shares memory with another
    big = pool.empty("big", (LARGEST // 4 + 1,), np.float32)
    assert big.base is None  # larger than the pool keeps: a plain array


def add_one_model():
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "one"], ["y"])], "add_one",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5])],
        [helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_outputs_kept_from_earlier_runs_never_change():
    session = ort.InferenceSession(add_one_model().SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = [rng.standard_normal((3, 5)).astype(np.float32) for _ in range(8)]
    kept = []
    for x in feeds:  # the first runs are noted and recorded, the later ones run compiled
        kept.append(session.run(None, {"x": x})[0])
    for x, y in zip(feeds, kept):
        np.testing.assert_array_equal(y, x + np.float32(1.0))


def test_a_repeated_run_writes_into_the_dropped_outputs_memory():
    session = ort.InferenceSession(add_one_model().SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    x = np.arange(15, dtype=np.float32).reshape(3, 5)
    for _ in range(3):  # noted, recorded and compiled
        session.run(None, {"x": x})
    y = session.run(None, {"x": x})[0]
    held = address(y)
    del y
    gc.collect()
    taken = np.empty((3, 5), np.float32)  # the heap would give it y's memory, were it freed
    again = session.run(None, {"x": x})[0]
    assert address(again) == held and not np.may_share_memory(again, taken)
    np.testing.assert_array_equal(again, x + np.float32(1.0))
