"""Load tester: latency and throughput vs input length and load, for one or several models.

`python -m lara_serve.clients loadtest --model NAME --lengths 1K,4K,16K --concurrency 1,8 --out DIR` (see cli.py).
The parts: inputs (what is sent; examples/ holds the shipped example files), protocol (how, per route),
grpc_route (the KServe v2 gRPC route, imported only when asked for), schedule (closed/open loop arrivals),
runner (one cell), rigour (measurement windows and their stability, thin percentiles, achieved vs offered
rate), sweep (all cells), report (statistics), writers (JSON, CSV, table), charts (PNG), html (report.html).
"""

from lara_serve.clients.loadtest.cli import check_loopback, main
from lara_serve.clients.loadtest.inputs import (
    InputError,
    InputGroup,
    Payload,
    builtin,
    from_paths,
    make_doc,
    synthetic_text,
)
from lara_serve.clients.loadtest.report import Cell, Report, Target
from lara_serve.clients.loadtest.schedule import LoadPoint, arrival_offsets
from lara_serve.clients.loadtest.sweep import SweepPlan, run_sweep

__all__ = [
    "Cell",
    "InputError",
    "InputGroup",
    "LoadPoint",
    "Payload",
    "Report",
    "SweepPlan",
    "Target",
    "arrival_offsets",
    "builtin",
    "check_loopback",
    "from_paths",
    "main",
    "make_doc",
    "run_sweep",
    "synthetic_text",
]
