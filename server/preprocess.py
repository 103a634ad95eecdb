"""Turn request payloads into model items, and items into padded batches.

An `Item` is one example: the per-example arrays of every model input (no batch axis) and its length
(tokens for text, 1 for images). Collation pads a batch to its longest member, so a text's result does
not depend on what it was batched with (the models mask padding).
"""

from __future__ import annotations

import codecs
import ctypes
import functools
import io
import threading
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image, ImageOps

from lara_serve.server.errors import ServeError, invalid, malformed, too_large
from lara_serve.server.repository import ImagePreprocessing, ModelConfig, TextPreprocessing

IDS, MASK, PIXELS = "input_ids", "attention_mask", "pixel_values"


@dataclass(frozen=True)
class Item:
    arrays: dict[str, np.ndarray]  # input name -> array without batch axis: [L] for text, [C, H, W]
    length: int  # cost unit of the batcher: tokens for text, 1 for an image
    truncated: bool = False  # text only: the input was longer than max_length and was cut
    # Word-piece texts only (a byte model's positions are its bytes): the UTF-8 text the model read (after
    # truncation) and the byte offset in it where each position starts ([CLS] -1, [SEP] len + 1), so that
    # :explain can map a passage's bytes to the positions it removes.
    text: bytes | None = None
    piece_starts: np.ndarray | None = None


# -- text ----------------------------------------------------------------------------------------------

# What a truncated text keeps: its first max_length bytes, its last, or half of each (the ends of a long
# document often say most about it). `true` means "head", the usual choice of text servers.
TRUNCATION_SIDES = ("head", "tail", "head+tail")
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no", "")


def truncation_side(*values: object, default: str | None = None) -> str | None:
    """A request's `truncate` values (bool, or "head" | "tail" | "head+tail", or a query string; a body's
    before a query's) -> the first side asked for, else None (413 when too long). `default` (the model's
    config.json preprocessing.truncate) applies only when the request sets none of them: an explicit false
    keeps the 413."""
    sides = [_side(v) for v in values if v is not None]
    return next((s for s in sides if s is not None), None) if sides else default


def _side(value: object) -> str | None:
    if isinstance(value, bool):
        return "head" if value else None
    if isinstance(value, str):
        v = value.strip().lower().replace(" ", "+")  # an unescaped "+" in a query string arrives as a space
        if v in TRUNCATION_SIDES:
            return v
        if v in _TRUE:
            return "head"
        if v in _FALSE:
            return None
    # A parameter of the wrong kind is a malformed request (400), like any other bad parameter.
    raise malformed(f"truncate must be true, false, or one of {list(TRUNCATION_SIDES)}; got {value!r}")


def _too_long(what: str, n: int, limit: int) -> ServeError:
    return too_large(
        f"{what} has {n} tokens (bytes); the model takes at most {limit}. Ask for truncation with truncate="
        f"{' | '.join(TRUNCATION_SIDES)} (keep the first {limit}, the last {limit}, or half of each): "
        "?truncate=head on :classify and :predict, parameters.truncate in a JSON body, --truncate in the CLI"
    )


def cut(seq: np.ndarray, limit: int, side: str) -> np.ndarray:
    """The part of a 1-D sequence that `side` keeps when it is longer than `limit`."""
    if len(seq) <= limit:
        return seq
    if side == "head":
        return seq[:limit]
    if side == "tail":
        return seq[len(seq) - limit :]
    head = (limit + 1) // 2
    return np.concatenate([seq[:head], seq[len(seq) - (limit - head) :]])


def text_item(data: bytes, prep: TextPreprocessing, truncate: str | None) -> Item:
    """UTF-8 bytes -> byte ids (+ byte_offset); longer than max_length is 413 unless truncation is asked."""
    _check_utf8(data)
    if not data:
        raise invalid("text must not be empty")
    if prep.kind == "wordpiece":
        return _wordpiece_item(data, prep, truncate)
    if len(data) > prep.max_length and truncate is None:
        raise _too_long("text", len(data), prep.max_length)
    # Cut the bytes, then widen: a 16 MB text costs max_length int64s, not 128 MB of them.
    kept_bytes = cut(np.frombuffer(data, dtype=np.uint8), prep.max_length, truncate or "head")  # [L]
    kept = kept_bytes.astype(np.int64) + prep.byte_offset  # the byte model reads bytes: a cut mid-character is fine
    return Item({IDS: kept, MASK: np.ones_like(kept)}, length=len(kept), truncated=len(kept) < len(data))


