"""The user-like data sets: labels, header removal, dedup, caps, and the digit folder, on small fakes."""

from __future__ import annotations

import json
import struct
from collections import Counter
from pathlib import Path

import pytest

from lara_serve.model_export.your_data import samples as su


def _mail(head: str, body: str) -> str:
    return head + "\n\n" + body


@pytest.fixture
def spam_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "spam"
    mails = {
        "easy-ham-1": [_mail("From: a\nSubject: Re: meeting notes", "See you at 3."),
                       _mail("Subject: RE: MEETING NOTES", "See you at 3."),  # same body, same subject (case)
                       _mail("From: c", "no subject line here")],
        "hard-ham-1": [_mail("Subject: Your weekly newsletter\r\nX: y", "Deals of the week inside.")],
        "spam-2": [_mail("Subject: WIN A PRIZE", "<html>Click now</html>"),
                   _mail("Subject: cheap meds", "Buy now.")],
    }  # fmt: skip
    for group, texts in mails.items():
        (root / group).mkdir(parents=True)
        for i, text in enumerate(texts):
            (root / group / f"{i}.json").write_text(json.dumps({"id": i, "group": group, "text": text}))
    monkeypatch.setenv("LARA_SPAM_DIR", str(root))
    return root


def test_subjects_are_distinct_lines_labelled_ham_or_spam(spam_dir: Path) -> None:
    rows = su.subjects(per_label=10)
    assert sorted((r["text"], r["label"]) for r in rows) == [
        ("Re: meeting notes", "ham"), ("WIN A PRIZE", "spam"), ("Your weekly newsletter", "ham"),
        ("cheap meds", "spam"),
    ]  # fmt: skip


def test_emails_drop_the_headers_and_duplicates(spam_dir: Path) -> None:
    rows = su.emails(per_label=10)
    assert Counter(r["label"] for r in rows) == {"ham": 2, "hard-ham": 1, "spam": 2}
    assert all("Subject:" not in r["text"] and "From:" not in r["text"] for r in rows)
    assert sum(r["text"] == "See you at 3." for r in rows) == 1


def test_the_cap_is_per_label_seeded_and_stratified() -> None:
    rows = [{"text": str(i), "label": "a" if i < 30 else "b"} for i in range(40)]
    a, b = su._cap(rows, 5, seed=1), su._cap(rows, 5, seed=1)
    assert a == b and Counter(r["label"] for r in a) == {"a": 5, "b": 5}
    assert su._cap(rows, 5, seed=2) != a


def test_a_missing_package_names_the_make_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LARA_SPAM_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(su.DataMissing, match="make user-data"):
        su.spam_assassin()


def _write_mo(path: Path, pairs: dict[str, str]) -> None:
    """A GNU .mo catalogue (little-endian, no hash table), the format gettext reads."""
    items = sorted(pairs.items())
    ids = [k.encode() for k, _ in items]
    strs = [v.encode() for _, v in items]
    n, header = len(items), 7 * 4
    orig_at, trans_at = header, header + 8 * n
    data_at = trans_at + 8 * n
    table_o, table_t, blob = b"", b"", b""
    for s in ids:
        table_o += struct.pack("<2I", len(s), data_at + len(blob))
        blob += s + b"\0"
    for s in strs:
        table_t += struct.pack("<2I", len(s), data_at + len(blob))
        blob += s + b"\0"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<7I", 0x950412DE, 0, n, orig_at, trans_at, 0, 0) + table_o + table_t + blob)


def test_catalogs_group_translated_messages_by_program(tmp_path: Path) -> None:
    meta = {"": "Content-Type: text/plain; charset=UTF-8\n"}
    pam = {f"Password {i} is too short": f"Das Passwort {i} ist zu kurz" for i in range(7)}
    pam["Same in both languages"] = "Same in both languages"  # untranslated: left out
    _write_mo(tmp_path / "de" / "LC_MESSAGES" / "Linux-PAM.mo", {**meta, **pam})
    glib = {f"Error reading file {i}": f"Erreur de lecture du fichier {i}" for i in range(12)}
    _write_mo(tmp_path / "fr" / "LC_MESSAGES" / "glib20.mo", {**meta, **glib})
    (tmp_path / "xx" / "LC_MESSAGES").mkdir(parents=True)
    (tmp_path / "xx" / "LC_MESSAGES" / "gtk30.mo").write_bytes(b"not a catalogue")  # skipped, not fatal
    rows = su.catalogs(per_label=10, strings=3, root=tmp_path)
    assert Counter(r["label"] for r in rows) == {"authentication": 2, "system-library": 4}
    for r in rows:
        lines = r["text"].split("\n")
        assert len(lines) == 3
        assert all(("Passwort" in x) == (r["label"] == "authentication") for x in lines)
        assert "Same in both languages" not in r["text"]


def test_digits_are_a_folder_of_32_pixel_pngs(tmp_path: Path) -> None:
    from PIL import Image

    n = su.write_digits(tmp_path / "d")
    files = sorted((tmp_path / "d").glob("*/*.png"))
    assert n == len(files) == 1797 and sorted(p.name for p in (tmp_path / "d").iterdir()) == [str(i) for i in range(10)]
    with Image.open(files[0]) as im:
        assert im.size == (32, 32) and im.mode == "L" and im.getextrema()[1] > 200


def test_sample_data_writes_one_part_of_the_fixed_split(tmp_path: Path) -> None:
    from lara_serve.model_export.training.data import load_news
    from lara_serve.model_export.your_data import sample_data

    sample_data.main(["news", str(tmp_path / "test.jsonl"), "--split", "test"])
    rows = [json.loads(line) for line in (tmp_path / "test.jsonl").read_text().splitlines()]
    assert [r["text"] for r in rows] == [d.text for d in load_news("test")]
    sample_data.main(["fashion", str(tmp_path / "t10k"), "--split", "test", "--limit", "12"])
    assert len(list((tmp_path / "t10k").glob("*/*.png"))) == 12
    with pytest.raises(ValueError, match="not all"):
        sample_data.write_fashion(tmp_path / "x", 1, "all")


def test_sources_are_seeded_python_files_of_each_project_within_the_size_range() -> None:
    rows = su.sources(per_label=3, seed=1)
    assert Counter(r["label"] for r in rows) == {p: 3 for p in su.SOURCE_PROJECTS}
    assert all(5 * 1024 <= len(r["text"].encode("utf-8")) <= 101 * 1024 for r in rows)  # replaced bytes may grow
    assert rows == su.sources(per_label=3, seed=1) and rows != su.sources(per_label=3, seed=2)
    assert "sources" in su.USER_DATASETS and "sources" not in su.DEFAULT_SETS
