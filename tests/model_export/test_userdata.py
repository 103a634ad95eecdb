"""`lara train`'s loader: every DATA form, the checks that name the line or file, the stratified split."""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from lara_serve.model_export.your_data import loader as ud

ROWS = [
    ("the match ended with a late goal", "sport"),
    ('shares fell, the market, as "traders" sold', "money"),
    ("a new chip for phones\nand laptops", "tech"),  # a line break inside a field
    ("the coach praised the team", "sport"),
    ("the bank raised its rates", "money"),
    ("cloud software, updated", "tech"),
]


def _write_forms(tmp: Path) -> dict[str, Path]:
    forms = {"jsonl": tmp / "d.jsonl", "csv": tmp / "d.csv", "tsv": tmp / "d.tsv", "folder": tmp / "texts"}
    forms["jsonl"].write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in ROWS))
    for key, delimiter in (("csv", ","), ("tsv", "\t")):
        with forms[key].open("w", newline="") as f:
            w = csv.writer(f, delimiter=delimiter)
            w.writerow(["label", "text"])
            w.writerows((y, t) for t, y in ROWS)
    for i, (t, y) in enumerate(ROWS):
        (forms["folder"] / y).mkdir(parents=True, exist_ok=True)
        (forms["folder"] / y / f"{i}.txt").write_text(t)
    return forms


def test_every_text_form_reads_the_same_examples(tmp_path: Path) -> None:
    forms = _write_forms(tmp_path)
    expected = sorted((t.encode(), y) for t, y in ROWS)
    for kind, path in forms.items():
        data = ud.load_data(path)
        assert data.task == "text", kind
        assert sorted(zip(data.texts, data.labels, strict=True)) == expected, kind
    # CSV ids are the file's line numbers: the quoted line break makes row 3 span lines 4-5.
    assert ud.load_data(forms["csv"]).ids == ["line 2", "line 3", "line 4", "line 6", "line 7", "line 8"]
    assert ud.load_data(forms["folder"]).ids[0] == "money/1.txt"


def test_fields_are_chosen_by_name(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"body": "a b", "cat": 3}\n{"body": "c d", "cat": 4}\n')
    data = ud.load_data(path, text_field="body", label_field="cat")
    assert data.labels == ["3", "4"] and data.texts == [b"a b", b"c d"]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("d.jsonl", '{"text": "a", "label": "x"}\n{"text": "b", "label": \n', "d.jsonl line 2: not valid JSON"),
        ("d.jsonl", '{"text": "a", "label": "x"}\n[1, 2]\n', "d.jsonl line 2: a JSON list"),
        ("d.jsonl", '{"text": "a", "label": "x"}\n{"txt": "b", "label": "y"}\n', "line 2: no 'text' field; fields found: ['label', 'txt']"),
        ("d.jsonl", '{"text": "a", "label": "x"}\n\n{"text": "  ", "label": "y"}\n', "d.jsonl line 3: empty text"),
        ("d.jsonl", '{"text": "a", "label": null}\n', "line 1: 'label' must be a string or an integer"),
        ("d.csv", "text,label\na,x\nb,y,z\n", "d.csv line 3: 3 fields, the header has 2"),
        ("d.csv", 'text,label\na,x\n"b,y\n', "d.csv line 3: malformed CSV row"),
        ("d.csv", "body,category\na,x\n", "d.csv line 1: no 'text' or 'label' column; columns found: ['body', 'category']"),
        ("d.tsv", "text\tlabel\na\tx\n\ty\n", "d.tsv line 3: empty text"),
        ("d.txt", "a\n", "unknown file type '.txt'"),
    ],
)  # fmt: skip
def test_bad_tables_name_the_line(tmp_path: Path, name: str, content: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ud.DataError, match=None) as err:
        ud.load_data(path)
    assert message in str(err.value), str(err.value)