@functools.lru_cache(maxsize=16)
def wordpiece_tokenizer(path: str) -> Any:
    """A tokenizers.Tokenizer from a model folder's file, loaded once; its own padding and truncation are
    switched off (the batcher pads, and a long text is the server's to refuse or cut)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(path)
    tok.no_truncation()
    tok.no_padding()
    return tok


def _wordpiece_item(data: bytes, prep: TextPreprocessing, truncate: str | None) -> Item:
    """[CLS] + the text's word pieces + [SEP]; more than max_length pieces is 413 unless truncation is asked
    (then the pieces are cut as the bytes of a byte model are, the special pieces kept)."""
    assert prep.tokenizer is not None  # read_config checks it
    tok = wordpiece_tokenizer(prep.tokenizer)
    text = data.decode("utf-8")
    enc = tok.encode(text, add_special_tokens=False)
    pieces = np.asarray(enc.ids, dtype=np.int64)
    if not len(pieces):
        raise invalid("text has no word pieces (only spaces or control characters)")
    if len(pieces) + 2 > prep.max_length and truncate is None:
        raise _too_long("text", len(pieces) + 2, prep.max_length)
    keep = cut(np.arange(len(pieces)), prep.max_length - 2, truncate or "head")  # [K] piece indices
    doc, starts = _kept_text(data, *_byte_spans(data, text, enc.offsets), keep)
    ids = np.concatenate(([tok.token_to_id("[CLS]")], pieces[keep], [tok.token_to_id("[SEP]")])).astype(np.int64)
    starts = np.concatenate(([-1], starts, [len(doc) + 1]))
    return Item({IDS: ids, MASK: np.ones_like(ids)}, len(ids), len(keep) < len(pieces), text=doc, piece_starts=starts)


def _byte_spans(data: bytes, text: str, offsets: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """The tokenizer's character offsets as UTF-8 byte offsets ([P] starts, [P] ends)."""
    chars = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    if data.isascii():
        return chars[:, 0], chars[:, 1]
    code = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    width = 1 + (code >= 0x80).astype(np.int64) + (code >= 0x800) + (code >= 0x10000)  # UTF-8 bytes per char
    at = np.concatenate(([0], np.cumsum(width)))  # byte offset of each character, and the end
    return at[chars[:, 0]], at[chars[:, 1]]


def _kept_text(data: bytes, starts: np.ndarray, ends: np.ndarray, keep: np.ndarray) -> tuple[bytes, np.ndarray]:
    """The bytes the kept pieces cover (one or two stretches: head, tail, or head+tail) and each kept piece's
    start in them. A whole text is its own bytes."""
    if len(keep) == len(starts):
        return data, starts
    breaks = np.flatnonzero(np.diff(keep) > 1) + 1
    doc, out, at = b"", [], 0
    for seg in np.split(keep, breaks):
        lo = 0 if seg[0] == 0 else int(starts[seg[0]])
        hi = len(data) if seg[-1] == len(starts) - 1 else int(ends[seg[-1]])
        doc += data[lo:hi]
        out.append(starts[seg] - lo + at)
        at += hi - lo
    return doc, np.concatenate(out)


_UTF8_CHUNK = 1 << 20


