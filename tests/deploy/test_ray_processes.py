"""deploy/ray/processes.py without Ray: a stand-in driver (a Python process named "ray-...") whose child
outlives it, as Ray's raylet and workers can. Linux only (/proc); each case takes well under a second."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import suppress

import pytest

from deploy.ray.processes import alive, descendants, processes, stop_driver

# The driver starts a child that ignores SIGTERM (a straggler), prints its pid, then sleeps; with "ignore"
# in argv the driver ignores SIGTERM too (a driver that hangs on shutdown).
DRIVER = """
import signal, subprocess, sys, time
if "ignore" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)", "ray-child"])
print(child.pid, flush=True)
time.sleep(60)
"""


def _gone(pids: set[int]) -> bool:
    """SIGKILL is delivered asynchronously: give the kernel a moment to end the processes."""
    deadline = time.monotonic() + 5
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not alive(pids)


def _start(*flags: str) -> tuple[subprocess.Popen, int]:
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, "ray-driver", *flags], stdout=subprocess.PIPE, text=True)
    assert driver.stdout is not None
    return driver, int(driver.stdout.readline())


@pytest.fixture
def cleanup() -> Iterator[list[int]]:
    pids: list[int] = []
    yield pids
    for pid in alive(set(pids)):  # a failed case must not leave sleepers behind (ours only: "ray-" named)
        with suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def test_descendants_and_alive_see_the_tree(cleanup: list[int]) -> None:
    driver, child = _start()
    cleanup += [driver.pid, child]
    assert child in descendants(driver.pid) and driver.pid not in descendants(driver.pid)
    assert processes()[child][0] == driver.pid and "ray-child" in processes()[child][1]
    plain = subprocess.Popen(["sleep", "30"])  # not a Ray process: never in alive()
    cleanup.append(plain.pid)
    assert alive({driver.pid, child, plain.pid}) == {driver.pid, child}
    plain.kill()
    plain.wait()
    stop_driver(driver, set(), timeout_s=5)


def test_stop_driver_kills_the_straggler_the_driver_left(cleanup: list[int]) -> None:
    driver, child = _start()
    cleanup += [driver.pid, child]
    tree: set[int] = set()
    start = time.monotonic()
    stop_driver(driver, tree, timeout_s=5)
    assert driver.returncode == -signal.SIGTERM and child in tree
    assert time.monotonic() - start < 5 and _gone(tree)


def test_a_driver_ignoring_sigterm_is_killed_after_the_timeout(cleanup: list[int]) -> None:
    driver, child = _start("ignore")
    cleanup += [driver.pid, child]
    tree: set[int] = set()
    stop_driver(driver, tree, timeout_s=0.5)
    assert driver.returncode == -signal.SIGKILL and child in tree and _gone(tree)
