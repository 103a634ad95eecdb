"""The user's labelled data for `lara train`: one loader for JSONL / CSV / TSV files and label folders.

    load_data(Path("tickets.jsonl"))          # {"text": ..., "label": ...} per line
    load_data(Path("photos/"))                # photos/<label>/<file>.png|.jpg|...  (or .txt files)

Every check names the file and line (or the file or folder) that failed and says what is allowed, so a
user fixes the data without reading code. Nothing here writes anything: the trainer checks all of the data
before it creates a single file.

Splits (`make_split`) are stratified and seeded: per label, a seeded shuffle takes round(n x fraction)
examples (at least one, never all), so every label is in train and, where it has enough examples, in
the test set and the holdout. The split is recorded by example ids (line numbers, or paths relative to the
folder) so that it can be rebuilt from the data.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import random
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Task = Literal["text", "image"]
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
TABLE_SUFFIXES = {".jsonl": None, ".csv": ",", ".tsv": "\t"}
# csv's default field limit (128 KiB) would refuse the long documents this trainer is for.
_CSV_FIELD_LIMIT = min(sys.maxsize, 2**31 - 1)


class DataError(ValueError):
    """The data cannot be used as given; the message names the file, line or folder and what is allowed."""


@dataclass
class UserData:
    """Examples in input order: a label name and an id each, plus the text (UTF-8 bytes) or image path."""

    task: Task
    source: Path
    labels: list[str]
    ids: list[str]  # "line N" of a file, or the path relative to the folder
    texts: list[bytes] = field(default_factory=list)
    images: list[Path] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.labels)

    def label_names(self) -> list[str]:
        return sorted(set(self.labels))

    def subset(self, idx: list[int]) -> UserData:
        return UserData(
            self.task,
            self.source,
            [self.labels[i] for i in idx],
            [self.ids[i] for i in idx],
            [self.texts[i] for i in idx] if self.texts else [],
            [self.images[i] for i in idx] if self.images else [],
        )


def _decode(path: Path, raw: bytes) -> str:
    """Strict UTF-8 (a leading BOM is dropped); the error names the byte offset and its line."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise DataError(
            f"{path}: not UTF-8 at byte offset {exc.start} (line {line}): {exc.reason}; "
            "re-encode the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)"
        ) from None


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror or exc}") from None


def _example(path: Path, line: int, row: dict[str, Any], text_field: str, label_field: str) -> tuple[bytes, str]:
    """One record's (text bytes, label), with the checks every table format shares."""
    missing = [f for f in (text_field, label_field) if f not in row]
    if missing:
        raise DataError(
            f"{path} line {line}: no {' or '.join(repr(f) for f in missing)} field; fields found: {sorted(row)} "
            "(choose them with --text-field / --label-field)"
        )
    text, label = row[text_field], row[label_field]
    if not isinstance(text, str):
        raise DataError(f"{path} line {line}: {text_field!r} must be a string, got {type(text).__name__}")
    if not text.strip():
        raise DataError(f"{path} line {line}: empty text in {text_field!r}; every example needs a text")
    if isinstance(label, bool) or not isinstance(label, str | int):
        raise DataError(f"{path} line {line}: {label_field!r} must be a string or an integer, got {label!r}")
    label = str(label).strip()
    if not label:
        raise DataError(f"{path} line {line}: empty label in {label_field!r}")
    return text.encode("utf-8"), label


def _read_jsonl(path: Path, text_field: str, label_field: str) -> tuple[list[bytes], list[str], list[str]]:
    texts, labels, ids = [], [], []
    # JSON Lines separates records by "\n" alone: str.splitlines() would also split at U+2028, U+2029, U+0085
    # and the like, which JSON strings may hold unescaped. A "\r" before the "\n" is JSON whitespace.
    for n, line in enumerate(_decode(path, _read(path)).split("\n"), start=1):
        if not line.strip():
            continue  # blank lines (a trailing newline, a separator) carry no example
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise DataError(f"{path} line {n}: not valid JSON ({exc}); each line must be one JSON object") from None
        if not isinstance(row, dict):
            raise DataError(f"{path} line {n}: a JSON {type(row).__name__}, not an object with text and label")
        text, label = _example(path, n, row, text_field, label_field)
        texts.append(text)
        labels.append(label)
        ids.append(f"line {n}")
    return texts, labels, ids


_DELIMITER_NAMES = {",": "comma", ";": "semicolon", "\t": "tab", "|": "pipe"}
_SNIFF_CHARS = 64 * 1024  # the header and the first lines: enough to see the delimiter


def _sniff_delimiter(text: str, default: str) -> str:
    """The delimiter of a table among , ; tab | (a ".csv" from a spreadsheet with a decimal comma uses ";"),
    found by csv.Sniffer over the first lines; the suffix's own (default) when the sniffer cannot tell."""
    sample = text[:_SNIFF_CHARS]
    if len(text) > _SNIFF_CHARS and "\n" in sample:
        sample = sample[: sample.rindex("\n")]  # whole lines only: a cut row would mislead the count
    try:
        found = csv.Sniffer().sniff(sample, delimiters="".join(_DELIMITER_NAMES)).delimiter
    except csv.Error:
        return default
    header = sample.split("\n", 1)[0]
    # The header names the columns: a delimiter it does not hold is a guess from the texts' own punctuation.
    in_header = [d for d in _DELIMITER_NAMES if d in header]
    if found in header or not in_header:
        return found
    return default if default in in_header else in_header[0]


