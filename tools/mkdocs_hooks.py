"""MkDocs hooks: the site shows files that live outside docs/, and a settings table that cannot go stale.

The pages under docs/ link to figures and notes where they live in the repository (`../research/results/
x.png`, `../README.md`), which reads right on GitHub. MkDocs only publishes docs/, so each such target is
added to the site under `repo/<path>` (a page if it is Markdown, a static file otherwise) and the link is
rewritten to it; a link to a folder goes to its README.md, or loses its link (the text stays) if it has
none. Then `mkdocs build --strict` still fails on a link whose target exists nowhere.

`<!-- settings-table -->` in a page becomes the table of server/settings.py's fields (name, environment
variable, default, description), generated from the code at every build.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SITE_PREFIX = "repo"
# [text](target) and ![alt](target), target without spaces; an optional "title" is kept.
_LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s#]+)(#[^)\s]*)?(\s+\"[^\"]*\")?\)")
_FENCE = re.compile(r"^(```|~~~)", re.MULTILINE)
_SCHEMES = ("http://", "https://", "mailto:", "data:", "/")

_extra: dict[str, Path] = {}  # site src_uri -> repository file, for files outside docs/


def _repo_path_of(src_uri: str) -> Path:
    return _extra.get(src_uri) or (DOCS / src_uri)


def _site_uri(target: Path) -> str | None:
    """Where a repository file appears in the site, adding it if it lives outside docs/."""
    target = target.resolve()
    if target.is_dir():
        readme = target / "README.md"
        if not readme.is_file():
            return None
        target = readme
    if not target.is_file() or ROOT not in target.parents:
        return None
    if DOCS in target.parents:
        return target.relative_to(DOCS).as_posix()
    uri = f"{SITE_PREFIX}/{target.relative_to(ROOT).as_posix()}"
    _extra[uri] = target
    return uri


def _rewrite(markdown: str, page_uri: str) -> str:
    """Rewrite relative links outside fenced code so that they point at the site's copy of their target."""
    here = _repo_path_of(page_uri).parent
    page_dir = posixpath.dirname(page_uri)

    def one(match: re.Match[str]) -> str:
        head, target, anchor, title = match.group(1), match.group(2), match.group(3) or "", match.group(4) or ""
        if target.startswith(_SCHEMES):
            return match.group(0)
        uri = _site_uri(here / target)
        if uri is None:
            if (here / target).is_dir():  # a folder without a README: keep the words, drop the link
                return f"{head[head.index('[') + 1 : -2]} (`{(here / target).resolve().relative_to(ROOT)}/`)"
            return match.group(0)  # missing: --strict reports it
        return f"{head}{posixpath.relpath(uri, page_dir or '.')}{anchor}{title})"

    parts = _FENCE.split(markdown)
    out, inside = [], False
    for part in parts:
        if part in ("```", "~~~"):
            inside = not inside
            out.append(part)
        else:
            out.append(part if inside else _LINK.sub(one, part))
    return "".join(out)


def settings_table() -> str:
    from lara_serve.server.settings import Settings

    rows = ["| setting | environment variable | default | what it does, and its trade-off |", "|---|---|---|---|"]
    for name, field in Settings.model_fields.items():
        default = field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]
        if isinstance(default, Path):
            default = default.relative_to(ROOT) if ROOT in default.parents else default
        shown = "-" if default in (None, [], {}) else f"`{default}`"
        text = (field.description or "").replace("|", "\\|").replace("\n", " ")
        rows.append(f"| `{name}` | `LARA_{name.upper()}` | {shown} | {text} |")
    return "\n".join(rows)


def on_files(files: Files, config: Any) -> Files:
    """Add every file outside docs/ that a page links to (and, for Markdown, what it links to in turn)."""
    _extra.clear()
    pending = [f.src_uri for f in files.documentation_pages()]
    seen: set[str] = set()
    while pending:
        uri = pending.pop()
        if uri in seen:
            continue
        seen.add(uri)
        _rewrite(_repo_path_of(uri).read_text(encoding="utf-8"), uri)  # registers targets in _extra
        pending += [u for u in _extra if u.endswith(".md") and u not in seen]
    for uri, path in _extra.items():
        if files.get_file_from_path(uri) is None:
            files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    markdown = _rewrite(markdown, page.file.src_uri)
    if "<!-- settings-table -->" in markdown:
        markdown = markdown.replace("<!-- settings-table -->", settings_table())
    return markdown
