"""`lara info | head -1`: a reader that stops early ends the CLI quietly, without a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import API_KEY


def test_a_closed_pipe_ends_quietly(live_url: str) -> None:
    cmd = [sys.executable, "-m", "lara_serve.clients", "--url", live_url, "--api-key", API_KEY, "info"]
    read, write = os.pipe()
    proc = subprocess.Popen(cmd, stdout=write, stderr=subprocess.PIPE)
    os.close(write)
    # The reader leaves before the CLI has its answer (as `head` does once it has its lines while a long
    # output is still coming): every write of the CLI meets a closed pipe.
    os.close(read)
    _, err = proc.communicate(timeout=60)
    assert b"Traceback" not in err and b"BrokenPipeError" not in err, err.decode()
    assert proc.returncode in (0, 141)
