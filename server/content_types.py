"""The media types each kind of model takes on :classify, in one place for the routes, the input decoder and
the model card."""

IMAGE_TYPES = ("image/png", "image/jpeg", "image/webp", "image/bmp", "image/gif")
TEXT_TYPES = ("text/plain",)
# Besides its own media types, :classify takes a multipart upload, raw bytes whose kind is sniffed, and an
# HTML form's text fields.
ANY_TYPES = ("multipart/form-data", "application/octet-stream", "application/x-www-form-urlencoded")
FORM_TYPES = (ANY_TYPES[0], ANY_TYPES[2])
