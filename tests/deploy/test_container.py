"""The CPU image, built and run as a user would (deploy/README.md): a private Docker daemon, the image from
deploy/build_image.sh, `docker run --read-only --cap-drop ALL --network host` on a loopback port; real
BBC texts and Fashion-MNIST PNGs get their labels, the server runs as uid 10001 and stops cleanly, and
LARA_DEVICE=cuda without a GPU refuses to start.

Needs root (apt-get install docker.io debootstrap when missing, dockerd). Skips with the reason elsewhere;
fails under CI=true. The daemon is private (deploy/ci/dockerd.sh: own data root and socket, no bridge, no
iptables), stopped by its PID and removed afterwards. Cached between runs on one machine, under
$LARA_CI_CACHE (default /var/cache/lara-serve-ci): the debootstrapped base (tar) and pip's downloads.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from smoke_data import ROOT, Example, clear_examples, ensure_debian_packages, need

from benchmarks.memory_one_mib import image_models, largest_batch, left_out_of_image
from lara_serve.clients.client import LaraClient
from lara_serve.server.testing import free_port

pytestmark = pytest.mark.slow

CACHE = Path(os.environ.get("LARA_CI_CACHE", "/var/cache/lara-serve-ci"))
BASE_TAR = CACHE / "debian-bookworm-minbase.tar"
BASE_TAR_MAX_AGE_S = 14 * 86400  # then debootstrap again, for current Debian packages
IMAGE = "lara-serve:ci-smoke"
UID = 10001


def run(cmd: list[str], env: dict[str, str], timeout: float, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} -> {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def host_network_state() -> tuple[str, str]:
    """What a plain dockerd would change on the host: ip_forward and the iptables rules (read only)."""
    forward = Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()
    rules = ""
    if shutil.which("iptables-save"):
        rules = subprocess.run(["iptables-save"], capture_output=True, text=True, timeout=30).stdout
        rules = "\n".join(line for line in rules.splitlines() if not line.startswith(("#", ":")))
    return forward, rules


@pytest.fixture(scope="module")
def docker() -> Iterator[dict[str, str]]:
    """Environment (DOCKER_HOST) of a private daemon; the daemon and its data are gone afterwards."""
    if os.geteuid() != 0:
        need("the container test runs its own dockerd, which needs root")
    ensure_debian_packages("docker.io", "debootstrap")
    before = host_network_state()
    # A short path: the daemon's unix sockets must fit in 108 bytes.
    workdir = tempfile.mkdtemp(prefix="lara-docker-", dir="/tmp")
    script = str(ROOT / "deploy" / "ci" / "dockerd.sh")
    started = subprocess.run([script, "start", workdir], capture_output=True, text=True, timeout=120)
    if started.returncode != 0:
        subprocess.run([script, "stop", workdir], capture_output=True, timeout=120)
        pytest.fail(f"private dockerd did not start: {started.stderr[-2000:]}")
    env = {**os.environ, "DOCKER_HOST": f"unix://{workdir}/docker.sock", "DOCKER_BUILDKIT": "0"}
    try:
        yield env
    finally:
        stopped = subprocess.run([script, "stop", workdir], capture_output=True, text=True, timeout=120)
        assert stopped.returncode == 0, stopped.stderr
        assert not Path(workdir).exists()
        assert host_network_state() == before, "the Docker daemon changed the host's ip_forward or iptables"


@pytest.fixture(scope="module")
def image(docker: dict[str, str]) -> str:
    CACHE.mkdir(parents=True, exist_ok=True)
    if BASE_TAR.exists() and time.time() - BASE_TAR.stat().st_mtime > BASE_TAR_MAX_AGE_S:
        BASE_TAR.unlink()
    env = {**docker, "IMAGE": IMAGE, "BASE_TAR": str(BASE_TAR), "PIP_CACHE_DIR": str(CACHE / "pip")}
    run([str(ROOT / "deploy" / "build_image.sh"), "cpu"], env, timeout=900)
    return IMAGE


@pytest.fixture(scope="module")
def examples() -> list[Example]:
    return clear_examples(per_class=1, skip=left_out_of_image())  # the image's models only


def docker_run(docker: dict[str, str], port: int, *extra: str) -> list[str]:
    return [
        "docker", "run", "--network", "host", "--read-only", "--tmpfs", "/tmp", "--cap-drop", "ALL",
        "--security-opt", "no-new-privileges", "-e", "LARA_HOST=127.0.0.1", "-e", f"LARA_PORT={port}",
        *extra,
    ]  # fmt: skip


def wait_ready(docker: dict[str, str], name: str, url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        state = run(["docker", "inspect", "-f", "{{.State.Running}}", name], docker, 30).stdout.strip()
        if state != "true":
            logs = run(["docker", "logs", name], docker, 30, check=False)
            pytest.fail(f"container exited before ready:\n{logs.stdout[-2000:]}{logs.stderr[-2000:]}")
        time.sleep(0.5)
    pytest.fail(f"not ready within {timeout_s} s")


def listening_addresses(port: int) -> set[str]:
    """Local IPv4 addresses (hex, as in /proc/net/tcp) with a socket listening on `port`."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:
            found.add(address)
    return found