def test_text_that_is_not_utf8_names_file_and_byte_offset(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"text": "ok", "label": "x"}\n{"text": "caf\xe9", "label": "y"}\n')
    with pytest.raises(ud.DataError, match=r"d.jsonl: not UTF-8 at byte offset 42 \(line 2\)"):
        ud.load_data(path)
    folder = tmp_path / "f"
    (folder / "a").mkdir(parents=True)
    (folder / "a" / "1.txt").write_bytes(b"abc\xff")
    with pytest.raises(ud.DataError, match=r"1.txt: not UTF-8 at byte offset 3"):
        ud.load_data(folder)


def test_label_checks(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"text": f"t{i}", "label": "a"}) + "\n" for i in range(3)))
    with pytest.raises(ud.DataError, match="one label only"):
        ud.check_labels(ud.load_data(path))
    with path.open("a") as f:
        f.write(json.dumps({"text": "lonely", "label": "b"}) + "\n")
    with pytest.raises(ud.DataError, match=r"fewer than 2 examples: 'b': 1 \(line 4\)"):
        ud.check_labels(ud.load_data(path))


def _png(path: Path, size: tuple[int, int], mode: str = "L", seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    shape = (size[1], size[0]) + ((3,) if mode == "RGB" else ())
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rng.integers(0, 256, size=shape, dtype=np.uint8), mode=mode).save(path)


def test_image_folder_task_shape_and_bad_images(tmp_path: Path) -> None:
    root = tmp_path / "imgs"
    _png(root / "cat" / "a.png", (20, 20))
    _png(root / "cat" / "b.png", (20, 16), "RGB")
    _png(root / "dog" / "c.png", (12, 12))
    data = ud.load_data(root)
    assert data.task == "image" and data.labels == ["cat", "cat", "dog"]
    assert ud.image_shape(data.images) == (20, 3)  # most common longer side; colour in any image -> RGB
    pixels = ud.read_images(data.images, 8, 3)
    assert tuple(pixels.shape) == (3, 3, 8, 8) and str(pixels.dtype) == "torch.uint8"
    raw = (root / "dog" / "c.png").read_bytes()
    (root / "dog" / "d.png").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ud.DataError, match=r"dog/d.png: unreadable or truncated image"):
        ud.load_data(root)
    (root / "dog" / "d.png").unlink()
    (root / "dog" / "notes.txt").write_text("x")
    with pytest.raises(ud.DataError, match="holds images and other files"):
        ud.load_data(root)
    with pytest.raises(ud.DataError, match="notes.txt: not an image file"):
        ud.load_data(root, task="image")


def test_split_is_stratified_reproducible_and_recorded(tmp_path: Path) -> None:
    labels = ["a"] * 50 + ["b"] * 30 + ["c"] * 5
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"text": f"doc {i}", "label": y}) + "\n" for i, y in enumerate(labels)))
    data = ud.load_data(path)
    one = ud.make_split(data, 0.2, 0.1, seed=7)
    assert one == ud.make_split(data, 0.2, 0.1, seed=7)
    assert one.test != ud.make_split(data, 0.2, 0.1, seed=8).test
    assert sorted(one.train + one.holdout + one.test) == list(range(len(labels)))
    assert Counter(labels[i] for i in one.test) == {"a": 10, "b": 6, "c": 1}
    assert Counter(labels[i] for i in one.holdout) == {"a": 4, "b": 2, "c": 1}
    assert Counter(labels[i] for i in one.train) == {"a": 36, "b": 22, "c": 3}
    record = one.record(data, data, seed=7)
    assert record["ids"]["test"] == [f"line {i + 1}" for i in one.test]
    assert record["data_sha256"] == ud.fingerprint(path) and record["counts"]["train"] == 61
    # With a test file, all of DATA is train + holdout.
    with_file = ud.make_split(data, 0.2, 0.1, seed=7, has_test_file=True)
    assert with_file.test == [] and len(with_file.train) + len(with_file.holdout) == len(labels)
