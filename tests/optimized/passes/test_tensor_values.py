"""The passes' fast constant readers and writers agree with onnx's numpy_helper."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from optimized.passes._graph import initializer, tensor_values

DTYPES = [np.float32, np.float64, np.float16, np.int8, np.int16, np.int32, np.int64, np.uint8,
          np.uint16, np.uint32, np.uint64, np.bool_]
SHAPES = [(), (0,), (3,), (2, 3, 5)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_tensor_values_reads_raw_and_typed_fields_as_to_array(dtype, shape):
    values = (np.random.default_rng(1).standard_normal(shape) * 50).astype(dtype)
    raw = numpy_helper.from_array(values, "w")
    typed = helper.make_tensor("w", helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape,
                               values.reshape(-1).tolist())
    for tensor in (raw, typed):
        got, expected = tensor_values(tensor), numpy_helper.to_array(tensor)
        assert got.dtype == expected.dtype and got.shape == expected.shape
        np.testing.assert_array_equal(got, expected)
        assert got.flags.writeable


def test_tensor_values_lets_to_array_name_a_wrong_element_count():
    tensor = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[2, 3], float_data=[1, 2])
    with pytest.raises(ValueError, match="reshape"):
        tensor_values(tensor)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_small_initializer_is_what_from_array_makes(dtype, shape):
    values = (np.random.default_rng(2).standard_normal(shape) * 50).astype(dtype)
    assert initializer("w", values).SerializeToString() == numpy_helper.from_array(
        values, "w").SerializeToString()
    strided = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]
    assert initializer("s", strided).SerializeToString() == numpy_helper.from_array(
        strided, "s").SerializeToString()
