"""settings.ort_shared_arena: the models' onnxruntime sessions on the CPU draw on one arena, so the process keeps
about the largest batch any model ran, not the sum of every model's largest batch; the answers are the same.

Each measurement is a fresh process with two sessions of the shipped lara-text-genre (two models as the
server loads them), one 32K-token batch through the first, then through the second."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lara_serve.server.backends import OrtOptions
from lara_serve.server.backends.onnx_runtime import OnnxRuntimeBackend
from lara_serve.server.repository import read_config

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "model_repository" / "lara-text-genre"
TOKENS = 32768

CHILD = """
import json, sys
from pathlib import Path
import numpy as np
from lara_serve.server.backends import OrtOptions
from lara_serve.server.backends.onnx_runtime import OnnxRuntimeBackend
from lara_serve.server.repository import read_config

def rss():
    line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024

model, shared, tokens = Path(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3])
config = read_config(model)
options = OrtOptions(long_via_torch=False, shared_arena=shared)
a, b = (OnnxRuntimeBackend(model, config, "cpu", num_threads=1, ort_options=options) for _ in range(2))
ids = np.random.default_rng(0).integers(40, 120, size=(1, tokens)).astype(np.int64)
batch = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
loaded = rss()
a.run_outputs(batch)
after_a = rss()
b.run_outputs(batch)
print(json.dumps({"first": after_a - loaded, "second": rss() - after_a}))
"""


def grown(shared: bool) -> dict[str, float]:
    cmd = [sys.executable, "-c", CHILD, str(MODEL), "1" if shared else "0", str(TOKENS)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


pytestmark = pytest.mark.skipif(not MODEL.is_dir(), reason="shipped model absent")


def test_a_second_model_reuses_the_shared_arena_and_keeps_its_own_otherwise() -> None:
    shared, own = grown(True), grown(False)
    # measured here: both first batches about +230 MiB; the second +0-10 MiB shared, +230 MiB own
    assert own["first"] > 100 and shared["first"] > 100, (shared, own)  # the batch really grew an arena
    assert own["second"] > 0.6 * own["first"], own  # its own arena: the same growth again
    assert shared["second"] < 0.25 * shared["first"], shared  # the shared one already had the room


def test_the_shared_arena_changes_no_answer() -> None:
    config = read_config(MODEL)
    ids = np.random.default_rng(1).integers(40, 120, size=(3, 700)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[1, 400:] = 0
    batch = {"input_ids": ids, "attention_mask": mask}
    outs = [
        OnnxRuntimeBackend(MODEL, config, "cpu", num_threads=1, ort_options=OrtOptions(shared_arena=s)).run_outputs(
            batch
        )
        for s in (True, False)
    ]
    assert np.array_equal(outs[0].logits, outs[1].logits)
    assert np.array_equal(outs[0].ood_score, outs[1].ood_score)
