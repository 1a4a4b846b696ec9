"""Experimental ops of old onnx releases (1.2-1.4), which the opset 7-9 corpora still use.

The installed onnx no longer has their schemas, so every attribute default is written here.
Their specs are the `onnx/defs/experiments/defs.cc` texts shipped in those releases' wheels.
"""
import numpy as np

from ..dtypes import np_dtype
from ..registry import lookup, op


def _later(op_type: str, opset: int):
    return lookup("", op_type, opset).fn


@op("ThresholdedRelu", 1)
def thresholded_relu_experimental(x, *, alpha=1.0):
    return _later("ThresholdedRelu", 10)(x, alpha=alpha)


@op("MeanVarianceNormalization", 8)
def mean_variance_normalization_experimental(x, *, axes=(0, 2, 3)):
    """onnx 1.3's experimental function; the same body as MeanVarianceNormalization-9."""
    return _later("MeanVarianceNormalization", 9)(x, axes=list(axes))


@op("DynamicSlice", 1)
def dynamic_slice(data, starts, ends, axes=None):
    """Slice-10 without steps."""
    return _later("Slice", 10)(data, starts, ends, axes)


@op("ConstantFill", 1)
def constant_fill(input=None, *, dtype=1, extra_shape=(), input_as_shape=0, shape=(), value=0.0):
    """A tensor of `value` in `dtype`; its shape is the input's values (input_as_shape=1), the
    input's shape, or the `shape` attribute, followed by `extra_shape`."""
    if input is None:
        base = list(shape)
    elif input_as_shape:
        base = [int(d) for d in np.asarray(input).reshape(-1)]
    else:
        base = list(np.shape(input))
    return np.full(base + list(extra_shape), value, dtype=np_dtype(dtype))


@op("GivenTensorFill", 1)
def given_tensor_fill(shape_input=None, *, extra_shape=(), input_as_shape=0, shape=(), values=()):
    if shape_input is None:
        base = list(shape)
    elif input_as_shape:
        base = [int(d) for d in np.asarray(shape_input).reshape(-1)]
    else:
        base = list(np.shape(shape_input))
    return np.asarray(values, dtype=np.float32).reshape(base + list(extra_shape))


@op("Affine", 1)
def affine(x, *, alpha=1.0, beta=0.0):
    return (alpha * x + beta).astype(x.dtype)


@op("ScaledTanh", 1)
def scaled_tanh(x, *, alpha=1.0, beta=1.0):
    return (alpha * np.tanh(beta * x)).astype(x.dtype)


@op("ParametricSoftplus", 1)
def parametric_softplus(x, *, alpha=1.0, beta=1.0):
    return (alpha * np.logaddexp(0, beta * x)).astype(x.dtype)


@op("Scale", 1)
def scale(x, *, scale=1.0):
    return (scale * x).astype(x.dtype)


@op("ImageScaler", 1)
def image_scaler(x, *, bias=None, scale=1.0):
    """scale * x + bias[c] on an NCHW image."""
    y = scale * x
    if bias is not None:
        y = y + np.asarray(bias, dtype=x.dtype).reshape(1, -1, 1, 1)
    return y.astype(x.dtype)


@op("Crop", 1)
def crop(x, *, border=(0, 0, 0, 0), scale=None):
    """NCHW crop: `scale` (height, width) from the left/top border, else cut all four borders."""
    left, top, right, bottom = border
    height, width = x.shape[2:]
    if scale is not None:
        return x[:, :, top : top + scale[0], left : left + scale[1]]
    return x[:, :, top : height - bottom, left : width - right]
