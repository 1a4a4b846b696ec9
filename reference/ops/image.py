"""Image decoding: ImageDecoder (decodes through Pillow, a dependency)."""
from __future__ import annotations

import io

import numpy as np

from ..registry import op

_CHANNELS = {"RGB": 3, "BGR": 3, "Grayscale": 1}


@op("ImageDecoder", 20)
def image_decoder(encoded_stream, *, pixel_format="RGB"):
    if pixel_format not in _CHANNELS:
        raise ValueError(f"pixel_format must be RGB, BGR or Grayscale, got {pixel_format!r}")
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError as e:
        raise ImportError("ImageDecoder needs Pillow, which onnx-parity depends on: pip install Pillow") from e
    data = np.ascontiguousarray(encoded_stream, dtype=np.uint8).tobytes()
    try:
        with Image.open(io.BytesIO(data)) as image:
            decoded = np.asarray(image.convert("L" if pixel_format == "Grayscale" else "RGB"))
    except (UnidentifiedImageError, OSError, ValueError):
        # the spec: a stream that cannot be decoded gives an empty matrix
        return np.zeros((0, 0, _CHANNELS[pixel_format]), dtype=np.uint8)
    if pixel_format == "Grayscale":
        return decoded[..., None].copy()
    if pixel_format == "BGR":
        decoded = decoded[..., ::-1]
    return np.ascontiguousarray(decoded)