def _read_table(
    path: Path, delimiter: str, text_field: str, label_field: str
) -> tuple[list[bytes], list[str], list[str]]:
    """CSV/TSV with a header row; line numbers are those of the file (a quoted field may span lines)."""
    csv.field_size_limit(_CSV_FIELD_LIMIT)
    text = _decode(path, _read(path))
    delimiter = _sniff_delimiter(text, delimiter)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    texts, labels, ids = [], [], []
    try:
        header = next(reader, None)
        if header is None:
            raise DataError(f"{path}: empty file; the first row must name the columns")
        header = [h.strip() for h in header]
        missing = [f for f in (text_field, label_field) if f not in header]
        if missing:
            raise DataError(
                f"{path} line 1: no {' or '.join(repr(f) for f in missing)} column; columns found: {header} "
                f"(split at {_DELIMITER_NAMES[delimiter]}; the delimiter is found among "
                f"{', '.join(_DELIMITER_NAMES.values())}; choose the columns with --text-field / --label-field)"
            )
        start = reader.line_num + 1
        for fields in reader:
            if not any(f.strip() for f in fields):
                start = reader.line_num + 1
                continue
            if len(fields) != len(header):
                raise DataError(
                    f"{path} line {start}: {len(fields)} fields, the header has {len(header)}; "
                    "quote fields that hold the delimiter, quotes or line breaks"
                )
            text, label = _example(path, start, dict(zip(header, fields, strict=True)), text_field, label_field)
            texts.append(text)
            labels.append(label)
            ids.append(f"line {start}")
            start = reader.line_num + 1
    except csv.Error as exc:
        raise DataError(f"{path} line {reader.line_num}: malformed {path.suffix[1:].upper()} row: {exc}") from None
    return texts, labels, ids


