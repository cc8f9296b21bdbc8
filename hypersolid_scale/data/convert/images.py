"""Per-image steps of the converter: PIL's decompression-bomb guard, color mode and resize, encoding."""

from __future__ import annotations

import io
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from PIL import Image

__all__ = ["ImageTooLarge", "encode_image", "pixel_limit", "prepare_image"]


class ImageTooLarge(ValueError):
    """An image whose header claims a side over --max-side (rejected before decoding)."""


@contextmanager
def pixel_limit(max_side: int) -> Iterator[None]:
    """PIL's decompression-bomb guard at max_side^2 pixels, as an error, for images the converter does not
    open itself (torchvision datasets decode inside `__getitem__`)."""
    saved = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = max_side * max_side
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            yield
    finally:
        Image.MAX_IMAGE_PIXELS = saved


def prepare_image(img: Image.Image, mode: str, resize: int | None) -> Image.Image:
    if mode != "keep":
        img = img.convert(mode)
    elif img.mode not in ("L", "RGB"):
        img = img.convert("RGB")
    if resize:
        img = img.resize((resize, resize), Image.Resampling.BICUBIC)
    return img


def encode_image(img: Image.Image, fmt: str, quality: int) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="JPEG" if fmt == "jpg" else "PNG", **({"quality": quality} if fmt == "jpg" else {}))
    return buf.getvalue()
