"""The process tree of a local Ray Serve driver, read from /proc (Linux): what it started, and stopping all of it.

Used by `benchmarks/scaleout.py` and `tests/deploy/test_ray_serve.py`, which start `deploy/ray/serve_app.py`
as a driver; Ray's gcs, raylet and workers are that driver's descendants and may outlive it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from contextlib import suppress
from pathlib import Path


def processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process now."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue  # gone meanwhile
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        out[int(entry.name)] = (ppid, cmdline)
    return out


def descendants(root: int) -> set[int]:
    """Every process below `root` (children, their children, ...), not `root` itself."""
    table, found, frontier = processes(), set(), {root}
    while frontier:
        children = {pid for pid, (ppid, _) in table.items() if ppid in frontier} - found
        found |= children
        frontier = children
    return found


def alive(pids: set[int]) -> set[int]:
    """Those still running as Ray processes (a zombie has exited; a PID reused by another program is not ours)."""
    running = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if state != "Z" and b"ray" in cmdline:
            running.add(pid)
    return running


def stop_driver(driver: subprocess.Popen, tree: set[int], timeout_s: float, settle_s: float = 0.0) -> None:
    """SIGTERM the driver (its descendants now joined to `tree` first), SIGKILL it after `timeout_s`; after
    `settle_s`, SIGKILL every process of `tree` still running as a Ray process."""
    if driver.poll() is None:
        tree |= descendants(driver.pid)
        driver.send_signal(signal.SIGTERM)
        try:
            driver.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            driver.kill()
            driver.wait(timeout=30)
    time.sleep(settle_s)
    for pid in alive(tree):
        with suppress(OSError):  # exited since
            os.kill(pid, signal.SIGKILL)
