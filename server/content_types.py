"""The media types each kind of model takes on :classify, in one place for the routes, the input decoder and
the model card."""

IMAGE_TYPES = ("image/png", "image/jpeg", "image/webp", "image/bmp", "image/gif")
TEXT_TYPES = ("text/plain",)
# Besides its own media types, :classify takes a multipart upload, raw bytes whose kind is sniffed, and an
# HTML form's text fields.
ANY_TYPES = ("multipart/form-data", "application/octet-stream", "application/x-www-form-urlencoded")
FORM_TYPES = (ANY_TYPES[0], ANY_TYPES[2])
# A text model also reads these as text, under the same charset rules as text/plain: a saved web page, a
# README, a CSV, a JSON or XML document, an e-mail. On :classify a JSON body is the document itself (the
# v1 JSON shape goes to :predict). Image models take none of them.
TEXT_LIKE_TYPES = ("text/*", "application/json", "application/xml", "message/rfc822", "*+json", "*+xml")


def is_json(media: str) -> bool:
    """application/json and its structured-syntax suffix (application/ld+json, ...)."""
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def is_text_like(media: str) -> bool:
    """A media type (lower case, no parameters) that a text model reads as text."""
    return (
        media.startswith("text/")
        or media in ("application/xml", "message/rfc822")
        or is_json(media)
        or (media.startswith("application/") and media.endswith("+xml"))
    )
