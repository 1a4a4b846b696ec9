"""The corpus loader decodes every value kind the corpora hold: tensors of every ONNX dtype,
strings, sequences, optionals (empty and full) and maps."""
import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conformance.corpus import parse_value
from reference.values import EMPTY

DTYPES = [
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
    np.float16, np.float32, np.float64, np.complex64, np.complex128,
    ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz,
    ml_dtypes.float8_e5m2, ml_dtypes.float8_e5m2fnuz, ml_dtypes.int4, ml_dtypes.uint4,
    ml_dtypes.float4_e2m1fn,
]


def _tensor_type(elem):
    return helper.make_tensor_type_proto(elem, None)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_tensor_roundtrip_every_dtype(dtype):
    values = np.array([[0, 1, 2], [3, 4, 5]]).astype(np.float32)
    if np.dtype(dtype) == np.bool_:
        values = values > 2
    array = values.astype(dtype)
    raw = numpy_helper.from_array(array, "t").SerializeToString()
    loaded = parse_value(raw, None)
    assert loaded.dtype == np.dtype(dtype)
    assert loaded.shape == (2, 3)
    if loaded.dtype.kind == "c":
        np.testing.assert_array_equal(loaded, array)
    else:
        np.testing.assert_array_equal(loaded.astype(np.float64), array.astype(np.float64))


def test_string_tensor_loads_as_text():
    raw = helper.make_tensor("s", TensorProto.STRING, [2], [b"ab", "é".encode()]).SerializeToString()
    loaded = parse_value(raw, _tensor_type(TensorProto.STRING))
    assert loaded.dtype == object and list(loaded) == ["ab", "é"]


def test_zero_dim_and_empty_tensors():
    for array in (np.float32(3.5), np.zeros((0, 4), np.int64)):
        loaded = parse_value(numpy_helper.from_array(np.asarray(array)).SerializeToString(), None)
        assert loaded.shape == np.asarray(array).shape and isinstance(loaded, np.ndarray)


def test_sequence():
    seq = [np.array([1, 2], np.int64), np.array([3], np.int64)]
    tp = helper.make_sequence_type_proto(_tensor_type(TensorProto.INT64))
    loaded = parse_value(numpy_helper.from_list(seq, "s").SerializeToString(), tp)
    assert isinstance(loaded, list) and [x.tolist() for x in loaded] == [[1, 2], [3]]


def test_optional_empty_and_full():
    tp = helper.make_optional_type_proto(_tensor_type(TensorProto.FLOAT))
    empty = numpy_helper.from_optional(None, "o", onnx.OptionalProto.TENSOR).SerializeToString()
    assert parse_value(empty, tp) is EMPTY
    full = numpy_helper.from_optional(np.array([1.5], np.float32), "o").SerializeToString()
    assert parse_value(full, tp).tolist() == [1.5]


def test_map():
    tp = helper.make_map_type_proto(TensorProto.INT64, _tensor_type(TensorProto.FLOAT))
    raw = numpy_helper.from_dict({1: np.float32(0.25), 7: np.float32(2.0)}, "m").SerializeToString()
    loaded = parse_value(raw, tp)
    assert sorted(loaded) == [1, 7] and float(loaded[7]) == 2.0