def _check_image(path: Path) -> None:
    """Decode the whole image once: a truncated or corrupt file fails here, naming it, not mid-training."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            im.load()
    except Exception as exc:  # Pillow raises many types for corrupt data
        raise DataError(f"{path}: unreadable or truncated image ({type(exc).__name__}: {exc})") from None


def _read_folder(root: Path, task: Task | None) -> UserData:
    subdirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    loose = sorted(p.name for p in root.iterdir() if p.is_file() and not p.name.startswith("."))
    if loose:
        raise DataError(f"{root}: files outside a label folder ({loose[:3]}); put each file in <folder>/<label>/")
    files = [(d.name, f) for d in subdirs for f in sorted(d.rglob("*")) if f.is_file() and not f.name.startswith(".")]
    if not files:
        raise DataError(f"{root}: no files; expected one subfolder per label holding text files or images")
    is_image = [f.suffix.lower() in IMAGE_SUFFIXES for _, f in files]
    if task is None:
        if any(is_image) and not all(is_image):
            odd = next(f for (_, f), im in zip(files, is_image, strict=True) if not im)
            raise DataError(f"{root}: holds images and other files (e.g. {odd}); use one kind, or force it with --task")
        task = "image" if all(is_image) else "text"
    labels = [label for label, _ in files]
    ids = [str(f.relative_to(root)) for _, f in files]
    if task == "image":
        bad = [f for (_, f), im in zip(files, is_image, strict=True) if not im]
        if bad:
            raise DataError(f"{bad[0]}: not an image file; allowed: {', '.join(IMAGE_SUFFIXES)}")
        for _, f in files:
            _check_image(f)
        return UserData("image", root, labels, ids, images=[f for _, f in files])
    texts = []
    for _, f in files:
        text = _decode(f, _read(f))
        if not text.strip():
            raise DataError(f"{f}: empty text; every example needs a text")
        texts.append(text.encode("utf-8"))
    return UserData("text", root, labels, ids, texts=texts)


def load_data(path: Path, task: Task | None = None, text_field: str = "text", label_field: str = "label") -> UserData:
    """Read and check DATA (a .jsonl/.csv/.tsv file or a label folder). The task is inferred unless given."""
    if path.is_dir():
        data = _read_folder(path, task)
    elif path.is_file():
        suffix = path.suffix.lower()
        if suffix not in TABLE_SUFFIXES:
            raise DataError(f"{path}: unknown file type {suffix!r}; use .jsonl, .csv, .tsv or a folder of labels")
        if task == "image":
            raise DataError(f"{path}: image data must be a folder with one subfolder per label, not a file")
        delimiter = TABLE_SUFFIXES[suffix]
        if delimiter is None:
            texts, labels, ids = _read_jsonl(path, text_field, label_field)
        else:
            texts, labels, ids = _read_table(path, delimiter, text_field, label_field)
        data = UserData("text", path, labels, ids, texts=texts)
    else:
        raise DataError(f"{path}: no such file or folder")
    if not data.labels:
        raise DataError(f"{path}: no examples")
    return data


def check_labels(data: UserData, min_per_label: int = 2) -> None:
    """At least two labels, each with at least `min_per_label` examples (one to learn, one to test)."""
    counts = Counter(data.labels)
    if len(counts) < 2:
        raise DataError(f"{data.source}: one label only ({next(iter(counts))!r}); a classifier needs at least two")
    few = {label: n for label, n in sorted(counts.items()) if n < min_per_label}
    if few:
        where = {label: data.ids[data.labels.index(label)] for label in few}
        detail = ", ".join(f"{label!r}: {n} ({where[label]})" for label, n in few.items())
        raise DataError(
            f"{data.source}: labels with fewer than {min_per_label} examples: {detail}; add examples or drop the label"
        )


def check_test_labels(test: UserData, train_labels: list[str]) -> None:
    unknown = sorted(set(test.labels) - set(train_labels))
    if unknown:
        raise DataError(f"{test.source}: labels not in the training data: {unknown}; known: {train_labels}")


def stratified_take(labels: list[str], fraction: float, seed: int, salt: str) -> tuple[list[int], list[int]]:
    """(kept, taken) index lists: per label a seeded shuffle, round(n x fraction) taken (at least 1 when the
    label has 2 or more, never all of it). Seeded by (seed, salt, label): adding a label changes no other."""
    if not 0.0 < fraction < 1.0:
        raise DataError(f"a split fraction must be in (0, 1), got {fraction}")
    by_label: dict[str, list[int]] = {}
    for i, y in enumerate(labels):
        by_label.setdefault(y, []).append(i)
    kept, taken = [], []
    for y in sorted(by_label):
        members = by_label[y]
        random.Random(f"{seed}:{salt}:{y}").shuffle(members)
        n = len(members)
        k = 0 if n < 2 else min(n - 1, max(1, round(n * fraction)))
        taken += members[:k]
        kept += members[k:]
    return sorted(kept), sorted(taken)


@dataclass
class Split:
    train: list[int]
    holdout: list[int]  # from train: per-epoch validation and calibration
    test: list[int]  # indices into the test data (DATA itself unless --test)

    def record(self, data: UserData, test: UserData, **settings: Any) -> dict[str, Any]:
        """split.json: the settings and every example id per part, enough to rebuild the split."""
        return {
            **settings,
            "data": str(data.source),
            "data_sha256": fingerprint(data.source),
            "test_data": str(test.source),
            "counts": {"train": len(self.train), "holdout": len(self.holdout), "test": len(self.test)},
            "ids": {
                "train": [data.ids[i] for i in self.train],
                "holdout": [data.ids[i] for i in self.holdout],
                "test": [test.ids[i] for i in self.test],
            },
        }


def make_split(
    data: UserData, test_fraction: float, holdout_fraction: float, seed: int, has_test_file: bool = False
) -> Split:
    """Seeded stratified test split (unless a test file is given), then a holdout from what is left."""
    if has_test_file:
        rest, test = list(range(len(data))), []
    else:
        rest, test = stratified_take(data.labels, test_fraction, seed, "test")
    kept, hold = stratified_take([data.labels[i] for i in rest], holdout_fraction, seed, "holdout")
    if not hold:
        raise DataError(f"{data.source}: too few examples for a holdout; give each label at least 3 examples")
    return Split([rest[i] for i in kept], [rest[i] for i in hold], test)


def fingerprint(path: Path) -> str:
    """sha256 of a data file, or of a folder's relative paths and contents (in sorted order)."""
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for f in files:
        h.update(str(f.relative_to(path) if path.is_dir() else f.name).encode() + b"\0")
        with f.open("rb") as fh:
            for block in iter(lambda fh=fh: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def read_images(paths: list[Path], size: int, channels: int) -> Any:
    """uint8 tensor [N, channels, size, size]: each image converted (L or RGB) and resized bilinearly, as the
    server's preprocessing does."""
    import numpy as np
    import torch
    from PIL import Image

    mode = "L" if channels == 1 else "RGB"
    out = np.empty((len(paths), size, size, channels), dtype=np.uint8)
    for i, p in enumerate(paths):
        with Image.open(p) as im:
            arr = np.asarray(im.convert(mode).resize((size, size), Image.Resampling.BILINEAR))
        out[i] = arr.reshape(size, size, channels)
    return torch.from_numpy(out).permute(0, 3, 1, 2).contiguous()  # [N, C, S, S]


def image_shape(paths: list[Path]) -> tuple[int, int]:
    """(most common longer side, channels): 3 when any image has colour, else 1."""
    from PIL import Image

    sides: Counter[int] = Counter()
    colour = False
    for p in paths:
        with Image.open(p) as im:
            sides[max(im.size)] += 1
            colour = colour or im.mode not in ("1", "L", "LA", "I", "I;16", "F")
    return sides.most_common(1)[0][0], 3 if colour else 1
