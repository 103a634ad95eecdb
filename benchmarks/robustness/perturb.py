"""The suite's perturbations: label-preserving changes of an article, filler placement, image transforms.

Kept apart from `lara_serve.model_export.training.augment` (training's perturbations) on purpose: the markup, the typo model
(keyboard neighbours) and the filler placement here are not the ones training saw, so the suite measures
robustness to a class of change, not recall of one recipe. The mechanics they share (the typo loop, word
wrapping) are augment's functions, written once.
"""

from __future__ import annotations

import io
import random
import re

import numpy as np

from lara_serve.model_export.training.augment import typo_text, wrap_words

SEP = b"\n\n"
POSITIONS = ("append", "prepend", "interleave")
TEXT_VARIANTS = ("upper", "lower", "title", "ws_collapse", "ws_wrap", "markup", "typos")
_KEYBOARD = ["qwertyuiop", "asdfghjkl", "zxcvbnm"]


def _neighbours(c: str) -> str:
    """Letters beside `c` on a QWERTY keyboard (the likeliest wrong key)."""
    for row in _KEYBOARD:
        i = row.find(c.lower())
        if i >= 0:
            near = row[max(0, i - 1) : i] + row[i + 1 : i + 2]
            return near.upper() if c.isupper() else near
    return c


def typos(text: str, rng: random.Random, rate: float = 0.02) -> str:
    """Each letter, with probability `rate`: swapped with the next character, dropped, doubled, or replaced
    by a keyboard neighbour."""
    return typo_text(text, rng, rate, lambda c: rng.choice(_neighbours(c)), draw_always=True)


def wrap(text: str, width: int = 64) -> str:
    """Hard-wrapped at `width` columns (an e-mail's body), blank lines between paragraphs kept."""
    return "\n\n".join("\n".join(wrap_words(para.split(), width)) for para in re.split(r"\n\s*\n|\n", text))


def html_page(text: str) -> str:
    """The article as a saved web page: head, title, paragraphs in <p>, line breaks as <br/>."""
    paras = [p.strip() for p in text.split("\n") if p.strip()]
    title = paras[0][:80] if paras else ""
    body = "\n".join(f'    <p class="body-text">{p}<br/></p>' for p in paras[1:])
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n  <meta charset="utf-8"/>\n'
        f'  <meta name="viewport" content="width=device-width"/>\n  <title>{title}</title>\n</head>\n'
        f'<body>\n  <main id="content">\n    <h1 class="headline">{title}</h1>\n{body}\n  </main>\n</body>\n</html>\n'
    )


def text_variant(raw: bytes, name: str, rng: random.Random) -> bytes:
    """One of TEXT_VARIANTS applied to an article's bytes."""
    text = raw.decode("utf-8", errors="ignore")
    fns = {
        "upper": str.upper,
        "lower": str.lower,
        "title": str.title,
        "ws_collapse": lambda t: " ".join(t.split()),
        "ws_wrap": wrap,
        "markup": html_page,
        "typos": lambda t: typos(t, rng),
    }
    if name not in fns:
        raise ValueError(f"unknown text variant {name!r}; allowed: {', '.join(TEXT_VARIANTS)}")
    return fns[name](text).encode("utf-8")


def _paragraph_cuts(article: bytes) -> list[int]:
    """Byte offsets just after each paragraph break (or sentence end, for a one-paragraph article)."""
    cuts = [m.end() for m in re.finditer(rb"\n+", article) if 0 < m.end() < len(article)]
    if not cuts:
        cuts = [m.end() for m in re.finditer(rb"[.!?] ", article) if m.end() < len(article)]
    return cuts


def place_filler(article: bytes, filler: bytes, position: str) -> bytes:
    """append: article, blank line, filler; prepend: the reverse; interleave: the filler cut into equal runs
    placed between the article's paragraphs (each run after a paragraph break), so the article is read in
    pieces separated by unrelated text. Without a break in the article the filler is appended."""
    if position == "append":
        return article + SEP + filler
    if position == "prepend":
        return filler + SEP + article
    if position != "interleave":
        raise ValueError(f"position must be one of {', '.join(POSITIONS)}, got {position!r}")
    cuts = _paragraph_cuts(article)
    if not cuts:
        return article + SEP + filler
    step = len(filler) / len(cuts)
    runs = [filler[round(i * step) : round((i + 1) * step)] for i in range(len(cuts))]
    out, prev = [], 0
    for cut, run in zip(cuts, runs, strict=True):
        out += [article[prev:cut], run, SEP]
        prev = cut
    out.append(article[prev:])
    return b"".join(out)


