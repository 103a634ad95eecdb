"""Raw uploads -> the bytes a model takes: media types, charsets, sniffing, base64 (no HTTP objects here).

A text model takes UTF-8 text, an image model an encoded image file. Clients send them in several
wrappings: `text/plain; charset=iso-8859-1` (decoded to UTF-8 here; other text-like types such as
text/html, application/json or message/rfc822 alike), `application/octet-stream` (the
kind is sniffed from the bytes), a multipart part (its own Content-Type), or a v2 BYTES element holding
base64 (`parameters.content_type = "base64"`, the convention of KServe's and MLServer's codecs).
"""

from __future__ import annotations

import base64
import binascii
import codecs

from lara_serve.server.content_types import ANY_TYPES, IMAGE_TYPES, TEXT_LIKE_TYPES, TEXT_TYPES, is_text_like
from lara_serve.server.errors import ErrorKind, ServeError, invalid

OCTET_STREAM = "application/octet-stream"
_UTF8 = codecs.lookup("utf-8").name
# File signatures of the image formats Pillow decodes here (what `file`/libmagic would say).
_IMAGE_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"BM", "image/bmp"),
)


def parse_content_type(value: str | None) -> tuple[str, dict[str, str]]:
    """'text/plain; charset="latin-1"' -> ('text/plain', {'charset': 'latin-1'})."""
    media, *params = (value or "").split(";")
    out = {}
    for param in params:
        key, _, val = param.partition("=")
        out[key.strip().lower()] = val.strip().strip('"')
    return media.strip().lower(), out


def sniff(data: bytes) -> str | None:
    """The media type the bytes look like: an image format by its signature, else text/plain if it is
    UTF-8 without NUL bytes, else None (unknown binary)."""
    for magic, media in _IMAGE_MAGIC:
        if data.startswith(magic):
            return media
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if b"\x00" in data:
        return None
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return "text/plain"


# The first base64 characters of each signature above (BMP's "Qk" is left out: too many texts start so).
_B64_IMAGE_STARTS = (b"iVBORw0KGgo", b"/9j/", b"R0lGOD", b"UklGR")


def image_for_text_model(data: bytes) -> str | None:
    """What a text model was sent if it is an image: "image/png" for a PNG file, "base64 image/png" for
    its base64 text (a v2 `raw` string without parameters.content_type); None for anything else."""
    kind = sniff(data[:16])
    if kind is not None and kind.startswith("image/") and kind != "image/bmp":
        return kind
    if data.startswith(_B64_IMAGE_STARTS) and len(data) >= 64 and b" " not in data[:256]:
        try:
            head = base64.b64decode(data[:64], validate=True)
        except (binascii.Error, ValueError):
            return None
        kind = sniff(head)
        return f"base64 {kind}" if kind is not None and kind.startswith("image/") else None
    return None


# Python codecs that decode bytes but are no character set: escape-sequence interpreters, IDN encodings,
# and "undefined". Bytes-to-bytes codecs (base64, hex, zlib, rot13, ...) are refused by bytes.decode itself.
_NOT_CHARSETS = frozenset({"undefined", "unicode-escape", "raw-unicode-escape", "idna", "punycode"})
CHARSET_HINT = (
    "send UTF-8, or text in a character set such as iso-8859-1, windows-1252, utf-16, shift_jis or gb18030 "
    "(transforms such as base64, hex, rot13 or zlib are not character sets)"
)


def _not_a_charset(charset: str, why: str) -> ServeError:
    return ServeError(ErrorKind.UNSUPPORTED_MEDIA_TYPE, f"charset {charset[:64]!r} {why}; {CHARSET_HINT}")


def to_utf8(data: bytes, charset: str | None) -> bytes:
    """Text in a declared charset -> UTF-8 bytes (the unit the text models count and were trained on)."""
    if not charset:
        return data
    try:
        codec = codecs.lookup(charset).name
    except (LookupError, ValueError):  # ValueError: a name with NUL bytes
        raise _not_a_charset(charset, "is unknown") from None
    if codec == _UTF8:
        return data
    if codec in _NOT_CHARSETS:
        raise _not_a_charset(charset, "is not a character set")
    try:
        return data.decode(codec).encode("utf-8")
    except LookupError:  # a bytes-to-bytes or text-to-text codec: not a character set
        raise _not_a_charset(charset, "is not a character set") from None
    except UnicodeError as exc:
        where = f" (byte {exc.start})" if isinstance(exc, UnicodeDecodeError) else ""
        raise invalid(f"the text is not valid {charset[:64]}{where}") from None


def model_bytes(task: str, model_name: str, data: bytes, content_type: str | None, what: str = "the body") -> bytes:
    """One upload for a model of `task` ("text" | "image") -> its bytes, or 415 saying what is accepted."""
    media, params = parse_content_type(content_type)
    allowed = TEXT_TYPES if task == "text" else IMAGE_TYPES
    if media in ("", OCTET_STREAM):
        kind = sniff(data)
        if kind is None or kind not in allowed:
            looks = f"looks like {kind}" if kind else "is not text or a known image format"
            raise ServeError(
                ErrorKind.UNSUPPORTED_MEDIA_TYPE,
                f"{what} ({media or 'no Content-Type'}) {looks}; {task} model {model_name!r} takes {list(allowed)}",
            )
        return data
    if media not in allowed and not (task == "text" and is_text_like(media)):
        listed = [*allowed, *TEXT_LIKE_TYPES] if task == "text" else list(allowed)
        raise ServeError(
            ErrorKind.UNSUPPORTED_MEDIA_TYPE,
            f"Content-Type {content_type!r} of {what} not accepted by {task} model {model_name!r}; use one of "
            f"{[*listed, *ANY_TYPES]}",
        )
    return to_utf8(data, params.get("charset")) if task == "text" else data


def b64_elements(elements: list[bytes], input_name: str) -> list[bytes]:
    """v2 BYTES elements declared base64 -> the decoded bytes (e.g. image files sent in JSON)."""
    out = []
    for index, element in enumerate(elements):
        try:
            out.append(base64.b64decode(element, validate=True))
        except (binascii.Error, ValueError):
            raise invalid(
                f"input {input_name!r} element {index} is not valid base64 (parameters.content_type='base64')"
            ) from None
    return out
