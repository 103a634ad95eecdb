"""What a device call sends, and a working tree slim enough for one.

The device tool (the GPU machine of the standing order) sends the checkout's tracked and untracked-not-ignored
files and refuses a tree over 64 MiB. The model binaries in model_repository/ are 186 of the 196 MB tracked
here (2026-12-07), so a call from this checkout as it is would be refused. Around a device call:

    python -m tools.device_tree size      # MiB that would travel now, and the largest files
    python -m tools.device_tree slim      # model files over 1 MB leave the index (git rm --cached: they stay on
                                          # disk and in every commit) and .git/info/exclude ignores them, but
                                          # those benchmarks/gpu_check.sh reads (KEEP); a pre-commit hook refuses
                                          # commits meanwhile
    ... the device call (bash benchmarks/gpu_check.sh) ...
    python -m tools.device_tree restore   # the index as HEAD has them, the exclude lines and the hook removed

Slim, about 26 MiB travel (the code, docs and results, and the byte news model that gpu_check.sh's end-to-end
section reads).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 64 << 20  # the device tool's limit on what travels (its README, Limits)
LARGE = 1 << 20  # model_repository/ files at least this large stay behind
# benchmarks/gpu.py's "e2e" section reads this model's config.json and weights
KEEP = (
    "model_repository/lara-text-news-bytes/config.json",
    "model_repository/lara-text-news-bytes/1/model.safetensors",
)
BEGIN, END = "# tools.device_tree slim: begin", "# tools.device_tree slim: end"
HOOK_MARK = "# tools.device_tree slim"


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout


def travelling(root: Path) -> list[Path]:
    """The files a device call sends: tracked in the index, and untracked files git does not ignore."""
    names = git(root, "ls-files", "-z", "--cached").split("\0") + git(
        root, "ls-files", "-z", "--others", "--exclude-standard"
    ).split("\0")
    return sorted({root / n for n in names if n and (root / n).exists()})


def size(root: Path) -> int:
    return sum(p.lstat().st_size for p in travelling(root))


def info_dir(root: Path) -> Path:
    return Path(git(root, "rev-parse", "--absolute-git-dir").strip())


def is_slim(root: Path) -> bool:
    exclude = info_dir(root) / "info" / "exclude"
    return exclude.is_file() and BEGIN in exclude.read_text()


def slim(root: Path, keep: tuple[str, ...] = KEEP, large: int = LARGE) -> list[str]:
    """Take model_repository/'s large tracked files out of the index and ignore them; returns their paths."""
    if is_slim(root):
        raise SystemExit("already slim: run `python -m tools.device_tree restore` first")
    tracked = [n for n in git(root, "ls-files", "-z", "model_repository").split("\0") if n]
    out = [n for n in tracked if n not in keep and (root / n).is_file() and (root / n).lstat().st_size >= large]
    if out:
        git(root, "rm", "-q", "--cached", "--", *out)
    gitdir = info_dir(root)
    exclude = gitdir / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    before = exclude.read_text() if exclude.is_file() else ""
    exclude.write_text(before + ("" if before.endswith("\n") or not before else "\n")
                       + "\n".join([BEGIN, *(f"/{n}" for n in out), END]) + "\n")  # fmt: skip
    hook = gitdir / "hooks" / "pre-commit"
    if not hook.exists():  # a commit now would delete the models from the project
        hook.parent.mkdir(parents=True, exist_ok=True)
        hook.write_text(f"#!/bin/sh\n{HOOK_MARK}\necho 'the tree is slim for a device call: run "
                        "python -m tools.device_tree restore before committing' >&2\nexit 1\n")  # fmt: skip
        hook.chmod(0o755)
    return out


def restore(root: Path) -> list[str]:
    """Undo `slim`: the index entries from HEAD, the exclude lines and the hook removed; returns the paths."""
    gitdir = info_dir(root)
    exclude = gitdir / "info" / "exclude"
    if not is_slim(root):
        return []
    text = exclude.read_text()
    head, rest = text.split(BEGIN + "\n", 1)
    block, tail = rest.split(END + "\n", 1)
    paths = [line[1:] for line in block.splitlines() if line.startswith("/")]
    if paths:
        git(root, "reset", "-q", "HEAD", "--", *paths)
    exclude.write_text(head.rstrip("\n") + ("\n" if head.strip() else "") + tail)
    hook = gitdir / "hooks" / "pre-commit"
    if hook.is_file() and HOOK_MARK in hook.read_text():
        hook.unlink()
    return paths


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("action", choices=["size", "slim", "restore"])
    args = p.parse_args(argv)
    if args.action == "slim":
        print(f"{len(slim(ROOT))} model files left the index (they stay on disk)")
    elif args.action == "restore":
        print(f"{len(restore(ROOT))} model files back in the index")
    files = travelling(ROOT)
    total = sum(f.lstat().st_size for f in files)
    verdict = "fits" if total <= LIMIT else "is over"
    print(f"{total / (1 << 20):.1f} MiB would travel in {len(files)} files; {verdict} the device's 64 MiB")
    if args.action == "size":
        for f in sorted(files, key=lambda f: -f.lstat().st_size)[:5]:
            print(f"  {f.lstat().st_size / (1 << 20):6.1f} MiB  {f.relative_to(ROOT)}")
    return 0 if total <= LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
