"""Run each mutant of a module against the tests that cover that module, in a scratch copy of the project.

The project itself is never written to: the packages and tests are copied to a temporary folder, a mutant
is written over its module there, the module's tests run with `-x` (the first failure kills the mutant)
and a per-mutant timeout, and the original is put back.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from benchmarks.mutation.operators import Mutant

# What a mutant's test run needs of the project; the rest (results, model repository) is linked, not copied.
_COPIED = ("lara_serve", "server", "clients", "kernels", "model_export", "tests", "pyproject.toml")
_LINKED = ("model_repository", "data_cache")
PYTEST_ARGS = ("-x", "-q", "-rfE", "-p", "no:cacheprovider", "--hypothesis-seed=0", "-o", "addopts=", "--timeout=60")


@dataclass(frozen=True)
class Outcome:
    status: str  # killed | survived | timeout | equivalent
    seconds: float
    detail: str = ""  # the first failing test, when killed


@contextmanager
def scratch_copy(root: Path) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="lara-mutants-") as tmp:
        work = Path(tmp)
        for name in _COPIED:
            src = root / name
            if src.is_dir():
                shutil.copytree(src, work / name, ignore=shutil.ignore_patterns("__pycache__", ".hypothesis"))
            elif src.exists():
                shutil.copy2(src, work / name)
        for name in _LINKED:
            if (root / name).exists():
                (work / name).symlink_to((root / name).resolve())
        yield work


def run_tests(work: Path, tests: list[str], timeout_s: float) -> tuple[int | None, float, str]:
    """(return code, or None on timeout; seconds; the last lines of the output)."""
    shutil.rmtree(work / ".hypothesis", ignore_errors=True)  # a fresh example database for every run
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
    start = time.perf_counter()
    # Own session, so a timeout kills the whole tree (a test may start a server process).
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", *tests, *PYTEST_ARGS],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        code = None
    return code, time.perf_counter() - start, "\n".join(out.strip().splitlines()[-3:])


def run_mutant(work: Path, path: str, original: str, mutant: Mutant, tests: list[str], timeout_s: float) -> Outcome:
    target = work / path
    target.write_text(mutant.source)
    try:
        code, seconds, tail = run_tests(work, tests, timeout_s)
    finally:
        target.write_text(original)
    if code is None:
        return Outcome("timeout", seconds)
    if code == 0:
        return Outcome("survived", seconds)
    # 1: a test failed; 2-4: collection or usage error (a mutant that breaks the import); 5: no tests ran.
    if code == 5:
        raise RuntimeError(f"no tests ran for {path}: {tail}")
    return Outcome("killed", seconds, _first_failure(tail))


def _first_failure(tail: str) -> str:
    for line in tail.splitlines():
        if line.startswith(("FAILED", "ERROR")):
            return line.split(" - ")[0][:160]
    return tail.splitlines()[-1][:160] if tail else ""
