"""Deployment files agree with the server: probe paths are real routes, ports match, every LARA_ variable is a
Settings field with a value Settings accepts, selectors select the pods, the image stays lean and offline.

Fast (no cluster, no Docker, no Ray). Schema validation and kustomize rendering are in test_k8s_schemas.py,
the built image in test_container.py, Ray Serve in test_ray_serve.py.
"""

from __future__ import annotations

import asyncio
import http.server
import re
import threading
import tomllib
from pathlib import Path
from typing import Any

import httpx
import pytest
from deploy_helpers import (
    DEPLOY,
    FOREIGN_ENV,
    K8S,
    LIVE,
    READY,
    ROOT,
    RUNTIME_STAGES,
    deployment_container,
    docker_env,
    dockerfile_instructions,
    dockerfile_stages,
    import_file,
    k8s_objects,
    kserve_container,
    lara_env_of,
    load,
    probes,
)
from fastapi import FastAPI
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from lara_serve.server.app import create_app
from lara_serve.server.settings import Settings


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return Settings(model_repository=tmp_path_factory.mktemp("repo"))


@pytest.fixture(scope="module")
def app(settings: Settings) -> FastAPI:
    return create_app(settings, models=[])


def get(app: FastAPI, path: str) -> httpx.Response:
    """In process; ASGITransport runs no lifespan, so no model is loaded: live but not ready."""

    async def call() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            return await client.get(path)

    return asyncio.run(call())


# -- files parse, kustomization lists them all -------------------------------------------------------------


def test_every_yaml_parses_into_named_objects() -> None:
    files = sorted(DEPLOY.rglob("*.yaml"))
    assert len(files) >= 7
    for path in files:
        for doc in load(path):
            assert isinstance(doc, dict), path
            if path.name != "kustomization.yaml":
                assert doc.get("apiVersion") and doc.get("kind") and doc["metadata"].get("name"), path


def test_kustomization_lists_every_manifest() -> None:
    listed = set(load(K8S / "kustomization.yaml")[0]["resources"])
    present = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present
    assert set(k8s_objects()) == {
        "ConfigMap",
        "Deployment",
        "Service",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
    }


# -- probes hit real routes ---------------------------------------------------------------------------------


def test_server_has_the_probe_routes(app: FastAPI) -> None:
    assert {LIVE, READY, "/metrics"} <= set(app.openapi()["paths"])
    live = get(app, LIVE)
    assert live.status_code == 200 and live.json() == {"live": True}
    assert get(app, READY).status_code == 503  # nothing loaded: not ready, but the route exists
    assert get(app, "/metrics").status_code == 200  # the Prometheus scrape path


@pytest.mark.parametrize("where", ["k8s", "kserve"])
def test_probes_use_the_v2_health_routes(where: str) -> None:
    container = deployment_container() if where == "k8s" else kserve_container()
    got = probes(container)
    assert got["startupProbe"]["path"] == LIVE
    assert got["livenessProbe"]["path"] == LIVE
    assert got["readinessProbe"]["path"] == READY


@pytest.mark.parametrize("stage", RUNTIME_STAGES)
def test_image_healthcheck_uses_liveness_route(stage: str) -> None:
    instructions = dockerfile_stages()[stage]
    (healthcheck,) = [args for keyword, args in instructions if keyword == "HEALTHCHECK"]
    script = re.search(r'"(/app/[^"]+\.py)"', healthcheck)
    assert script, healthcheck
    local = ROOT / script.group(1).removeprefix("/app/")
    assert LIVE in local.read_text()
    assert any(keyword == "COPY" and str(local.relative_to(ROOT)) in args for keyword, args in instructions)


def test_healthcheck_script_exit_codes(monkeypatch: pytest.MonkeyPatch) -> None:
    healthcheck = import_file("lara_deploy_healthcheck", DEPLOY / "docker" / "healthcheck.py")

    class Live(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server API)
            self.send_response(200 if self.path == LIVE else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Live) as httpd:
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        monkeypatch.setenv("LARA_PORT", str(httpd.server_address[1]))
        assert healthcheck.main() == 0
        httpd.shutdown()
    assert healthcheck.main() == 1  # nothing listens any more


# -- ports ----------------------------------------------------------------------------------------------------


