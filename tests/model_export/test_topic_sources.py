"""Other sources of two topics for lara-text-news's head, and the non-English filler (issue 53)."""

from __future__ import annotations

import gzip
import json
import random
import warnings
from pathlib import Path

import pytest
import torch

from lara_serve.model_export.models.registry import NEWS_LABELS
from lara_serve.model_export.pretrained import topic_sources as ts
from lara_serve.model_export.pretrained.classifier import in_holdout
from lara_serve.model_export.pretrained.robust_head import (
    ENGLISH_FILLER_GENRES,
    SELECTION_GENRES,
    TokenSet,
    _cut_from,
    english_prose,
    translated_man_pages,
)


def _addresses(root: Path, years: range) -> None:
    root.mkdir(parents=True)
    for y in years:  # written out of order: the loader sorts by year
        words = " ".join(f"word{y}x{i}" for i in range(3000))
        (root / f"{y}_someone.json").write_text(json.dumps({"year": y, "name": "someone", "text": words}))


def test_sotu_items_keep_the_latest_out_and_cut_excerpts_from_their_address(tmp_path: Path) -> None:
    root = tmp_path / "sotu"
    _addresses(root, range(2000 + ts.LATEST_KEPT_OUT + 6 - 1, 1999, -1))
    stems = [stem for stem, _ in ts.sotu_addresses(root)]
    assert stems == [f"{y}_someone" for y in range(2000, 2006)]  # oldest first; the latest 16 left out
    items = ts.sotu_items(seed=0, root=root)
    texts = dict(ts.sotu_addresses(root))
    assert {i.label for i in items} == {NEWS_LABELS.index("politics")}
    for stem in stems:
        mine = [i for i in items if i.key == stem]
        whole = int(stems.index(stem) % ts.WHOLE_EVERY == 0)
        assert len(mine) == ts.EXCERPTS_PER_ADDRESS + whole
        for i in mine:
            assert i.text in texts[stem] and 0 < len(i.text) <= 6000 or i.text == texts[stem]
            assert i.text.split()[0].startswith(f"word{stem[:4]}x")  # cut at word boundaries
    assert ts.sotu_items(seed=0, root=root) == items  # seeded


def test_python_descriptions_are_tech_keyed_by_distribution(tmp_path: Path) -> None:
    for name, body in (("alpha_pkg-1.0", "A library for parsing. " * 20), ("tiny-0.1", "short")):
        (tmp_path / f"{name}.dist-info").mkdir()
        (tmp_path / f"{name}.dist-info" / "METADATA").write_text(f"Name: x\nVersion: 1\n\n{body}")
    items = ts.python_description_items(tmp_path)
    assert [(i.key, i.label, i.source) for i in items] == [
        ("alpha_pkg", NEWS_LABELS.index("tech"), "python_description")
    ]
    assert items[0].text.startswith("A library for parsing.")


def test_description_prose_drops_code_markup_and_link_targets() -> None:
    body = (
        '# Tool\n\n<a href="https://ci"><img src="badge.svg" alt="CI"></a>\n\n'
        "Tool parses [timetables](https://example.org/t) for railways. ![logo](logo.png)\n\n"
        "```python\nimport tool\ntool.parse('x')\n```\n\n"
        "Use it like this::\n\n    >>> tool.parse(path)\n    Table(rows=3)\n\n"
        "$ pip install tool\n\n\n\nIt is fast.\n"
    )
    prose = ts.description_prose(body)
    assert prose == "# Tool\n\nTool parses timetables for railways.\n\nUse it like this::\n\nIt is fast."
    for code in ("import", "parse(", "pip", "href", "https", "badge", "logo"):
        assert code not in prose


def test_python_descriptions_are_trained_without_their_code(tmp_path: Path) -> None:
    body = "A library for parsing timetables. " * 8 + "\n\n```\n" + "x = parse()\n" * 300 + "```\n"
    (tmp_path / "pkg-1.0.dist-info").mkdir()
    (tmp_path / "pkg-1.0.dist-info" / "METADATA").write_text(f"Name: pkg\n\n{body}")
    (text,) = (i.text for i in ts.python_description_items(tmp_path))
    assert text == ("A library for parsing timetables. " * 8).strip()


def test_a_missing_source_is_skipped_with_a_warning(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LARA_SOTU_DIR", str(tmp_path / "nowhere"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        items = ts.topic_items(seed=0)
    assert any("sotu" in str(w.message) for w in caught)
    assert all(i.source == "python_description" for i in items)


def test_the_holdout_rule_keeps_one_key_on_one_side(tmp_path: Path) -> None:
    root = tmp_path / "sotu"
    _addresses(root, range(1900, 1900 + ts.LATEST_KEPT_OUT + 40))
    items = ts.sotu_items(seed=1, root=root)
    sides = {}
    for i in items:
        assert sides.setdefault(i.key, in_holdout(i.key)) == in_holdout(i.key)
    assert len(set(sides.values())) == 2  # 40 addresses: both sides are used


def test_translated_man_pages_drop_troff(tmp_path: Path) -> None:
    page = ".TH LS 1\n.SH NAME\nls \\- Verzeichnisinhalte auflisten\n.PP\n\\fBls\\fP zeigt Dateien " + "und mehr " * 80
    (tmp_path / "de" / "man1").mkdir(parents=True)
    (tmp_path / "de" / "man1" / "ls.1.gz").write_bytes(gzip.compress(page.encode()))
    (tmp_path / "man1").mkdir()  # the untranslated pages are not read
    (tmp_path / "man1" / "ls.1.gz").write_bytes(gzip.compress(b"English " * 200))
    pages = translated_man_pages.__wrapped__(tmp_path)
    assert len(pages) == 1
    assert pages[0].startswith("ls  Verzeichnisinhalte auflisten\nls zeigt Dateien")
    assert "\\" not in pages[0] and ".TH" not in pages[0]
    cut = _cut_from(pages, 100, random.Random(0))
    assert len(cut) == 100 and cut in "\n".join(pages * 2)


def test_english_filler_is_brown_without_news_fiction_government_or_the_selection_genre(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for doc_id in ("ca01", "cb02", "cd01", "ce03", "cg01", "ch01", "cj10", "ck01"):
        (tmp_path / doc_id).write_text(f"{doc_id}/nn text/nn ./.\n")
    monkeypatch.setenv("LARA_BROWN_DIR", str(tmp_path))
    assert english_prose.__wrapped__() == ("cd01 text.", "ce03 text.", "cj10 text.")
    assert english_prose.__wrapped__(SELECTION_GENRES) == ("cg01 text.",)
    assert not set(SELECTION_GENRES) & set(ENGLISH_FILLER_GENRES)
    monkeypatch.setenv("LARA_BROWN_DIR", str(tmp_path / "missing"))
    assert english_prose.__wrapped__() == ()  # not installed: the kind is left out, the build goes on


def test_token_sets_join_in_order() -> None:
    a = TokenSet(torch.arange(6.0).reshape(3, 2).half(), torch.tensor([0, 1, 3]))
    b = TokenSet(torch.arange(6.0, 10.0).reshape(2, 2).half(), torch.tensor([0, 2]))
    j = a.join(b)
    assert len(j) == 3
    for i, want in enumerate([a.rows(0), a.rows(1), b.rows(0)]):
        assert torch.equal(j.rows(i), want)