def process_status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {key: value.strip() for key, _, value in (line.partition(":") for line in lines)}


@pytest.mark.timeout(1200)
def test_image_is_lean_and_not_root(image: str, docker: dict[str, str]) -> None:
    (info,) = json.loads(run(["docker", "image", "inspect", image], docker, 60).stdout)
    assert info["Config"]["User"] == f"{UID}:{UID}"
    size_mb = info["Size"] / 1e6
    # 345 MB in 2026-11 with the byte news model; 469 MB with lara-text-news's int8 graph and sliced program
    assert size_mb < 520, f"image grew to {size_mb:.0f} MB (469 MB in 2026-12)"
    # Neither PyTorch nor pip are in the serving image.
    probe = "import importlib.util as u; print([m for m in ('torch', 'triton', 'pip') if u.find_spec(m)])"
    out = run(["docker", "run", "--rm", "--network", "host", image, "python", "-c", probe], docker, 120).stdout
    assert out.strip() == "[]"


def test_container_classifies_real_inputs_and_stops_cleanly(
    image: str, docker: dict[str, str], examples: list[Example]
) -> None:
    port, name = free_port(), f"lara-smoke-{os.getpid()}"
    url = f"http://127.0.0.1:{port}"
    run([*docker_run(docker, port, "-d", "--name", name), image], docker, 60)
    try:
        wait_ready(docker, name, url, timeout_s=180)
        assert listening_addresses(port) == {"0100007F"}, "the server must listen on 127.0.0.1 only"
        pid = int(run(["docker", "inspect", "-f", "{{.State.Pid}}", name], docker, 30).stdout)
        status = process_status(pid)
        assert status["Uid"].split() == [str(UID)] * 4 and status["Gid"].split() == [str(UID)] * 4
        assert int(status["CapEff"], 16) == 0

        with LaraClient(url, timeout_s=30) as client:
            for example in examples:  # v1 :classify, raw body
                got = client.classify(example.model, example.data, content_type=example.content_type)
                assert got.label == example.label, (example.model, example.label, got)
                assert abs(got.score - example.probability) < 1e-2, (example.model, got.score, example.probability)
            for model in {e.model for e in examples}:  # v2 infer, a batch of every example of the model
                mine = [e for e in examples if e.model == model]
                result = client.infer(model, [e.data for e in mine])
                assert [result.labels[i] for i in result.probabilities.argmax(axis=1)] == [e.label for e in mine]
        # The image ships the fused LaraAttention kernel, built in its build stage (no compiler at run time).
        cards = httpx.get(f"{url}/info", timeout=30).json()["models"]
        assert cards and all(card["attention_kernel"] == "fused" for card in cards), cards
    finally:
        started = time.monotonic()
        run(["docker", "stop", "-t", "60", name], docker, 120, check=False)
        stop_s = time.monotonic() - started
        state = json.loads(run(["docker", "inspect", "-f", "{{json .State}}", name], docker, 30).stdout)
        logs = run(["docker", "logs", name], docker, 30, check=False)
        run(["docker", "rm", "-f", name], docker, 60, check=False)
    output = logs.stdout + logs.stderr
    # SIGTERM -> drain -> exit 0 well before the 60 s after which docker would SIGKILL (exit 137).
    assert state["ExitCode"] == 0 and not state["OOMKilled"], (state, output[-2000:])
    assert stop_s < 45, f"docker stop took {stop_s:.1f} s"
    assert "Application shutdown complete" in output, output[-2000:]
    assert "Traceback" not in output, output[-3000:]


def test_device_cuda_without_gpu_refuses_to_start(image: str, docker: dict[str, str]) -> None:
    port = free_port()
    cmd = [*docker_run(docker, port, "--rm", "-e", "LARA_DEVICE=cuda"), image]
    try:
        done = subprocess.run(cmd, env=docker, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("LARA_DEVICE=cuda without a GPU kept running for 120 s; it must exit at start-up")
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-2000:]
    # One line that says why (onnxruntime's own warnings aside), no traceback, no silent CPU fallback.
    lines = [line for line in output.splitlines() if line.strip() and "[W:onnxruntime" not in line]
    assert len(lines) == 1 and "cuda" in lines[0].lower(), output[-2000:]
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/v2/health/live", timeout=2)  # never served


