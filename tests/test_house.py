"""The house: one import name of our own, rooms that import only downwards, no import circles.

The graph is read from the source (tests/house.py), so a new circle or a room importing upwards fails here
with the modules named, before anything is run.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.house import FOLDERS, PACKAGE, ROOT, cycles, import_graph, module_files

# What each part may import of ours (besides itself and lara_serve's own helpers). The layers of
# style.md: deploy and benchmarks on top, server over model_export over kernels, clients on its own.
PARTS_MAY_IMPORT = {
    "kernels": set(),
    "model_export": {"kernels"},
    "server": {"kernels", "model_export"},
    # `lara train` runs model_export's training; the CLI's other commands are HTTP clients
    "clients": {"model_export"},
}
# model_export's rooms, lowest first: a room may import the rooms listed for it (and kernels).
ROOMS_MAY_IMPORT = {
    "models": set(),
    "export": {"models"},
    "training": {"models"},
    "pretrained": {"models", "training", "export", "head"},
    "head": {"models", "training", "export"},
    "your_data": {"models", "training", "export", "head", "pretrained"},
}


def _part(module: str) -> tuple[str, str | None]:
    """lara_serve.model_export.models.ood -> ("model_export", "head"); lara_serve.server.app -> ("server", None)."""
    parts = module.split(".")[1:]
    if not parts or parts[0] not in FOLDERS:
        return "lara_serve", None
    room = parts[1] if parts[0] == "model_export" and len(parts) > 1 else None
    return parts[0], room if room in ROOMS_MAY_IMPORT else None


def test_no_import_circles() -> None:
    assert cycles(import_graph()) == []


def test_the_circle_finder_finds_circles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]


def test_parts_import_only_downwards() -> None:
    wrong = []
    for module, targets in import_graph().items():
        part, _ = _part(module)
        for target in targets:
            other, _ = _part(target)
            if other not in (part, "lara_serve") and other not in PARTS_MAY_IMPORT.get(part, set()):
                wrong.append(f"{module} -> {target}")
    assert wrong == []


def test_model_export_rooms_import_only_downwards() -> None:
    files = module_files()
    rooms = {m.split(".")[2] for m in files if m.startswith(f"{PACKAGE}.model_export.") and m.count(".") >= 3}
    assert rooms <= set(ROOMS_MAY_IMPORT), f"a room without import rules: {rooms - set(ROOMS_MAY_IMPORT)}"
    loose = [
        m
        for m in files
        if m.startswith(f"{PACKAGE}.model_export.") and files[m].name != "__init__.py" and m.count(".") == 2
    ]
    assert loose == [], "model_export holds rooms only: put these modules in a room"
    wrong = []
    for module, targets in import_graph().items():
        part, room = _part(module)
        if part != "model_export" or room is None:
            continue
        for target in targets:
            other_part, other = _part(target)
            if other_part == "model_export" and other not in (None, room) and other not in ROOMS_MAY_IMPORT[room]:
                wrong.append(f"{module} -> {target}")
    assert wrong == []


def test_every_room_says_what_lives_there() -> None:
    for room in sorted((ROOT / "model_export").iterdir()):
        if (room / "__init__.py").exists():
            doc = (room / "__init__.py").read_text(encoding="utf-8")
            assert doc.startswith('"""') and "import" in doc.split('"""')[1], f"{room.name}: no docstring on imports"


def test_pyproject_lists_every_package_folder() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    on_disk = {PACKAGE}
    for folder in FOLDERS:
        assert config["package-dir"][f"{PACKAGE}.{folder}"] == folder
        on_disk |= {
            ".".join((PACKAGE, *p.parent.relative_to(ROOT).parts))
            for p in (ROOT / folder).rglob("__init__.py")
            if "__pycache__" not in p.parts
        }
    assert set(config["packages"]) == on_disk


@pytest.mark.parametrize("name", FOLDERS)
def test_a_bare_folder_name_is_not_ours(name: str, tmp_path: Path) -> None:
    """From the repository root, `import kernels` must not find our folder: with no other package of that
    name it fails; with one installed (here a stand-in on sys.path) that one is imported."""
    # -S: no site-packages, so an installed package of that name (Hugging Face's kernels) cannot answer
    run = [sys.executable, "-S", "-c", f"import {name}; print({name}.__file__)"]
    missing = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert missing.returncode != 0 and f"No module named {name!r}" in missing.stderr
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text("MARK = 'theirs'\n")
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    theirs = subprocess.run([*run[:3], f"import {name}; print({name}.MARK)"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    assert theirs.returncode == 0, theirs.stderr
    assert theirs.stdout.strip() == "theirs"
