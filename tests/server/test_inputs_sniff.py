"""What `lara_serve.server.inputs` takes bytes to be: image signatures (WebP too), UTF-8 text or unknown binary, and an
image (or its base64 text) sent to a text model. Each expectation is written out by hand from the formats'
published signatures, so a slip in the sniffing (a wrong offset, a lost check) changes an answer here."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from lara_serve.server.inputs import image_for_text_model, sniff


def _image(fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.new("L", (28, 28), color=128).save(buf, format=fmt)
    return buf.getvalue()


def test_webp_is_known_by_riff_and_webp_at_their_offsets() -> None:
    webp = _image("WEBP")
    assert webp[:4] == b"RIFF" and webp[8:12] == b"WEBP"
    assert sniff(webp) == "image/webp"
    # RIFF of another kind (a WAVE header, ASCII apart from its size field) is not an image.
    wave = b"RIFF\x24\x01\x00\x00WAVEfmt "
    assert sniff(wave) is None  # the size field holds NUL bytes: unknown binary
    assert sniff(b"RIFF1234WAVE and then text") == "text/plain"


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ("café au lait".encode(), "text/plain"),
        (b"caf\xe9 au lait", None),  # latin-1, not UTF-8
        (b"\xff\xfeh\x00i\x00", None),  # UTF-16 with a BOM: NUL bytes
        (b"a\x00b", None),
        (b"", "text/plain"),
    ],
)
def test_text_is_utf8_without_nul_bytes(data: bytes, expected: str | None) -> None:
    assert sniff(data) == expected


@pytest.mark.parametrize(("fmt", "media"), [("PNG", "image/png"), ("JPEG", "image/jpeg"), ("GIF", "image/gif")])
def test_an_image_sent_to_a_text_model_is_named(fmt: str, media: str) -> None:
    assert image_for_text_model(_image(fmt)) == media
    assert image_for_text_model(base64.b64encode(_image(fmt))) == f"base64 {media}"


def test_bmp_and_its_base64_are_not_taken_for_images() -> None:
    """'BM' and its base64 'Qk' begin too many texts: neither form is named an image."""
    bmp = _image("BMP")
    assert sniff(bmp) == "image/bmp"
    assert image_for_text_model(bmp) is None
    assert image_for_text_model(base64.b64encode(bmp)) is None


def test_base64_look_alikes_are_text() -> None:
    png64 = base64.b64encode(_image("PNG"))
    assert image_for_text_model(png64[:12]) is None  # a PNG's base64 start, but under 64 characters
    assert image_for_text_model(png64[:40] + b" " + png64[40:]) is None  # words, not one base64 run
    bad = png64[:11] + b"!!!!" + png64[11:]  # not base64: strict decoding refuses what lenient decoding skips
    assert image_for_text_model(bad) is None
    riff = base64.b64encode(b"RIFF\x24\x01\x00\x00WAVEfmt " + bytes(64))  # starts "UklGR" but is no image
    assert riff.startswith(b"UklGR") and image_for_text_model(riff) is None
    assert image_for_text_model(b"x" * 200) is None
    assert image_for_text_model(b"The quarterly results beat expectations.") is None
