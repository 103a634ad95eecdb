#!/usr/bin/env bash
# Issue 6 device check: the whole GPU run in one command, from the repository root on the H200 machine
# (its own image: Python 3.12, torch 2.11, triton 3.6; nothing is installed). Through the device tool:
#   bash benchmarks/gpu_check.sh          with timeout_s about 420
# The device tool sends at most 64 MiB of working tree and the model binaries make 187: run
# `python -m tools.device_tree slim` before the call and `python -m tools.device_tree restore` after (docs/gpu.md).
# gpu.py stops starting new sections after --budget-s and saves gpu.json after every section, so a
# timeout still leaves the finished sections. Writes $OUT/gpu.json, $OUT/gpu.log, $OUT/nvidia-smi.txt
# (OUT defaults to benchmarks/results off the device). CPU check of the script itself, no GPU needed:
#   TRITON_INTERPRET=1 .venv/bin/python benchmarks/gpu.py --cpu-smoke --out /tmp/gpu-smoke
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT="${OUT:-benchmarks/results}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
unset TRITON_INTERPRET  # compiled kernels on the GPU
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-/tmp/lara-triton-cache}"
export PYTHONUNBUFFERED=1

{ nvidia-smi; nvidia-smi -q -d CLOCK,POWER; } >"$OUT/nvidia-smi.txt" 2>&1 || true
"$PY" -c 'import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)' \
    2>&1 | tee "$OUT/versions.txt"
timeout -k 10 360 "$PY" benchmarks/gpu.py --out "$OUT" --budget-s 300 2>&1 | tee "$OUT/gpu.log"
rc=${PIPESTATUS[0]}
echo "gpu.py exit status $rc (124 = hit the 360 s guard; gpu.json holds the finished sections)"
exit "$rc"