def _check_utf8(data: bytes) -> None:
    """Valid UTF-8, checked a MiB at a time: a 16 MB text never becomes one (up to 64 MB) str."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    view = memoryview(data)
    for start in range(0, len(data), _UTF8_CHUNK):
        try:
            decoder.decode(view[start : start + _UTF8_CHUNK], final=False)
        except UnicodeDecodeError as exc:  # exc.start may count bytes held over from the last chunk
            raise invalid(f"text must be UTF-8: {exc.reason} near byte {max(0, start + exc.start - 3)}") from None
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise invalid("text must be UTF-8: it ends inside a multi-byte character") from None


def text_items_from_tensors(tensors: dict[str, np.ndarray], config: ModelConfig, truncate: str | None) -> list[Item]:
    """Pre-tokenized `input_ids` [B, L] (+ optional `attention_mask` [B, L], 1 = real token)."""
    prep = config.preprocessing
    assert isinstance(prep, TextPreprocessing)
    ids = tensors[IDS]
    mask = tensors.get(MASK)
    if mask is None:
        mask = np.ones_like(ids)
    if ids.ndim != 2 or mask.shape != ids.shape:
        raise invalid(f"{IDS} and {MASK} must both be [batch, length]; got {ids.shape} and {mask.shape}")
    if ids.shape[1] == 0:
        raise invalid(f"{IDS} must have length >= 1")
    if ids.size and (ids.min() < 0 or ids.max() >= config.vocab_size):
        raise invalid(f"{IDS} must be in [0, {config.vocab_size}); got [{ids.min()}, {ids.max()}]")
    if not np.isin(mask, (0, 1)).all():
        raise invalid(f"{MASK} must hold only 0 and 1")
    if not mask.any(axis=1).all():
        raise invalid(f"every row of {MASK} needs at least one 1 (a real token)")
    # A row's trailing padding is dropped so its cost and padded length match the raw-text path; the limit
    # applies to what is left.
    items = []
    for row_ids, row_mask in zip(ids, mask, strict=True):
        last = int(np.flatnonzero(row_mask)[-1]) + 1
        if last > prep.max_length and truncate is None:
            raise _too_long(f"a row of {IDS}", last, prep.max_length)
        kept_ids = cut(row_ids[:last], prep.max_length, truncate or "head").copy()
        kept_mask = cut(row_mask[:last], prep.max_length, truncate or "head").copy()
        items.append(Item({IDS: kept_ids, MASK: kept_mask}, length=len(kept_ids), truncated=len(kept_ids) < last))
    return items


# -- images --------------------------------------------------------------------------------------------

# The one allow-list of image formats, for every route (Pillow names). Others (TIFF, EPS, PSD, ...) are
# refused before Pillow parses more than the magic bytes: they add parser surface, not value.
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "BMP", "GIF")


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim  # type: ignore[no-any-return]
    except (OSError, AttributeError):  # not glibc: nothing to trim
        return None


_MALLOC_TRIM = _malloc_trim()
_TRIM_PIXELS = 1 << 20  # decodes this large leave buffers worth handing back to the OS


def release_free_memory() -> None:
    """Hand the allocator's free memory back to the OS (glibc malloc_trim; a no-op elsewhere)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


class DecodeBudget:
    """Pixels being decoded at once, over all threads. A decode waits until its pixels fit, so a burst of
    large images costs at most `capacity` pixels of decode buffers instead of one image per thread.
    Decodes run on `executor`, `threads` at most at once (ServedModel.items_from_bytes gives each request
    one decode at a time, so a 150-file upload cannot queue ahead of everyone else).

    glibc keeps a freed decode buffer in the arena of the thread that decoded it, so without a trim each
    decoding thread would hold its largest image for good (measured: 32 concurrent 4096x4096 PNGs add
    ~480 MiB with or without the budget); after a large decode the budget hands free memory back."""

    def __init__(self, capacity: int, threads: int = 2) -> None:
        self.capacity = capacity
        self._in_use = 0
        self._free = threading.Condition()
        self._threads = threads
        self._executor: ThreadPoolExecutor | None = None

    @property
    def executor(self) -> ThreadPoolExecutor:
        if self._executor is None:  # on first use: an app that never decodes an image starts no threads
            self._executor = ThreadPoolExecutor(self._threads, thread_name_prefix="lara-decode")
        return self._executor

    def acquire(self, pixels: int) -> int:
        pixels = min(pixels, self.capacity)  # one image larger than the budget runs alone
        with self._free:
            self._free.wait_for(lambda: self._in_use + pixels <= self.capacity)
            self._in_use += pixels
        return pixels

    def release(self, pixels: int) -> None:
        with self._free:
            self._in_use -= pixels
            self._free.notify_all()
        if pixels >= _TRIM_PIXELS and _MALLOC_TRIM is not None:
            _MALLOC_TRIM(0)


# -- image preparation: a user's picture in the training convention -----------------------------------

_MID_GREY = 127.5  # a grey level above this is "light"


def prepare_image(image: Image.Image, prep: ImagePreprocessing) -> Image.Image:
    """A decoded image -> the model's mode ("L" is Pillow's ITU-R 601-2 luma) and height x width.

    The steps config.json turns on bring a user's picture to the training convention: transparent pixels
    composited onto the background, a light background inverted, surplus margins trimmed, the aspect ratio
    kept by padding with the background. Without those keys: convert and stretch, as always. An image already in the convention
    (28x28 greyscale, light on black, for Fashion-MNIST) passes unchanged, bit for bit.
    """
    mode = "L" if prep.channels == 1 else "RGB"
    if prep.composite_alpha and image.has_transparency_data:
        image = _composite(image, mode, prep.background)
    else:
        image = image.convert(mode)  # Pillow drops an alpha channel here: what was behind it shows
    if prep.invert_light_background and _on_other_side(_border_median(image), prep.background):
        image = ImageOps.invert(image)
    if prep.trim_margins:
        image = _trim(image, prep.width / prep.height, prep.background)
    if prep.keep_aspect_ratio:
        return _fit(image, prep.width, prep.height, prep.background)
    return image.resize((prep.width, prep.height), Image.Resampling.BILINEAR)


