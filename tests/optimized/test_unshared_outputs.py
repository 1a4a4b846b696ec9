"""feeds.unshared_outputs: an output is copied exactly when np.may_share_memory finds it
sharing a feed's memory (or when it is read-only or repeats another output), whatever owns that
memory: a numpy array, a view of one, or a buffer numpy does not own."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from optimized.feeds import unshared_outputs


def copied(output, feeds) -> bool:
    return unshared_outputs([output], feeds)[0] is not output


def test_a_view_of_a_feed_is_copied_and_a_fresh_array_is_not():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    assert copied(x[1], {"x": x})
    assert copied(x, {"x": x[:, 1]})  # the feed is the view
    assert not copied(np.zeros(3, np.float32), {"x": x})


def test_memory_numpy_does_not_own_is_still_seen():
    x = np.arange(12, dtype=np.float32)
    through_a_buffer = np.frombuffer(memoryview(x), np.float32)  # its base is no ndarray
    assert copied(x, {"x": through_a_buffer})
    assert copied(through_a_buffer, {"x": x})
    assert copied(through_a_buffer[2:], {"x": np.frombuffer(memoryview(x), np.float32)[:4]})


def test_read_only_and_repeated_outputs_are_copied():
    x = np.zeros(3, np.float32)
    frozen = np.ones(3, np.float32)
    frozen.flags.writeable = False
    out = unshared_outputs([x, x, frozen], {})
    assert out[0] is x and out[1] is not x and out[2] is not frozen
    np.testing.assert_array_equal(out[1], x)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 11), st.integers(0, 12), st.integers(1, 3), st.integers(0, 11),
       st.integers(0, 12), st.integers(1, 3), st.booleans(), st.booleans())
def test_copied_exactly_where_may_share_memory_says(a0, a1, astep, b0, b1, bstep, foreign_a,
                                                     foreign_b):
    base = np.arange(12, dtype=np.float32)
    a_source = np.frombuffer(memoryview(base), np.float32) if foreign_a else base
    b_source = np.frombuffer(memoryview(base), np.float32) if foreign_b else base
    a, b = a_source[a0:a1:astep], b_source[b0:b1:bstep][::-1]
    assert copied(a, {"b": b}) == np.may_share_memory(a, b)


@pytest.mark.parametrize("shape", [(0,), (2, 0)])
def test_an_empty_output_shares_nothing(shape):
    x = np.zeros(4, np.float32)
    assert not copied(x[:0].reshape(shape), {"x": x})
