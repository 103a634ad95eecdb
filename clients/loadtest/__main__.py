"""`python -m clients.loadtest ...`, the same as `python -m clients loadtest ...`."""

import sys

from clients.loadtest.cli import main

sys.exit(main(prog="python -m clients.loadtest"))
