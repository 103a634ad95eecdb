"""`lara train`'s loader at its edges, by hand-computed cases: label and text types, blank rows and their
line numbers, folder layouts, the label checks at their bounds, the split's rounding rules, the data
fingerprint and the image reader's pixels (test_userdata.py covers the common paths)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from PIL import Image

from lara_serve.model_export.your_data import loader as ud


def _jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"text": "a", "label": True}, "line 1: 'label' must be a string or an integer, got True"),
        ({"text": "a", "label": 1.5}, "line 1: 'label' must be a string or an integer, got 1.5"),
        ({"text": "a", "label": "  "}, "line 1: empty label in 'label'"),
        ({"text": 7, "label": "x"}, "line 1: 'text' must be a string, got int"),
        ({"label": "x"}, "line 1: no 'text' field; fields found: ['label']"),
        ({"text": "a"}, "line 1: no 'label' field; fields found: ['text']"),
        ({"x": 1}, "line 1: no 'text' or 'label' field"),
    ],
)  # fmt: skip
def test_bad_records_are_named(tmp_path: Path, row: dict[str, object], message: str) -> None:
    with pytest.raises(ud.DataError) as err:
        ud.load_data(_jsonl(tmp_path / "d.jsonl", [row]))
    assert message in str(err.value), str(err.value)


def test_labels_are_trimmed_strings_and_blank_lines_keep_numbering(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('\n{"text": "a", "label": 3}\n\n{"text": " b ", "label": " y "}\n')
    data = ud.load_data(path)
    assert data.labels == ["3", "y"] and data.texts == [b"a", b" b "] and data.ids == ["line 2", "line 4"]
    assert len(data) == 2 and data.label_names() == ["3", "y"]
    path.write_text("\n  \n")
    with pytest.raises(ud.DataError, match="d.jsonl: no examples"):
        ud.load_data(path)


def test_csv_blank_rows_bom_and_padded_header(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_bytes("\ufeff text , label\na,x\n\n , \nb,y\n".encode())
    data = ud.load_data(path)
    # Line 3 is empty and line 4 holds only blank fields: neither is an example, and neither shifts the ids.
    assert data.labels == ["x", "y"] and data.ids == ["line 2", "line 5"]
    path.write_text("")
    with pytest.raises(ud.DataError, match="d.csv: empty file; the first row must name the columns"):
        ud.load_data(path)
    long_text = "w" * 200_000  # over csv's default 128 KiB field limit: long documents are the point
    path.write_text(f"text,label\n{long_text},x\n")
    assert ud.load_data(path).texts == [long_text.encode()]


def test_folder_layouts(tmp_path: Path) -> None:
    root = tmp_path / "f"
    (root / "a" / "deep").mkdir(parents=True)
    (root / "b").mkdir()
    (root / "a" / "deep" / "1.txt").write_text("nested text")  # labelled by its top folder
    (root / "a" / ".hidden").write_text("")  # hidden files are not examples
    (root / "b" / "2.txt").write_text("bee")
    (root / ".DS_Store").write_text("")
    data = ud.load_data(root)
    assert data.task == "text" and data.labels == ["a", "b"] and data.texts == [b"nested text", b"bee"]
    assert data.ids == ["a/deep/1.txt", "b/2.txt"]
    sub = data.subset([1, 0])
    assert sub.labels == ["b", "a"] and sub.ids == ["b/2.txt", "a/deep/1.txt"] and sub.texts == [b"bee", b"nested text"]
    (root / "b" / "3.txt").write_text(" \n")
    with pytest.raises(ud.DataError, match=r"b/3.txt: empty text"):
        ud.load_data(root)
    (root / "b" / "3.txt").unlink()
    (root / "loose.txt").write_text("x")
    with pytest.raises(ud.DataError, match=r"files outside a label folder \(\['loose.txt'\]\)"):
        ud.load_data(root)
    empty = tmp_path / "empty"
    (empty / "a").mkdir(parents=True)
    with pytest.raises(ud.DataError, match="no files; expected one subfolder per label"):
        ud.load_data(empty)


def test_paths_that_are_not_data(tmp_path: Path) -> None:
    with pytest.raises(ud.DataError, match="missing.jsonl: no such file or folder"):
        ud.load_data(tmp_path / "missing.jsonl")
    path = _jsonl(tmp_path / "d.jsonl", [{"text": "a", "label": "x"}])
    with pytest.raises(ud.DataError, match="image data must be a folder"):
        ud.load_data(path, task="image")
    assert ud.load_data(path, task="text").labels == ["x"]


def _data(labels: list[str]) -> ud.UserData:
    return ud.UserData("text", Path("d.jsonl"), labels, [f"line {i + 1}" for i in range(len(labels))],
                       texts=[b"t"] * len(labels))  # fmt: skip


def test_label_checks_at_their_bounds() -> None:
    ud.check_labels(_data(["a", "a", "a", "b", "b", "b"]), min_per_label=3)  # exactly the minimum: fine
    with pytest.raises(ud.DataError, match=r"fewer than 3 examples: 'b': 2 \(line 4\); add examples"):
        ud.check_labels(_data(["a", "a", "a", "b", "b"]), min_per_label=3)
    ud.check_test_labels(_data(["a"]), ["a", "b"])
    with pytest.raises(ud.DataError, match=r"labels not in the training data: \['c', 'd'\]; known: \['a', 'b'\]"):
        ud.check_test_labels(_data(["d", "a", "c"]), ["a", "b"])


def test_stratified_take_rounding_and_bounds() -> None:
    def taken(n: int, fraction: float) -> int:
        return len(ud.stratified_take(["a"] * n, fraction, seed=0, salt="test")[1])

    assert taken(10, 0.25) == 2 and taken(10, 0.35) == 4  # round(2.5) = 2, round(3.5) = 4 (to even)
    assert taken(5, 0.01) == 1  # at least one
    assert taken(3, 0.99) == 2  # never all
    assert taken(1, 0.5) == 0 and taken(2, 0.5) == 1
    kept, took = ud.stratified_take(["a", "b", "a", "b", "a", "b"], 0.34, seed=0, salt="test")
    assert sorted(kept + took) == list(range(6)) and kept == sorted(kept) and took == sorted(took)
    for bad in (0.0, 1.0, -0.1):
        with pytest.raises(ud.DataError, match=r"a split fraction must be in \(0, 1\)"):
            ud.stratified_take(["a", "a"], bad, seed=0, salt="test")


def test_split_seeding_is_per_label_and_per_salt() -> None:
    base = ["a"] * 20
    alone = ud.stratified_take(base, 0.3, seed=1, salt="test")[1]
    with_b = ud.stratified_take(base + ["b"] * 20, 0.3, seed=1, salt="test")[1]
    assert [i for i in with_b if i < 20] == alone  # adding a label leaves the others' picks alone
    salts = {tuple(ud.stratified_take(base, 0.3, seed=1, salt=s)[1]) for s in ("test", "holdout", "x", "y")}
    assert len(salts) > 1


def test_a_split_needs_a_holdout_and_records_the_test_file(tmp_path: Path) -> None:
    with pytest.raises(ud.DataError, match="too few examples for a holdout; give each label at least 3"):
        ud.make_split(_data(["a", "a", "b", "b"]), 0.2, 0.2, seed=0)  # 1 test + 1 left per label: no holdout
    split = ud.make_split(_data(["a"] * 3 + ["b"] * 3), 0.2, 0.2, seed=0)
    assert (len(split.train), len(split.holdout), len(split.test)) == (2, 2, 2)
    data = ud.load_data(_jsonl(tmp_path / "d.jsonl", [{"text": f"t{i}", "label": "ab"[i % 2]} for i in range(6)]))
    test = ud.load_data(_jsonl(tmp_path / "t.jsonl", [{"text": "u", "label": "a"}, {"text": "v", "label": "b"}]))
    split = ud.Split(train=[0, 1, 2], holdout=[3, 4, 5], test=[1])
    record = split.record(data, test, seed=3)
    assert record["seed"] == 3 and record["test_data"] == str(test.source)
    assert record["counts"] == {"train": 3, "holdout": 3, "test": 1}
    assert record["ids"] == {"train": ["line 1", "line 2", "line 3"], "holdout": ["line 4", "line 5", "line 6"],
                             "test": ["line 2"]}  # fmt: skip


def test_fingerprint_of_files_and_folders(tmp_path: Path) -> None:
    big = bytes(range(256)) * 6000  # 1.5 MiB: read in more than one block
    (tmp_path / "d.jsonl").write_bytes(big)
    # The documented formula: sha256 over the name, a NUL and the contents.
    assert ud.fingerprint(tmp_path / "d.jsonl") == hashlib.sha256(b"d.jsonl\0" + big).hexdigest()
    root = tmp_path / "f"
    (root / "a").mkdir(parents=True)
    (root / "a" / "1.txt").write_text("one")
    (root / "a" / "2.txt").write_text("two")
    first = ud.fingerprint(root)
    assert first == hashlib.sha256(b"a/1.txt\0one" + b"a/2.txt\0two").hexdigest()
    (root / "a" / "2.txt").write_text("tw0")
    assert ud.fingerprint(root) != first


def test_read_images_converts_and_resizes_like_the_server(tmp_path: Path) -> None:
    grey, red = tmp_path / "grey.png", tmp_path / "red.png"
    Image.new("L", (10, 6), 100).save(grey)
    Image.new("RGB", (5, 5), (255, 0, 0)).save(red)
    pixels = ud.read_images([grey, red], 4, 1)
    assert tuple(pixels.shape) == (2, 1, 4, 4)
    assert pixels[0].unique().tolist() == [100]  # bilinear resize of a flat image stays flat
    assert pixels[1].unique().tolist() == [76]  # ITU-R 601 luma: 255 x 299/1000 = 76.2
    colour = tmp_path / "colour.png"
    Image.new("RGB", (3, 3), (10, 20, 30)).save(colour)
    rgb = ud.read_images([colour], 2, 3)
    assert tuple(rgb.shape) == (1, 3, 2, 2) and rgb[0, :, 1, 0].tolist() == [10, 20, 30]  # channels first
    assert ud.image_shape([grey, grey, red]) == (10, 3) and ud.image_shape([grey]) == (10, 1)
    la = tmp_path / "la.png"
    Image.new("LA", (7, 7)).save(la)
    assert ud.image_shape([la, la, grey]) == (7, 1)  # grey with alpha is not colour