ONE_MIB = 1 << 20
POD_LIMIT = "2g"  # deploy/k8s/deployment.yaml and deploy/kserve/inferenceservice.yaml: memory 2Gi
# The manifests' settings that bear on a long document (deploy/k8s/configmap.yaml).
MANIFEST_ENV = {"LARA_NUM_THREADS": "2", "LARA_MAX_BATCH_TOKENS": "65536", "LARA_REQUEST_TIMEOUT_S": "180.0"}


# The container's own memory cgroup as it sees it: cgroup v2 files, else cgroup v1's (this machine: v1).
LIMIT_FILES = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
PEAK_FILES = ("/sys/fs/cgroup/memory.peak", "/sys/fs/cgroup/memory/memory.max_usage_in_bytes")


def cgroup_memory(docker: dict[str, str], name: str, files: tuple[str, ...]) -> int | None:
    """The first readable of the container's cgroup memory `files`, in bytes; None when none is."""
    for file in files:
        done = run(["docker", "exec", name, "cat", file], docker, 30, check=False)
        value = done.stdout.strip()
        if done.returncode == 0 and value.isdecimal():
            return int(value)
    return None


@pytest.mark.timeout(1200)
def test_one_mib_document_within_a_2_gib_limit(image: str, docker: dict[str, str]) -> None:
    """Issue 49: the image under the manifests' 2 GiB limit answers a max-length (1 MiB) text document to each
    of its text models with 200 on its sliced program, the container is not OOM-killed, and the server serves
    on afterwards."""
    port, name = free_port(), f"lara-mib-{os.getpid()}"
    url = f"http://127.0.0.1:{port}"
    env = [arg for key, value in MANIFEST_ENV.items() for arg in ("-e", f"{key}={value}")]
    limits = ["--memory", POD_LIMIT, "--memory-swap", POD_LIMIT]  # no swap to spill into
    run([*docker_run(docker, port, "-d", "--name", name, *limits, *env), image], docker, 60)
    text = (ROOT / "examples" / "long-document.txt").read_bytes()
    document = (text * (ONE_MIB // len(text) + 1))[:ONE_MIB]
    headers = {"Content-Type": "text/plain; charset=utf-8"}
    try:
        wait_ready(docker, name, url, timeout_s=180)
        limit = cgroup_memory(docker, name, LIMIT_FILES)
        if limit is None:
            need(f"the container's memory limit cannot be read here (none of {LIMIT_FILES})")
        assert limit == 2 * 2**30, limit
        models = image_models()
        texts = [m for m, config in models.items() if config["task"] == "text"]
        assert "lara-text-news" in texts, texts
        budget = int(MANIFEST_ENV["LARA_MAX_BATCH_TOKENS"])
        for model in texts:  # one after the other: each arena grown by its largest batch, then 1 MiB on top
            batch = [t.decode("utf-8", "ignore") for t in largest_batch(models[model], document, budget)]
            grown = httpx.post(f"{url}/v1/models/{model}:predict", json={"instances": batch}, timeout=300)
            assert grown.status_code == 200, grown.text[:500]
            whole = httpx.post(f"{url}/v1/models/{model}:classify", content=document, headers=headers, timeout=600)
            assert whole.status_code == 200, (model, whole.text[:500])
            assert not whole.json()["truncated"], model  # read whole, not cut to fit
            # the same text repeated: the same topic as its first 64 KiB
            assert whole.json()["label"] == grown.json()["predictions"][0]["label"], model
            peak = cgroup_memory(docker, name, PEAK_FILES)
            print(f"{model}, 1 MiB: {whole.elapsed.total_seconds():.1f} s, container memory.peak {peak} bytes")
        assert httpx.get(f"{url}/v2/health/ready", timeout=10).status_code == 200
        for model in texts:
            short = httpx.post(f"{url}/v1/models/{model}:classify", content=text[:2048], headers=headers, timeout=60)
            assert short.status_code == 200, short.text
    finally:
        state = json.loads(run(["docker", "inspect", "-f", "{{json .State}}", name], docker, 30).stdout)
        logs = run(["docker", "logs", name], docker, 30, check=False)
        run(["docker", "rm", "-f", name], docker, 60, check=False)
    assert state["Running"] and not state["OOMKilled"], (state, (logs.stdout + logs.stderr)[-2000:])
