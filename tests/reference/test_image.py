"""ImageDecoder: pixel formats on lossless encodings, undecodable streams, missing Pillow."""
import builtins
import io

import numpy as np
import pytest
from onnx import helper

from reference import ReferenceEvaluator
from reference.ops.image import image_decoder

Image = pytest.importorskip("PIL.Image")


def decode(data, **attrs):
    node = helper.make_node("ImageDecoder", ["x"], ["y"], **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", 2, data.shape)],
        [helper.make_empty_tensor_value_info("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    return ReferenceEvaluator(model, check=False).run(None, {"x": data})[0]


# 2 x 3 RGB image: red, green, blue / white, black, grey
PIXELS = np.array([[[255, 0, 0], [0, 255, 0], [0, 0, 255]],
                   [[255, 255, 255], [0, 0, 0], [128, 128, 128]]], dtype=np.uint8)


def encoded(fmt, pixels=PIXELS):
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format=fmt)
    return np.frombuffer(buf.getvalue(), dtype=np.uint8)


@pytest.mark.parametrize("fmt", ["PNG", "BMP", "PPM", "TIFF"])
def test_rgb_and_bgr(fmt):
    data = encoded(fmt)
    rgb = decode(data)
    assert rgb.dtype == np.uint8 and rgb.shape == (2, 3, 3)
    np.testing.assert_array_equal(rgb, PIXELS)
    np.testing.assert_array_equal(decode(data, pixel_format="BGR"), PIXELS[..., ::-1])


def test_grayscale_has_one_channel():
    gray = decode(encoded("PNG"), pixel_format="Grayscale")
    assert gray.shape == (2, 3, 1) and gray.dtype == np.uint8
    # white, black and grey stay what they are; ITU-R 601 luma for the primaries
    assert gray[1, :, 0].tolist() == [255, 0, 128]
    assert gray[0, :, 0].tolist() == [76, 150, 29]


def test_grayscale_source_decoded_as_rgb():
    data = encoded("PNG", PIXELS[..., 0])
    rgb = decode(data)
    assert rgb.shape == (2, 3, 3)
    np.testing.assert_array_equal(rgb, np.repeat(PIXELS[..., :1], 3, axis=-1))


def test_undecodable_stream_gives_an_empty_image():
    y = decode(np.frombuffer(b"not an image at all", dtype=np.uint8))
    assert y.dtype == np.uint8 and y.size == 0


def test_bad_pixel_format():
    with pytest.raises(Exception, match="pixel_format"):
        decode(encoded("PNG"), pixel_format="CMYK")


def test_missing_pillow_says_how_to_install_it(monkeypatch):
    data = encoded("PNG")
    real_import = builtins.__import__

    def no_pil(name, *args, **kwargs):
        if name == "PIL" or name.startswith("PIL."):
            raise ImportError("No module named 'PIL'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pil)
    with pytest.raises(ImportError, match=r"needs Pillow.*pip install Pillow"):
        image_decoder(data)