def _on_other_side(level: float, background: int) -> bool:
    return (level > _MID_GREY) != (background > _MID_GREY)


def _composite(image: Image.Image, mode: str, background: int) -> Image.Image:
    """Transparent pixels -> the background grey level. When the visible pixels are themselves on the
    background's side of mid-grey (a dark drawing on transparency, for a black background), they are
    composited onto the opposite level instead, so they stay visible and the light-background step turns
    the result into the training convention."""
    rgba = image.convert("RGBA")
    alpha = np.asarray(rgba.getchannel("A"), dtype=np.uint16)  # [H, W]
    colour = np.asarray(rgba.convert(mode), dtype=np.uint16).reshape(*alpha.shape, -1)  # [H, W, C]
    luma = colour[..., 0] if mode == "L" else np.asarray(rgba.convert("L"), dtype=np.uint16)  # [H, W]
    weight = float(alpha.sum(dtype=np.float64))
    if weight > 0:
        seen = float((luma.astype(np.float32) * alpha).sum(dtype=np.float64)) / weight  # alpha-weighted mean
        if not _on_other_side(seen, background):
            background = 255 - background
    a = alpha[..., None]  # [H, W, 1]
    # Integer "over" with rounding: 255 * 255 + 127 fits uint16, and an opaque pixel keeps its value exactly.
    out = (colour * a + np.uint16(background) * (255 - a) + 127) // 255  # [H, W, C]
    return Image.fromarray(out.astype(np.uint8).squeeze(-1) if mode == "L" else out.astype(np.uint8), mode)


def _border_median(image: Image.Image) -> float:
    """Median grey level of the one-pixel frame: the background of a centred object."""
    grey = np.asarray(image if image.mode == "L" else image.convert("L"))  # [H, W]
    frame = np.concatenate([grey[0], grey[-1], grey[1:-1, 0], grey[1:-1, -1]])  # [2W + 2H - 4]
    return float(np.median(frame))


_CONTENT_LEVEL = 32  # a pixel further than this from the background is part of the object (JPEG noise is not)