# -- images: uint8 [N, 28, 28] in, uint8 [N, 28, 28] out ------------------------------------------------


def shift(x: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Each image moved k pixels up, down, left or right (seeded per image), zeros shifted in."""
    out = np.zeros_like(x)
    for i, d in enumerate(rng.integers(0, 4, len(x))):
        dy, dx = [(-k, 0), (k, 0), (0, -k), (0, k)][d]
        h, w = x.shape[1:]
        out[i, max(dy, 0) : h + min(dy, 0), max(dx, 0) : w + min(dx, 0)] = x[
            i, max(-dy, 0) : h + min(-dy, 0), max(-dx, 0) : w + min(-dx, 0)
        ]
    return out


def rotate(x: np.ndarray, degrees: float, rng: np.random.Generator) -> np.ndarray:
    """Each image rotated by +-degrees (sign seeded per image) about its centre, bilinear, zeros outside."""
    from scipy.ndimage import rotate as nd_rotate

    signs = rng.choice([-1.0, 1.0], len(x))
    return np.stack(
        [
            np.clip(nd_rotate(img.astype(np.float32), s * degrees, reshape=False, order=1), 0, 255)
            for img, s in zip(x, signs, strict=True)
        ]
    ).astype(np.uint8)


def jpeg(x: np.ndarray, quality: int) -> np.ndarray:
    """Each image saved as a JPEG at `quality` and decoded again (blocking and ringing artefacts)."""
    from PIL import Image

    out = np.empty_like(x)
    for i, img in enumerate(x):
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG", quality=quality)
        out[i] = np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("L"))
    return out


def gaussian_noise(x: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """Additive gaussian noise of `sigma` grey levels (0-255 scale), clipped."""
    return np.clip(x.astype(np.float32) + rng.normal(0.0, sigma, x.shape), 0, 255).astype(np.uint8)


def upscale_digits(images: np.ndarray) -> np.ndarray:
    """sklearn's 8x8 digits (0-16) -> 28x28 uint8: scaled to 20x20 (bilinear) and centred, as MNIST is."""
    from PIL import Image

    out = np.zeros((len(images), 28, 28), dtype=np.uint8)
    for i, img in enumerate(images):
        small = Image.fromarray((img * (255.0 / 16.0)).astype(np.uint8)).resize((20, 20), Image.BILINEAR)
        out[i, 4:24, 4:24] = np.asarray(small)
    return out


# Photometric corruptions. Their code is the suite's own (Pillow's enhancers, scipy's filter), not the training
# recipe's (lara_serve.model_export.training.augment_image), so a model is measured on the change, not on the recipe.


def contrast(x: np.ndarray, factor: float) -> np.ndarray:
    """Pillow's ImageEnhance.Contrast: each image's levels scaled by `factor` about its mean grey level."""
    from PIL import Image, ImageEnhance

    return np.stack([np.asarray(ImageEnhance.Contrast(Image.fromarray(img)).enhance(factor)) for img in x])


def scale(x: np.ndarray, factor: float) -> np.ndarray:
    """Every level multiplied by `factor` (a dimmer exposure: the black background stays black), rounded."""
    return np.clip(np.rint(x.astype(np.float32) * factor), 0, 255).astype(np.uint8)


def brightness(x: np.ndarray, delta: int) -> np.ndarray:
    """`delta` grey levels added to every pixel, clipped to 0-255 (the background lifts to `delta`)."""
    return np.clip(x.astype(np.int16) + delta, 0, 255).astype(np.uint8)


def gamma(x: np.ndarray, g: float) -> np.ndarray:
    """255 * (x / 255) ** g, rounded: g < 1 lifts the dark levels, g > 1 sinks them."""
    return np.clip(np.rint(255.0 * (x / 255.0) ** g), 0, 255).astype(np.uint8)


def blur(x: np.ndarray, sigma: float) -> np.ndarray:
    """Gaussian blur of `sigma` pixels (scipy.ndimage.gaussian_filter, reflected edges), rounded."""
    from scipy.ndimage import gaussian_filter

    out = np.stack([gaussian_filter(img.astype(np.float32), sigma) for img in x])
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)
