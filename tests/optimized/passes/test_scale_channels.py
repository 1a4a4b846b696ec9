"""scale_channels (conv_bn_folding's weight scaling): blockwise, bit for bit the float64
product rounded once to the weights' type."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from optimized.passes._graph import scale_channels

BUFFER = np.getbufsize()  # elements numpy's ufuncs cast at a time


def whole(w, scale):
    return (w.astype(np.float64) * scale.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(0, 7), min_size=1, max_size=4),
       dtype=st.sampled_from([np.float32, np.float16, np.float64]), seed=st.integers(0, 99))
def test_scale_channels_is_the_float64_product_rounded_once(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal(shape) * 100).astype(dtype)
    scale = rng.standard_normal(shape[0]) * 3.7
    out = scale_channels(w, scale)
    assert out.dtype == w.dtype and out.shape == w.shape
    assert out.tobytes() == whole(w, scale).tobytes()


def test_scale_channels_rows_longer_and_shorter_than_a_block():
    rng = np.random.default_rng(3)
    for shape in [(3, BUFFER + 5), (2 * BUFFER + 1, 1, 1, 1), (37, 5, 3, 2)]:
        w = rng.standard_normal(shape).astype(np.float32)
        scale = rng.standard_normal(shape[0])
        assert scale_channels(w, scale).tobytes() == whole(w, scale).tobytes()