def test_k8s_ports_agree() -> None:
    objects = k8s_objects()
    container = deployment_container()
    (port,) = container["ports"]
    config = objects["ConfigMap"]["data"]
    assert int(config["LARA_PORT"]) == port["containerPort"]
    assert config["LARA_HOST"] == "0.0.0.0"  # reachable from the kubelet and the Service
    for probe in probes(container).values():
        assert probe["port"] in (port["name"], port["containerPort"])
    (service_port,) = objects["Service"]["spec"]["ports"]
    assert service_port["targetPort"] in (port["name"], port["containerPort"])
    annotations = objects["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == port["containerPort"]
    assert annotations["prometheus.io/path"] == "/metrics"


def test_kserve_ports_agree() -> None:
    container = kserve_container()
    (port,) = container["ports"]
    env = lara_env_of(container)
    assert int(env["LARA_PORT"]) == port["containerPort"] == 8080  # KServe's port for custom containers
    assert env["LARA_HOST"] == "0.0.0.0"
    assert env["PROTOCOL"] == "v2"
    assert {p["port"] for p in probes(container).values()} == {port["containerPort"]}


@pytest.mark.parametrize("stage", RUNTIME_STAGES)
def test_dockerfile_port_and_bind(stage: str) -> None:
    exposed = [args for keyword, args in dockerfile_stages()[stage] if keyword == "EXPOSE"]
    env = docker_env(stage)
    assert exposed == [env["LARA_PORT"]] == ["8000"]
    assert env["LARA_HOST"] == "0.0.0.0"
    assert env["LARA_BACKEND"] == "onnxruntime"
    assert env["LARA_DEVICE"] == stage.replace("gpu", "cuda")  # the gpu image never runs on the CPU silently


# -- env names are Settings fields, values are accepted --------------------------------------------------------


def all_env_names() -> dict[str, set[str]]:
    objects = k8s_objects()
    return {
        "configmap": set(objects["ConfigMap"]["data"]),
        "deployment": set(lara_env_of(deployment_container())),
        "kserve": set(lara_env_of(kserve_container())),
        "dockerfile": {k for stage in RUNTIME_STAGES for k in docker_env(stage) if k.startswith("LARA_")},
    }


@pytest.mark.parametrize("where", ["configmap", "deployment", "kserve", "dockerfile"])
def test_env_names_are_settings_fields(where: str) -> None:
    fields = {"LARA_" + name.upper() for name in Settings.model_fields}
    names = all_env_names()[where] - FOREIGN_ENV
    assert names, where
    assert names <= fields, f"not Settings fields: {sorted(names - fields)}"


@pytest.mark.parametrize("where", ["configmap", "kserve", "dockerfile-cpu", "dockerfile-gpu"])
def test_env_values_are_valid_settings(where: str, tmp_path: Path) -> None:
    if where == "configmap":
        values = dict(k8s_objects()["ConfigMap"]["data"])
    elif where == "kserve":
        values = {k: v for k, v in lara_env_of(kserve_container()).items() if k not in FOREIGN_ENV}
    else:
        values = {k: v for k, v in docker_env(where.removeprefix("dockerfile-")).items() if k.startswith("LARA_")}
    kwargs: dict[str, Any] = {k.removeprefix("LARA_").lower(): v for k, v in values.items()}
    kwargs["model_repository"] = tmp_path  # the image's path does not exist here
    Settings(**kwargs)  # raises on any value the server would refuse at start-up


def test_api_key_comes_from_an_optional_secret() -> None:
    (api_key,) = [e for e in deployment_container()["env"] if e["name"] == "LARA_API_KEY"]
    assert "value" not in api_key
    assert api_key["valueFrom"]["secretKeyRef"]["optional"] is True
    assert "LARA_API_KEY" not in k8s_objects()["ConfigMap"]["data"]


# -- objects reference each other ------------------------------------------------------------------------------


def test_selectors_and_references() -> None:
    objects = k8s_objects()
    deployment = objects["Deployment"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    for selector in (
        deployment["spec"]["selector"]["matchLabels"],
        objects["Service"]["spec"]["selector"],
        objects["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"],
    ):
        assert selector.items() <= pod_labels.items()
    target = objects["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    hpa = objects["HorizontalPodAutoscaler"]["spec"]
    assert 1 <= objects["PodDisruptionBudget"]["spec"]["minAvailable"] < hpa["minReplicas"] <= hpa["maxReplicas"]
    (config_ref,) = deployment_container()["envFrom"]
    assert config_ref["configMapRef"]["name"] == objects["ConfigMap"]["metadata"]["name"]


def test_threads_match_cpu_limit() -> None:
    limit = deployment_container()["resources"]["limits"]["cpu"]
    assert int(k8s_objects()["ConfigMap"]["data"]["LARA_NUM_THREADS"]) == int(limit)


# -- image: non-root, lean, offline ---------------------------------------------------------------------------


def test_dockerfile_base_is_a_build_arg_and_user_is_not_root() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert "# syntax=" not in text  # it would pull a frontend image
    instructions = dockerfile_instructions()
    assert instructions[0] == ("ARG", "BASE=local/debian:bookworm")
    froms = [args for keyword, args in instructions if keyword == "FROM"]
    assert froms and all(f.split()[0] == "${BASE}" for f in froms)
    stages = dockerfile_stages()
    assert list(stages)[-2:] == ["build-gpu", "gpu"]  # --target cpu (the classic builder) never builds gpu
    for stage in RUNTIME_STAGES:
        (user,) = [args for keyword, args in stages[stage] if keyword == "USER"]
        uid = user.split(":")[0]
        assert uid not in ("0", "root")
        assert k8s_objects()["Deployment"]["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == int(uid)
    installs = [args for keyword, args in instructions if keyword == "RUN" and "pip install" in args]
    assert installs and all("--no-index" in args for args in installs)


def test_serving_requirements_are_lean_and_within_the_project_requirements() -> None:
    pins = {}
    for line in (DEPLOY / "requirements-serve.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[canonicalize_name(name)] = Version(version)
    assert {"onnxruntime", "fastapi", "uvicorn", "pydantic-settings"} <= set(pins)
    assert not {"torch", "triton", "onnx", "onnxscript", "safetensors", "matplotlib"} & set(pins)
    declared = {}
    for spec in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        requirement = Requirement(spec)
        declared[canonicalize_name(requirement.name)] = requirement.specifier
    for name, version in pins.items():
        assert name in declared, f"{name} is pinned for the image but is no project dependency"
        assert version in declared[name], f"{name}=={version} is outside the project's {declared[name]}"
    # The image is the serving install (`pip install .`): every base dependency is pinned for it.
    assert set(declared) <= set(pins), f"not in requirements-serve.txt: {sorted(set(declared) - set(pins))}"


def test_dockerignore_keeps_the_context_small() -> None:
    lines = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()]
    lines = [line for line in lines if line and not line.startswith("#")]
    assert lines[0] == "*"  # allow-list: everything else (.git, .venv, runs/, tests/) stays out
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    copied = set()
    for keyword, args in dockerfile_instructions():
        if keyword == "COPY" and "--from" not in args:
            copied.update(source.rstrip("/") for source in args.split()[:-1])
    wheelhouses = {"deploy/wheels", "deploy/wheels-gpu"}
    assert wheelhouses <= copied
    assert copied - wheelhouses <= allowed
    assert {f"{w}/*.whl" for w in wheelhouses} <= allowed


# -- Ray Serve app: importable without ray, arguments checked ---------------------------------------------------


def test_ray_app_imports_without_ray() -> None:
    serve_app = import_file("lara_deploy_serve_app", DEPLOY / "ray" / "serve_app.py")
    overrides, ray_options = serve_app.split_args({"max_batch_size": "8", "num_cpus": "2", "model": "m"})
    assert overrides == {"max_batch_size": "8", "num_threads": "2"}
    assert ray_options == {"num_cpus": "2", "model": "m"}
    with pytest.raises(ValueError, match="unknown argument"):
        serve_app.split_args({"max_batch": "8"})


def test_ray_token_budget() -> None:
    padded_tokens = import_file("lara_deploy_serve_app", DEPLOY / "ray" / "serve_app.py").padded_tokens

    class Item:
        def __init__(self, length: int) -> None:
            self.length = length

    def size(*lengths: int) -> int:
        return padded_tokens([Item(n) for n in lengths], budget=1000, max_items=4)

    assert size(300, 400) == 800  # padded to the longest
    assert size(600, 500) > 1000  # over the budget: Ray defers the second item
    assert size(10, 10, 10, 10) <= 1000 < size(10, 10, 10, 10, 10)  # the item count is capped too
    assert size(5000) == 1000  # a lone long item still runs
