"""Readers of the deployment files shared by the tests of tests/deploy (Dockerfile, k8s, KServe)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
KSERVE = DEPLOY / "kserve" / "inferenceservice.yaml"
LIVE, READY = "/v2/health/live", "/v2/health/ready"
# Env variables that are not LARA settings, and why they are allowed.
FOREIGN_ENV = {
    "PROTOCOL",  # KServe: the protocol of a custom predictor container
    "LARA_ORT_LIBRARY",  # the image's prebuilt fused-kernel library, read by kernels/ort_library.py
}


def load(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def import_file(name: str, path: Path) -> Any:
    """deploy/ is not a package of the project: load its modules by path."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def k8s_objects() -> dict[str, dict[str, Any]]:
    """kind -> object, for the kustomize base (one object of each kind)."""
    objects: dict[str, dict[str, Any]] = {}
    for name in load(K8S / "kustomization.yaml")[0]["resources"]:
        for doc in load(K8S / name):
            assert doc["kind"] not in objects, f"two {doc['kind']} objects"
            objects[doc["kind"]] = doc
    return objects


def kserve_container() -> dict[str, Any]:
    (isvc,) = load(KSERVE)
    (container,) = isvc["spec"]["predictor"]["containers"]
    return container


def deployment_container() -> dict[str, Any]:
    (container,) = k8s_objects()["Deployment"]["spec"]["template"]["spec"]["containers"]
    return container


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    instructions, pending = [], ""
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        keyword, _, rest = pending.strip().partition(" ")
        instructions.append((keyword.upper(), " ".join(rest.split())))
        pending = ""
    return instructions


RUNTIME_STAGES = ("cpu", "gpu")  # the Dockerfile's image targets; the other stages only build venvs


def dockerfile_stages() -> dict[str, list[tuple[str, str]]]:
    """Stage name -> its instructions (FROM first); unnamed stages are keyed by their position."""
    stages: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for keyword, args in dockerfile_instructions():
        if keyword == "FROM":
            words = args.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(stages))
            current = stages.setdefault(name, [])
        if current is not None:
            current.append((keyword, args))
    return stages


def docker_env(stage: str = "cpu") -> dict[str, str]:
    env = {}
    for keyword, args in dockerfile_stages()[stage]:
        if keyword == "ENV":
            env.update(dict(re.findall(r"(\w+)=(\S+)", args)))
    return env


def lara_env_of(container: dict[str, Any]) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def probes(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {kind: container[kind]["httpGet"] for kind in ("startupProbe", "livenessProbe", "readinessProbe")}
