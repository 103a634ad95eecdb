#!/usr/bin/env bash
# Checks of the GPU image that need no GPU (run after `make image-gpu`, with DOCKER_HOST set):
#   1. onnxruntime in the image offers the CUDA provider, and the provider's libraries resolve (but libcuda.so.1);
#   2. with LARA_DEVICE=cpu the image starts and becomes ready on 127.0.0.1;
#   3. with the image's default LARA_DEVICE=cuda and no GPU it refuses to start: non-zero exit, nothing served.
#
#   deploy/ci/check_gpu_image.sh [IMAGE]      # default lara-serve:gpu
set -euo pipefail

IMAGE=${1:-lara-serve:gpu}
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
run=(docker run --network host --read-only --tmpfs /tmp --cap-drop ALL -e LARA_HOST=127.0.0.1 -e "LARA_PORT=$port")

echo "== 1. CUDA provider and its libraries"
docker run --rm --network host --entrypoint python "$IMAGE" -c '
import glob, subprocess, onnxruntime as ort
assert "CUDAExecutionProvider" in ort.get_available_providers(), ort.get_available_providers()
(lib,) = glob.glob("/opt/venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime_providers_cuda.so")
missing = [l for l in subprocess.run(["ldd", lib], capture_output=True, text=True).stdout.splitlines() if "not found" in l]
assert all("libcuda.so.1" in l for l in missing), missing
print("providers:", ort.get_available_providers(), "| unresolved:", [l.split()[0] for l in missing])'

echo "== 2. LARA_DEVICE=cpu starts and serves"
name=lara-gpu-check-$$
"${run[@]}" -d --name "$name" -e LARA_DEVICE=cpu "$IMAGE" >/dev/null
trap 'docker rm -f "$name" >/dev/null 2>&1 || true' EXIT
for _ in $(seq 1 240); do
    if python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/v2/health/ready', timeout=2)" 2>/dev/null; then
        echo "ready on 127.0.0.1:$port"
        break
    fi
    [ "$(docker inspect -f '{{.State.Running}}' "$name")" = true ] || { docker logs "$name" | tail -20; exit 1; }
    sleep 0.5
done
docker stop -t 40 "$name" >/dev/null
echo "stopped: exit code $(docker inspect -f '{{.State.ExitCode}}' "$name")"
docker rm "$name" >/dev/null

echo "== 3. LARA_DEVICE=cuda without a GPU must refuse to start"
name=lara-gpu-check-cuda-$$
set +e
out=$(timeout 180 "${run[@]}" --name "$name" "$IMAGE" 2>&1)
code=$?
set -e
docker rm -f "$name" >/dev/null 2>&1 || true  # still there only if the client timed out
echo "$out" | tail -n 5
echo "exit code $code, $(echo "$out" | wc -l) lines of output"
if [ "$code" -eq 0 ] || [ "$code" -eq 124 ]; then
    echo "FAIL: LARA_DEVICE=cuda without a GPU did not refuse to start (exit $code)" >&2
    exit 1
fi
echo "OK"
