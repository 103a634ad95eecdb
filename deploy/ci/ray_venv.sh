#!/usr/bin/env bash
# A venv with ray[serve] and the server's runtime pins, made once and reused (about 600 MB, 1-2 min to make).
# Ray stays out of the project venv: it is big, and it brings its own versions of the web stack.
#
#   python=$(deploy/ci/ray_venv.sh)     # prints the venv's python as the last line of stdout
#
# The venv lives under $LARA_CI_CACHE (default /var/cache/lara-serve-ci), named by a hash of what it holds,
# so a change of the Ray pin, of deploy/requirements-serve.txt or of the interpreter makes a new one.
#   RAY_SPEC   what to install (default 'ray[serve]==2.60.0')
#   PYTHON     interpreter for the venv (default python3; it must match the image's CPython 3.11)
set -euo pipefail

cd "$(dirname "$0")/../.."
CACHE=${LARA_CI_CACHE:-/var/cache/lara-serve-ci}
RAY_SPEC=${RAY_SPEC:-ray[serve]==2.60.0}
PYTHON=${PYTHON:-python3}

key=$({ echo "$RAY_SPEC"; cat deploy/requirements-serve.txt; "$PYTHON" -c 'import sys; print(sys.version)'; } \
    | sha256sum | cut -c1-16)
venv="$CACHE/ray-venv-$key"
mkdir -p "$CACHE"
# One maker at a time; a second caller waits, then finds the venv made.
exec 9>"$CACHE/ray-venv.lock"
flock -w 900 9 || { echo "timed out waiting for $CACHE/ray-venv.lock" >&2; exit 1; }
if [ ! -f "$venv/.complete" ]; then
    # Made in place (venv scripts carry their path); .complete is written last, so a half-made venv is redone.
    rm -rf "$venv"
    echo "making $venv ($RAY_SPEC + deploy/requirements-serve.txt)" >&2
    "$PYTHON" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "$RAY_SPEC" \
        -r deploy/requirements-serve.txt >&2
    touch "$venv/.complete"
    # Keep only this venv: older ones are dead weight of ~600 MB each.
    find "$CACHE" -maxdepth 1 -name 'ray-venv-*' ! -name "ray-venv-$key" -exec rm -rf {} +
fi
echo "$venv/bin/python"
