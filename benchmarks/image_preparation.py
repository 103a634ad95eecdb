"""Images prepared the way a user expects: the shipped lara-vit-fashion on t10k variants, through the server's
own preprocessing (server.preprocess.image_item), with the preparation steps of its config.json and without.

    python -m benchmarks.image_preparation [--limit N] [--threads 1]

Every t10k image is encoded as a PNG in each variant:
- clean: the image as it is (light garment on black);
- dark_on_light: 255 - x, the same garment dark on white;
- transparent_light: RGBA, white ink, alpha = x (a light garment on a transparent background);
- transparent_dark: RGBA, ink 255 - x, alpha = x (a dark garment on a transparent background);
- transparent_dark_mask: RGBA, ink 255 - x, alpha 255 on the garment's pixels (x > 0), 0 elsewhere;
- tall_28x40 / wide_40x28: x padded with black to 28 wide x 40 high / 40 wide x 28 high, centred;
- dark_tall_28x40: 255 - x padded with white to 28 x 40.
"before" is the shipped config.json without the preparation keys (what the server did until now),
"prepared" the shipped one ("prepared_without_trim": the same with trim_margins off, non-square variants). Accuracies carry Wilson 95% intervals (benchmarks.robustness.stats), with the
share answered "Bag" (the issue's symptom). `clean_identical` counts the clean images whose pixel_values
are bit for bit the same either way. Writes benchmarks/results/image_preparation.json and
image_preparation_examples.png (inputs over what the model sees).
"""

from __future__ import annotations

import argparse
import io
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from benchmarks.robustness.stats import wilson
from lara_serve.model_export.export.exporter import make_session
from lara_serve.model_export.training.data import load_fashion
from lara_serve.server.preprocess import PIXELS, image_item
from lara_serve.server.repository import ImagePreprocessing, read_config

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "model_repository" / "lara-vit-fashion"
RESULTS = ROOT / "benchmarks" / "results"
STEP_KEYS = ("background", "composite_alpha", "invert_light_background", "keep_aspect_ratio", "trim_margins")
MAX_PIXELS = 1 << 20


def _png(array: np.ndarray, mode: str | None = None) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array, mode=mode).save(buffer, format="PNG")
    return buffer.getvalue()


def _pad(x: np.ndarray, height: int, width: int, fill: int) -> np.ndarray:
    out = np.full((height, width), fill, dtype=np.uint8)
    top, left = (height - x.shape[0]) // 2, (width - x.shape[1]) // 2
    out[top : top + x.shape[0], left : left + x.shape[1]] = x
    return out


def _rgba(ink: np.ndarray, alpha: np.ndarray) -> bytes:
    return _png(np.dstack([ink, ink, ink, alpha]), "RGBA")


VARIANTS = {
    "clean": lambda x: _png(x),
    "dark_on_light": lambda x: _png(255 - x),
    "transparent_light": lambda x: _rgba(np.full_like(x, 255), x),
    "transparent_dark": lambda x: _rgba(255 - x, x),
    "transparent_dark_mask": lambda x: _rgba(255 - x, np.where(x > 0, 255, 0).astype(np.uint8)),
    "tall_28x40": lambda x: _png(_pad(x, 40, 28, 0)),
    "wide_40x28": lambda x: _png(_pad(x, 28, 40, 0)),
    "dark_tall_28x40": lambda x: _png(_pad(255 - x, 40, 28, 255)),
}


def _pixels(raws: list[bytes], prep: ImagePreprocessing) -> np.ndarray:
    return np.stack([image_item(r, prep, MAX_PIXELS).arrays[PIXELS] for r in raws])  # [N, 1, 28, 28]


class _Model:
    """The shipped ONNX graph; a prediction is kept per distinct pixel_values, since most prepared variants give
    back the clean image's exact pixels and need no second run."""

    def __init__(self, threads: int) -> None:
        self.session = make_session(MODEL / "1" / "model.onnx", threads=threads)
        self.seen: dict[bytes, int] = {}

    def __call__(self, pixels: np.ndarray, batch: int = 256) -> np.ndarray:
        keys = [p.tobytes() for p in pixels]
        todo = list({k: i for i, k in enumerate(keys) if k not in self.seen}.values())  # one run per distinct input
        for s in range(0, len(todo), batch):
            idx = todo[s : s + batch]
            pred = self.session.run(["logits"], {PIXELS: pixels[idx]})[0].argmax(1)  # [b]
            self.seen.update((keys[i], int(p)) for i, p in zip(idx, pred, strict=True))
        return np.array([self.seen[k] for k in keys])


