import io

import numpy as np
import pytest
from PIL import Image

from sim.analysis.figures import encode_png


@pytest.mark.parametrize("channels, mode", [(3, "RGB"), (4, "RGBA")])
def test_encode_png_round_trips_the_pixels_and_the_resolution(channels, mode):
    rng = np.random.default_rng(7)
    pixels = rng.integers(0, 256, (5, 7, channels), dtype=np.uint8)
    data = encode_png(pixels, 100)
    image = Image.open(io.BytesIO(data))
    assert image.mode == mode and np.array_equal(np.asarray(image), pixels)
    assert image.info["dpi"] == pytest.approx((100, 100), abs=0.01)
    assert encode_png(pixels, 100) == data
    # A strided view (RGB taken out of an RGBA buffer, as save_figure does) encodes the same as a copy.
    rgba = rng.integers(0, 256, (4, 6, 4), dtype=np.uint8)
    assert encode_png(rgba[..., :3], 72) == encode_png(np.ascontiguousarray(rgba[..., :3]), 72)


def test_encode_png_refuses_what_it_cannot_store():
    with pytest.raises(ValueError, match="uint8 RGB or RGBA"):
        encode_png(np.zeros((2, 2, 3), dtype=np.float32), 100)
    with pytest.raises(ValueError, match="uint8 RGB or RGBA"):
        encode_png(np.zeros((2, 2, 2), dtype=np.uint8), 100)
