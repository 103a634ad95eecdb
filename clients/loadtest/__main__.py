"""`python -m lara_serve.clients.loadtest ...`, the same as `python -m lara_serve.clients loadtest ...`."""

import sys

from lara_serve.clients.loadtest.cli import main

sys.exit(main(prog="python -m lara_serve.clients.loadtest"))