def _row(pred: np.ndarray, labels: np.ndarray, bag: int) -> dict[str, Any]:
    return {
        "accuracy": wilson(int((pred == labels).sum()), len(labels)),
        "answered_bag": wilson(int((pred == bag).sum()), len(labels)),
    }


def run(limit: int | None, threads: int) -> dict[str, Any]:
    config = read_config(MODEL)
    prepared = config.preprocessing
    assert isinstance(prepared, ImagePreprocessing)
    before = ImagePreprocessing(**prepared.model_dump(exclude=set(STEP_KEYS)))
    no_trim = prepared.model_copy(update={"trim_margins": False})
    images, labels = load_fashion("test")
    x, y = images[:limit, 0].numpy(), labels[:limit].numpy()  # uint8 [N, 28, 28], [N]
    model = _Model(threads)
    bag = config.labels.index("Bag")
    rows: dict[str, Any] = {}
    clean_identical = None
    for name, encode in VARIANTS.items():
        start = time.perf_counter()
        raws = [encode(im) for im in x]
        p_before, p_prepared = _pixels(raws, before), _pixels(raws, prepared)
        if name == "clean":
            clean_identical = int(sum(a.tobytes() == b.tobytes() for a, b in zip(p_before, p_prepared, strict=True)))
        rows[name] = {
            "before": _row(model(p_before), y, bag),
            "prepared": _row(model(p_prepared), y, bag),
        }
        if "x" in name:  # non-square: what trimming the margins adds to keeping the aspect ratio
            rows[name]["prepared_without_trim"] = _row(model(_pixels(raws, no_trim)), y, bag)
        acc = {k: rows[name][k]["accuracy"]["value"] for k in ("before", "prepared")}
        print(
            f"{name:24s} before {acc['before']:.4f}  prepared {acc['prepared']:.4f}  ({time.perf_counter() - start:.1f} s)"
        )
    return {
        "model": config.name,
        "n": len(y),
        "split": "t10k",
        "preparation": {k: getattr(prepared, k) for k in STEP_KEYS},
        "clean_identical": clean_identical,
        "variants": rows,
        "shipped_test_accuracy": (config.model_extra or {}).get("metrics", {}).get("test_accuracy"),
    }


def examples(path: Path, n: int = 3, scale: int = 4) -> None:
    """A strip per variant: the PNG as sent (transparency over a checkerboard) above what the model sees."""
    x = load_fashion("test")[0][:n, 0].numpy()
    prep = read_config(MODEL).preprocessing
    assert isinstance(prep, ImagePreprocessing)
    cell = 40 * scale + 8
    sheet = Image.new("RGB", (cell * n * len(VARIANTS), cell * 2), (128, 128, 128))
    checker = np.indices((40 * scale, 40 * scale)).sum(0) // 8 % 2 * 60 + 160  # light grey checkerboard
    for v, encode in enumerate(VARIANTS.values()):
        for i, im in enumerate(x):
            raw = Image.open(io.BytesIO(encode(im))).convert("RGBA")
            raw = raw.resize((raw.width * scale, raw.height * scale), Image.Resampling.NEAREST)
            back = Image.fromarray(checker[: raw.height, : raw.width].astype(np.uint8)).convert("RGBA")
            shown = Image.alpha_composite(back, raw).convert("RGB")
            seen = image_item(encode(im), prep, MAX_PIXELS).arrays[PIXELS][0] * prep.std + prep.mean  # [28, 28]
            seen_img = Image.fromarray((seen.clip(0, 1) * 255).round().astype(np.uint8)).resize(
                (28 * scale, 28 * scale), Image.Resampling.NEAREST
            )
            left = (v * n + i) * cell + 4
            sheet.paste(shown, (left, 4))
            sheet.paste(seen_img, (left, cell + 4))
    sheet.save(path)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--limit", type=int, default=None, help="first N t10k images (default: all 10,000)")
    p.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads")
    p.add_argument("--out", type=Path, default=RESULTS / "image_preparation.json")
    args = p.parse_args(argv)
    start = time.perf_counter()
    result = run(args.limit, args.threads)
    result["command"] = "python -m benchmarks.image_preparation" + (f" --limit {args.limit}" if args.limit else "")
    result["wall_s"] = round(time.perf_counter() - start, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    examples(args.out.with_name("image_preparation_examples.png"))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