def _trim(image: Image.Image, aspect: float, background: int) -> Image.Image:
    """Cut background off the longer side, down to the model's aspect ratio (width / height) at most, keeping
    the object centred: a garment in a tall photo then fills the frame as the training images' garments do.
    An image already of the model's shape (any 28x28) is never cut."""
    width, height = image.size
    grey = np.asarray(image if image.mode == "L" else image.convert("L"), dtype=np.int16)  # [H, W]
    content = np.abs(grey - background) > _CONTENT_LEVEL  # [H, W]
    tall = width < height * aspect  # cut rows; else columns
    size, keep = (height, round(width / aspect)) if tall else (width, round(height * aspect))
    lines = np.flatnonzero(content.any(axis=1 if tall else 0))  # rows (columns) holding the object
    if lines.size == 0 or keep >= size:
        return image
    span = max(keep, 1, int(lines[-1] - lines[0] + 1))
    start = min(max(int(lines[0] + lines[-1] + 1 - span) // 2, 0), size - span)  # centred on the object
    return image.crop((0, start, width, start + span) if tall else (start, 0, start + span, height))


def _fit(image: Image.Image, width: int, height: int, background: int) -> Image.Image:
    """Resize to fit inside width x height keeping the aspect ratio, centred on a background canvas.
    Resizing before padding keeps the canvas small whatever the input's shape (a 1 x 10^6 strip)."""
    scale = min(width / image.width, height / image.height)
    size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    fitted = image.resize(size, Image.Resampling.BILINEAR)
    if size == (width, height):
        return fitted
    fill = background if image.mode == "L" else (background,) * 3
    canvas = Image.new(image.mode, (width, height), fill)
    canvas.paste(fitted, ((width - size[0]) // 2, (height - size[1]) // 2))
    return canvas


# The fewest bytes a JPEG of W x H pixels can have: 1/8 bit per 8x8 block, 16x below the smallest real
# one measured (a uniform progressive JPEG, 2 bits per block). libjpeg fills missing scan data with grey
# and Pillow cannot tell, so a cut file that still ends in an EOI marker would otherwise be classified.
_JPEG_MIN_BYTES_PER_PIXEL = 1 / 4096


def image_item(data: bytes, prep: ImagePreprocessing, max_pixels: int, budget: DecodeBudget | None = None) -> Item:
    """Encoded image -> prepare_image (grayscale or RGB, bilinear resize), [0, 1], (x - mean) / std as
    [C, H, W] float32."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)
            width, height = image.size  # read from the header: nothing decoded yet
            if width * height > max_pixels:
                raise too_large(f"image has {width}x{height} pixels; at most {max_pixels} are allowed")
            if image.format == "JPEG" and len(data) < width * height * _JPEG_MIN_BYTES_PER_PIXEL:
                size = f"{width}x{height}"
                raise invalid(f"the JPEG has {len(data)} bytes, too few for {size} pixels: it is truncated")
            held = budget.acquire(width * height) if budget is not None else 0
            try:
                image = prepare_image(image, prep)
            finally:
                if budget is not None:
                    budget.release(held)
    except ServeError:
        raise
    except (Image.DecompressionBombWarning, Image.DecompressionBombError):
        raise too_large(f"the image declares more pixels than allowed (at most {max_pixels})") from None
    except Image.UnidentifiedImageError:
        raise invalid(f"cannot decode the data as an image; send one of {', '.join(IMAGE_FORMATS)}") from None
    except Exception as exc:  # Pillow raises many types for corrupt data; its messages may hold reprs
        if "decompressed data too large" in str(exc).lower():  # a zlib bomb in PNG metadata chunks
            raise too_large("the image's compressed metadata expands beyond Pillow's safety limit") from None
        raise invalid(
            f"cannot decode the image ({type(exc).__name__}); send a valid " + "/".join(IMAGE_FORMATS)
        ) from None
    pixels = np.asarray(image, dtype=np.float32).reshape(prep.height, prep.width, -1) / 255.0  # [H, W, C]
    pixels = (pixels - np.float32(prep.mean)) / np.float32(prep.std)
    return Item({PIXELS: np.ascontiguousarray(pixels.transpose(2, 0, 1), dtype=np.float32)}, length=1)  # [C, H, W]


def image_items_from_tensors(tensors: dict[str, np.ndarray], config: ModelConfig) -> list[Item]:
    prep = config.preprocessing
    assert isinstance(prep, ImagePreprocessing)
    pixels = tensors[PIXELS]
    expected = (prep.channels, prep.height, prep.width)
    if pixels.ndim != 4 or tuple(pixels.shape[1:]) != expected:
        raise invalid(f"{PIXELS} must be [batch, {', '.join(map(str, expected))}]; got {list(pixels.shape)}")
    if not np.isfinite(pixels).all():
        raise invalid(f"{PIXELS} must be finite (no NaN or Inf)")
    return [Item({PIXELS: np.ascontiguousarray(p, dtype=np.float32)}, length=1) for p in pixels]


# -- batches -------------------------------------------------------------------------------------------


def collate(items: Sequence[Item], config: ModelConfig) -> dict[str, np.ndarray]:
    """Stack items into backend inputs; text is right-padded to the longest item (mask 0 on padding)."""
    if isinstance(config.preprocessing, ImagePreprocessing):
        return {PIXELS: np.stack([it.arrays[PIXELS] for it in items])}  # [B, C, H, W]
    longest = max(it.arrays[IDS].shape[0] for it in items)
    ids = np.full((len(items), longest), config.preprocessing.pad_id, dtype=np.int64)  # [B, L]
    mask = np.zeros((len(items), longest), dtype=np.int64)  # [B, L]
    for row, it in enumerate(items):
        n = it.arrays[IDS].shape[0]
        ids[row, :n] = it.arrays[IDS]
        mask[row, :n] = it.arrays[MASK]
    return {IDS: ids, MASK: mask}


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float64, returned as float32: same logits row -> same bits, whatever B is."""
    z = logits.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):  # Inf logits give NaN rows, refused by ServedModel
        z = np.exp(z - z.max(axis=-1, keepdims=True))
        return (z / z.sum(axis=-1, keepdims=True)).astype(np.float32)
